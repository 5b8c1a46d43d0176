// Package wush is the Go API of libwush (include/wush/wush.h): WUSH transforms and 4-bit
// (MXFP4/NVFP4/INT4) quantization, calibration, checkpoints and the W4A4 runtime.
//
// cgo reads the installed header itself (`#cgo pkg-config: wush`), so the declarations cannot
// drift from the library the package is built against. docs/BINDINGS.md says how the library is
// found and how versions work.
//
// Handles (Context, Calibrator, Options, Transform, QWeight, CheckpointWriter, Checkpoint,
// TensorFile, Linear) are released by Close, or by a finalizer when they become unreachable.
// Close may be called in any order: a Context closed while prepared layers (Linear) still use
// it is released when the last of them is closed. Methods of a closed handle return an error.
//
// Errors are *Error values carrying the status and wush_last_error()'s message. libwush keeps
// that message per OS thread, so every call locks its goroutine to its thread between the call
// and reading the message.
//
// Goroutines, as the header's thread rules allow: a Context may be used from several goroutines
// at once (the library serializes calls on one context); Transform, QWeight, Checkpoint,
// TensorFile and Linear are only read and may be shared freely; Calibrator and Options may be
// read concurrently but their modifying methods (Add*, Merge, Import, Set*) need the caller's
// exclusion. Close must not race with other calls on the same handle.
//
// CPU contexts take Go slices. CUDA contexts take device pointers, through the methods named
// *Device, which take unsafe.Pointer: the slice methods refuse a CUDA context.
//
// Element types: the methods take float32 slices; beside each one that reads or writes tensors
// is a generic function named after its receiver and method (Go methods take no type
// parameters) over Element (float32, Float16, BFloat16) and OutputElement (float32, BFloat16):
// LinearRun, LinearForward, LinearQuantize, ContextQuantizeActivations, ContextGemm,
// ContextLinearForward, ContextLayerLoss, CalibratorAdd, CalibratorAddValidation.
// BuildTransform, NewQWeight and LayerQuantize are generic over the weight's type themselves.
package wush

// #cgo pkg-config: wush
// #include <stdint.h>
// #include <stdlib.h>
// #include <wush/wush.h>
// extern int wushGoProgress(void*, double);
// static wush_status wush_go_set_progress(wush_options* o, uintptr_t h) {
//     return wush_options_set_progress(o, h ? wushGoProgress : NULL, (void*)h);
// }
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"runtime/cgo"
	"sync"
	"unsafe"
)

// ---- errors ------------------------------------------------------------------------------------

// Status is a wush_status value.
type Status int32

// The statuses of the header (values pinned by it).
const (
	OK                 Status = C.WUSH_OK
	ErrInvalidArgument Status = C.WUSH_ERR_INVALID_ARGUMENT
	ErrOutOfMemory     Status = C.WUSH_ERR_OUT_OF_MEMORY
	ErrUnsupported     Status = C.WUSH_ERR_UNSUPPORTED
	ErrNonFinite       Status = C.WUSH_ERR_NON_FINITE
	ErrBufferTooSmall  Status = C.WUSH_ERR_BUFFER_TOO_SMALL
	ErrNumerical       Status = C.WUSH_ERR_NUMERICAL
	ErrIO              Status = C.WUSH_ERR_IO
	ErrCorruptFile     Status = C.WUSH_ERR_CORRUPT_FILE
	ErrCUDA            Status = C.WUSH_ERR_CUDA
	ErrCancelled       Status = C.WUSH_ERR_CANCELLED
	ErrInternal        Status = C.WUSH_ERR_INTERNAL
	ErrNotFound        Status = C.WUSH_ERR_NOT_FOUND
)

// String is the library's name of the status, e.g. "WUSH_ERR_NON_FINITE".
func (s Status) String() string { return C.GoString(C.wush_status_string(C.wush_status(s))) }

// Error is a failed call: its status and message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Status.String() + ": " + e.Message }

func invalid(format string, a ...interface{}) error {
	return &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf(format, a...)}
}

// call runs f, a libwush call, and turns a failure into an *Error with the message of that
// call: the goroutine stays on its OS thread in between, because the message is per thread.
func call(f func() C.wush_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := f(); st != C.WUSH_OK {
		return &Error{Status: Status(st), Message: C.GoString(C.wush_last_error())}
	}
	return nil
}

var errClosed = &Error{Status: ErrInvalidArgument, Message: "the handle was closed"}

// ---- enums -------------------------------------------------------------------------------------

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

// Backend is where a context runs (wush_backend).
type Backend int32

const (
	CPU  Backend = C.WUSH_BACKEND_CPU
	CUDA Backend = C.WUSH_BACKEND_CUDA
)

// ContextParameter is a wush_context_parameter.
type ContextParameter int32

const (
	NumThreads    ContextParameter = C.WUSH_CONTEXT_NUM_THREADS
	CPUISASetting ContextParameter = C.WUSH_CONTEXT_CPU_ISA
)

// CPUISA is a SIMD kernel set of the CPU runtime (wush_cpu_isa).
type CPUISA int32

const (
	ISAAuto       CPUISA = C.WUSH_CPU_ISA_AUTO
	ISAScalar     CPUISA = C.WUSH_CPU_ISA_SCALAR
	ISAAVX2       CPUISA = C.WUSH_CPU_ISA_AVX2
	ISAAVX512VNNI CPUISA = C.WUSH_CPU_ISA_AVX512_VNNI
)

// Option is an option id of Options (wush_option).
type Option int32

const (
	OptionDamping        Option = C.WUSH_OPTION_DAMPING
	OptionSeed           Option = C.WUSH_OPTION_SEED
	OptionTransformDtype Option = C.WUSH_OPTION_TRANSFORM_DTYPE
	OptionSearch         Option = C.WUSH_OPTION_SEARCH
	OptionSearchTokens   Option = C.WUSH_OPTION_SEARCH_TOKENS
	OptionSearchGuard    Option = C.WUSH_OPTION_SEARCH_GUARD
)

