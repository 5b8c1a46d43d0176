// Command wushexample calls libwush's C API from Go through cgo.
//
// It quantizes a 2 x 64 float32 matrix to MXFP4 and back and checks every code, scale byte and
// decoded value against an independent reference written from the rules in include/wush/wush.h.
// Prints "go binding: OK" or lists the mismatches and exits 1.
//
// The library is found with pkg-config (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig); at run time the
// dynamic loader needs LD_LIBRARY_PATH=$(pkg-config --variable=libdir wush) unless libwush is in a
// system directory.
package main

// #cgo pkg-config: wush
// #include <stdlib.h>
// #include <wush/wush.h>
import "C"

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"unsafe"
)

const (
	nRows   = 2
	dIn     = 64
	group   = 32
	nGroups = nRows * dIn / group
	// The ABI major this program was written against (the SONAME is libwush.so.<major>).
	expectedMajor = 0
)

// ---- independent MXFP4 reference (header: e = floor(log2(amax)), code = RNE_e2m1(x*3/2^e)) ---

var e2m1Magnitude = [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// pow2 returns 2^e exactly.
func pow2(e int) float64 {
	p := 1.0
	for ; e > 0; e-- {
		p *= 2
	}
	for ; e < 0; e++ {
		p *= 0.5
	}
	return p
}

// floorLog2 returns floor(log2(a)) for a finite a > 0, exactly.
func floorLog2(a float64) int {
	e := 0
	for a >= 2 {
		a *= 0.5
		e++
	}
	for a < 1 {
		a *= 2
		e--
	}
	return e
}

// e2m1MagnitudeCode rounds |y| to the E2M1 grid, ties to the even index (mantissa bit 0).
func e2m1MagnitudeCode(a float64) uint8 {
	switch {
	case a <= 0.25:
		return 0
	case a < 0.75:
		return 1
	case a <= 1.25:
		return 2
	case a < 1.75:
		return 3
	case a <= 2.5:
		return 4
	case a < 3.5:
		return 5
	case a <= 5.0:
		return 6
	default:
		return 7
	}
}

// referenceGroup returns the scale byte, codes and decoded values of one group.
func referenceGroup(x []float32) (uint8, []uint8, []float64) {
	codes := make([]uint8, len(x))
	decoded := make([]float64, len(x))
	amax := 0.0
	for _, v := range x {
		amax = math.Max(amax, math.Abs(float64(v)))
	}
	if amax == 0 {
		return 0, codes, decoded
	}
	e := floorLog2(amax)
	if e < -127 {
		e = -127
	} else if e > 127 {
		e = 127
	}
	for i, v := range x {
		y := float64(v) * 3 / pow2(e) // exact in float64
		mag := e2m1MagnitudeCode(math.Abs(y))
		sign := 1.0
		codes[i] = mag
		if math.Signbit(float64(v)) { // -0.0 keeps its sign: code 8
			codes[i] |= 8
			sign = -1
		}
		decoded[i] = sign * e2m1Magnitude[mag] * pow2(e) / 3
	}
	return uint8(e + 127), codes, decoded
}

// Group 0 (amax 4.0 -> e = 2, scale byte 129), with its codes worked out by hand.
var group0 = [group]float32{
	0, float32(math.Copysign(0, -1)), 4, -4, 1, -1, 2, 0.5,
	0.25, 0.3333333432674408, 0.3333333134651184, 1.6666666269302368,
	1.666666746139526, 2.3333332538604736, 2.3333334922790527, 3.3333332538604736,
	3.3333334922790527, 3.9, -2.5, 0.1, -0.1, 3, -3, 2.6666667461395264,
	1.25, 1.5, -0.75, 0.6, 2.2, -3.5, 3.6, 0.75,
}

// x*3/4 -> nearest E2M1 (ties to even) -> code; e.g. 1.0 -> 0.75 (tie) -> 1.0 -> code 2.
var group0Codes = [group]uint8{
	0, 8, 5, 13, 2, 10, 3, 1, 0, 1, 0, 2, 3, 3, 4, 4,
	5, 5, 12, 0, 8, 4, 12, 4, 2, 2, 9, 1, 3, 13, 5, 1,
}

func closeEnough(got float32, want float64) bool {
	if want == 0 {
		return got == 0
	}
	return math.Abs(float64(got)-want) <= 1e-6*math.Abs(want)
}

func statusName(st C.wush_status) string { return C.GoString(C.wush_status_string(st)) }
func lastError() string                  { return C.GoString(C.wush_last_error()) }

func run() (errs []string, fatal error) {
	fail := func(format string, a ...interface{}) { errs = append(errs, fmt.Sprintf(format, a...)) }

	if v := uint(C.wush_version()); v/10000 != expectedMajor {
		fail("loaded library version %d has another ABI major", v)
	}

	// Group 0 hand-checked; group 1 amax 0.75 (e = -1); group 2 amax 7.9 (top value rounds up
	// to 6); group 3 all zeros (scale byte 0).
	x := make([]float32, nRows*dIn)
	for i := 0; i < group; i++ {
		x[i] = group0[i]
		x[group+i] = float32((i*11)%23-11) * (float32(0.75) / 11)
		x[2*group+i] = float32((i*7)%19-9) * (float32(7.9) / 9)
		x[3*group+i] = 0
	}
	var wantScales []uint8
	var wantCodes []uint8
	var wantY []float64
	for g := 0; g < nGroups; g++ {
		s, c, d := referenceGroup(x[g*group : (g+1)*group])
		wantScales = append(wantScales, s)
		wantCodes = append(wantCodes, c...)
		wantY = append(wantY, d...)
	}
	// The reference must agree with the hand-worked group before it is trusted for the rest.
	if fmt.Sprint(wantScales) != fmt.Sprint([]uint8{129, 126, 129, 0}) {
		fail("reference: unexpected scale bytes %v", wantScales)
	}
	for i := 0; i < group; i++ {
		if wantCodes[i] != group0Codes[i] {
			fail("reference: group 0 code %d is %d, hand table says %d", i, wantCodes[i], group0Codes[i])
		}
	}

	var groupSize C.size_t
	if st := C.wush_format_group_size(C.WUSH_FORMAT_MXFP4, &groupSize); st != C.WUSH_OK || groupSize != group {
		fail("wush_format_group_size: %s / %d", statusName(st), groupSize)
	}
	var codesBytes, scalesBytes C.size_t
	st := C.wush_format_buffer_sizes(C.WUSH_FORMAT_MXFP4, nRows, dIn, &codesBytes, &scalesBytes)
	if st != C.WUSH_OK || codesBytes != nRows*dIn/2 || scalesBytes != nGroups {
		return errs, fmt.Errorf("wush_format_buffer_sizes: %s, codes %d, scales %d", statusName(st), codesBytes, scalesBytes)
	}

	var ctx *C.wush_context
	if st := C.wush_context_create(C.WUSH_BACKEND_CPU, 0, &ctx); st != C.WUSH_OK {
		return errs, fmt.Errorf("wush_context_create: %s: %s", statusName(st), lastError())
	}
	defer C.wush_context_destroy(ctx)

	// Go memory passed to C holds no Go pointers, so cgo's pointer rules allow it.
	codes := make([]uint8, codesBytes)
	scales := make([]uint8, scalesBytes)
	st = C.wush_quantize_rows(ctx, C.WUSH_FORMAT_MXFP4, C.WUSH_DTYPE_F32, unsafe.Pointer(&x[0]),
		nRows, dIn, unsafe.Pointer(&codes[0]), C.size_t(len(codes)),
		unsafe.Pointer(&scales[0]), C.size_t(len(scales)))
	if st != C.WUSH_OK {
		return errs, fmt.Errorf("wush_quantize_rows: %s: %s", statusName(st), lastError())
	}
	for g := 0; g < nGroups; g++ {
		if scales[g] != wantScales[g] {
			fail("group %d: scale byte %d, expected %d", g, scales[g], wantScales[g])
		}
	}
	for i := 0; i < nRows*dIn; i++ {
		// element 2k in the low nibble, element 2k+1 in the high nibble
		got := codes[i/2] & 0x0F
		if i%2 == 1 {
			got = codes[i/2] >> 4
		}
		if got != wantCodes[i] {
			fail("element %d (x = %g): code %d, expected %d", i, x[i], got, wantCodes[i])
		}
	}

	y := make([]float32, nRows*dIn)
	st = C.wush_dequantize_rows(ctx, C.WUSH_FORMAT_MXFP4, unsafe.Pointer(&codes[0]), C.size_t(len(codes)),
		unsafe.Pointer(&scales[0]), C.size_t(len(scales)), nRows, dIn,
		(*C.float)(unsafe.Pointer(&y[0])), C.size_t(len(y)))
	if st != C.WUSH_OK {
		fail("wush_dequantize_rows: %s: %s", statusName(st), lastError())
	} else {
		for i := range y {
			if !closeEnough(y[i], wantY[i]) {
				fail("element %d: decoded %g, expected %g", i, y[i], wantY[i])
			}
		}
	}

	// Failure path: d_in = 48 is not a multiple of G = 32.
	if st := C.wush_format_buffer_sizes(C.WUSH_FORMAT_MXFP4, 1, 48, &codesBytes, &scalesBytes); st != C.WUSH_ERR_INVALID_ARGUMENT {
		fail("wush_format_buffer_sizes(d_in = 48) returned %s", statusName(st))
	}
	for i := range codes {
		codes[i] = 0xAB
	}
	for i := range scales {
		scales[i] = 0xCD
	}
	st = C.wush_quantize_rows(ctx, C.WUSH_FORMAT_MXFP4, C.WUSH_DTYPE_F32, unsafe.Pointer(&x[0]),
		1, 48, unsafe.Pointer(&codes[0]), C.size_t(len(codes)),
		unsafe.Pointer(&scales[0]), C.size_t(len(scales)))
	if st != C.WUSH_ERR_INVALID_ARGUMENT {
		fail("wush_quantize_rows(d_in = 48) returned %s", statusName(st))
	}
	if lastError() == "" {
		fail("wush_last_error() is empty after a failure")
	}
	if statusName(C.WUSH_ERR_INVALID_ARGUMENT) != "WUSH_ERR_INVALID_ARGUMENT" {
		fail("wush_status_string(WUSH_ERR_INVALID_ARGUMENT)")
	}
	for _, b := range codes {
		if b != 0xAB {
			fail("a failed wush_quantize_rows wrote to codes")
			break
		}
	}
	for _, b := range scales {
		if b != 0xCD {
			fail("a failed wush_quantize_rows wrote to scales")
			break
		}
	}
	C.wush_context_destroy(nil) // documented no-op
	return errs, nil
}

func main() {
	// wush_last_error() is per OS thread, and a goroutine may move to another OS thread between
	// two cgo calls: keep this goroutine on one thread so a failing call and the wush_last_error()
	// that follows it see the same thread-local message.
	runtime.LockOSThread()
	errs, fatal := run()
	for _, e := range errs {
		fmt.Fprintf(os.Stderr, "go binding: FAIL: %s\n", e)
	}
	if fatal != nil {
		fmt.Fprintf(os.Stderr, "go binding: FAIL: %v\n", fatal)
		os.Exit(1)
	}
	if len(errs) > 0 {
		fmt.Fprintf(os.Stderr, "go binding: %d mismatch(es)\n", len(errs))
		os.Exit(1)
	}
	fmt.Println("go binding: OK")
}
