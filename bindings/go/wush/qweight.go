package wush

// Pre-quantized weights and the layerwise loss (wush.h: "Pre-quantized weights and the
// layerwise loss").

// #include <stdlib.h>
// #include <wush/wush.h>
import "C"

import (
	"runtime"
	"unsafe"
)

// Method is a weight quantization method (wush_method).
type Method int32

const (
	RTN  Method = C.WUSH_METHOD_RTN
	GPTQ Method = C.WUSH_METHOD_GPTQ
)

// Name is wush_method_name: "rtn" or "gptq" (the name a checkpoint records a layer's method
// under; "" for a value that is not a method). Safe from any goroutine.
func (m Method) Name() string { return goStringOrEmpty(C.wush_method_name(C.wush_method(m))) }

// String is Name, so that a Method prints as its name.
func (m Method) String() string { return m.Name() }

// MethodFromName is wush_method_from_name: parses a name as Name returns it, case-insensitive.
// Safe from any goroutine. An unknown name is an *Error with ErrInvalidArgument and the
// library's message.
func MethodFromName(name string) (Method, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var m C.wush_method
	err := call(func() C.wush_status { return C.wush_method_from_name(cs, &m) })
	return Method(m), err
}

// QWeight is a wush_qweight (read-only after creation; safe to share).
type QWeight struct{ p *C.wush_qweight }

// QWeightInfo is what wush_qweight_info reports.
type QWeightInfo struct {
	Format    Format
	Method    Method
	DOut, DIn int
}

func wrapQWeight(p *C.wush_qweight) *QWeight {
	q := &QWeight{p: p}
	runtime.SetFinalizer(q, (*QWeight).Close)
	return q
}

// Close releases the qweight.
func (q *QWeight) Close() {
	if q.p != nil {
		C.wush_qweight_destroy(q.p)
		q.p = nil
		runtime.SetFinalizer(q, nil)
	}
}

// NewQWeight is wush_qweight_create: weight is d_out x d_in float32, Float16 or BFloat16.
func NewQWeight[W Element](ctx *Context, t *Transform, format Format, method Method, weight []W, dOut int, opts *Options) (*QWeight, error) {
	p := ctx.ptr()
	if p == nil || t.p == nil {
		return nil, errClosed
	}
	if err := expectElems(len(weight), dOut, t.dIn, "weight"); err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(ctx)
	defer runtime.KeepAlive(t)
	defer runtime.KeepAlive(opts)
	var q *C.wush_qweight
	if err := call(func() C.wush_status {
		return C.wush_qweight_create(p, t.p, C.wush_format(format), C.wush_method(method), C.wush_dtype(DTypeOf[W]()), ptrOf(weight),
			C.size_t(dOut), C.size_t(t.dIn), optPtr(opts), &q)
	}); err != nil {
		return nil, err
	}
	return wrapQWeight(q), nil
}

// LayerQuantize is wush_layer_quantize: a layer's transform and quantized weights in one call
// (weight as NewQWeight).
func LayerQuantize[W Element](ctx *Context, cal *Calibrator, kind TransformKind, format Format, method Method, weight []W,
	dOut int, opts *Options) (*Transform, *QWeight, error) {
	p := ctx.ptr()
	if p == nil || cal.p == nil {
		return nil, nil, errClosed
	}
	if err := expectElems(len(weight), dOut, cal.dIn, "weight"); err != nil {
		return nil, nil, err
	}
	defer runtime.KeepAlive(ctx)
	defer runtime.KeepAlive(cal)
	defer runtime.KeepAlive(opts)
	var t *C.wush_transform
	var q *C.wush_qweight
	if err := call(func() C.wush_status {
		return C.wush_layer_quantize(p, cal.p, C.wush_transform_kind(kind), C.wush_format(format), C.wush_method(method),
			C.wush_dtype(DTypeOf[W]()), ptrOf(weight), C.size_t(dOut), C.size_t(cal.dIn), optPtr(opts), &t, &q)
	}); err != nil {
		return nil, nil, err
	}
	return wrapTransform(t), wrapQWeight(q), nil
}

// Info is wush_qweight_info.
func (q *QWeight) Info() (QWeightInfo, error) {
	if q.p == nil {
		return QWeightInfo{}, errClosed
	}
	defer runtime.KeepAlive(q)
	var f C.wush_format
	var m C.wush_method
	var o, i C.size_t
	if err := call(func() C.wush_status { return C.wush_qweight_info(q.p, &f, &m, &o, &i) }); err != nil {
		return QWeightInfo{}, err
	}
	dOut, err := goLen(uint64(o), "d_out")
	if err != nil {
		return QWeightInfo{}, err
	}
	dIn, err := goLen(uint64(i), "d_in")
	if err != nil {
		return QWeightInfo{}, err
	}
	return QWeightInfo{Format(f), Method(m), dOut, dIn}, nil
}

// Data is wush_qweight_data: copies of the packed codes and scales.
func (q *QWeight) Data() (codes, scales []byte, err error) {
	if q.p == nil {
		return nil, nil, errClosed
	}
	defer runtime.KeepAlive(q)
	var c, s unsafe.Pointer
	var cb, sb C.size_t
	if err := call(func() C.wush_status { return C.wush_qweight_data(q.p, &c, &cb, &s, &sb) }); err != nil {
		return nil, nil, err
	}
	if codes, err = goBytes(c, uint64(cb), "qweight codes"); err != nil {
		return nil, nil, err
	}
	if scales, err = goBytes(s, uint64(sb), "qweight scales"); err != nil {
		return nil, nil, err
	}
	return codes, scales, nil
}

// LayerLoss is wush_layer_loss (runtime false) or wush_layer_loss_runtime (true), on float32
// weight (d_out x d_in) and held-out tokens x. Host memory on every backend. ContextLayerLoss
// takes the other element types.
func (c *Context) LayerLoss(t *Transform, q *QWeight, weight, x []float32, runtimePath bool) (float64, error) {
	return ContextLayerLoss(c, t, q, weight, x, runtimePath)
}

// ContextLayerLoss is LayerLoss with weight and x each float32, Float16 or BFloat16.
func ContextLayerLoss[W Element, X Element](c *Context, t *Transform, q *QWeight, weight []W, x []X,
	runtimePath bool) (float64, error) {
	p := c.ptr()
	if p == nil || t.p == nil || q.p == nil {
		return 0, errClosed
	}
	info, err := q.Info()
	if err != nil {
		return 0, err
	}
	if err := expectElems(len(weight), info.DOut, info.DIn, "weight"); err != nil {
		return 0, err
	}
	n, err := rowsOf(len(x), info.DIn, "x")
	if err != nil {
		return 0, err
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(t)
	defer runtime.KeepAlive(q)
	var loss C.double
	err = call(func() C.wush_status {
		wd, xd := C.wush_dtype(DTypeOf[W]()), C.wush_dtype(DTypeOf[X]())
		if runtimePath {
			return C.wush_layer_loss_runtime(p, t.p, q.p, wd, ptrOf(weight), xd, ptrOf(x), C.size_t(n), &loss)
		}
		return C.wush_layer_loss(p, t.p, q.p, wd, ptrOf(weight), xd, ptrOf(x), C.size_t(n), &loss)
	})
	return float64(loss), err
}