// MomentMode is what a calibrator accumulates (wush_moment_mode).
type MomentMode int32

const (
	MomentsBlockDiagonal MomentMode = C.WUSH_MOMENTS_BLOCK_DIAGONAL
	MomentsFull          MomentMode = C.WUSH_MOMENTS_FULL
)

// TransformKind is a per-block transform kind (wush_transform_kind).
type TransformKind int32

const (
	Identity TransformKind = C.WUSH_TRANSFORM_IDENTITY
	Hadamard TransformKind = C.WUSH_TRANSFORM_HADAMARD
	Random   TransformKind = C.WUSH_TRANSFORM_RANDOM
	WUS      TransformKind = C.WUSH_TRANSFORM_WUS
	WUSH     TransformKind = C.WUSH_TRANSFORM_WUSH
)

// Method is a weight quantization method (wush_method).
type Method int32

const (
	RTN  Method = C.WUSH_METHOD_RTN
	GPTQ Method = C.WUSH_METHOD_GPTQ
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
	return int(g), err
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
	return int(v), err
}

// BufferSizes is wush_format_buffer_sizes: code and scale bytes of an nRows x dIn matrix.
func (f Format) BufferSizes(nRows, dIn int) (codes, scales int, err error) {
	var c, s C.size_t
	err = call(func() C.wush_status {
		return C.wush_format_buffer_sizes(C.wush_format(f), C.size_t(nRows), C.size_t(dIn), &c, &s)
	})
	return int(c), int(s), err
}

// Size is wush_dtype_size.
func (d DType) Size() (int, error) {
	var v C.size_t
	err := call(func() C.wush_status { return C.wush_dtype_size(C.wush_dtype(d), &v) })
	return int(v), err
}

// Name is wush_cpu_isa_name.
func (i CPUISA) Name() string { return goStringOrEmpty(C.wush_cpu_isa_name(C.wush_cpu_isa(i))) }

// Supported is wush_cpu_isa_supported.
func (i CPUISA) Supported() bool { return C.wush_cpu_isa_supported(C.wush_cpu_isa(i)) != 0 }

// Name is wush_transform_kind_name: "i", "h", "r", "wus" or "wush".
func (k TransformKind) Name() string {
	return goStringOrEmpty(C.wush_transform_kind_name(C.wush_transform_kind(k)))
}

// TransformKindFromName is wush_transform_kind_from_name.
func TransformKindFromName(name string) (TransformKind, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var k C.wush_transform_kind
	err := call(func() C.wush_status { return C.wush_transform_kind_from_name(cs, &k) })
	return TransformKind(k), err
}

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

// TransformSpec is a transform as the tools spell it ("wush", "wush+s", "h", ...): a kind, and
// whether the per-block search (OptionSearch) is asked for (the "+s" suffix).
type TransformSpec struct {
	Kind   TransformKind
	Search bool
}

// String is the tools' spelling: the kind's short name, then "+s" with the search.
func (s TransformSpec) String() string {
	if s.Search {
		return s.Kind.Name() + "+s"
	}
	return s.Kind.Name()
}

// TransformSpecFromName is wush_transform_spec_from_name: a name TransformKindFromName accepts
// (case-insensitive), optionally followed by "+s". Safe from any goroutine. Errors: an *Error
// with ErrInvalidArgument and the library's message for an unknown name, or for a search of a
// data-free kind ("i+s", "h+s", "r+s": only WUS and WUSH have free parameters to search).
func TransformSpecFromName(name string) (TransformSpec, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var k C.wush_transform_kind
	var s C.int
	if err := call(func() C.wush_status { return C.wush_transform_spec_from_name(cs, &k, &s) }); err != nil {
		return TransformSpec{}, err
	}
	return TransformSpec{Kind: TransformKind(k), Search: s != 0}, nil
}

func goStringOrEmpty(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// ---- elements and slices -----------------------------------------------------------------------

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

// ---- version -----------------------------------------------------------------------------------

// Version is wush_version: the loaded library's MAJOR*10000 + MINOR*100 + PATCH.
func Version() uint { return uint(C.wush_version()) }

// VersionString is wush_version_string.
func VersionString() string { return C.GoString(C.wush_version_string()) }

// HeaderVersion is the version of the wush.h this package was compiled against.
const HeaderVersion = uint(C.WUSH_VERSION_NUMBER)

// CheckVersion reports an error when the loaded library has another ABI major than the header
// the package was built with, or is older than it. NewContext calls it.
func CheckVersion() error {
	got := Version()
	if got/10000 != HeaderVersion/10000 || got < HeaderVersion {
		return &Error{Status: ErrUnsupported, Message: fmt.Sprintf(
			"libwush %s is loaded but the package was built against %d", VersionString(), HeaderVersion)}
	}
	return nil
}

// ---- context -----------------------------------------------------------------------------------

// Context is a wush_context: a backend and its settings. Safe for concurrent use.
type Context struct {
	mu      sync.Mutex
	p       *C.wush_context
	backend Backend
	users   int  // open Linears on this context
	closing bool // Close was called; destroyed when users reaches 0
}

// NewContext is wush_context_create (device must be 0 for CPU).
func NewContext(backend Backend, device int) (*Context, error) {
	if err := CheckVersion(); err != nil {
		return nil, err
	}
	var p *C.wush_context
	if err := call(func() C.wush_status { return C.wush_context_create(C.wush_backend(backend), C.int(device), &p) }); err != nil {
		return nil, err
	}
	// The backend as the library reports it (wush_context_backend), kept for Backend().
	var b C.wush_backend
	if err := call(func() C.wush_status { return C.wush_context_backend(p, &b) }); err != nil {
		C.wush_context_destroy(p)
		return nil, err
	}
	c := &Context{p: p, backend: Backend(b)}
	runtime.SetFinalizer(c, (*Context).Close)
	return c, nil
}

// NewCPUContext is NewContext(CPU, 0).
func NewCPUContext() (*Context, error) { return NewContext(CPU, 0) }

// Close releases the context (once its prepared layers are closed too).
func (c *Context) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closing = true
	c.releaseLocked()
}

