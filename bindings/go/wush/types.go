package wush

// Element types and block formats (wush.h: "Element types and block formats"): Format and
// DType, the 16-bit element types and the element slices the runtime reads.

// #include <stdlib.h>
// #include <wush/wush.h>
import "C"

import (
	"math"
	"unsafe"
)

// Format is a 4-bit block format (wush_format).
type Format int32

const (
	MXFP4    Format = C.WUSH_FORMAT_MXFP4
	NVFP4    Format = C.WUSH_FORMAT_NVFP4
	INT4     Format = C.WUSH_FORMAT_INT4
	MXFP4OCP Format = C.WUSH_FORMAT_MXFP4_OCP
)

// DType is an element type of dense tensors (wush_dtype).
type DType int32

const (
	F32  DType = C.WUSH_DTYPE_F32
	F16  DType = C.WUSH_DTYPE_F16
	BF16 DType = C.WUSH_DTYPE_BF16
)

// Name is wush_format_name: "mxfp4", "nvfp4", "int4", "mxfp4_ocp" ("" for an unknown value).
func (f Format) Name() string { return goStringOrEmpty(C.wush_format_name(C.wush_format(f))) }

// FormatFromName is wush_format_from_name (case-insensitive).
func FormatFromName(name string) (Format, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var f C.wush_format
	err := call(func() C.wush_status { return C.wush_format_from_name(cs, &f) })
	return Format(f), err
}

// GroupSize is wush_format_group_size.
func (f Format) GroupSize() (int, error) {
	var g C.size_t
	err := call(func() C.wush_status { return C.wush_format_group_size(C.wush_format(f), &g) })
	return lenAfter(uint64(g), err, "group size")
}

// TensorFactor is wush_format_tensor_factor.
func (f Format) TensorFactor() (float32, error) {
	var v C.float
	err := call(func() C.wush_status { return C.wush_format_tensor_factor(C.wush_format(f), &v) })
	return float32(v), err
}

// ScaleBytes is wush_format_scale_bytes.
func (f Format) ScaleBytes() (int, error) {
	var v C.size_t
	err := call(func() C.wush_status { return C.wush_format_scale_bytes(C.wush_format(f), &v) })
	return lenAfter(uint64(v), err, "scale bytes")
}

// BufferSizes is wush_format_buffer_sizes: code and scale bytes of an nRows x dIn matrix.
func (f Format) BufferSizes(nRows, dIn int) (codes, scales int, err error) {
	if err := nonNegative("nRows, dIn", nRows, dIn); err != nil {
		return 0, 0, err
	}
	var c, s C.size_t
	if err := call(func() C.wush_status {
		return C.wush_format_buffer_sizes(C.wush_format(f), C.size_t(nRows), C.size_t(dIn), &c, &s)
	}); err != nil {
		return 0, 0, err
	}
	if codes, err = goLen(uint64(c), "codes bytes"); err != nil {
		return 0, 0, err
	}
	if scales, err = goLen(uint64(s), "scales bytes"); err != nil {
		return 0, 0, err
	}
	return codes, scales, nil
}

// Size is wush_dtype_size.
func (d DType) Size() (int, error) {
	var v C.size_t
	err := call(func() C.wush_status { return C.wush_dtype_size(C.wush_dtype(d), &v) })
	return lenAfter(uint64(v), err, "element size")
}

// Half is a 16-bit float element (binary16 or bfloat16) as its bits; which one is said by the
// DType passed with the slice (QuantizeRows). Float16 and BFloat16 carry their DType in the type
// and are what the generic runtime functions take.
type Half uint16

// BF16FromFloat32 rounds to bfloat16, to nearest even.
func BF16FromFloat32(x float32) Half {
	b := math.Float32bits(x)
	if x != x {
		return Half((b >> 16) | 0x40)
	}
	return Half((b + 0x7fff + ((b >> 16) & 1)) >> 16)
}

// Float16 is an IEEE binary16 value, as its bits.
type Float16 uint16

// BFloat16 is a bfloat16 value (the upper 16 bits of a binary32), as its bits.
type BFloat16 uint16

// Element is an element type of the dense tensors the library reads (wush_dtype F32, F16,
// BF16): the type parameter of the generic runtime functions (LinearRun, ContextGemm, ...).
type Element interface{ float32 | Float16 | BFloat16 }

// OutputElement is an element type the runtime writes outputs in: float32 or BFloat16 (the
// header's y_dtype; BF16 is the float32 result rounded to nearest even).
type OutputElement interface{ float32 | BFloat16 }

// DTypeOf is the DType of an Element type: F32, F16 or BF16.
func DTypeOf[T Element]() DType {
	var z T
	switch any(z).(type) {
	case Float16:
		return F16
	case BFloat16:
		return BF16
	}
	return F32
}

// Float16FromFloat32 rounds to binary16, to nearest even (overflow gives +-Inf, NaN stays NaN).
func Float16FromFloat32(x float32) Float16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp, man := int(b>>23)&0xff, b&0x7fffff
	if exp == 0xff {
		if man != 0 {
			return Float16(sign | 0x7e00)
		}
		return Float16(sign | 0x7c00)
	}
	e := exp - 127 + 15 // binary16's biased exponent
	switch {
	case e >= 0x1f:
		return Float16(sign | 0x7c00)
	case e <= 0: // a binary16 subnormal (or zero): units of 2^-24
		if e < -10 {
			return Float16(sign)
		}
		m := man | 0x800000
		shift := uint(14 - e)
		h, rem, half := m>>shift, m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || (rem == half && h&1 == 1) {
			h++
		}
		return Float16(sign | uint16(h))
	}
	h := uint32(e)<<10 | man>>13
	if rem := man & 0x1fff; rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is right, up to +-Inf
	}
	return Float16(sign | uint16(h))
}

// Float32 is the value (exact).
func (h Float16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp, man := uint32(h>>10)&0x1f, uint32(h&0x3ff)
	switch exp {
	case 0:
		v := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			return -v
		}
		return v
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// BFloat16FromFloat32 rounds to bfloat16, to nearest even (NaN stays NaN).
func BFloat16FromFloat32(x float32) BFloat16 { return BFloat16(BF16FromFloat32(x)) }

// Float32 is the value (exact).
func (b BFloat16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

// Tensor data the runtime reads: []float32 (F32) or []Half with a DType (F16 or BF16).
type elements struct {
	ptr   unsafe.Pointer
	n     int
	dtype DType
}

func elemsOf(x interface{}, halfType DType) (elements, error) {
	switch v := x.(type) {
	case []float32:
		return elements{ptrOf(v), len(v), F32}, nil
	case []Float16:
		return elements{ptrOf(v), len(v), F16}, nil
	case []BFloat16:
		return elements{ptrOf(v), len(v), BF16}, nil
	case []Half:
		if halfType != F16 && halfType != BF16 {
			return elements{}, invalid("a []Half needs F16 or BF16")
		}
		return elements{ptrOf(v), len(v), halfType}, nil
	}
	return elements{}, invalid("unsupported element slice %T (use []float32, []Float16, []BFloat16 or []Half)", x)
}

func ptrOf[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func rowsOf(n, width int, what string) (int, error) {
	if width <= 0 || n%width != 0 {
		return 0, invalid("%s holds %d elements, not a multiple of its row width %d", what, n, width)
	}
	return n / width, nil
}
