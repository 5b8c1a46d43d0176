package wush

// Tests against the installed libwush (run by tests/bindings/run_bindings.sh). Oracles are
// independent of the code under test: MXFP4 bytes from the header's rules written out here, a
// decoder of all formats written here, and float64 products computed here.

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var e2m1 = [8]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6}

func e2m1Code(a float64) uint8 { // nearest grid index, ties to the even index
	best := 0
	for i := 1; i < 8; i++ {
		d, db := math.Abs(a-e2m1[i]), math.Abs(a-e2m1[best])
		if d < db || (d == db && i%2 == 0) {
			best = i
		}
	}
	return uint8(best)
}

// mxfp4Group: e = floor(log2(amax)), code = RNE(x * 3 / 2^e) (the header's MXFP4 rule).
func mxfp4Group(x []float32) (uint8, []uint8) {
	amax := 0.0
	for _, v := range x {
		amax = math.Max(amax, math.Abs(float64(v)))
	}
	codes := make([]uint8, len(x))
	e := 0
	if amax > 0 {
		e = int(math.Floor(math.Log2(amax)))
	}
	for i, v := range x {
		if amax > 0 {
			codes[i] = e2m1Code(math.Abs(float64(v) * 3 / math.Ldexp(1, e)))
		}
		if math.Signbit(float64(v)) {
			codes[i] |= 8
		}
	}
	if amax == 0 {
		return 0, codes
	}
	return uint8(e + 127), codes
}

func nibble(codes []byte, i int) uint8 { return (codes[i/2] >> (4 * (i % 2))) & 15 }

func e2m1Value(c uint8) float64 {
	if c&8 != 0 {
		return -e2m1[c&7]
	}
	return e2m1[c&7]
}

func e4m3Value(b uint8) float64 {
	e, m := int((b>>3)&15), float64(b&7)
	v := (1 + m/8) * math.Ldexp(1, e-7)
	if e == 0 {
		v = m / 8 * math.Ldexp(1, -6)
	}
	if b&0x80 != 0 {
		return -v
	}
	return v
}

// decode is a decoder of every format written from the header's table.
func decode(f Format, codes, scales []byte, n int) []float64 {
	g := 32
	if f == NVFP4 {
		g = 16
	}
	out := make([]float64, n)
	for i := range out {
		c, grp := nibble(codes, i), i/g
		switch f {
		case MXFP4:
			out[i] = e2m1Value(c) * math.Ldexp(1, int(scales[grp])-127) / 3
		case MXFP4OCP:
			out[i] = e2m1Value(c) * math.Ldexp(1, int(scales[grp])-127)
		case NVFP4:
			out[i] = e2m1Value(c) * e4m3Value(scales[grp]) / 10
		case INT4:
			q := int(c)
			if q >= 8 {
				q -= 16
			}
			s := math.Float32frombits((uint32(scales[2*grp]) | uint32(scales[2*grp+1])<<8) << 16)
			out[i] = (float64(q) + 0.5) * float64(s)
		}
	}
	return out
}

