package wush

// Prepared layers (wush.h: "Prepared layers"): a transform and a qweight bound to one context.

// #include <wush/wush.h>
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Linear is a wush_linear: a layer prepared once on a context. Safe for concurrent use (calls
// are serialized per context by the library; the layer is only read).
type Linear struct {
	p         *C.wush_linear
	ctx       *Context
	DOut, DIn int
	Format    Format
	closeOnce sync.Once
}

// NewLinear is wush_linear_create. The transform and qweight may be closed afterwards.
func NewLinear(ctx *Context, t *Transform, q *QWeight) (*Linear, error) {
	ctx.mu.Lock()
	defer ctx.mu.Unlock()
	if ctx.closing || ctx.p == nil || t.p == nil || q.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(t)
	defer runtime.KeepAlive(q)
	var l *C.wush_linear
	if err := call(func() C.wush_status { return C.wush_linear_create(ctx.p, t.p, q.p, &l) }); err != nil {
		return nil, err
	}
	var o, i C.size_t
	var f C.wush_format
	C.wush_linear_info(l, &o, &i, &f)
	ctx.users++
	lin := &Linear{p: l, ctx: ctx, DOut: int(o), DIn: int(i), Format: Format(f)}
	runtime.SetFinalizer(lin, (*Linear).Close)
	return lin, nil
}

// Close releases the layer (and its context, if that was closed and this was its last layer).
func (l *Linear) Close() {
	l.closeOnce.Do(func() {
		C.wush_linear_destroy(l.p)
		l.p = nil
		runtime.SetFinalizer(l, nil)
		l.ctx.mu.Lock()
		l.ctx.users--
		l.ctx.releaseLocked()
		l.ctx.mu.Unlock()
	})
}

func (l *Linear) live() (*C.wush_context, error) {
	if l.p == nil {
		return nil, errClosed
	}
	l.ctx.mu.Lock()
	defer l.ctx.mu.Unlock()
	return l.ctx.p, nil // a context with open layers is never destroyed
}

// requireHost refuses Go slices on a CUDA context (its context may be closing: the layer keeps
// it alive until the layer is closed).
func (l *Linear) requireHost(what string) error {
	if l.ctx.backend != CPU {
		return invalid("%s with Go slices needs a CPU context; use the *Device methods", what)
	}
	return nil
}

// WorkspaceSize is wush_linear_workspace_size for up to nTokens tokens.
func (l *Linear) WorkspaceSize(nTokens int) (int, error) {
	cp, err := l.live()
	if err != nil {
		return 0, err
	}
	if err := nonNegative("nTokens", nTokens); err != nil {
		return 0, err
	}
	defer runtime.KeepAlive(l)
	var b C.size_t
	if err := call(func() C.wush_status { return C.wush_linear_workspace_size(cp, l.p, C.size_t(nTokens), &b) }); err != nil {
		return 0, err
	}
	return goLen(uint64(b), "workspace bytes")
}

// Quantize is wush_linear_quantize: the activation side alone (CPU contexts), of float32
// activations; LinearQuantize takes the other element types.
func (l *Linear) Quantize(x []float32, codes, scales []byte) error {
	return LinearQuantize(l, x, codes, scales)
}

// LinearQuantize is wush_linear_quantize (CPU contexts): x is float32, Float16 or BFloat16.
func LinearQuantize[X Element](l *Linear, x []X, codes, scales []byte) error {
	if err := l.requireHost("Linear.Quantize"); err != nil {
		return err
	}
	n, err := rowsOf(len(x), l.DIn, "x")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(x)
	return l.QuantizeDevice(DTypeOf[X](), ptrOf(x), n, ptrOf(codes), len(codes), ptrOf(scales), len(scales))
}

// Run is wush_linear_run: y (n x d_out float32) for x (n x d_in float32) with a caller's
// workspace of WorkspaceSize bytes; allocates nothing (CPU contexts). LinearRun takes and writes
// the other element types.
func (l *Linear) Run(x, y []float32, workspace []byte) error { return LinearRun(l, x, y, workspace) }

// LinearRun is wush_linear_run (CPU contexts): x (n x d_in) float32, Float16 or BFloat16, y
// (n x d_out) float32 or BFloat16 (the float32 result rounded to nearest even).
func LinearRun[X Element, Y OutputElement](l *Linear, x []X, y []Y, workspace []byte) error {
	if err := l.requireHost("Linear.Run"); err != nil {
		return err
	}
	n, err := rowsOf(len(x), l.DIn, "x")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(x)
	defer runtime.KeepAlive(y)
	defer runtime.KeepAlive(workspace)
	return l.RunDevice(DTypeOf[X](), ptrOf(x), n, DTypeOf[Y](), ptrOf(y), len(y), ptrOf(workspace), len(workspace))
}

// RunBias is wush_linear_run_bias: Run with a bias of d_out values, added in float32 before y is
// written (a nil bias is Run). LinearRunBias takes the other element types.
func (l *Linear) RunBias(x, bias, y []float32, workspace []byte) error {
	return LinearRunBias(l, x, bias, y, workspace)
}

// LinearRunBias is wush_linear_run_bias (CPU contexts): LinearRun with a bias (float32, Float16
// or BFloat16; d_out values, else ErrInvalidArgument) added in float32 before the rounding to y's
// type. A nil bias is LinearRun, bit for bit.
func LinearRunBias[X Element, B Element, Y OutputElement](l *Linear, x []X, bias []B, y []Y, workspace []byte) error {
	if err := l.requireHost("Linear.RunBias"); err != nil {
		return err
	}
	if bias == nil {
		return LinearRun(l, x, y, workspace)
	}
	n, err := rowsOf(len(x), l.DIn, "x")
	if err != nil {
		return err
	}
	if len(bias) == 0 { // not nil but empty: a bias of the wrong length, not "no bias"
		return invalid("bias has 0 elements; the layer's d_out is %d", l.DOut)
	}
	defer runtime.KeepAlive(x)
	defer runtime.KeepAlive(bias)
	defer runtime.KeepAlive(y)
	defer runtime.KeepAlive(workspace)
	return l.RunBiasDevice(DTypeOf[X](), ptrOf(x), n, DTypeOf[B](), ptrOf(bias), len(bias), DTypeOf[Y](), ptrOf(y),
		len(y), ptrOf(workspace), len(workspace))
}

// Forward is Run with a new output and workspace.
func (l *Linear) Forward(x []float32) ([]float32, error) { return LinearForward[float32](l, x) }

// LinearForward is LinearRun with a new output and workspace; the output type is named
// (LinearForward[wush.BFloat16](l, x)), the input's inferred.
func LinearForward[Y OutputElement, X Element](l *Linear, x []X) ([]Y, error) {
	n, err := rowsOf(len(x), l.DIn, "x")
	if err != nil {
		return nil, err
	}
	wb, err := l.WorkspaceSize(n)
	if err != nil {
		return nil, err
	}
	ny, err := elemCount(n, l.DOut, "y")
	if err != nil {
		return nil, err
	}
	y := make([]Y, ny)
	return y, LinearRun(l, x, y, make([]byte, wb))
}

// RunQuantized is wush_linear_run_quantized (experimental; CPU contexts): the GEMM half of Run,
// y (nTokens x d_out float32 or BFloat16) from the codes and scales Quantize wrote.
func LinearRunQuantized[Y OutputElement](l *Linear, codes, scales []byte, nTokens int, y []Y, workspace []byte) error {
	if err := l.requireHost("Linear.RunQuantized"); err != nil {
		return err
	}
	defer runtime.KeepAlive(codes)
	defer runtime.KeepAlive(scales)
	defer runtime.KeepAlive(y)
	defer runtime.KeepAlive(workspace)
	return l.RunQuantizedDevice(ptrOf(codes), len(codes), ptrOf(scales), len(scales), nTokens, DTypeOf[Y](), ptrOf(y),
		len(y), ptrOf(workspace), len(workspace))
}

// RunQuantizedDevice is wush_linear_run_quantized (experimental) with raw pointers: device
// pointers on a CUDA context (stream-ordered, allocation-free, graph-capturable).
func (l *Linear) RunQuantizedDevice(codes unsafe.Pointer, codesBytes int, scales unsafe.Pointer, scalesBytes int,
	nTokens int, yDtype DType, y unsafe.Pointer, yCount int, workspace unsafe.Pointer, workspaceBytes int) error {
	cp, err := l.live()
	if err != nil {
		return err
	}
	if err := nonNegative("codesBytes, scalesBytes, nTokens, yCount, workspaceBytes", codesBytes, scalesBytes, nTokens,
		yCount, workspaceBytes); err != nil {
		return err
	}
	defer runtime.KeepAlive(l)
	return call(func() C.wush_status {
		return C.wush_linear_run_quantized(cp, l.p, codes, C.size_t(codesBytes), scales, C.size_t(scalesBytes),
			C.size_t(nTokens), C.wush_dtype(yDtype), y, C.size_t(yCount), workspace, C.size_t(workspaceBytes))
	})
}

// LastKernels is wush_linear_last_kernels (experimental): the kernels the layer's last call ran,
// e.g. "cpu.quantize.avx2 cpu.gemm.avx2" or "quantize.small_m gemm.decode"; "" before the first.
func (l *Linear) LastKernels() (string, error) {
	if _, err := l.live(); err != nil {
		return "", err
	}
	defer runtime.KeepAlive(l)
	var buf [64]C.char // the header: 64 bytes are always enough
	err := call(func() C.wush_status { return C.wush_linear_last_kernels(l.p, &buf[0], C.size_t(len(buf))) })
	if err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// QuantizeDevice is wush_linear_quantize with raw pointers: device pointers on a CUDA context
// (stream-ordered, allocation-free). The caller keeps the memory valid until the stream is done.
func (l *Linear) QuantizeDevice(dtype DType, x unsafe.Pointer, nTokens int, codes unsafe.Pointer, codesBytes int,
	scales unsafe.Pointer, scalesBytes int) error {
	cp, err := l.live()
	if err != nil {
		return err
	}
	if err := nonNegative("nTokens, codesBytes, scalesBytes", nTokens, codesBytes, scalesBytes); err != nil {
		return err
	}
	defer runtime.KeepAlive(l)
	return call(func() C.wush_status {
		return C.wush_linear_quantize(cp, l.p, C.wush_dtype(dtype), x, C.size_t(nTokens), codes, C.size_t(codesBytes),
			scales, C.size_t(scalesBytes))
	})
}

// RunBiasDevice is wush_linear_run_bias with raw pointers: device pointers on a CUDA context
// (stream-ordered, allocation-free, graph-capturable); a nil bias is RunDevice.
func (l *Linear) RunBiasDevice(xDtype DType, x unsafe.Pointer, nTokens int, biasDtype DType, bias unsafe.Pointer,
	biasCount int, yDtype DType, y unsafe.Pointer, yCount int, workspace unsafe.Pointer, workspaceBytes int) error {
	cp, err := l.live()
	if err != nil {
		return err
	}
	if err := nonNegative("nTokens, biasCount, yCount, workspaceBytes", nTokens, biasCount, yCount,
		workspaceBytes); err != nil {
		return err
	}
	defer runtime.KeepAlive(l)
	return call(func() C.wush_status {
		return C.wush_linear_run_bias(cp, l.p, C.wush_dtype(xDtype), x, C.size_t(nTokens), C.wush_dtype(biasDtype), bias,
			C.size_t(biasCount), C.wush_dtype(yDtype), y, C.size_t(yCount), workspace, C.size_t(workspaceBytes))
	})
}

// RunDevice is wush_linear_run with raw pointers: device pointers on a CUDA context
// (stream-ordered, allocation-free, graph-capturable).
func (l *Linear) RunDevice(xDtype DType, x unsafe.Pointer, nTokens int, yDtype DType, y unsafe.Pointer, yCount int,
	workspace unsafe.Pointer, workspaceBytes int) error {
	cp, err := l.live()
	if err != nil {
		return err
	}
	if err := nonNegative("nTokens, yCount, workspaceBytes", nTokens, yCount, workspaceBytes); err != nil {
		return err
	}
	defer runtime.KeepAlive(l)
	return call(func() C.wush_status {
		return C.wush_linear_run(cp, l.p, C.wush_dtype(xDtype), x, C.size_t(nTokens), C.wush_dtype(yDtype), y,
			C.size_t(yCount), workspace, C.size_t(workspaceBytes))
	})
}
