package wush

// Quantizing and dequantizing rows, no transform (wush.h: "Quantizing and dequantizing rows").

// #include <wush/wush.h>
import "C"

import "runtime"

// QuantizeRows is wush_quantize_rows: the rows (width dIn) of x ([]float32, or []Half with
// halfType) into new code and scale buffers. Host memory on every backend.
func (c *Context) QuantizeRows(format Format, x interface{}, halfType DType, dIn int) (codes, scales []byte, err error) {
	e, err := elemsOf(x, halfType)
	if err != nil {
		return nil, nil, err
	}
	nRows, err := rowsOf(e.n, dIn, "x")
	if err != nil {
		return nil, nil, err
	}
	cb, sb, err := format.BufferSizes(nRows, dIn)
	if err != nil {
		return nil, nil, err
	}
	codes, scales = make([]byte, cb), make([]byte, sb)
	return codes, scales, c.QuantizeRowsInto(format, x, halfType, dIn, codes, scales)
}

// QuantizeRowsInto is wush_quantize_rows into caller buffers.
func (c *Context) QuantizeRowsInto(format Format, x interface{}, halfType DType, dIn int, codes, scales []byte) error {
	p := c.ptr()
	if p == nil {
		return errClosed
	}
	e, err := elemsOf(x, halfType)
	if err != nil {
		return err
	}
	nRows, err := rowsOf(e.n, dIn, "x")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(x)
	return call(func() C.wush_status {
		return C.wush_quantize_rows(p, C.wush_format(format), C.wush_dtype(e.dtype), e.ptr, C.size_t(nRows), C.size_t(dIn),
			ptrOf(codes), C.size_t(len(codes)), ptrOf(scales), C.size_t(len(scales)))
	})
}

// DequantizeRows is wush_dequantize_rows: nRows rows of width dIn.
func (c *Context) DequantizeRows(format Format, codes, scales []byte, nRows, dIn int) ([]float32, error) {
	p := c.ptr()
	if p == nil {
		return nil, errClosed
	}
	n, err := elemCount(nRows, dIn, "nRows x dIn")
	if err != nil {
		return nil, err
	}
	y := make([]float32, n)
	defer runtime.KeepAlive(c)
	err = call(func() C.wush_status {
		return C.wush_dequantize_rows(p, C.wush_format(format), ptrOf(codes), C.size_t(len(codes)), ptrOf(scales),
			C.size_t(len(scales)), C.size_t(nRows), C.size_t(dIn), (*C.float)(ptrOf(y)), C.size_t(len(y)))
	})
	return y, err
}
