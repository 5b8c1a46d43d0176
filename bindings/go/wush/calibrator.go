package wush

// Calibration (wush.h: "Calibration"): streaming second moments of a layer's input activations.

// #include <stdint.h>
// #include <wush/wush.h>
import "C"

import (
	"runtime"
	"unsafe"
)

// MomentMode is what a calibrator accumulates (wush_moment_mode).
type MomentMode int32

const (
	MomentsBlockDiagonal MomentMode = C.WUSH_MOMENTS_BLOCK_DIAGONAL
	MomentsFull          MomentMode = C.WUSH_MOMENTS_FULL
)

// Calibrator is a wush_calibrator. Reads (counts, moments, export) are safe concurrently;
// Add, AddValidation, Merge, ImportState and Set* need the caller's exclusion.
type Calibrator struct {
	p      *C.wush_calibrator
	dIn, g int
}

// NewCalibrator is wush_calibrator_create.
func NewCalibrator(dIn, groupSize int, mode MomentMode) (*Calibrator, error) {
	if err := nonNegative("dIn, groupSize", dIn, groupSize); err != nil {
		return nil, err
	}
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

// AddSequences is wush_calibrator_add_sequences on a CPU context: x holds whole sequences of
// sequenceLength tokens (rows of d_in float32) back to back, and the token sample remembers each
// sampled token's sequence, so that the search's guard can hold out whole sequences.
func (c *Calibrator) AddSequences(ctx *Context, x []float32, sequenceLength int) error {
	if err := nonNegative("sequenceLength", sequenceLength); err != nil {
		return err
	}
	return c.addRows(ctx, "Calibrator.AddSequences", len(x), func(p *C.wush_context, n C.size_t) C.wush_status {
		return C.wush_calibrator_add_sequences(p, c.p, C.wush_dtype(F32), ptrOf(x), n, C.size_t(sequenceLength))
	})
}

// AddDocument is wush_calibrator_add_document on a CPU context: every row of x (d_in float32
// each) belongs to the caller's document `document` (one document's windows, added in several
// calls, share the id), so that the search's guard can hold out whole documents.
func (c *Calibrator) AddDocument(ctx *Context, x []float32, document uint64) error {
	return c.addRows(ctx, "Calibrator.AddDocument", len(x), func(p *C.wush_context, n C.size_t) C.wush_status {
		return C.wush_calibrator_add_document(p, c.p, C.wush_dtype(F32), ptrOf(x), n, C.uint64_t(document))
	})
}

// CalibratorAdd is wush_calibrator_add on a CPU context: x is float32, Float16 or BFloat16.
func CalibratorAdd[X Element](c *Calibrator, ctx *Context, x []X) error {
	return offer(c, ctx, x, false)
}

// CalibratorAddValidation is wush_calibrator_add_validation on a CPU context (x as CalibratorAdd).
func CalibratorAddValidation[X Element](c *Calibrator, ctx *Context, x []X) error {
	return offer(c, ctx, x, true)
}

func offer[X Element](c *Calibrator, ctx *Context, x []X, validation bool) error {
	return c.addRows(ctx, "Calibrator.Add", len(x), func(p *C.wush_context, n C.size_t) C.wush_status {
		if validation {
			return C.wush_calibrator_add_validation(p, c.p, C.wush_dtype(DTypeOf[X]()), ptrOf(x), n)
		}
		return C.wush_calibrator_add(p, c.p, C.wush_dtype(DTypeOf[X]()), ptrOf(x), n)
	})
}

// addRows runs one of the calibrator's add calls on `elements` values of x (rows of d_in) on a
// CPU context, after the checks every add makes: a host context, an open calibrator, whole rows.
func (c *Calibrator) addRows(ctx *Context, what string, elements int,
	add func(p *C.wush_context, n C.size_t) C.wush_status) error {
	p, err := ctx.host(what)
	if err != nil {
		return err
	}
	if c.p == nil {
		return errClosed
	}
	n, err := rowsOf(elements, c.dIn, "x")
	if err != nil {
		return err
	}
	defer runtime.KeepAlive(ctx)
	defer runtime.KeepAlive(c)
	return call(func() C.wush_status { return add(p, C.size_t(n)) })
}

// AddDevice is wush_calibrator_add on a CUDA context: x is a device pointer to nTokens x d_in
// elements of dtype on the context's device.
func (c *Calibrator) AddDevice(ctx *Context, dtype DType, x unsafe.Pointer, nTokens int) error {
	p := ctx.ptr()
	if p == nil || c.p == nil {
		return errClosed
	}
	if err := nonNegative("nTokens", nTokens); err != nil {
		return err
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
	if err := nonNegative("block", block); err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(c)
	n, err := elemCount(c.g, c.g, "G x G")
	if err != nil {
		return nil, err
	}
	m := make([]float64, n)
	err = call(func() C.wush_status {
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
	if err := nonNegative("n", n); err != nil {
		return err
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
	return lenAfter(uint64(n), err, "sample count")
}

// SetValidationSize is wush_calibrator_set_validation_size.
func (c *Calibrator) SetValidationSize(n int) error {
	if c.p == nil {
		return errClosed
	}
	if err := nonNegative("n", n); err != nil {
		return err
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
	return lenAfter(uint64(n), err, "validation count")
}
