package wush

// Transforms (wush.h: "Transforms"), with the search's per-layer guard report.

// #include <stdlib.h>
// #include <wush/wush.h>
import "C"

import (
	"runtime"
	"unsafe"
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
	if err := expectElems(len(weight), dOut, cal.dIn, "weight"); err != nil {
		return nil, err
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
	if err := nonNegative("dIn, groupSize", dIn, groupSize); err != nil {
		return nil, err
	}
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
	if err = call(func() C.wush_status { return C.wush_transform_info(t.p, &k, &d, &g) }); err != nil {
		return 0, 0, 0, err
	}
	if dIn, err = goLen(uint64(d), "d_in"); err != nil {
		return 0, 0, 0, err
	}
	if groupSize, err = goLen(uint64(g), "group size"); err != nil {
		return 0, 0, 0, err
	}
	return TransformKind(k), dIn, groupSize, nil
}

// Matrices is wush_transform_matrices: (C, G, G) float32.
func (t *Transform) Matrices() ([]float32, error) {
	_, d, g, err := t.Info()
	if err != nil {
		return nil, err
	}
	defer runtime.KeepAlive(t)
	n, err := elemCount(d, g, "C x G x G")
	if err != nil {
		return nil, err
	}
	m := make([]float32, n)
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
	nb, err := goLen(uint64(n), "fallback blocks")
	if err != nil {
		return nil, err
	}
	b := make([]C.size_t, nb)
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
	// GuardHoldOutSequences: whole sequences of the token sample (Calibrator.AddSequences).
	GuardHoldOutSequences GuardSource = C.WUSH_GUARD_HOLD_OUT_SEQUENCES
	// GuardHoldOutDocuments: whole documents of the token sample, left out of the WUSH
	// candidates' fit too (Calibrator.AddDocument).
	GuardHoldOutDocuments GuardSource = C.WUSH_GUARD_HOLD_OUT_DOCUMENTS
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
	// GuardShrunk: the kind asked for without the search, its moments shrunk (damping max(lambda, 1)).
	GuardShrunk GuardCandidate = C.WUSH_GUARD_SHRUNK
)

// GuardCandidates lists every candidate in the header's order (C values 0..5).
var GuardCandidates = [...]GuardCandidate{GuardSearched, GuardPlain, GuardIdentity, GuardHadamard, GuardRandom, GuardShrunk}

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
	// Undecided: some candidate is lower than the kept one by more than 1% but the rule could
	// not confirm it (wush_transform_guard_undecided); UndecidedCandidate is the lowest such.
	Undecided          bool
	UndecidedCandidate GuardCandidate
	NSequences         int // held-out sequences (documents) under GuardHoldOutSequences (GuardHoldOutDocuments), else 0
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
	nTokens, err := goLen(uint64(n), "guard tokens")
	if err != nil {
		return nil, err
	}
	var undecided C.int
	var which C.wush_guard_candidate
	var nSeq C.size_t
	if err := call(func() C.wush_status {
		return C.wush_transform_guard_undecided(t.p, &undecided, &which, &nSeq)
	}); err != nil {
		return nil, err
	}
	nSequences, err := goLen(uint64(nSeq), "guard sequences")
	if err != nil {
		return nil, err
	}
	r := &GuardReport{Source: GuardSource(source), NTokens: nTokens, Kept: GuardCandidate(kept),
		Undecided: undecided != 0, UndecidedCandidate: GuardCandidate(which), NSequences: nSequences}
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