func sample(n int, seed uint32) []float32 {
	s := seed*2654435761 + 1
	x := make([]float32, n)
	for i := range x {
		s = s*1664525 + 1013904223
		u := float32(s>>8)/float32(1<<24) - 0.5
		switch {
		case i%29 == 0:
			x[i] = 0
		case i%37 == 0:
			x[i] = u * 40
		default:
			x[i] = u * 3
		}
	}
	return x
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func cpu(t *testing.T) *Context {
	ctx, err := NewCPUContext()
	must(t, err)
	t.Cleanup(ctx.Close)
	return ctx
}

func statusOf(err error) Status {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return OK
}

func TestMXFP4RowsMatchTheHeaderRules(t *testing.T) {
	ctx := cpu(t)
	rows, dIn := 4, 96
	x := sample(rows*dIn, 1)
	x[1] = float32(math.Copysign(0, -1))
	for i := 2 * dIn; i < 2*dIn+32; i++ {
		x[i] = 0
	}
	codes, scales, err := ctx.QuantizeRows(MXFP4, x, F32, dIn)
	must(t, err)
	for g := 0; g < rows*dIn/32; g++ {
		s, c := mxfp4Group(x[g*32 : (g+1)*32])
		if scales[g] != s {
			t.Errorf("group %d: scale %d, want %d", g, scales[g], s)
		}
		for k, want := range c {
			if got := nibble(codes, g*32+k); got != want {
				t.Errorf("group %d code %d (x=%v): %d, want %d", g, k, x[g*32+k], got, want)
			}
		}
	}
	y, err := ctx.DequantizeRows(MXFP4, codes, scales, rows, dIn)
	must(t, err)
	want := decode(MXFP4, codes, scales, rows*dIn)
	for i := range y {
		if y[i] != float32(want[i]) {
			t.Fatalf("decoded element %d: %v, want %v", i, y[i], want[i])
		}
	}
}

func TestEveryFormatDecodesAsItsTableSays(t *testing.T) {
	ctx := cpu(t)
	rows, dIn := 3, 64
	x := sample(rows*dIn, 2)
	for _, f := range []Format{MXFP4, MXFP4OCP, NVFP4, INT4} {
		codes, scales, err := ctx.QuantizeRows(f, x, F32, dIn)
		must(t, err)
		y, err := ctx.DequantizeRows(f, codes, scales, rows, dIn)
		must(t, err)
		want := decode(f, codes, scales, rows*dIn)
		num, den := 0.0, 0.0
		for i := range y {
			if math.Abs(float64(y[i])-want[i]) > 1e-6*math.Abs(want[i]) {
				t.Fatalf("%s element %d: %v, want %v", f.Name(), i, y[i], want[i])
			}
			num += math.Pow(float64(y[i]-x[i]), 2)
			den += float64(x[i]) * float64(x[i])
		}
		// This outlier-heavy sample loses 5-25% (INT4 clips); a mixed-up layout loses all.
		if num/den > 0.4 {
			t.Errorf("%s: round-trip relative error %v", f.Name(), num/den)
		}
	}
	// bf16 input as []Half: the same bytes as its float32 values.
	xb := make([]Half, 64)
	xf := make([]float32, 64)
	for i, v := range sample(64, 3) {
		xb[i] = BF16FromFloat32(v)
		xf[i] = math.Float32frombits(uint32(xb[i]) << 16)
	}
	c1, s1, err := ctx.QuantizeRows(NVFP4, xb, BF16, 64)
	must(t, err)
	c2, s2, err := ctx.QuantizeRows(NVFP4, xf, F32, 64)
	must(t, err)
	if string(c1) != string(c2) || string(s1) != string(s2) {
		t.Error("bf16 and float32 inputs of equal values quantize differently")
	}
}

func TestQueries(t *testing.T) {
	if f, err := FormatFromName("NVFP4"); err != nil || f != NVFP4 {
		t.Error("FormatFromName", f, err)
	}
	if g, _ := NVFP4.GroupSize(); g != 16 {
		t.Error("NVFP4 group", g)
	}
	if b, _ := INT4.ScaleBytes(); b != 2 {
		t.Error("INT4 scale bytes", b)
	}
	if k, err := TransformKindFromName("hadamard"); err != nil || k != Hadamard || WUSH.Name() != "wush" {
		t.Error("transform names", k, err)
	}
	if Version()/10000 != HeaderVersion/10000 || CheckVersion() != nil {
		t.Error("version", Version(), HeaderVersion)
	}
	if VersionString() != PackageVersion && Version() == HeaderVersion {
		t.Error("version string", VersionString())
	}
	if o, i, err := ExampleLayerShape("small_256x512"); err != nil || o != 512 || i != 256 {
		t.Error("example shape", o, i, err)
	}
	if !ISAScalar.Supported() {
		t.Error("scalar ISA unsupported")
	}
}

func TestBadInputIsAnErrorWithTheLibraryMessage(t *testing.T) {
	ctx := cpu(t)
	_, _, err := ctx.QuantizeRows(MXFP4, make([]float32, 40), F32, 20)
	if statusOf(err) != ErrInvalidArgument || !strings.HasPrefix(err.Error(), "WUSH_ERR_INVALID_ARGUMENT: ") ||
		len(err.(*Error).Message) == 0 {
		t.Errorf("d_in 20: %v", err)
	}
	err = ctx.QuantizeRowsInto(MXFP4, make([]float32, 64), F32, 32, make([]byte, 31), make([]byte, 2))
	if statusOf(err) != ErrBufferTooSmall {
		t.Errorf("short buffer: %v", err)
	}
	x := make([]float32, 64)
	x[40] = float32(math.NaN())
	_, _, err = ctx.QuantizeRows(MXFP4, x, F32, 32)
	if statusOf(err) != ErrNonFinite || !strings.Contains(err.Error(), "8") {
		t.Errorf("NaN: %v", err)
	}
	_, err = OpenCheckpoint(filepath.Join(t.TempDir(), "does-not-exist.safetensors"))
	if statusOf(err) != ErrIO || !strings.Contains(err.Error(), "does-not-exist") {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "corrupt.safetensors")
	must(t, os.WriteFile(bad, []byte("\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}"), 0o644))
	if _, err = OpenCheckpoint(bad); statusOf(err) != ErrCorruptFile {
		t.Errorf("corrupt file: %v", err)
	}
}

// The messages are per OS thread; many goroutines failing differently at once must each get
// their own message.
func TestErrorMessagesStayWithTheirCall(t *testing.T) {
	ctx := cpu(t)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				if g%2 == 0 {
					_, _, err := ctx.QuantizeRows(MXFP4, make([]float32, 40), F32, 20)
					if statusOf(err) != ErrInvalidArgument {
						t.Errorf("goroutine %d: %v", g, err)
					}
				} else {
					_, err := OpenCheckpoint("/nonexistent/dir/ck.safetensors")
					if statusOf(err) != ErrIO || !strings.Contains(err.Error(), "ck.safetensors") {
						t.Errorf("goroutine %d: %v", g, err)
					}
				}
			}
		}(g)
	}
	wg.Wait()
}

