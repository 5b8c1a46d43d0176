package wush

// Sizes between the library and Go (sizes.go): counts at and past 2^31, 2^32 and math.MaxInt
// come back exact or as an error, never truncated, wrapped or as a panic.

import (
	"errors"
	"math"
	"math/bits"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

func wantStatus(t *testing.T, what string, err error, st Status) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Status != st {
		t.Fatalf("%s: got error %v, want one with status %v", what, err, st)
	}
}

func TestGoLenIsExactOrAnError(t *testing.T) {
	for _, n := range []uint64{0, 16, 1<<31 - 1, 1<<31 + 16, 1<<32 + 16, math.MaxInt32 + 1, math.MaxUint32,
		uint64(math.MaxInt), uint64(math.MaxInt) + 1, 1<<63 + 16, math.MaxUint64} {
		got, err := goLen(n, "n")
		if n <= uint64(math.MaxInt) {
			if err != nil || uint64(got) != n || got < 0 {
				t.Errorf("goLen(%d) = %d, %v; want %d exactly", n, got, err, n)
			}
		} else {
			if err == nil {
				t.Errorf("goLen(%d) = %d, no error; a Go length cannot hold it", n, got)
			} else {
				wantStatus(t, "goLen("+strconv.FormatUint(n, 10)+")", err, ErrUnsupported)
			}
		}
	}
}

func TestGoBytesCopiesOrRefusesWithoutPanicking(t *testing.T) {
	src := []byte{1, 2, 3, 4, 5}
	p := unsafe.Pointer(&src[0])
	b, err := goBytes(p, 5, "five")
	if err != nil || string(b) != string(src) {
		t.Fatalf("goBytes(5) = %v, %v", b, err)
	}
	b[0] = 9
	if src[0] != 1 {
		t.Fatal("goBytes returned the library's memory, not a copy")
	}
	if b, err := goBytes(nil, 0, "empty"); err != nil || b == nil || len(b) != 0 {
		t.Fatalf("goBytes(nil, 0) = %#v, %v; want an empty slice as C.GoBytes gives", b, err)
	}
	// Counts no Go slice can hold: an error before anything is read (p holds 5 bytes).
	for _, n := range []uint64{1 << 62, uint64(math.MaxInt), uint64(math.MaxInt) + 1, 1<<63 + 16, math.MaxUint64} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("goBytes(%d) panicked: %v", n, r)
				}
			}()
			b, err := goBytes(p, n, "huge")
			if err == nil {
				t.Errorf("goBytes(%d) = %d bytes, no error", n, len(b))
			}
		}()
	}
}

func TestElemCountIsExactOrAnError(t *testing.T) {
	type tc struct{ a, b int }
	cases := []tc{{0, 0}, {0, math.MaxInt}, {math.MaxInt, 1}, {1, math.MaxInt}, {math.MaxInt/2 + 1, 2},
		{math.MaxInt, math.MaxInt}, {1<<16 + 1, 1<<16 - 1}, {-1, 4}, {4, -1}, {math.MinInt, -1}}
	if strconv.IntSize == 64 {
		big := func(v uint64) int { return int(v) } // constants over 2^31 only where int holds them
		cases = append(cases, tc{big(1<<31 + 16), 1}, tc{big(1<<32 + 16), 1}, tc{big(1<<32 + 16), big(1 << 32)},
			tc{big(1<<31 + 16), big(1 << 32)}, tc{big(1<<58 + 1), 64}, tc{big(1<<32 - 1), big(1<<31 + 1)})
	}
	for _, c := range cases {
		got, err := elemCount(c.a, c.b, "m")
		hi, lo := bits.Mul64(uint64(c.a), uint64(c.b))
		fits := c.a >= 0 && c.b >= 0 && hi == 0 && lo <= uint64(math.MaxInt)
		if fits && (err != nil || uint64(got) != lo) {
			t.Errorf("elemCount(%d, %d) = %d, %v; want %d", c.a, c.b, got, err, lo)
		}
		if !fits {
			if err == nil {
				t.Errorf("elemCount(%d, %d) = %d, no error; the product is negative or over math.MaxInt", c.a, c.b, got)
			} else {
				wantStatus(t, "elemCount", err, ErrInvalidArgument)
			}
		}
	}
	// A product that wraps to the slice's length must not pass the check (1<<58+1) x 64 = 2^64 + 64.
	if strconv.IntSize == 64 {
		rows := uint64(1)<<58 + 1 // a variable: int(constant) would not compile where int has 32 bits
		if err := expectElems(64, int(rows), 64, "weight"); err == nil {
			t.Error("expectElems accepted 64 elements for a (2^58+1) x 64 matrix")
		}
	}
	if err := expectElems(12, 3, 4, "weight"); err != nil {
		t.Errorf("expectElems(12, 3, 4): %v", err)
	}
}

