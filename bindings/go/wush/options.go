package wush

// Options and progress (wush.h: "Options and progress"); the C progress callback is in
// progress.go (a file with //export may only declare in its cgo preamble).

// #include <stdint.h>
// #include <wush/wush.h>
// extern int wushGoProgress(void*, double);
// static wush_status wush_go_set_progress(wush_options* o, uintptr_t h) {
//     return wush_options_set_progress(o, h ? wushGoProgress : NULL, (void*)h);
// }
import "C"

import (
	"runtime"
	"runtime/cgo"
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
	OptionHessianDamping Option = C.WUSH_OPTION_HESSIAN_DAMPING
)

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
	return lenAfter(uint64(n), err, "sample size")
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
