// The abi-upgrade check's Go program (tests/bindings/run_bindings.sh, check `abi-upgrade`): the
// same calls, oracles and report as tests/bindings/abi_upgrade/rust/src/main.rs, through cgo.
//
// It uses only calls that existed in the previous release. The script builds it twice, with the
// wush.h beside it (in the package directory, so Go's build cache hashes it) being the previous
// release's header (abi/previous/wush.h) or the installed one, and runs both against the NEW
// installed library (linked through CGO_LDFLAGS from pkg-config). The reports of both builds and
// of the Rust program must be identical.
//
//	wush-upgrade-check DIR      (DIR: where the checkpoint is written)
package main

// #cgo CFLAGS: -I${SRCDIR}
// #cgo LDFLAGS: -lwush
// #include <stdint.h>
// #include <stdlib.h>
// #include "wush.h"
import "C"

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"runtime"
	"unsafe"
)

// wush_last_error() is per OS thread: every call runs on main's goroutine, kept on one thread.
func init() { runtime.LockOSThread() }

const (
	nTokens = 256
	dIn     = 64
	dOut    = 32
	g       = 32 // MXFP4's group size
)

type report struct {
	lines    []string
	failures int
}

func (r *report) put(key, value string) { r.lines = append(r.lines, key+" "+value) }

func (r *report) check(what string, ok bool, detail string) {
	v := "ok"
	if !ok {
		fmt.Fprintf(os.Stderr, "FAIL: %s: %s\n", what, detail)
		r.failures++
		v = "FAILED"
	}
	r.put("check."+what, v)
}

func (r *report) status(what string, st C.wush_status) bool {
	ok := st == C.WUSH_OK
	msg := ""
	if !ok {
		msg = lastError()
	}
	r.check(what, ok, fmt.Sprintf("%s (%s)", statusName(st), msg))
	return ok
}

func cstr(p *C.char) string {
	if p == nil {
		return "(null)"
	}
	return C.GoString(p)
}

func lastError() string                  { return cstr(C.wush_last_error()) }
func statusName(st C.wush_status) string { return cstr(C.wush_status_string(st)) }

func fnv(b []byte) string {
	h := uint64(0xcbf29ce484222325)
	for _, c := range b {
		h = (h ^ uint64(c)) * 0x100000001b3
	}
	return fmt.Sprintf("%016x", h)
}

func fnvF32(v []float32) string {
	b := make([]byte, 0, 4*len(v))
	for _, x := range v {
		u := math.Float32bits(x)
		b = append(b, byte(u), byte(u>>8), byte(u>>16), byte(u>>24))
	}
	return fnv(b)
}

func fnvF64(v []float64) string {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		u := math.Float64bits(x)
		for k := 0; k < 8; k++ {
			b = append(b, byte(u>>(8*k)))
		}
	}
	return fnv(b)
}

// data: a 64-bit LCG's top 24 bits as floats in [-1, 1), scaled by 1 + i % period.
func data(seed uint64, n, period int) []float32 {
	s := seed
	out := make([]float32, n)
	for i := range out {
		s = s*6364136223846793005 + 1442695040888963407
		u := float64(s>>40)/16777216.0*2.0 - 1.0
		out[i] = float32(u * float64(1+i%period))
	}
	return out
}