type layer struct {
	weight, heldout []float32
	dOut, dIn       int
	cal             *Calibrator
}

func calibrated(t *testing.T, ctx *Context) layer {
	l, err := GenerateExampleLayer("small_256x512", 7, 512, 64)
	must(t, err)
	cal, err := NewCalibrator(l.DIn, 32, MomentsBlockDiagonal)
	must(t, err)
	must(t, cal.Add(ctx, l.Calibration[:256*l.DIn]))
	other, err := NewCalibrator(l.DIn, 32, MomentsBlockDiagonal)
	must(t, err)
	must(t, other.Add(ctx, l.Calibration[256*l.DIn:]))
	must(t, cal.Merge(other))
	other.Close()
	if n, _ := cal.TokenCount(); n != 512 {
		t.Fatal("token count", n)
	}
	// Block 0's moment entry (0, 1) against a float64 sum written here.
	m, err := cal.SecondMoment(0)
	must(t, err)
	s := 0.0
	for tk := 0; tk < 512; tk++ {
		s += float64(l.Calibration[tk*256]) * float64(l.Calibration[tk*256+1])
	}
	if math.Abs(m[1]-s/512) > 1e-9*math.Abs(s/512) {
		t.Fatalf("moment %v, want %v", m[1], s/512)
	}
	return layer{l.Weight, l.Heldout, l.DOut, l.DIn, cal}
}

func TestCalibrateBuildPrequantizeWriteOpen(t *testing.T) {
	ctx := cpu(t)
	l := calibrated(t, ctx)
	opts, err := NewOptions()
	must(t, err)
	must(t, opts.SetDouble(OptionDamping, 0.02))
	tr, err := BuildTransform(ctx, l.cal, l.weight, l.dOut, WUSH, opts)
	must(t, err)
	q, err := NewQWeight(ctx, tr, MXFP4, RTN, l.weight, l.dOut, opts)
	must(t, err)
	if info, _ := q.Info(); info != (QWeightInfo{MXFP4, RTN, 512, 256}) {
		t.Error("info", info)
	}
	t2, q2, err := LayerQuantize(ctx, l.cal, WUSH, MXFP4, RTN, l.weight, l.dOut, opts)
	must(t, err)
	c1, s1, _ := q.Data()
	c2, s2, _ := q2.Data()
	if string(c1) != string(c2) || string(s1) != string(s2) {
		t.Error("LayerQuantize differs from BuildTransform + NewQWeight")
	}
	m1, _ := tr.Matrices()
	m2, _ := t2.Matrices()
	if len(m1) != 256*32 || len(m1) != len(m2) {
		t.Fatal("matrices", len(m1), len(m2))
	}
	h, err := FixedTransform(Hadamard, 256, 32, nil)
	must(t, err)
	qh, err := NewQWeight(ctx, h, MXFP4, RTN, l.weight, l.dOut, nil)
	must(t, err)
	loss, err := ctx.LayerLoss(tr, q, l.weight, l.heldout, false)
	must(t, err)
	lossH, err := ctx.LayerLoss(h, qh, l.weight, l.heldout, false)
	must(t, err)
	if !(loss > 0 && loss < lossH) {
		t.Errorf("WUSH loss %v not below Hadamard's %v", loss, lossH)
	}

	path := filepath.Join(t.TempDir(), "flow.safetensors")
	w, err := NewCheckpointWriter()
	must(t, err)
	must(t, w.AddLayer("model.fc", tr, q))
	must(t, w.AddLayer("model.fc_h", h, qh))
	if statusOf(w.AddLayer("model.fc", tr, q)) != ErrInvalidArgument {
		t.Error("a repeated layer name was accepted")
	}
	must(t, w.Write(path, nil))
	w.Close()
	ck, err := OpenCheckpoint(path)
	must(t, err)
	defer ck.Close()
	names, err := ck.LayerNames()
	must(t, err)
	if strings.Join(names, ",") != "model.fc,model.fc_h" {
		t.Error("names", names)
	}
	lt, lq, err := ck.LoadLayer("model.fc")
	must(t, err)
	c3, s3, _ := lq.Data()
	lm, _ := lt.Matrices()
	if string(c3) != string(c1) || string(s3) != string(s1) {
		t.Error("loaded qweight differs")
	}
	for i := range lm {
		if lm[i] != m1[i] {
			t.Fatal("loaded transform differs at", i)
		}
	}
	if _, _, err := ck.LoadLayer("nope"); statusOf(err) != ErrNotFound {
		t.Error("missing layer:", err)
	}
	f, err := OpenTensorFile(path)
	must(t, err)
	defer f.Close()
	ct, ok, err := f.Find("model.fc.codes")
	must(t, err)
	if !ok || ct.DType != "U8" || len(ct.Shape) != 2 || ct.Shape[0] != 512 || ct.Shape[1] != 128 || string(ct.Data) != string(c1) {
		t.Error("codes tensor", ok, ct.DType, ct.Shape)
	}
	if _, ok, err := f.Find("missing"); ok || err != nil {
		t.Error("missing tensor", ok, err)
	}
}

