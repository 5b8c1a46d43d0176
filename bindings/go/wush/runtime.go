package wush

// Runtime (wush.h: "Runtime"): the CPU ISAs, fused transform + quantization, the W4A4 GEMM
// and the per-call linear forward.

// #include <wush/wush.h>
import "C"

import "runtime"

// CPUISA is a SIMD kernel set of the CPU runtime (wush_cpu_isa).
type CPUISA int32

const (
	ISAAuto       CPUISA = C.WUSH_CPU_ISA_AUTO
	ISAScalar     CPUISA = C.WUSH_CPU_ISA_SCALAR
	ISAAVX2       CPUISA = C.WUSH_CPU_ISA_AVX2
	ISAAVX512VNNI CPUISA = C.WUSH_CPU_ISA_AVX512_VNNI
)

// Name is wush_cpu_isa_name.
func (i CPUISA) Name() string { return goStringOrEmpty(C.wush_cpu_isa_name(C.wush_cpu_isa(i))) }

// Supported is wush_cpu_isa_supported.
func (i CPUISA) Supported() bool { return C.wush_cpu_isa_supported(C.wush_cpu_isa(i)) != 0 }

// QuantizeActivations is wush_quantize_activations (CPU contexts) of float32 activations;
// ContextQuantizeActivations takes the other element types.
func (c *Context) QuantizeActivations(t *Transform, format Format, x []float32, codes, scales []byte) error {
	return ContextQuantizeActivations(c, t, format, x, codes, scales)
}

// ContextQuantizeActivations is wush_quantize_activations (CPU contexts): x is float32, Float16
// or BFloat16.
func ContextQuantizeActivations[X Element](c *Context, t *Transform, format Format, x []X, codes, scales []byte) error {
	p, err := c.host("QuantizeActivations")
	if err != nil {
		return err
	}
	if t.p == nil {
		return errClosed
	}
	n, err := rowsOf(len(x), t.dIn, "x")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(t)
	return call(func() C.wush_status {
		return C.wush_quantize_activations(p, t.p, C.wush_format(format), C.wush_dtype(DTypeOf[X]()), ptrOf(x), C.size_t(n),
			C.size_t(t.dIn), ptrOf(codes), C.size_t(len(codes)), ptrOf(scales), C.size_t(len(scales)))
	})
}

// Gemm is wush_gemm: y (m x d_out, float32) from m packed activation rows (CPU contexts);
// ContextGemm writes BFloat16 too.
func (c *Context) Gemm(q *QWeight, aCodes, aScales []byte, m int, y []float32) error {
	return ContextGemm(c, q, aCodes, aScales, m, y)
}

// ContextGemm is wush_gemm (CPU contexts): y (m x d_out) in float32 or BFloat16.
func ContextGemm[Y OutputElement](c *Context, q *QWeight, aCodes, aScales []byte, m int, y []Y) error {
	p, err := c.host("Gemm")
	if err != nil {
		return err
	}
	if q.p == nil {
		return errClosed
	}
	if err := nonNegative("m", m); err != nil {
		return err
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(q)
	return call(func() C.wush_status {
		return C.wush_gemm(p, q.p, ptrOf(aCodes), C.size_t(len(aCodes)), ptrOf(aScales), C.size_t(len(aScales)),
			C.size_t(m), C.wush_dtype(DTypeOf[Y]()), ptrOf(y), C.size_t(len(y)))
	})
}

// LinearForward is wush_linear_forward with a workspace it allocates (CPU contexts), float32 in
// and out; ContextLinearForward takes and writes the other element types.
func (c *Context) LinearForward(t *Transform, q *QWeight, x []float32) ([]float32, error) {
	return ContextLinearForward[float32](c, t, q, x)
}

// ContextLinearForward is wush_linear_forward with a workspace it allocates (CPU contexts): x is
// float32, Float16 or BFloat16, the output float32 or BFloat16 (name it:
// ContextLinearForward[wush.BFloat16](ctx, t, q, x)).
func ContextLinearForward[Y OutputElement, X Element](c *Context, t *Transform, q *QWeight, x []X) ([]Y, error) {
	p, err := c.host("LinearForward")
	if err != nil {
		return nil, err
	}
	if t.p == nil || q.p == nil {
		return nil, errClosed
	}
	n, err := rowsOf(len(x), t.dIn, "x")
	if err != nil {
		return nil, err
	}
	info, err := q.Info()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(t)
	defer runtime.KeepAlive(q)
	var wsBytes C.size_t
	if err := call(func() C.wush_status {
		return C.wush_linear_forward_workspace_size(p, t.p, q.p, C.size_t(n), &wsBytes)
	}); err != nil {
		return nil, err
	}
	wb, err := goLen(uint64(wsBytes), "workspace bytes")
	if err != nil {
		return nil, err
	}
	ny, err := elemCount(n, info.DOut, "y")
	if err != nil {
		return nil, err
	}
	ws := make([]byte, wb)
	y := make([]Y, ny)
	err = call(func() C.wush_status {
		return C.wush_linear_forward(p, t.p, q.p, C.wush_dtype(DTypeOf[X]()), ptrOf(x), C.size_t(n),
			C.wush_dtype(DTypeOf[Y]()), ptrOf(y), C.size_t(len(y)), ptrOf(ws), C.size_t(len(ws)))
	})
	return y, err
}