// Public functions given sizes whose product overflows int, or a negative size: an *Error that
// says so, no panic, nothing allocated for the wrapped product.
func TestSizeProductsPastMaxIntAreErrors(t *testing.T) {
	refused := func(what string, f func() error) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%s panicked: %v", what, r)
			}
		}()
		err := f()
		if err == nil {
			t.Errorf("%s: no error", what)
			return
		}
		wantStatus(t, what, err, ErrInvalidArgument)
		if msg := err.Error(); !strings.Contains(msg, "overflow") && !strings.Contains(msg, "negative") {
			t.Errorf("%s: %v; want the overflow (or negative size) named", what, err)
		}
	}
	ctx := cpu(t)
	defer ctx.Close()
	refused("DequantizeRows", func() error {
		_, err := ctx.DequantizeRows(MXFP4, nil, nil, math.MaxInt/32+1, 32)
		return err
	})
	refused("DequantizeRows with a negative row count", func() error {
		_, err := ctx.DequantizeRows(MXFP4, nil, nil, -1, 32)
		return err
	})
	name := ExampleLayerNames()[0]
	_, dIn, err := ExampleLayerShape(name)
	must(t, err)
	refused("GenerateExampleLayer", func() error {
		_, err := GenerateExampleLayer(name, 1, math.MaxInt/dIn+1, 0)
		return err
	})
	refused("GenerateExampleLayer with a negative token count", func() error {
		_, err := GenerateExampleLayer(name, 1, 0, -1)
		return err
	})
	// d_out x d_in past math.MaxInt (the old check compared the wrapped product to len(weight)).
	const g = 32
	cal, err := NewCalibrator(2*g, g, MomentsBlockDiagonal)
	must(t, err)
	defer cal.Close()
	tr, err := FixedTransform(Hadamard, 2*g, g, nil)
	must(t, err)
	defer tr.Close()
	w := make([]float32, 2*g)
	dOut := math.MaxInt/(2*g) + 1
	refused("BuildTransform", func() error {
		_, err := BuildTransform(ctx, cal, w, dOut, WUSH, nil)
		return err
	})
	refused("NewQWeight", func() error {
		_, err := NewQWeight(ctx, tr, MXFP4, RTN, w, dOut, nil)
		return err
	})
	refused("LayerQuantize", func() error {
		_, _, err := LayerQuantize(ctx, cal, Hadamard, MXFP4, RTN, w, dOut, nil)
		return err
	})
}

func TestNonNegativeAndInt32Arg(t *testing.T) {
	if err := nonNegative("a, b", 0, math.MaxInt); err != nil {
		t.Errorf("nonNegative(0, MaxInt): %v", err)
	}
	err := nonNegative("a, b", 1, -1)
	if err == nil || !strings.Contains(err.Error(), "b is negative") {
		t.Errorf("nonNegative(1, -1) = %v; want b named", err)
	}
	wantStatus(t, "nonNegative", err, ErrInvalidArgument)
	for _, n := range []int{0, -1, math.MaxInt32, math.MinInt32} {
		if err := int32Arg("device", n); err != nil {
			t.Errorf("int32Arg(%d): %v", n, err)
		}
	}
	if strconv.IntSize == 64 {
		for _, v := range []int64{math.MaxInt32 + 1, 1 << 32, math.MinInt32 - 1, math.MaxInt64} {
			if err := int32Arg("device", int(v)); err == nil {
				t.Errorf("int32Arg(%d): no error (a C int would hold %d)", v, int32(v))
			}
		}
	}
}