// The header's MXFP4 rule: e = floor(log2(amax)) clamped to [-127, 127], scale byte e + 127,
// code = RNE(x * 3 / 2^e) on the E2M1 grid (sign bit 8), low nibble first.
var e2m1 = [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

func e2m1Code(a float64) byte {
	best := 0
	for i := 1; i < 8; i++ {
		d, db := math.Abs(a-e2m1[i]), math.Abs(a-e2m1[best])
		if d < db || (d == db && i%2 == 0) {
			best = i
		}
	}
	return byte(best)
}

func mxfp4Reference(x []float32) (codes, scales []byte) {
	codes = make([]byte, len(x)/2)
	for gi := 0; gi*g < len(x); gi++ {
		grp := x[gi*g : (gi+1)*g]
		amax := 0.0
		for _, v := range grp {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		e := -127
		if amax != 0 {
			e = int(math.Floor(math.Log2(amax)))
			e = min(max(e, -127), 127)
		}
		scales = append(scales, byte(e+127))
		for j, v := range grp {
			var c byte
			if amax != 0 {
				c = e2m1Code(math.Abs(float64(v) * 3 / math.Ldexp(1, e)))
				if math.Signbit(float64(v)) {
					c |= 8
				}
			}
			i := gi*g + j
			codes[i/2] |= c << (4 * (i % 2))
		}
	}
	return codes, scales
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func max(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func relErr(a []float32, b []float64) float64 {
	num, den := 0.0, 0.0
	for i := range a {
		d := float64(a[i]) - b[i]
		num += d * d
		den += b[i] * b[i]
	}
	return math.Sqrt(num / den)
}

func ptr[T any](s []T) unsafe.Pointer { return unsafe.Pointer(&s[0]) }

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: wush-upgrade-check DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	r := &report{}

	// ---- version, enums and names (facts the previous header documents) ----------------------
	v := uint(C.wush_version())
	hv := uint(C.WUSH_VERSION_NUMBER)
	r.put("header_version", fmt.Sprint(hv))
	r.check("version_same_major", v/10000 == uint(C.WUSH_VERSION_MAJOR), fmt.Sprintf("library %d", v))
	r.check("version_not_older", v >= hv, fmt.Sprintf("library %d", v))
	formats := []struct {
		f     C.wush_format
		name  string
		group int
	}{{C.WUSH_FORMAT_MXFP4, "mxfp4", 32}, {C.WUSH_FORMAT_NVFP4, "nvfp4", 16}, {C.WUSH_FORMAT_INT4, "int4", 32},
		{C.WUSH_FORMAT_MXFP4_OCP, "mxfp4_ocp", 32}}
	for _, f := range formats {
		got := cstr(C.wush_format_name(f.f))
		r.check("format_name."+f.name, got == f.name, got)
		var gs C.size_t
		r.status("format_group_size."+f.name, C.wush_format_group_size(f.f, &gs))
		r.check("format_group."+f.name, int(gs) == f.group, fmt.Sprint(gs))
		back := C.wush_format(-1)
		cs := C.CString(f.name)
		r.status("format_from_name."+f.name, C.wush_format_from_name(cs, &back))
		C.free(unsafe.Pointer(cs))
		r.check("format_roundtrip."+f.name, back == f.f, fmt.Sprint(back))
	}
	kinds := []struct {
		k    C.wush_transform_kind
		name string
	}{{C.WUSH_TRANSFORM_IDENTITY, "i"}, {C.WUSH_TRANSFORM_HADAMARD, "h"}, {C.WUSH_TRANSFORM_RANDOM, "r"},
		{C.WUSH_TRANSFORM_WUS, "wus"}, {C.WUSH_TRANSFORM_WUSH, "wush"}}
	for _, k := range kinds {
		got := cstr(C.wush_transform_kind_name(k.k))
		r.check("kind_name."+k.name, got == k.name, got)
	}
	for _, d := range []struct {
		d    C.wush_dtype
		size int
	}{{C.WUSH_DTYPE_F32, 4}, {C.WUSH_DTYPE_F16, 2}, {C.WUSH_DTYPE_BF16, 2}} {
		var s C.size_t
		r.status(fmt.Sprintf("dtype_size.%d", d.d), C.wush_dtype_size(d.d, &s))
		r.check(fmt.Sprintf("dtype_size_value.%d", d.d), int(s) == d.size, fmt.Sprint(s))
	}
	for _, s := range []struct {
		st   C.wush_status
		name string
	}{{C.WUSH_OK, "WUSH_OK"}, {C.WUSH_ERR_INVALID_ARGUMENT, "WUSH_ERR_INVALID_ARGUMENT"},
		{C.WUSH_ERR_BUFFER_TOO_SMALL, "WUSH_ERR_BUFFER_TOO_SMALL"}, {C.WUSH_ERR_NON_FINITE, "WUSH_ERR_NON_FINITE"},
		{C.WUSH_ERR_NOT_FOUND, "WUSH_ERR_NOT_FOUND"}} {
		got := statusName(s.st)
		r.check("status_string."+s.name, got == s.name, got)
	}

	// ---- error text ----------------------------------------------------------------------------
	var ctx *C.wush_context
	st := C.wush_context_create(C.WUSH_BACKEND_CPU, 7, &ctx)
	r.check("bad_device_refused", st == C.WUSH_ERR_INVALID_ARGUMENT && ctx == nil, statusName(st))
	msg := lastError()
	r.check("bad_device_message", msg != "", msg)
	r.status("context_create", C.wush_context_create(C.WUSH_BACKEND_CPU, 0, &ctx))
	backend := C.wush_backend(-1)
	r.status("context_backend", C.wush_context_backend(ctx, &backend))
	r.check("context_backend_cpu", backend == C.WUSH_BACKEND_CPU, fmt.Sprint(backend))

	// ---- options -------------------------------------------------------------------------------
	var opts *C.wush_options
	r.status("options_create", C.wush_options_create(&opts))
	var dv C.double
	r.status("options_get_damping", C.wush_options_get_double(opts, C.WUSH_OPTION_DAMPING, &dv))
	r.put("options.damping_default", fmt.Sprintf("%016x", math.Float64bits(float64(dv))))
	r.status("options_set_damping", C.wush_options_set_double(opts, C.WUSH_OPTION_DAMPING, 0.03125))
	r.status("options_get_damping2", C.wush_options_get_double(opts, C.WUSH_OPTION_DAMPING, &dv))
	r.check("options_damping_value", dv == 0.03125, fmt.Sprint(dv))
	r.status("options_set_seed", C.wush_options_set_int(opts, C.WUSH_OPTION_SEED, 1234))
	var iv C.int64_t
	r.status("options_get_seed", C.wush_options_get_int(opts, C.WUSH_OPTION_SEED, &iv))
	r.check("options_seed_value", iv == 1234, fmt.Sprint(iv))
	r.status("options_get_dtype", C.wush_options_get_int(opts, C.WUSH_OPTION_TRANSFORM_DTYPE, &iv))
	r.check("options_transform_dtype_default", iv == C.int64_t(C.WUSH_DTYPE_F32), fmt.Sprint(iv))
	st = C.wush_options_set_int(opts, C.WUSH_OPTION_SEARCH_TOKENS, 8)
	r.check("options_out_of_bounds_refused", st == C.WUSH_ERR_INVALID_ARGUMENT, statusName(st))

	// ---- calibrator ----------------------------------------------------------------------------
	x := data(1, nTokens*dIn, 7)
	w := data(2, dOut*dIn, 3)
	var cal *C.wush_calibrator
	r.status("calibrator_create", C.wush_calibrator_create(dIn, g, C.WUSH_MOMENTS_BLOCK_DIAGONAL, &cal))
	r.status("calibrator_add", C.wush_calibrator_add(ctx, cal, C.WUSH_DTYPE_F32, ptr(x), nTokens))
	var count C.uint64_t
	r.status("calibrator_token_count", C.wush_calibrator_token_count(cal, &count))
	r.check("calibrator_tokens", count == nTokens, fmt.Sprint(count))
	for b := 0; b < dIn/g; b++ {
		m := make([]float64, g*g)
		r.status(fmt.Sprintf("second_moment.%d", b),
			C.wush_calibrator_second_moment(cal, C.size_t(b), (*C.double)(ptr(m)), C.size_t(len(m))))
		worst := 0.0
		for i := 0; i < g; i++ {
			for j := 0; j < g; j++ {
				want := 0.0
				for t := 0; t < nTokens; t++ {
					want += float64(x[t*dIn+b*g+i]) * float64(x[t*dIn+b*g+j])
				}
				want /= nTokens
				worst = math.Max(worst, math.Abs(m[i*g+j]-want)/(1+math.Abs(want)))
			}
		}
		r.check(fmt.Sprintf("second_moment_formula.%d", b), worst < 1e-9, fmt.Sprint(worst))
	}
	var stateLen C.size_t
	r.status("calibrator_state_size", C.wush_calibrator_state_size(cal, &stateLen))
	state := make([]float64, stateLen)
	r.status("calibrator_export", C.wush_calibrator_export_state(cal, (*C.double)(ptr(state)), stateLen))
	r.put("calibrator.state", fmt.Sprintf("%d %s", stateLen, fnvF64(state)))

	// ---- quantize_rows against the header's MXFP4 rule; dequantize against the codes --------------
	var cb, sb C.size_t
	r.status("buffer_sizes", C.wush_format_buffer_sizes(C.WUSH_FORMAT_MXFP4, dOut, dIn, &cb, &sb))
	r.check("buffer_sizes_value", cb == dOut*dIn/2 && sb == dOut*dIn/g, fmt.Sprintf("%d %d", cb, sb))
	codes, scales := make([]byte, cb), make([]byte, sb)
	r.status("quantize_rows", C.wush_quantize_rows(ctx, C.WUSH_FORMAT_MXFP4, C.WUSH_DTYPE_F32, ptr(w), dOut, dIn,
		ptr(codes), cb, ptr(scales), sb))
	rc, rs := mxfp4Reference(w)
	r.check("quantize_rows_mxfp4_rule", bytes.Equal(codes, rc) && bytes.Equal(scales, rs), "bytes differ from the rule")
	wd := make([]float32, dOut*dIn)
	r.status("dequantize_rows", C.wush_dequantize_rows(ctx, C.WUSH_FORMAT_MXFP4, ptr(codes), cb, ptr(scales), sb,
		dOut, dIn, (*C.float)(ptr(wd)), C.size_t(len(wd))))
	dqOK := true
	for i := range w {
		c := (codes[i/2] >> (4 * (i % 2))) & 15
		mag := e2m1[c&7] * math.Ldexp(1, int(scales[i/g])-127) / 3
		if c&8 != 0 {
			mag = -mag
		}
		dqOK = dqOK && wd[i] == float32(mag) // the decoded value rounded to float32 (the output's type)
	}
	r.check("dequantize_rows_values", dqOK, "a decoded value differs")
	st = C.wush_quantize_rows(ctx, C.WUSH_FORMAT_MXFP4, C.WUSH_DTYPE_F32, ptr(w), dOut, dIn, ptr(codes), cb-1,
		ptr(scales), sb)
	r.check("quantize_rows_small_buffer", st == C.WUSH_ERR_BUFFER_TOO_SMALL, statusName(st))
	r.put("quantize_rows", fnv(codes)+" "+fnv(scales))

	// ---- transform build and qweight -----------------------------------------------------------
	var t *C.wush_transform
	r.status("transform_build", C.wush_transform_build(ctx, cal, C.WUSH_DTYPE_F32, ptr(w), dOut, dIn,
		C.WUSH_TRANSFORM_WUSH, opts, &t))
	kind, tdin, tg := C.wush_transform_kind(-1), C.size_t(0), C.size_t(0)
	r.status("transform_info", C.wush_transform_info(t, &kind, &tdin, &tg))
	r.check("transform_info_values", kind == C.WUSH_TRANSFORM_WUSH && tdin == dIn && tg == g,
		fmt.Sprintf("%d %d %d", kind, tdin, tg))
	mats := make([]float32, dIn*g)
	r.status("transform_matrices", C.wush_transform_matrices(t, (*C.float)(ptr(mats)), C.size_t(len(mats))))
	r.put("transform.matrices", fnvF32(mats))
	var q *C.wush_qweight
	r.status("qweight_create", C.wush_qweight_create(ctx, t, C.WUSH_FORMAT_MXFP4, C.WUSH_METHOD_RTN, C.WUSH_DTYPE_F32,
		ptr(w), dOut, dIn, opts, &q))
	qf, qm, qo, qi := C.wush_format(-1), C.wush_method(-1), C.size_t(0), C.size_t(0)
	r.status("qweight_info", C.wush_qweight_info(q, &qf, &qm, &qo, &qi))
	r.check("qweight_info_values", qf == C.WUSH_FORMAT_MXFP4 && qm == C.WUSH_METHOD_RTN && qo == dOut && qi == dIn,
		fmt.Sprintf("%d %d %d %d", qf, qm, qo, qi))
	qbytes := func(q *C.wush_qweight) ([]byte, []byte) {
		var c, s unsafe.Pointer
		var cn, sn C.size_t
		if C.wush_qweight_data(q, &c, &cn, &s, &sn) != C.WUSH_OK || c == nil || s == nil {
			return nil, nil
		}
		return C.GoBytes(c, C.int(cn)), C.GoBytes(s, C.int(sn))
	}
	qc, qs := qbytes(q)
	r.put("qweight.data", fmt.Sprintf("%d %d %s %s", len(qc), len(qs), fnv(qc), fnv(qs)))

	// ---- checkpoint: write, open, load back (the same bytes) -----------------------------------
	path := C.CString(dir + "/upgrade-go.safetensors")
	defer C.free(unsafe.Pointer(path))
	var ck *C.wush_checkpoint
	r.status("checkpoint_create", C.wush_checkpoint_create(&ck))
	lname := C.CString("blocks.0.fc")
	defer C.free(unsafe.Pointer(lname))
	r.status("checkpoint_add_layer", C.wush_checkpoint_add_layer(ck, lname, t, q))
	r.status("checkpoint_write", C.wush_checkpoint_write(ck, path, nil))
	C.wush_checkpoint_destroy(ck)
	var rd *C.wush_checkpoint
	r.status("checkpoint_open", C.wush_checkpoint_open(path, &rd))
	var nl C.size_t
	r.status("checkpoint_layer_count", C.wush_checkpoint_layer_count(rd, &nl))
	var np *C.char
	r.status("checkpoint_layer_name", C.wush_checkpoint_layer_name(rd, 0, &np))
	gotName := cstr(np)
	r.check("checkpoint_layers", nl == 1 && gotName == "blocks.0.fc", fmt.Sprintf("%d %s", nl, gotName))
	missing := C.CString("no.such.layer")
	defer C.free(unsafe.Pointer(missing))
	var t2 *C.wush_transform
	var q2 *C.wush_qweight
	st = C.wush_checkpoint_load_layer(rd, missing, &t2, &q2)
	r.check("checkpoint_missing_layer", st == C.WUSH_ERR_NOT_FOUND, statusName(st))
	r.status("checkpoint_load_layer", C.wush_checkpoint_load_layer(rd, lname, &t2, &q2))
	mats2 := make([]float32, dIn*g)
	r.status("loaded_matrices", C.wush_transform_matrices(t2, (*C.float)(ptr(mats2)), C.size_t(len(mats2))))
	sameT := true
	for i := range mats {
		sameT = sameT && math.Float32bits(mats[i]) == math.Float32bits(mats2[i])
	}
	r.check("checkpoint_roundtrip_transform", sameT, "matrices differ")
	qc2, qs2 := qbytes(q2)
	r.check("checkpoint_roundtrip_qweight", bytes.Equal(qc, qc2) && bytes.Equal(qs, qs2), "codes/scales differ")

	// ---- prepared layer forward from the loaded layer, against float64 x W^T -------------------
	var lin *C.wush_linear
	r.status("linear_create", C.wush_linear_create(ctx, t2, q2, &lin))
	lo, li, lf := C.size_t(0), C.size_t(0), C.wush_format(-1)
	r.status("linear_info", C.wush_linear_info(lin, &lo, &li, &lf))
	r.check("linear_info_values", lo == dOut && li == dIn && lf == C.WUSH_FORMAT_MXFP4, fmt.Sprintf("%d %d %d", lo, li, lf))
	var wsb C.size_t
	r.status("linear_workspace_size", C.wush_linear_workspace_size(ctx, lin, nTokens, &wsb))
	ws := make([]byte, wsb+1)
	y := make([]float32, nTokens*dOut)
	r.status("linear_run", C.wush_linear_run(ctx, lin, C.WUSH_DTYPE_F32, ptr(x), nTokens, C.WUSH_DTYPE_F32, ptr(y),
		C.size_t(len(y)), ptr(ws), wsb))
	exact := make([]float64, nTokens*dOut)
	for tk := 0; tk < nTokens; tk++ {
		for o := 0; o < dOut; o++ {
			s := 0.0
			for i := 0; i < dIn; i++ {
				s += float64(x[tk*dIn+i]) * float64(w[o*dIn+i])
			}
			exact[tk*dOut+o] = s
		}
	}
	e := relErr(y, exact)
	r.check("linear_run_vs_float64", e > 0 && e < 0.25, fmt.Sprintf("relative error %g", e))
	r.put("linear_run.y", fnvF32(y))
	yb := make([]uint16, nTokens*dOut)
	r.status("linear_run_bf16", C.wush_linear_run(ctx, lin, C.WUSH_DTYPE_F32, ptr(x), nTokens, C.WUSH_DTYPE_BF16,
		ptr(yb), C.size_t(len(yb)), ptr(ws), wsb))
	bf16OK := true
	for i := range y {
		// |y| lies between the bfloat16 values lo (its binary32 bits truncated) and hi (the next one
		// up); the output is the nearer, ties to the even one, with y's sign.
		mag := math.Abs(float64(y[i]))
		bl := uint16(math.Float32bits(float32(mag)) >> 16)
		lo, hi := float64(math.Float32frombits(uint32(bl)<<16)), float64(math.Float32frombits(uint32(bl+1)<<16))
		want := bl + 1
		if mag-lo < hi-mag || (mag-lo == hi-mag && bl%2 == 0) {
			want = bl
		}
		bf16OK = bf16OK && yb[i]&0x7fff == want && (yb[i]&0x8000 != 0) == math.Signbit(float64(y[i]))
	}
	r.check("linear_run_bf16_is_rounded_f32", bf16OK, "a BF16 output is not the nearest to the F32 one")
	forward := make([]float32, nTokens*dOut)
	var fwb C.size_t
	r.status("forward_workspace", C.wush_linear_forward_workspace_size(ctx, t, q, nTokens, &fwb))
	fws := make([]byte, fwb+1)
	r.status("linear_forward", C.wush_linear_forward(ctx, t, q, C.WUSH_DTYPE_F32, ptr(x), nTokens, C.WUSH_DTYPE_F32,
		ptr(forward), C.size_t(len(forward)), ptr(fws), fwb))
	sameY := true
	for i := range y {
		sameY = sameY && forward[i] == y[i]
	}
	r.check("linear_forward_matches_prepared", sameY, "wush_linear_forward differs from wush_linear_run")
	st = C.wush_linear_run(ctx, lin, C.WUSH_DTYPE_F32, ptr(x), nTokens, C.WUSH_DTYPE_F32, ptr(y), C.size_t(len(y)-1),
		ptr(ws), wsb)
	r.check("linear_run_small_output", st == C.WUSH_ERR_BUFFER_TOO_SMALL, statusName(st))
	msg = lastError()
	r.check("linear_run_small_output_message", msg != "", msg)
	var loss C.double
	r.status("layer_loss", C.wush_layer_loss(ctx, t, q, C.WUSH_DTYPE_F32, ptr(w), C.WUSH_DTYPE_F32, ptr(x), nTokens,
		&loss))
	r.put("layer_loss", fmt.Sprintf("%016x", math.Float64bits(float64(loss))))

	C.wush_linear_destroy(lin)
	C.wush_transform_destroy(t2)
	C.wush_qweight_destroy(q2)
	C.wush_checkpoint_destroy(rd)
	C.wush_qweight_destroy(q)
	C.wush_transform_destroy(t)
	C.wush_calibrator_destroy(cal)
	C.wush_options_destroy(opts)
	C.wush_context_destroy(ctx)

	for _, l := range r.lines {
		fmt.Println(l)
	}
	fmt.Fprintf(os.Stderr, "wush-upgrade-check (go, header %d): %d failed of %d lines\n", hv, r.failures, len(r.lines))
	if r.failures != 0 {
		os.Exit(1)
	}
}