func (c *Context) releaseLocked() {
	if c.closing && c.users == 0 && c.p != nil {
		C.wush_context_destroy(c.p)
		c.p = nil
		runtime.SetFinalizer(c, nil)
	}
}

// ptr returns the live handle, or nil once Close was called.
func (c *Context) ptr() *C.wush_context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil
	}
	return c.p
}

// Backend is the context's backend.
func (c *Context) Backend() Backend { return c.backend }

func (c *Context) host(what string) (*C.wush_context, error) {
	p := c.ptr()
	if p == nil {
		return nil, errClosed
	}
	if c.backend != CPU {
		return nil, invalid("%s with Go slices needs a CPU context; a CUDA context takes device pointers (the *Device methods)", what)
	}
	return p, nil
}

// SetParameter is wush_context_set_parameter.
func (c *Context) SetParameter(param ContextParameter, value int64) error {
	p := c.ptr()
	if p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status {
		return C.wush_context_set_parameter(p, C.wush_context_parameter(param), C.int64_t(value))
	})
}

// Parameter is wush_context_get_parameter.
func (c *Context) Parameter(param ContextParameter) (int64, error) {
	p := c.ptr()
	if p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(c)
	var v C.int64_t
	err := call(func() C.wush_status { return C.wush_context_get_parameter(p, C.wush_context_parameter(param), &v) })
	return int64(v), err
}

// CPUISA is wush_context_cpu_isa.
func (c *Context) CPUISA() (CPUISA, error) {
	p := c.ptr()
	if p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(c)
	var v C.wush_cpu_isa
	err := call(func() C.wush_status { return C.wush_context_cpu_isa(p, &v) })
	return CPUISA(v), err
}

// Describe is wush_context_describe, e.g. "cpu (avx2)".
func (c *Context) Describe() (string, error) {
	p := c.ptr()
	if p == nil {
		return "", errClosed
	}
	defer runtime.KeepAlive(c)
	var buf [256]C.char // the header: 256 bytes are always enough
	err := call(func() C.wush_status { return C.wush_context_describe(p, &buf[0], C.size_t(len(buf))) })
	if err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// Synchronize is wush_context_synchronize.
func (c *Context) Synchronize() error {
	p := c.ptr()
	if p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status { return C.wush_context_synchronize(p) })
}

// SetStreamDevice is wush_context_set_stream: stream is a cudaStream_t (nil: the default
// stream) that must outlive its use by the context.
func (c *Context) SetStreamDevice(stream unsafe.Pointer) error {
	p := c.ptr()
	if p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status { return C.wush_context_set_stream(p, stream) })
}