// Negative sizes and indices are refused before they reach a C size_t (where -1 is 2^64 - 1), and
// an int that a C int would truncate is refused before it names another device.
func TestNegativeSizesAreRefusedBeforeTheLibrary(t *testing.T) {
	refused := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
			return
		}
		wantStatus(t, what, err, ErrInvalidArgument)
		if !strings.Contains(err.Error(), "negative") && !strings.Contains(err.Error(), "C int") {
			t.Errorf("%s: %v; want the negative size named", what, err)
		}
	}
	const g = 32
	ctx := cpu(t)
	defer ctx.Close()
	_, err := NewCalibrator(-2*g, g, MomentsBlockDiagonal)
	refused("NewCalibrator(dIn -64)", err)
	_, err = NewCalibrator(2*g, -g, MomentsBlockDiagonal)
	refused("NewCalibrator(groupSize -32)", err)
	cal, err := NewCalibrator(2*g, g, MomentsBlockDiagonal)
	must(t, err)
	defer cal.Close()
	_, err = cal.SecondMoment(-1)
	refused("SecondMoment(-1)", err)
	refused("SetSampleSize(-1)", cal.SetSampleSize(-1))
	refused("SetValidationSize(-1)", cal.SetValidationSize(-1))
	refused("AddDevice(nTokens -1)", cal.AddDevice(ctx, F32, nil, -1))
	_, err = FixedTransform(Hadamard, -2*g, g, nil)
	refused("FixedTransform(dIn -64)", err)
	_, err = FixedTransform(Hadamard, 2*g, -g, nil)
	refused("FixedTransform(groupSize -32)", err)
	_, _, err = MXFP4.BufferSizes(-1, 2*g)
	refused("BufferSizes(nRows -1)", err)
	tr, err := FixedTransform(Hadamard, 2*g, g, nil)
	must(t, err)
	defer tr.Close()
	q, err := NewQWeight(ctx, tr, MXFP4, RTN, make([]float32, 2*2*g), 2, nil)
	must(t, err)
	defer q.Close()
	refused("Gemm(m -1)", ctx.Gemm(q, nil, nil, -1, nil))
	lin, err := NewLinear(ctx, tr, q)
	must(t, err)
	defer lin.Close()
	_, err = lin.WorkspaceSize(-1)
	refused("WorkspaceSize(-1)", err)
	refused("QuantizeDevice(nTokens -1)", lin.QuantizeDevice(F32, nil, -1, nil, 0, nil, 0))
	refused("RunDevice(yCount -1)", lin.RunDevice(F32, nil, 0, F32, nil, -1, nil, 0))
	path := filepath.Join(t.TempDir(), "sizes.safetensors")
	w, err := NewCheckpointWriter()
	must(t, err)
	defer w.Close()
	must(t, w.AddLayer("l", tr, q))
	must(t, w.Write(path, nil))
	f, err := OpenTensorFile(path)
	must(t, err)
	defer f.Close()
	_, err = f.Tensor(-1)
	refused("Tensor(-1)", err)
	if strconv.IntSize == 64 {
		device := int64(1) << 32 // a C int would make it device 0
		c, err := NewContext(CPU, int(device))
		if err == nil {
			c.Close()
		}
		refused("NewContext(CPU, 2^32)", err)
	}
}

func TestLenAfterKeepsTheCallsErrorFirst(t *testing.T) {
	if n, err := lenAfter(math.MaxInt, nil, "n"); err != nil || n != math.MaxInt {
		t.Errorf("lenAfter(MaxInt) = %d, %v", n, err)
	}
	callErr := invalid("the call failed")
	if n, err := lenAfter(7, callErr, "n"); n != 0 || err != callErr {
		t.Errorf("lenAfter after a failed call = %d, %v; want 0 and the call's error", n, err)
	}
	_, err := lenAfter(math.MaxUint64, nil, "n")
	wantStatus(t, "lenAfter(2^64-1)", err, ErrUnsupported)
}
