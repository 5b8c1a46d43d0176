package wush

// Sizes between the library and Go (sizes.go): counts at and past 2^31, 2^32 and math.MaxInt
// come back exact or as an error, never truncated, wrapped or as a panic.

import (
	"errors"
	"math"
	"math/bits"
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
		if err := expectElems(64, int(uint64(1)<<58+1), 64, "weight"); err == nil {
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