// StreamDevice is wush_context_get_stream.
func (c *Context) StreamDevice() (unsafe.Pointer, error) {
	p := c.ptr()
	if p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(c)
	var s unsafe.Pointer
	err := call(func() C.wush_status { return C.wush_context_get_stream(p, &s) })
	return s, err
}

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
	y := make([]float32, nRows*dIn)
	defer runtime.KeepAlive(c)
	err := call(func() C.wush_status {
		return C.wush_dequantize_rows(p, C.wush_format(format), ptrOf(codes), C.size_t(len(codes)), ptrOf(scales),
			C.size_t(len(scales)), C.size_t(nRows), C.size_t(dIn), (*C.float)(ptrOf(y)), C.size_t(len(y)))
	})
	return y, err
}

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
	ws := make([]byte, wsBytes)
	y := make([]Y, n*info.DOut)
	err = call(func() C.wush_status {
		return C.wush_linear_forward(p, t.p, q.p, C.wush_dtype(DTypeOf[X]()), ptrOf(x), C.size_t(n),
			C.wush_dtype(DTypeOf[Y]()), ptrOf(y), C.size_t(len(y)), ptrOf(ws), C.size_t(len(ws)))
	})
	return y, err
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
	if len(weight) != info.DOut*info.DIn {
		return 0, invalid("weight holds %d elements, expected %d", len(weight), info.DOut*info.DIn)
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

// ---- options -----------------------------------------------------------------------------------

// Options is a wush_options: builder settings. Concurrent reads are safe; Set* need exclusion.
type Options struct {
	p        *C.wush_options
	progress cgo.Handle
}

// NewOptions is wush_options_create.
func NewOptions() (*Options, error) {
	var p *C.wush_options
	if err := call(func() C.wush_status { return C.wush_options_create(&p) }); err != nil {
		return nil, err
	}
	o := &Options{p: p}
	runtime.SetFinalizer(o, (*Options).Close)
	return o, nil
}

// Close releases the options.
func (o *Options) Close() {
	if o.p != nil {
		C.wush_options_destroy(o.p)
		o.p = nil
		runtime.SetFinalizer(o, nil)
	}
	if o.progress != 0 {
		o.progress.Delete()
		o.progress = 0
	}
}

func optPtr(o *Options) *C.wush_options {
	if o == nil {
		return nil
	}
	return o.p
}

// SetDouble is wush_options_set_double.
func (o *Options) SetDouble(id Option, v float64) error {
	if o.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(o)
	return call(func() C.wush_status { return C.wush_options_set_double(o.p, C.wush_option(id), C.double(v)) })
}

// SetInt is wush_options_set_int.
func (o *Options) SetInt(id Option, v int64) error {
	if o.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(o)
	return call(func() C.wush_status { return C.wush_options_set_int(o.p, C.wush_option(id), C.int64_t(v)) })
}

// Double is wush_options_get_double.
func (o *Options) Double(id Option) (float64, error) {
	if o.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(o)
	var v C.double
	err := call(func() C.wush_status { return C.wush_options_get_double(o.p, C.wush_option(id), &v) })
	return float64(v), err
}

// Int is wush_options_get_int.
func (o *Options) Int(id Option) (int64, error) {
	if o.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(o)
	var v C.int64_t
	err := call(func() C.wush_status { return C.wush_options_get_int(o.p, C.wush_option(id), &v) })
	return int64(v), err
}

// SampleSize is wush_options_sample_size: the token sample a calibrator needs for these options
// (Calibrator sample size), 0 without the search.
func (o *Options) SampleSize() (int, error) {
	if o.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(o)
	var n C.size_t
	err := call(func() C.wush_status { return C.wush_options_sample_size(o.p, &n) })
	return int(n), err
}

// SetProgress is wush_options_set_progress: f(fraction) returns false to cancel (the operation
// then fails with ErrCancelled; a panic in f cancels too). nil removes the callback. f may be
// called from several goroutines at once when the options serve several builders.
func (o *Options) SetProgress(f func(float64) bool) error {
	if o.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(o)
	var h cgo.Handle
	if f != nil {
		h = cgo.NewHandle(f)
	}
	if err := call(func() C.wush_status { return C.wush_go_set_progress(o.p, C.uintptr_t(h)) }); err != nil {
		if h != 0 {
			h.Delete()
		}
		return err
	}
	if o.progress != 0 {
		o.progress.Delete()
	}
	o.progress = h
	return nil
}

// ---- calibrator --------------------------------------------------------------------------------

// Calibrator is a wush_calibrator. Reads (counts, moments, export) are safe concurrently;
// Add, AddValidation, Merge, ImportState and Set* need the caller's exclusion.
type Calibrator struct {
	p      *C.wush_calibrator
	dIn, g int
}

// NewCalibrator is wush_calibrator_create.
func NewCalibrator(dIn, groupSize int, mode MomentMode) (*Calibrator, error) {
	var p *C.wush_calibrator
	if err := call(func() C.wush_status {
		return C.wush_calibrator_create(C.size_t(dIn), C.size_t(groupSize), C.wush_moment_mode(mode), &p)
	}); err != nil {
		return nil, err
	}
	c := &Calibrator{p: p, dIn: dIn, g: groupSize}
	runtime.SetFinalizer(c, (*Calibrator).Close)
	return c, nil
}

// Close releases the calibrator.
func (c *Calibrator) Close() {
	if c.p != nil {
		C.wush_calibrator_destroy(c.p)
		c.p = nil
		runtime.SetFinalizer(c, nil)
	}
}

// Add is wush_calibrator_add on a CPU context (rows of d_in float32 tokens).
// CalibratorAdd takes the other element types.
func (c *Calibrator) Add(ctx *Context, x []float32) error { return offer(c, ctx, x, false) }

// AddValidation is wush_calibrator_add_validation on a CPU context.
func (c *Calibrator) AddValidation(ctx *Context, x []float32) error { return offer(c, ctx, x, true) }

// CalibratorAdd is wush_calibrator_add on a CPU context: x is float32, Float16 or BFloat16.
func CalibratorAdd[X Element](c *Calibrator, ctx *Context, x []X) error {
	return offer(c, ctx, x, false)
}

// CalibratorAddValidation is wush_calibrator_add_validation on a CPU context (x as CalibratorAdd).
func CalibratorAddValidation[X Element](c *Calibrator, ctx *Context, x []X) error {
	return offer(c, ctx, x, true)
}

func offer[X Element](c *Calibrator, ctx *Context, x []X, validation bool) error {
	p, err := ctx.host("Calibrator.Add")
	if err != nil {
		return err
	}
	if c.p == nil {
		return errClosed
	}
	n, err := rowsOf(len(x), c.dIn, "x")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(ctx)
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status {
		if validation {
			return C.wush_calibrator_add_validation(p, c.p, C.wush_dtype(DTypeOf[X]()), ptrOf(x), C.size_t(n))
		}
		return C.wush_calibrator_add(p, c.p, C.wush_dtype(DTypeOf[X]()), ptrOf(x), C.size_t(n))
	})
}

// AddDevice is wush_calibrator_add on a CUDA context: x is a device pointer to nTokens x d_in
// elements of dtype on the context's device.
func (c *Calibrator) AddDevice(ctx *Context, dtype DType, x unsafe.Pointer, nTokens int) error {
	p := ctx.ptr()
	if p == nil || c.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(ctx)
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status { return C.wush_calibrator_add(p, c.p, C.wush_dtype(dtype), x, C.size_t(nTokens)) })
}

// Merge is wush_calibrator_merge.
func (c *Calibrator) Merge(from *Calibrator) error {
	if c.p == nil || from.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(from)
	return call(func() C.wush_status { return C.wush_calibrator_merge(c.p, from.p) })
}

// TokenCount is wush_calibrator_token_count.
func (c *Calibrator) TokenCount() (uint64, error) {
	if c.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(c)
	var n C.uint64_t
	err := call(func() C.wush_status { return C.wush_calibrator_token_count(c.p, &n) })
	return uint64(n), err
}

// SecondMoment is wush_calibrator_second_moment: block's G x G moment, row-major.
func (c *Calibrator) SecondMoment(block int) ([]float64, error) {
	if c.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(c)
	m := make([]float64, c.g*c.g)
	err := call(func() C.wush_status {
		return C.wush_calibrator_second_moment(c.p, C.size_t(block), (*C.double)(ptrOf(m)), C.size_t(len(m)))
	})
	return m, err
}

// ExportState is wush_calibrator_state_size + wush_calibrator_export_state.
func (c *Calibrator) ExportState() ([]float64, error) {
	if c.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(c)
	var n C.size_t
	if err := call(func() C.wush_status { return C.wush_calibrator_state_size(c.p, &n) }); err != nil {
		return nil, err
	}
	s := make([]float64, n)
	err := call(func() C.wush_status { return C.wush_calibrator_export_state(c.p, (*C.double)(ptrOf(s)), n) })
	return s, err
}

