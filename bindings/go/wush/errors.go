package wush

// Status and errors (wush.h: "Status and errors"): the Status values, the *Error type and
// the helpers every call goes through.

// #include <wush/wush.h>
import "C"

import (
	"fmt"
	"runtime"
)

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

func goStringOrEmpty(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}
