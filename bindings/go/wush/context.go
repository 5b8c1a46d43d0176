package wush

// Contexts (wush.h: "Contexts").

// #include <stdint.h>
// #include <wush/wush.h>
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
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
	// OpenMPTeam: 1 runs the CPU runtime on the process's OpenMP threads (see wush.h).
	OpenMPTeam ContextParameter = C.WUSH_CONTEXT_OPENMP_TEAM
	// Experimental (see wush.h): the CUDA backend's kernel switches, read when a layer is prepared.
	CUDAPrefillMinM  ContextParameter = C.WUSH_CONTEXT_CUDA_PREFILL_MIN_M
	CUDABlockScaled  ContextParameter = C.WUSH_CONTEXT_CUDA_BLOCKSCALED
	CUDAStreamDecode ContextParameter = C.WUSH_CONTEXT_CUDA_STREAM_DECODE
	CUDABF16Prefill  ContextParameter = C.WUSH_CONTEXT_CUDA_BF16_PREFILL
	CUDATCQuantize   ContextParameter = C.WUSH_CONTEXT_CUDA_TC_QUANTIZE
)

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
	if err := int32Arg("device", device); err != nil {
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