func TestPreparedLayerEqualsPerCallAndFloat64(t *testing.T) {
	ctx := cpu(t)
	must(t, ctx.SetParameter(NumThreads, 2))
	l := calibrated(t, ctx)
	tr, q, err := LayerQuantize(ctx, l.cal, WUSH, MXFP4, RTN, l.weight, l.dOut, nil)
	must(t, err)
	lin, err := NewLinear(ctx, tr, q)
	must(t, err)
	defer lin.Close()
	x := l.heldout
	n := len(x) / l.dIn
	y, err := lin.Forward(x)
	must(t, err)
	yc, err := ctx.LinearForward(tr, q, x)
	must(t, err)
	for i := range y {
		if y[i] != yc[i] {
			t.Fatalf("prepared %v != per-call %v at %d", y[i], yc[i], i)
		}
	}
	cb, sb, _ := MXFP4.BufferSizes(n, l.dIn)
	ac, as := make([]byte, cb), make([]byte, sb)
	must(t, lin.Quantize(x, ac, as))
	ac2, as2 := make([]byte, cb), make([]byte, sb)
	must(t, ctx.QuantizeActivations(tr, MXFP4, x, ac2, as2))
	if string(ac) != string(ac2) || string(as) != string(as2) {
		t.Error("Linear.Quantize differs from QuantizeActivations")
	}
	yg := make([]float32, n*l.dOut)
	must(t, ctx.Gemm(q, ac, as, n, yg))
	// float64 product of the decoded operands: the header promises about 1e-6 (Frobenius).
	a := decode(MXFP4, ac, as, n*l.dIn)
	wc, ws, _ := q.Data()
	wd := decode(MXFP4, wc, ws, l.dOut*l.dIn)
	num, den := 0.0, 0.0
	for tk := 0; tk < n; tk++ {
		for o := 0; o < l.dOut; o++ {
			s := 0.0
			for k := 0; k < l.dIn; k++ {
				s += a[tk*l.dIn+k] * wd[o*l.dIn+k]
			}
			num += math.Pow(float64(y[tk*l.dOut+o])-s, 2)
			den += s * s
			if yg[tk*l.dOut+o] != y[tk*l.dOut+o] {
				t.Fatal("Gemm differs from Forward")
			}
		}
	}
	if math.Sqrt(num/den) > 1e-5 {
		t.Errorf("relative error vs float64 %v", math.Sqrt(num/den))
	}
	if err := lin.Run(x, y, make([]byte, 1)); statusOf(err) != ErrBufferTooSmall {
		t.Error("small workspace:", err)
	}
	// Shared between goroutines: the same output.
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			y2, err := lin.Forward(x)
			if err != nil || len(y2) != len(y) || y2[7] != y[7] || y2[len(y)-1] != y[len(y)-1] {
				t.Error("concurrent forward differs", err)
			}
		}()
	}
	wg.Wait()
}