// ImportState is wush_calibrator_import_state.
func (c *Calibrator) ImportState(state []float64) error {
	if c.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status {
		return C.wush_calibrator_import_state(c.p, (*C.double)(ptrOf(state)), C.size_t(len(state)))
	})
}

// SetSampleSize is wush_calibrator_set_sample_size.
func (c *Calibrator) SetSampleSize(n int) error {
	if c.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status { return C.wush_calibrator_set_sample_size(c.p, C.size_t(n)) })
}

// SampleCount is wush_calibrator_sample_count.
func (c *Calibrator) SampleCount() (int, error) {
	if c.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(c)
	var n C.size_t
	err := call(func() C.wush_status { return C.wush_calibrator_sample_count(c.p, &n) })
	return int(n), err
}

// SetValidationSize is wush_calibrator_set_validation_size.
func (c *Calibrator) SetValidationSize(n int) error {
	if c.p == nil {
		return errClosed
	}
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status { return C.wush_calibrator_set_validation_size(c.p, C.size_t(n)) })
}

// ValidationCount is wush_calibrator_validation_count.
func (c *Calibrator) ValidationCount() (int, error) {
	if c.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(c)
	var n C.size_t
	err := call(func() C.wush_status { return C.wush_calibrator_validation_count(c.p, &n) })
	return int(n), err
}

// ---- transforms and qweights -------------------------------------------------------------------

// Transform is a wush_transform (read-only after creation; safe to share).
type Transform struct {
	p   *C.wush_transform
	dIn int
}

func wrapTransform(p *C.wush_transform) *Transform {
	var d C.size_t
	C.wush_transform_info(p, nil, &d, nil)
	t := &Transform{p: p, dIn: int(d)}
	runtime.SetFinalizer(t, (*Transform).Close)
	return t
}

// Close releases the transform.
func (t *Transform) Close() {
	if t.p != nil {
		C.wush_transform_destroy(t.p)
		t.p = nil
		runtime.SetFinalizer(t, nil)
	}
}

// BuildTransform is wush_transform_build: weight is d_out x d_in (d_in the calibrator's) float32,
// Float16 or BFloat16.
func BuildTransform[W Element](ctx *Context, cal *Calibrator, weight []W, dOut int, kind TransformKind, opts *Options) (*Transform, error) {
	p := ctx.ptr()
	if p == nil || cal.p == nil {
		return nil, errClosed
	}
	if len(weight) != dOut*cal.dIn {
		return nil, invalid("weight holds %d elements, expected %d", len(weight), dOut*cal.dIn)
	}
	defer runtime.KeepAlive(ctx)
	defer runtime.KeepAlive(cal)
	defer runtime.KeepAlive(opts)
	var t *C.wush_transform
	if err := call(func() C.wush_status {
		return C.wush_transform_build(p, cal.p, C.wush_dtype(DTypeOf[W]()), ptrOf(weight), C.size_t(dOut), C.size_t(cal.dIn),
			C.wush_transform_kind(kind), optPtr(opts), &t)
	}); err != nil {
		return nil, err
	}
	return wrapTransform(t), nil
}

// FixedTransform is wush_transform_create_fixed (identity, Hadamard, random).
func FixedTransform(kind TransformKind, dIn, groupSize int, opts *Options) (*Transform, error) {
	defer runtime.KeepAlive(opts)
	var t *C.wush_transform
	if err := call(func() C.wush_status {
		return C.wush_transform_create_fixed(C.wush_transform_kind(kind), C.size_t(dIn), C.size_t(groupSize), optPtr(opts), &t)
	}); err != nil {
		return nil, err
	}
	return wrapTransform(t), nil
}

// Info is wush_transform_info.
func (t *Transform) Info() (kind TransformKind, dIn, groupSize int, err error) {
	if t.p == nil {
		return 0, 0, 0, errClosed
	}
	defer runtime.KeepAlive(t)
	var k C.wush_transform_kind
	var d, g C.size_t
	err = call(func() C.wush_status { return C.wush_transform_info(t.p, &k, &d, &g) })
	return TransformKind(k), int(d), int(g), err
}

// Matrices is wush_transform_matrices: (C, G, G) float32.
func (t *Transform) Matrices() ([]float32, error) {
	_, d, g, err := t.Info()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(t)
	m := make([]float32, d*g)
	err = call(func() C.wush_status { return C.wush_transform_matrices(t.p, (*C.float)(ptrOf(m)), C.size_t(len(m))) })
	return m, err
}

// FallbackBlocks is wush_transform_fallback_blocks.
func (t *Transform) FallbackBlocks() ([]int, error) {
	if t.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(t)
	var n C.size_t
	if err := call(func() C.wush_status { return C.wush_transform_fallback_blocks(t.p, &n, nil, 0) }); err != nil {
		return nil, err
	}
	b := make([]C.size_t, n)
	if err := call(func() C.wush_status {
		return C.wush_transform_fallback_blocks(t.p, &n, (*C.size_t)(ptrOf(b)), C.size_t(len(b)))
	}); err != nil {
		return nil, err
	}
	out := make([]int, 0, len(b))
	for _, v := range b[:n] {
		out = append(out, int(v))
	}
	return out, nil
}

// SingularValues is wush_transform_singular_values: C x G doubles.
func (t *Transform) SingularValues() ([]float64, error) {
	if t.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(t)
	s := make([]float64, t.dIn)
	err := call(func() C.wush_status {
		return C.wush_transform_singular_values(t.p, (*C.double)(ptrOf(s)), C.size_t(len(s)))
	})
	return s, err
}

// GuardSource is where the search's per-layer guard took its held-out tokens
// (wush_guard_source).
type GuardSource int32

