package wush

// #include <wush/wush.h>
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// wushGoProgress is the C progress callback of Options.SetProgress: user_data is the cgo.Handle
// of the Go function. It runs on the thread of the libwush call that reports progress.
//
//export wushGoProgress
func wushGoProgress(user unsafe.Pointer, fraction C.double) C.int {
	f := cgo.Handle(uintptr(user)).Value().(func(float64) bool)
	cont := func() (ok bool) {
		defer func() {
			if recover() != nil { // a panic must not unwind through C: it cancels instead
				ok = false
			}
		}()
		return f(float64(fraction))
	}()
	if cont {
		return 0
	}
	return 1
}