func TestHandlesCloseInAnyOrder(t *testing.T) {
	ctx, err := NewCPUContext()
	must(t, err)
	l := calibrated(t, ctx)
	tr, q, err := LayerQuantize(ctx, l.cal, WUSH, MXFP4, RTN, l.weight, l.dOut, nil)
	must(t, err)
	l.cal.Close()
	lin, err := NewLinear(ctx, tr, q)
	must(t, err)
	want, err := lin.Forward(l.heldout)
	must(t, err)
	path := filepath.Join(t.TempDir(), "order.safetensors")
	w, _ := NewCheckpointWriter()
	must(t, w.AddLayer("fc", tr, q))
	must(t, w.Write(path, nil))
	tr.Close() // a prepared layer keeps what it needs
	q.Close()
	w.Close()
	ctx.Close() // deferred until its last layer is closed
	got, err := lin.Forward(l.heldout)
	must(t, err)
	if got[3] != want[3] {
		t.Error("forward changed after closing its inputs")
	}
	lin.Close()
	lin.Close() // twice is harmless
	if _, err := lin.Forward(l.heldout); statusOf(err) != ErrInvalidArgument {
		t.Error("closed layer:", err)
	}
	if _, _, err := ctx.QuantizeRows(MXFP4, make([]float32, 32), F32, 32); err != errClosed {
		t.Error("closed context:", err)
	}

	ctx2 := cpu(t)
	ck, err := OpenCheckpoint(path)
	must(t, err)
	lt, lq, err := ck.LoadLayer("fc")
	must(t, err)
	ck.Close() // loaded qweights keep the file mapped
	lin2, err := NewLinear(ctx2, lt, lq)
	must(t, err)
	lt.Close()
	lq.Close()
	got, err = lin2.Forward(l.heldout)
	must(t, err)
	if got[3] != want[3] {
		t.Error("checkpoint round trip changed the output")
	}
	lin2 = nil
	runtime.GC() // finalizers release what was not closed
}

func TestProgressCanCancel(t *testing.T) {
	ctx := cpu(t)
	l := calibrated(t, ctx)
	opts, err := NewOptions()
	must(t, err)
	defer opts.Close()
	calls := 0
	var mu sync.Mutex
	must(t, opts.SetProgress(func(float64) bool { mu.Lock(); calls++; mu.Unlock(); return false }))
	if _, err := BuildTransform(ctx, l.cal, l.weight, l.dOut, WUSH, opts); statusOf(err) != ErrCancelled || calls == 0 {
		t.Error("cancel:", err, calls)
	}
	must(t, opts.SetProgress(nil))
	_, err = BuildTransform(ctx, l.cal, l.weight, l.dOut, WUSH, opts)
	must(t, err)
}

func TestCalibratorStateRoundTrips(t *testing.T) {
	ctx := cpu(t)
	l := calibrated(t, ctx)
	st, err := l.cal.ExportState()
	must(t, err)
	c2, err := NewCalibrator(256, 32, MomentsBlockDiagonal)
	must(t, err)
	must(t, c2.ImportState(st))
	if n, _ := c2.TokenCount(); n != 512 {
		t.Error("imported token count", n)
	}
	if statusOf(c2.ImportState(st[1:])) != ErrInvalidArgument {
		t.Error("a short state was accepted")
	}
}

func TestCUDAContextRefusesSlicesOrIsUnsupported(t *testing.T) {
	ctx, err := NewContext(CUDA, 0)
	if err != nil {
		if statusOf(err) != ErrUnsupported {
			t.Error(err)
		}
		return
	}
	defer ctx.Close()
	tr, _ := FixedTransform(Hadamard, 64, 32, nil)
	if err := ctx.QuantizeActivations(tr, MXFP4, make([]float32, 64), make([]byte, 32), make([]byte, 2)); statusOf(err) != ErrInvalidArgument {
		t.Error(err)
	}
}

// SampleSize follows the rule wush.h states: 0 without the search; the search's tokens, doubled
// while the guard's default hold-out is on.
func TestSampleSizeFollowsTheSearchAndItsGuard(t *testing.T) {
	o, err := NewOptions()
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	want := func(n int) {
		t.Helper()
		if got, err := o.SampleSize(); err != nil || got != n {
			t.Fatalf("SampleSize = %d, %v; want %d", got, err, n)
		}
	}
	want(0)
	if o.SetInt(OptionSearch, 1) != nil || o.SetInt(OptionSearchTokens, 96) != nil {
		t.Fatal("setting the search")
	}
	want(192)
	if o.SetInt(OptionSearchGuard, 0) != nil {
		t.Fatal("turning the guard off")
	}
	want(96)
	if o.SetInt(OptionSearchGuard, 2) == nil {
		t.Fatal("guard 2 accepted")
	}
}

// ---- element types: Float16 and BFloat16 against their definitions ------------------------------