const (
	// GuardNone: no guard ran (no search, a data-free kind, the default hold-out off or too
	// small a token sample, or a transform not made by LayerQuantize).
	GuardNone GuardSource = C.WUSH_GUARD_NONE
	// GuardValidation: the calibrator's validation tokens.
	GuardValidation GuardSource = C.WUSH_GUARD_VALIDATION
	// GuardHoldOut: every second token of the calibrator's token sample.
	GuardHoldOut GuardSource = C.WUSH_GUARD_HOLD_OUT
)

// GuardCandidate is one of the guard's candidate layers (wush_guard_candidate), all built by
// the same method and seed.
type GuardCandidate int32

const (
	// GuardSearched: the searched WUS/WUSH layer (the kind asked for, with the search).
	GuardSearched GuardCandidate = C.WUSH_GUARD_SEARCHED
	// GuardPlain: the kind asked for without the search (Algorithm 1).
	GuardPlain    GuardCandidate = C.WUSH_GUARD_PLAIN
	GuardIdentity GuardCandidate = C.WUSH_GUARD_IDENTITY
	GuardHadamard GuardCandidate = C.WUSH_GUARD_HADAMARD
	GuardRandom   GuardCandidate = C.WUSH_GUARD_RANDOM
)

// GuardCandidates lists every candidate in the header's order (C values 0..4).
var GuardCandidates = [...]GuardCandidate{GuardSearched, GuardPlain, GuardIdentity, GuardHadamard, GuardRandom}

// GuardScore is one candidate's score in the guard's decision (wush_transform_guard_candidate).
type GuardScore struct {
	Candidate GuardCandidate
	// Loss is the candidate's layer loss on the held-out tokens (as LayerLoss computes it for
	// that candidate's layer on those tokens).
	Loss float64
	// Difference is the mean over tokens of the paired per-token loss differences, searched -
	// candidate (positive where the candidate is better); 0 for GuardSearched.
	Difference float64
	// StdError is the standard error of that mean (sample standard deviation / sqrt(n)); 0 for
	// GuardSearched.
	StdError float64
	// Replaces: the candidate met the rule (loss below 0.99 x the searched loss and Difference >
	// 2 StdError); never for GuardSearched.
	Replaces bool
}

// GuardReport is what the search's per-layer guard decided for a layer (wush_transform_guard
// and wush_transform_guard_candidate of every candidate).
type GuardReport struct {
	Source  GuardSource
	NTokens int            // held-out tokens scored
	Kept    GuardCandidate // the lowest loss among those that replace, else GuardSearched
	// Candidates holds every candidate's score, in GuardCandidates' order.
	Candidates []GuardScore
}

// Guard is wush_transform_guard plus wush_transform_guard_candidate of every candidate: what the
// search's per-layer guard (OptionSearch, OptionSearchGuard) compared and kept when LayerQuantize
// made this transform, or nil (and no error) when no guard ran: no search, a data-free kind, the
// default hold-out off or too small a token sample, or a transform LayerQuantize did not make
// (built, fixed or loaded from a checkpoint). Only reads the transform: safe from several
// goroutines at once. Errors: a closed transform; otherwise the library's *Error.
func (t *Transform) Guard() (*GuardReport, error) {
	if t.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(t)
	var source C.wush_guard_source
	var n C.size_t
	var kept C.wush_guard_candidate
	if err := call(func() C.wush_status { return C.wush_transform_guard(t.p, &source, &n, &kept) }); err != nil {
		return nil, err
	}
	if GuardSource(source) == GuardNone {
		return nil, nil
	}
	r := &GuardReport{Source: GuardSource(source), NTokens: int(n), Kept: GuardCandidate(kept)}
	for _, c := range GuardCandidates {
		s, err := t.GuardCandidate(c)
		if err != nil {
			return nil, err
		}
		r.Candidates = append(r.Candidates, s)
	}
	return r, nil
}