// f16Value decodes binary16 bits by the format's definition (IEEE 754), in float64.
func f16Value(h uint16) float64 {
	e, m := int(h>>10)&31, float64(h&1023)
	v := (1 + m/1024) * math.Ldexp(1, e-15)
	switch e {
	case 0:
		v = m / 1024 * math.Ldexp(1, -14)
	case 31:
		v = math.Inf(1)
		if m != 0 {
			v = math.NaN()
		}
	}
	if h&0x8000 != 0 {
		return -v
	}
	return v
}

// nearestOf reports whether got is a correctly rounded (to nearest, ties to even bits) choice of
// x among the neighbours lo and hi (consecutive values with bit patterns bl and bh = bl + 1).
func nearestOf(x, lo, hi float64, bl, got uint16) bool {
	dl, dh := x-lo, hi-x
	switch {
	case dl < dh:
		return got == bl
	case dh < dl:
		return got == bl+1
	}
	return got == bl+bl&1 // the even one
}

func TestFloat16AgainstItsDefinition(t *testing.T) {
	for b := 0; b < 1<<16; b++ {
		h := uint16(b)
		want, got := f16Value(h), float64(Float16(h).Float32())
		if !(got == want || math.IsNaN(want) && math.IsNaN(got)) || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("Float16(%#04x).Float32() = %v, want %v", h, got, want)
		}
		if math.IsNaN(want) {
			if r := Float16FromFloat32(float32(want)); !math.IsNaN(f16Value(uint16(r))) {
				t.Fatalf("NaN encodes to %#04x", r)
			}
			continue
		}
		if r := Float16FromFloat32(float32(want)); uint16(r) != h {
			t.Fatalf("Float16FromFloat32(%v) = %#04x, want %#04x", want, r, h)
		}
		// Between h and the next value up in magnitude: the midpoint (exact in float32) rounds to
		// the even one, one float32 step either side to the nearer one.
		if h&0x7fff >= 0x7c00 {
			continue
		}
		lo, hi := math.Abs(want), math.Abs(f16Value(h+1))
		if hi == math.Inf(1) {
			hi = 65536 // where the rounding to +-Inf starts: the next binade's first value
		}
		mid := float32((lo + hi) / 2)
		for _, x := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, float32(math.Inf(1)))} {
			sx := x
			if h&0x8000 != 0 {
				sx = -x
			}
			r := uint16(Float16FromFloat32(sx)) & 0x7fff
			if !nearestOf(float64(x), lo, hi, h&0x7fff, r) {
				t.Fatalf("Float16FromFloat32(%v) = %#04x, not the nearest of %#04x, %#04x", sx, r, h&0x7fff, h&0x7fff+1)
			}
		}
	}
	if Float16FromFloat32(1e-9) != 0 || Float16FromFloat32(-1e6) != 0xfc00 {
		t.Error("underflow to +0 / overflow to -Inf")
	}
}

func TestBFloat16AgainstItsDefinition(t *testing.T) {
	for i, x := range sample(20000, 3) {
		x *= float32(math.Ldexp(1, i%60-30))
		b := BFloat16FromFloat32(x)
		if got, want := float64(b.Float32()), float64(math.Float32frombits(uint32(b)<<16)); got != want {
			t.Fatalf("Float32 of %#04x: %v, want %v", b, got, want)
		}
		mag := uint16(b) & 0x7fff
		// The two bfloat16 neighbours of |x| by their definition (the upper 16 bits of a binary32).
		bl := uint16(math.Float32bits(float32(math.Abs(float64(x)))) >> 16)
		lo, hi := float64(math.Float32frombits(uint32(bl)<<16)), float64(math.Float32frombits(uint32(bl+1)<<16))
		if !nearestOf(math.Abs(float64(x)), lo, hi, bl, mag) || (uint16(b)&0x8000 != 0) != math.Signbit(float64(x)) {
			t.Fatalf("BFloat16FromFloat32(%v) = %#04x, not the nearest of %#04x, %#04x", x, b, bl, bl+1)
		}
	}
	if DTypeOf[float32]() != F32 || DTypeOf[Float16]() != F16 || DTypeOf[BFloat16]() != BF16 {
		t.Error("DTypeOf")
	}
}

// ---- the runtime in every dtype the header allows ------------------------------------------------

func toF16(x []float32) ([]Float16, []float32) {
	h, back := make([]Float16, len(x)), make([]float32, len(x))
	for i, v := range x {
		h[i] = Float16FromFloat32(v)
		back[i] = float32(f16Value(uint16(h[i]))) // the rounded value, decoded by the test's own rule
	}
	return h, back
}

func toBF16(x []float32) ([]BFloat16, []float32) {
	b, back := make([]BFloat16, len(x)), make([]float32, len(x))
	for i, v := range x {
		b[i] = BFloat16FromFloat32(v)
		back[i] = math.Float32frombits(uint32(b[i]) << 16)
	}
	return b, back
}

// checkBF16Output: each BF16 output is the float32 output (y, computed on the same inputs) rounded
// to nearest even, as the header says.
func checkBF16Output(t *testing.T, what string, yb []BFloat16, y []float32) {
	t.Helper()
	if len(yb) != len(y) {
		t.Fatalf("%s: %d outputs, want %d", what, len(yb), len(y))
	}
	for i := range y {
		a := math.Abs(float64(y[i]))
		bl := uint16(math.Float32bits(float32(a)) >> 16)
		lo, hi := float64(math.Float32frombits(uint32(bl)<<16)), float64(math.Float32frombits(uint32(bl+1)<<16))
		if !nearestOf(a, lo, hi, bl, uint16(yb[i])&0x7fff) || (uint16(yb[i])&0x8000 != 0) != math.Signbit(float64(y[i])) {
			t.Fatalf("%s: output %d is %#04x, not %v rounded to bfloat16", what, i, yb[i], y[i])
		}
	}
}

func equalF32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, want %v", what, i, got[i], want[i])
		}
	}
}

// Float16 and BFloat16 inputs give what float32 inputs holding the same (rounded) values give, and
// BFloat16 outputs are the float32 outputs rounded; the float32 path itself is checked against
// float64 in TestPreparedLayerEqualsPerCallAndFloat64.
func TestRuntimeTakesEveryDType(t *testing.T) {
	ctx := cpu(t)
	l := calibrated(t, ctx)
	tr, q, err := LayerQuantize(ctx, l.cal, WUSH, MXFP4, RTN, l.weight, l.dOut, nil)
	must(t, err)
	lin, err := NewLinear(ctx, tr, q)
	must(t, err)
	defer lin.Close()
	n := len(l.heldout) / l.dIn
	x16, x16f := toF16(l.heldout)
	xb, xbf := toBF16(l.heldout)
	cb, sb, _ := MXFP4.BufferSizes(n, l.dIn)
	wb, err := lin.WorkspaceSize(n)
	must(t, err)

	// Prepared layer: forward, run, quantize.
	y, err := lin.Forward(l.heldout)
	must(t, err)
	y16f, err := lin.Forward(x16f)
	must(t, err)
	ybf, err := lin.Forward(xbf)
	must(t, err)
	got, err := LinearForward[float32](lin, x16)
	must(t, err)
	equalF32(t, "LinearForward(Float16)", got, y16f)
	got, err = LinearForward[float32](lin, xb)
	must(t, err)
	equalF32(t, "LinearForward(BFloat16)", got, ybf)
	yb, err := LinearForward[BFloat16](lin, l.heldout)
	must(t, err)
	checkBF16Output(t, "LinearForward[BFloat16](float32)", yb, y)
	yb = make([]BFloat16, n*l.dOut)
	must(t, LinearRun(lin, x16, yb, make([]byte, wb)))
	checkBF16Output(t, "LinearRun(Float16 -> BFloat16)", yb, y16f)
	if err := LinearRun(lin, xb, yb[:len(yb)-1], make([]byte, wb)); statusOf(err) != ErrBufferTooSmall {
		t.Error("a short BFloat16 output:", err)
	}
	if err := LinearRun(lin, x16[:l.dIn+1], yb, make([]byte, wb)); statusOf(err) != ErrInvalidArgument {
		t.Error("x not whole rows:", err)
	}
	for _, tc := range []struct {
		name string
		run  func(codes, scales []byte) error
		ref  []float32
	}{
		{"Float16", func(c, s []byte) error { return LinearQuantize(lin, x16, c, s) }, x16f},
		{"BFloat16", func(c, s []byte) error { return LinearQuantize(lin, xb, c, s) }, xbf},
	} {
		c, s := make([]byte, cb), make([]byte, sb)
		c2, s2 := make([]byte, cb), make([]byte, sb)
		must(t, tc.run(c, s))
		must(t, lin.Quantize(tc.ref, c2, s2))
		if string(c) != string(c2) || string(s) != string(s2) {
			t.Errorf("LinearQuantize(%s) differs from float32 activations of the same values", tc.name)
		}
		c3, s3 := make([]byte, cb), make([]byte, sb)
		switch tc.name {
		case "Float16":
			must(t, ContextQuantizeActivations(ctx, tr, MXFP4, x16, c3, s3))
		default:
			must(t, ContextQuantizeActivations(ctx, tr, MXFP4, xb, c3, s3))
		}
		if string(c3) != string(c2) || string(s3) != string(s2) {
			t.Errorf("ContextQuantizeActivations(%s) differs from float32 activations of the same values", tc.name)
		}
	}

	// Per-call functions: GEMM and forward with BFloat16 outputs, forward with half inputs.
	ac, as := make([]byte, cb), make([]byte, sb)
	must(t, ctx.QuantizeActivations(tr, MXFP4, l.heldout, ac, as))
	yg := make([]float32, n*l.dOut)
	must(t, ctx.Gemm(q, ac, as, n, yg))
	ygb := make([]BFloat16, n*l.dOut)
	must(t, ContextGemm(ctx, q, ac, as, n, ygb))
	checkBF16Output(t, "ContextGemm[BFloat16]", ygb, yg)
	yfb, err := ContextLinearForward[BFloat16](ctx, tr, q, x16)
	must(t, err)
	checkBF16Output(t, "ContextLinearForward(Float16 -> BFloat16)", yfb, y16f)
	yf, err := ContextLinearForward[float32](ctx, tr, q, xb)
	must(t, err)
	equalF32(t, "ContextLinearForward(BFloat16)", yf, ybf)

	// Losses with BFloat16 weights and Float16 tokens, against float32 holding the same values.
	wbits, wf := toBF16(l.weight)
	for _, runtimePath := range []bool{false, true} {
		want, err := ctx.LayerLoss(tr, q, wf, x16f, runtimePath)
		must(t, err)
		got, err := ContextLayerLoss(ctx, tr, q, wbits, x16, runtimePath)
		must(t, err)
		if got != want || !(want > 0) {
			t.Errorf("ContextLayerLoss(BFloat16, Float16, runtime %v) = %v, want %v", runtimePath, got, want)
		}
	}
}