// GuardCandidate is wush_transform_guard_candidate for one candidate, as the library answers it:
// an *Error with ErrInvalidArgument and the library's message when no guard ran for this
// transform or the candidate is unknown. Safe from several goroutines at once.
func (t *Transform) GuardCandidate(c GuardCandidate) (GuardScore, error) {
	if t.p == nil {
		return GuardScore{}, errClosed
	}
	defer runtime.KeepAlive(t)
	var loss, diff, se C.double
	var replaces C.int
	if err := call(func() C.wush_status {
		return C.wush_transform_guard_candidate(t.p, C.wush_guard_candidate(c), &loss, &diff, &se, &replaces)
	}); err != nil {
		return GuardScore{}, err
	}
	return GuardScore{Candidate: c, Loss: float64(loss), Difference: float64(diff), StdError: float64(se),
		Replaces: replaces != 0}, nil
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
	if len(weight) != dOut*t.dIn {
		return nil, invalid("weight holds %d elements, expected %d", len(weight), dOut*t.dIn)
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
	if len(weight) != dOut*cal.dIn {
		return nil, nil, invalid("weight holds %d elements, expected %d", len(weight), dOut*cal.dIn)
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
	err := call(func() C.wush_status { return C.wush_qweight_info(q.p, &f, &m, &o, &i) })
	return QWeightInfo{Format(f), Method(m), int(o), int(i)}, err
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
	return C.GoBytes(c, C.int(cb)), C.GoBytes(s, C.int(sb)), nil
}

// ---- prepared layers ---------------------------------------------------------------------------

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
	defer runtime.KeepAlive(l)
	var b C.size_t
	err = call(func() C.wush_status { return C.wush_linear_workspace_size(cp, l.p, C.size_t(nTokens), &b) })
	return int(b), err
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
	y := make([]Y, n*l.DOut)
	return y, LinearRun(l, x, y, make([]byte, wb))
}

// QuantizeDevice is wush_linear_quantize with raw pointers: device pointers on a CUDA context
// (stream-ordered, allocation-free). The caller keeps the memory valid until the stream is done.
func (l *Linear) QuantizeDevice(dtype DType, x unsafe.Pointer, nTokens int, codes unsafe.Pointer, codesBytes int,
	scales unsafe.Pointer, scalesBytes int) error {
	cp, err := l.live()
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(l)
	return call(func() C.wush_status {
		return C.wush_linear_quantize(cp, l.p, C.wush_dtype(dtype), x, C.size_t(nTokens), codes, C.size_t(codesBytes),
			scales, C.size_t(scalesBytes))
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
	defer runtime.KeepAlive(l)
	return call(func() C.wush_status {
		return C.wush_linear_run(cp, l.p, C.wush_dtype(xDtype), x, C.size_t(nTokens), C.wush_dtype(yDtype), y,
			C.size_t(yCount), workspace, C.size_t(workspaceBytes))
	})
}

// ---- checkpoints -------------------------------------------------------------------------------

// CheckpointWriter is a checkpoint being written. It keeps the added transforms and qweights
// reachable until Write (the C checkpoint references them); closing one of them explicitly
// before Write makes Write fail with ErrInvalidArgument.
type CheckpointWriter struct {
	p    *C.wush_checkpoint
	refs []interface{}
}

// NewCheckpointWriter is wush_checkpoint_create.
func NewCheckpointWriter() (*CheckpointWriter, error) {
	var p *C.wush_checkpoint
	if err := call(func() C.wush_status { return C.wush_checkpoint_create(&p) }); err != nil {
		return nil, err
	}
	w := &CheckpointWriter{p: p}
	runtime.SetFinalizer(w, (*CheckpointWriter).Close)
	return w, nil
}

// Close releases the writer.
func (w *CheckpointWriter) Close() {
	if w.p != nil {
		C.wush_checkpoint_destroy(w.p)
		w.p = nil
		w.refs = nil
		runtime.SetFinalizer(w, nil)
	}
}

// AddLayer is wush_checkpoint_add_layer.
func (w *CheckpointWriter) AddLayer(name string, t *Transform, q *QWeight) error {
	if w.p == nil || t.p == nil || q.p == nil {
		return errClosed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	if err := call(func() C.wush_status { return C.wush_checkpoint_add_layer(w.p, cs, t.p, q.p) }); err != nil {
		return err
	}
	w.refs = append(w.refs, t, q)
	return nil
}

// Write is wush_checkpoint_write (atomic). opts may be nil.
func (w *CheckpointWriter) Write(path string, opts *Options) error {
	if w.p == nil {
		return errClosed
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(w)
	defer runtime.KeepAlive(opts)
	return call(func() C.wush_status { return C.wush_checkpoint_write(w.p, cs, optPtr(opts)) })
}

// Checkpoint is an opened, validated, memory-mapped checkpoint (safe to share). Loaded
// qweights keep the file mapped after Close.
type Checkpoint struct{ p *C.wush_checkpoint }

// CheckpointMode is how OpenCheckpointMode holds a checkpoint's bytes (wush_checkpoint_mode).
type CheckpointMode int32

const (
	// CheckpointMap: memory-mapped, read on demand (OpenCheckpoint).
	CheckpointMap CheckpointMode = C.WUSH_CHECKPOINT_MAP
	// CheckpointCopy: read whole into memory at the open; the file is not used again.
	CheckpointCopy CheckpointMode = C.WUSH_CHECKPOINT_COPY
)

// OpenCheckpointMode is wush_checkpoint_open_mode: OpenCheckpoint with a choice of how the
// file's bytes are held. CheckpointCopy reads the whole file into memory owned by the library and
// validates that copy: truncating, rewriting or deleting the file afterwards changes nothing that
// was opened (and cannot raise SIGBUS). CheckpointMap is OpenCheckpoint. Safe to call from
// several goroutines. Errors (*Error, the library's message): ErrInvalidArgument (an unknown
// mode), ErrIO (including a file that shrinks while it is read), ErrOutOfMemory, ErrCorruptFile
// naming the first violation.
func OpenCheckpointMode(path string, mode CheckpointMode) (*Checkpoint, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.wush_checkpoint
	if err := call(func() C.wush_status {
		return C.wush_checkpoint_open_mode(cs, C.wush_checkpoint_mode(mode), &p)
	}); err != nil {
		return nil, err
	}
	c := &Checkpoint{p: p}
	runtime.SetFinalizer(c, (*Checkpoint).Close)
	return c, nil
}

// OpenCheckpoint is wush_checkpoint_open.
func OpenCheckpoint(path string) (*Checkpoint, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.wush_checkpoint
	if err := call(func() C.wush_status { return C.wush_checkpoint_open(cs, &p) }); err != nil {
		return nil, err
	}
	c := &Checkpoint{p: p}
	runtime.SetFinalizer(c, (*Checkpoint).Close)
	return c, nil
}

// Close releases the checkpoint.
func (c *Checkpoint) Close() {
	if c.p != nil {
		C.wush_checkpoint_destroy(c.p)
		c.p = nil
		runtime.SetFinalizer(c, nil)
	}
}

// LayerNames is wush_checkpoint_layer_count + wush_checkpoint_layer_name, in file order.
func (c *Checkpoint) LayerNames() ([]string, error) {
	if c.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(c)
	var n C.size_t
	if err := call(func() C.wush_status { return C.wush_checkpoint_layer_count(c.p, &n) }); err != nil {
		return nil, err
	}
	names := make([]string, 0, n)
	for i := C.size_t(0); i < n; i++ {
		var s *C.char
		if err := call(func() C.wush_status { return C.wush_checkpoint_layer_name(c.p, i, &s) }); err != nil {
			return nil, err
		}
		names = append(names, C.GoString(s))
	}
	return names, nil
}

// LoadLayer is wush_checkpoint_load_layer.
func (c *Checkpoint) LoadLayer(name string) (*Transform, *QWeight, error) {
	if c.p == nil {
		return nil, nil, errClosed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(c)
	var t *C.wush_transform
	var q *C.wush_qweight
	if err := call(func() C.wush_status { return C.wush_checkpoint_load_layer(c.p, cs, &t, &q) }); err != nil {
		return nil, nil, err
	}
	return wrapTransform(t), wrapQWeight(q), nil
}

// ExportFPQuant is wush_checkpoint_export_fp_quant; configPath "" writes no config file.
func (c *Checkpoint) ExportFPQuant(path, configPath string, opts *Options) error {
	if c.p == nil {
		return errClosed
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var cfg *C.char
	if configPath != "" {
		cfg = C.CString(configPath)
		defer C.free(unsafe.Pointer(cfg))
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(opts)
	return call(func() C.wush_status { return C.wush_checkpoint_export_fp_quant(c.p, cs, cfg, optPtr(opts)) })
}

// ---- tensor files ------------------------------------------------------------------------------

// Tensor is one tensor of a TensorFile; Data is a copy of its bytes.
type Tensor struct {
	Name, DType string
	Shape       []uint64
	Data        []byte
}

// TensorFile is a validated, memory-mapped safetensors file (safe to share).
type TensorFile struct{ p *C.wush_tensor_file }

// OpenTensorFile is wush_tensor_file_open.
func OpenTensorFile(path string) (*TensorFile, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.wush_tensor_file
	if err := call(func() C.wush_status { return C.wush_tensor_file_open(cs, &p) }); err != nil {
		return nil, err
	}
	f := &TensorFile{p: p}
	runtime.SetFinalizer(f, (*TensorFile).Close)
	return f, nil
}

// Close unmaps the file.
func (f *TensorFile) Close() {
	if f.p != nil {
		C.wush_tensor_file_destroy(f.p)
		f.p = nil
		runtime.SetFinalizer(f, nil)
	}
}

// Count is wush_tensor_file_count.
func (f *TensorFile) Count() (int, error) {
	if f.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(f)
	var n C.size_t
	err := call(func() C.wush_status { return C.wush_tensor_file_count(f.p, &n) })
	return int(n), err
}

// Tensor is wush_tensor_file_tensor (the data copied out of the mapping).
func (f *TensorFile) Tensor(index int) (Tensor, error) {
	if f.p == nil {
		return Tensor{}, errClosed
	}
	defer runtime.KeepAlive(f)
	var name, dtype *C.char
	var ndim, nbytes C.size_t
	var shape *C.uint64_t
	var data unsafe.Pointer
	if err := call(func() C.wush_status {
		return C.wush_tensor_file_tensor(f.p, C.size_t(index), &name, &dtype, &ndim, &shape, &data, &nbytes)
	}); err != nil {
		return Tensor{}, err
	}
	t := Tensor{Name: C.GoString(name), DType: C.GoString(dtype), Data: C.GoBytes(data, C.int(nbytes))}
	for _, d := range unsafe.Slice(shape, int(ndim)) {
		t.Shape = append(t.Shape, uint64(d))
	}
	return t, nil
}

// Find is wush_tensor_file_find; ok is false when there is no such tensor.
func (f *TensorFile) Find(name string) (t Tensor, ok bool, err error) {
	if f.p == nil {
		return Tensor{}, false, errClosed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(f)
	var i C.size_t
	err = call(func() C.wush_status { return C.wush_tensor_file_find(f.p, cs, &i) })
	if e, isErr := err.(*Error); isErr && e.Status == ErrNotFound {
		return Tensor{}, false, nil
	} else if err != nil {
		return Tensor{}, false, err
	}
	t, err = f.Tensor(int(i))
	return t, err == nil, err
}

// Metadata is wush_tensor_file_metadata; ok is false when the key is absent.
func (f *TensorFile) Metadata(key string) (value string, ok bool, err error) {
	if f.p == nil {
		return "", false, errClosed
	}
	cs := C.CString(key)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(f)
	var v *C.char
	err = call(func() C.wush_status { return C.wush_tensor_file_metadata(f.p, cs, &v) })
	if e, isErr := err.(*Error); isErr && e.Status == ErrNotFound {
		return "", false, nil
	} else if err != nil {
		return "", false, err
	}
	return C.GoString(v), true, nil
}

// ---- built-in example layers -------------------------------------------------------------------

// ExampleLayer is a built-in layer's weight (DOut x DIn) and activations (tokens x DIn).
type ExampleLayer struct {
	DOut, DIn           int
	Weight, Calibration []float32
	Heldout             []float32
}

// ExampleLayerNames is wush_example_layer_count + wush_example_layer_name.
func ExampleLayerNames() []string {
	n := int(C.wush_example_layer_count())
	names := make([]string, 0, n)
	for i := 0; i < n; i++ {
		names = append(names, goStringOrEmpty(C.wush_example_layer_name(C.size_t(i))))
	}
	return names
}

// ExampleLayerShape is wush_example_layer_shape: (d_out, d_in).
func ExampleLayerShape(name string) (dOut, dIn int, err error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var o, i C.size_t
	err = call(func() C.wush_status { return C.wush_example_layer_shape(cs, &o, &i) })
	return int(o), int(i), err
}

// GenerateExampleLayer is wush_example_layer_generate.
func GenerateExampleLayer(name string, seed uint64, nCalibration, nHeldout int) (*ExampleLayer, error) {
	dOut, dIn, err := ExampleLayerShape(name)
	if err != nil {
		return nil, err
	}
	l := &ExampleLayer{DOut: dOut, DIn: dIn, Weight: make([]float32, dOut*dIn),
		Calibration: make([]float32, nCalibration*dIn), Heldout: make([]float32, nHeldout*dIn)}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	err = call(func() C.wush_status {
		return C.wush_example_layer_generate(cs, C.uint64_t(seed), C.size_t(nCalibration), C.size_t(nHeldout),
			(*C.float)(ptrOf(l.Weight)), C.size_t(len(l.Weight)), (*C.float)(ptrOf(l.Calibration)),
			C.size_t(len(l.Calibration)), (*C.float)(ptrOf(l.Heldout)), C.size_t(len(l.Heldout)))
	})
	return l, err
}