// Calibration and the weight side take half-precision inputs too: the same results as float32
// holding the same values.
func TestBuildersTakeEveryDType(t *testing.T) {
	ctx := cpu(t)
	l, err := GenerateExampleLayer("small_256x512", 7, 256, 0)
	must(t, err)
	xb, xbf := toBF16(l.Calibration)
	w16, w16f := toF16(l.Weight)
	calH, err := NewCalibrator(l.DIn, 32, MomentsBlockDiagonal)
	must(t, err)
	defer calH.Close()
	calF, err := NewCalibrator(l.DIn, 32, MomentsBlockDiagonal)
	must(t, err)
	defer calF.Close()
	must(t, CalibratorAdd(calH, ctx, xb))
	must(t, calF.Add(ctx, xbf))
	must(t, calH.SetValidationSize(32))
	must(t, calF.SetValidationSize(32))
	must(t, CalibratorAddValidation(calH, ctx, xb[:32*l.DIn]))
	must(t, calF.AddValidation(ctx, xbf[:32*l.DIn]))
	if a, b := mustCount(t, calH), mustCount(t, calF); a != b || a != 32 {
		t.Errorf("validation counts %d, %d", a, b)
	}
	for b := 0; b < l.DIn/32; b++ {
		mh, err := calH.SecondMoment(b)
		must(t, err)
		mf, err := calF.SecondMoment(b)
		must(t, err)
		for i := range mh {
			if math.Abs(mh[i]-mf[i]) > 1e-12*(1+math.Abs(mf[i])) {
				t.Fatalf("block %d moment %d: %v from BFloat16, %v from float32", b, i, mh[i], mf[i])
			}
		}
	}
	trH, err := BuildTransform(ctx, calF, w16, l.DOut, WUSH, nil)
	must(t, err)
	trF, err := BuildTransform(ctx, calF, w16f, l.DOut, WUSH, nil)
	must(t, err)
	mH, _ := trH.Matrices()
	mF, _ := trF.Matrices()
	equalF32(t, "BuildTransform(Float16)", mH, mF)
	qH, err := NewQWeight(ctx, trF, MXFP4, RTN, w16, l.DOut, nil)
	must(t, err)
	qF, err := NewQWeight(ctx, trF, MXFP4, RTN, w16f, l.DOut, nil)
	must(t, err)
	c1, s1, _ := qH.Data()
	c2, s2, _ := qF.Data()
	if string(c1) != string(c2) || string(s1) != string(s2) || len(c1) == 0 {
		t.Error("NewQWeight(Float16) differs from float32 weights of the same values")
	}
	_, qL, err := LayerQuantize(ctx, calF, WUSH, MXFP4, RTN, w16, l.DOut, nil)
	must(t, err)
	c3, s3, _ := qL.Data()
	if string(c3) != string(c2) || string(s3) != string(s2) {
		t.Error("LayerQuantize(Float16) differs from float32 weights of the same values")
	}
}

func mustCount(t *testing.T, c *Calibrator) int {
	t.Helper()
	n, err := c.ValidationCount()
	must(t, err)
	return n
}
