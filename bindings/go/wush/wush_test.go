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
	// The split run (quantize, then the GEMM alone) gives Forward's bytes, and names its kernels.
	if k, err := lin.LastKernels(); err != nil || !strings.HasPrefix(k, "cpu.quantize.") {
		t.Errorf("LastKernels after Quantize: %q %v", k, err)
	}
	ys := make([]float32, n*l.dOut)
	wsb, err := lin.WorkspaceSize(n)
	must(t, err)
	must(t, LinearRunQuantized(lin, ac, as, n, ys, make([]byte, wsb)))
	for i := range y {
		if ys[i] != y[i] {
			t.Fatalf("RunQuantized %v != Forward %v at %d", ys[i], y[i], i)
		}
	}
	if k, err := lin.LastKernels(); err != nil || !strings.HasPrefix(k, "cpu.gemm.") {
		t.Errorf("LastKernels after RunQuantized: %q %v", k, err)
	}
	if err := LinearRunQuantized(lin, ac[1:], as, n, ys, make([]byte, wsb)); statusOf(err) != ErrBufferTooSmall {
		t.Error("short codes:", err)
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

// ---- names, transform specs, the per-layer guard, checkpoint open modes --------------------------
//
// Oracles: the spellings the header documents, written out here; the library's messages, which
// start with the C function's name (the package's own messages never do); the guard's numbers
// recomputed from candidate layers built separately without any guard, scored with LayerLoss on
// the held-out tokens (one token at a time for the paired statistics), and the guard's rule
// (wush.h, WUSH_OPTION_SEARCH_GUARD) written again here.

// libraryError: err is an *Error with ErrInvalidArgument whose message is the library's for a
// call of function fn about `name`.
func libraryError(t *testing.T, err error, fn, name string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.HasPrefix(e.Message, fn+": ") ||
		!strings.Contains(e.Message, "\""+name+"\"") {
		t.Errorf("%s(%q): want ErrInvalidArgument with the library's message naming it, got %v", fn, name, err)
	}
}

func TestMethodNamesAreTheHeadersAndRoundTrip(t *testing.T) {
	// wush.h: wush_method_name returns "rtn" or "gptq".
	if RTN.Name() != "rtn" || GPTQ.Name() != "gptq" || GPTQ.String() != "gptq" {
		t.Errorf("names %q %q", RTN.Name(), GPTQ.Name())
	}
	for _, m := range []Method{RTN, GPTQ} {
		for _, s := range []string{m.Name(), strings.ToUpper(m.Name())} {
			if got, err := MethodFromName(s); err != nil || got != m {
				t.Errorf("MethodFromName(%q) = %v, %v", s, got, err)
			}
		}
	}
	if got, err := MethodFromName("GpTq"); err != nil || got != GPTQ {
		t.Errorf("GpTq: %v %v", got, err)
	}
	for _, bad := range []string{"awq", "rtn ", "gptq+s"} {
		_, err := MethodFromName(bad)
		libraryError(t, err, "wush_method_from_name", bad)
	}
	if _, err := MethodFromName(""); statusOf(err) != ErrInvalidArgument {
		t.Errorf("empty name: %v", err)
	}
}

func TestTransformSpecsParseAsTheHeaderSays(t *testing.T) {
	table := []struct {
		name   string
		kind   TransformKind
		search bool
	}{
		{"i", Identity, false}, {"h", Hadamard, false}, {"r", Random, false}, {"wus", WUS, false},
		{"wush", WUSH, false}, {"identity", Identity, false}, {"hadamard", Hadamard, false},
		{"random", Random, false}, {"WUSH", WUSH, false}, {"Hadamard", Hadamard, false},
		{"wush+s", WUSH, true}, {"wus+s", WUS, true}, {"WUSH+s", WUSH, true}, {"Wus+s", WUS, true},
	}
	for _, c := range table {
		s, err := TransformSpecFromName(c.name)
		if err != nil || s.Kind != c.kind || s.Search != c.search {
			t.Errorf("%q: %+v %v", c.name, s, err)
			continue
		}
		if back, err := TransformSpecFromName(s.String()); err != nil || back != s {
			t.Errorf("%q: %q parses to %+v %v", c.name, s.String(), back, err)
		}
	}
	if s := (TransformSpec{WUSH, true}).String(); s != "wush+s" {
		t.Errorf("String: %q", s)
	}
	// A search of a data-free kind is refused with the library's message, as are unknown names.
	for _, bad := range []string{"i+s", "h+s", "r+s", "identity+s", "hadamard+s", "random+s", "x+s", "wush+", "wush+t"} {
		_, err := TransformSpecFromName(bad)
		libraryError(t, err, "wush_transform_spec_from_name", bad)
	}
	// "the message says which": refusing "h+s" is not the unknown-name message.
	_, e1 := TransformSpecFromName("h+s")
	_, e2 := TransformSpecFromName("x+s")
	if e1 == nil || e2 == nil || strings.Replace(e1.Error(), "h+s", "x+s", 1) == e2.Error() {
		t.Errorf("h+s and x+s refused alike: %v / %v", e1, e2)
	}
}

func TestContextBackendIsTheLibrarys(t *testing.T) {
	if b := cpu(t).Backend(); b != CPU {
		t.Errorf("backend %d", b)
	}
}

const (
	gDIn  = 64
	gDOut = 48
	gNCal = 512
	gNVal = 64
)

type xorshift uint64

func newRng(seed uint64) *xorshift {
	r := xorshift(seed*0x9E3779B97F4A7C15 + 0x2545F4914F6CDD1D)
	return &r
}

func (r *xorshift) uniform() float64 {
	*r ^= *r >> 12
	*r ^= *r << 25
	*r ^= *r >> 27
	return (float64((uint64(*r)*0x2545F4914F6CDD1D)>>11) + 0.5) / 9007199254740992.0
}

func (r *xorshift) gauss() float64 {
	return math.Sqrt(-2*math.Log(r.uniform())) * math.Cos(2*math.Pi*r.uniform())
}

// guardTokens: channels j % 4 == 0 have standard deviation loud, the others quiet. Calibration
// uses (4, 0.05); "shifted" documents swap them, so a transform fitted to the calibration moments
// amplifies exactly the channels that are now loud.
func guardTokens(n int, loud, quiet float64, seed uint64) []float32 {
	r := newRng(seed)
	x := make([]float32, n*gDIn)
	for i := range x {
		s := quiet
		if i%gDIn%4 == 0 {
			s = loud
		}
		x[i] = float32(r.gauss() * s)
	}
	return x
}

func guardWeight() []float32 {
	r := newRng(7)
	w := make([]float32, gDOut*gDIn)
	for i := range w {
		w[i] = float32(r.gauss() * 0.1)
	}
	return w
}

func guardCalibrator(t *testing.T, ctx *Context, cal, val []float32) *Calibrator {
	c, err := NewCalibrator(gDIn, 32, MomentsBlockDiagonal)
	must(t, err)
	t.Cleanup(c.Close)
	must(t, c.SetSampleSize(256))
	if val != nil {
		must(t, c.SetValidationSize(len(val)/gDIn))
	}
	must(t, c.Add(ctx, cal))
	if val != nil {
		must(t, c.AddValidation(ctx, val))
	}
	return c
}

// searchedOptions: the search on, 128 tokens of the 256-token sample, guard = OptionSearchGuard.
func searchedOptions(t *testing.T, guard int64) *Options {
	o, err := NewOptions()
	must(t, err)
	t.Cleanup(o.Close)
	must(t, o.SetInt(OptionSearch, 1))
	must(t, o.SetInt(OptionSearchTokens, 128))
	must(t, o.SetInt(OptionSearchGuard, guard))
	return o
}

type builtLayer struct {
	t *Transform
	q *QWeight
}

func quantizeLayer(t *testing.T, ctx *Context, c *Calibrator, kind TransformKind, w []float32, o *Options) builtLayer {
	tr, q, err := LayerQuantize(ctx, c, kind, MXFP4, RTN, w, gDOut, o)
	must(t, err)
	t.Cleanup(tr.Close)
	t.Cleanup(q.Close)
	return builtLayer{tr, q}
}

// guardCandidates: the six candidates in GuardCandidates' order, built separately without any
// guard: the searched WUSH layer (default hold-out off, no validation tokens), plain WUSH, I, H, R,
// and plain WUSH with the shrunk moments as the header defines them (damping max(0.01, 1), the
// Hessian's 0.01).
func guardCandidates(t *testing.T, ctx *Context, c *Calibrator, w []float32) []builtLayer {
	off := searchedOptions(t, 0)
	shrunk, err := NewOptions()
	must(t, err)
	t.Cleanup(shrunk.Close)
	must(t, shrunk.SetDouble(OptionHessianDamping, 0.01))
	must(t, shrunk.SetDouble(OptionDamping, 1.0))
	out := []builtLayer{quantizeLayer(t, ctx, c, WUSH, w, off), quantizeLayer(t, ctx, c, WUSH, w, nil),
		quantizeLayer(t, ctx, c, Identity, w, nil), quantizeLayer(t, ctx, c, Hadamard, w, nil),
		quantizeLayer(t, ctx, c, Random, w, nil), quantizeLayer(t, ctx, c, WUSH, w, shrunk)}
	for i, b := range out {
		if r, err := b.t.Guard(); err != nil || r != nil {
			t.Fatalf("candidate %d built without a guard reports %+v, %v", i, r, err)
		}
	}
	return out
}

func meanOf(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// paired: mean and standard error of the paired differences base - alt.
func paired(base, alt []float64) (float64, float64) {
	d := make([]float64, len(base))
	for i := range base {
		d[i] = base[i] - alt[i]
	}
	m, v := meanOf(d), 0.0
	for _, x := range d {
		v += (x - m) * (x - m)
	}
	v /= float64(len(d) - 1)
	return m, math.Sqrt(v / float64(len(d)))
}

// ruleReplaces: the rule of wush.h, an alternative replaces the searched layer only when its loss
// is lower by more than 1% and by more than two standard errors of the per-token differences.
func ruleReplaces(searched, alt []float64) bool {
	md, se := paired(searched, alt)
	return meanOf(alt) < 0.99*meanOf(searched) && md > 2*se
}

func sameFloats32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// checkGuarded checks a guarded layer and its report against the candidates on the held-out
// tokens; it returns the kept candidate.
func checkGuarded(t *testing.T, ctx *Context, got builtLayer, cand []builtLayer, w, held []float32, source GuardSource) GuardCandidate {
	t.Helper()
	n := len(held) / gDIn
	losses := make([][]float64, len(cand))
	for i, c := range cand {
		for k := 0; k < n; k++ {
			l, err := ctx.LayerLoss(c.t, c.q, w, held[k*gDIn:(k+1)*gDIn], false)
			must(t, err)
			losses[i] = append(losses[i], l)
		}
	}
	chosen := 0
	for i := 1; i < 5; i++ {
		if ruleReplaces(losses[0], losses[i]) && meanOf(losses[i]) < meanOf(losses[chosen]) {
			chosen = i
		}
	}
	r, err := got.t.Guard()
	must(t, err)
	if r == nil {
		t.Fatal("a searched layer with held-out tokens reports no guard")
	}
	if r.Source != source || r.NTokens != n || r.Kept != GuardCandidates[chosen] || len(r.Candidates) != 6 {
		t.Fatalf("report %+v; want source %d, %d tokens, kept %d (the rule)", r, source, n, chosen)
	}
	for i, c := range GuardCandidates {
		s := r.Candidates[i]
		if one, err := got.t.GuardCandidate(c); err != nil || one != s || s.Candidate != c {
			t.Errorf("candidate %d: %+v / %+v %v", c, s, one, err)
		}
		want, err := ctx.LayerLoss(cand[i].t, cand[i].q, w, held, false)
		must(t, err)
		if math.Abs(s.Loss-want) > 1e-10*want || math.Abs(s.Loss-meanOf(losses[i])) > 1e-9*want {
			t.Errorf("candidate %d: loss %g, LayerLoss %g, mean of tokens %g", c, s.Loss, want, meanOf(losses[i]))
		}
		md, se := paired(losses[0], losses[i])
		scale := meanOf(losses[0]) + meanOf(losses[i])
		if math.Abs(s.Difference-md) > 1e-9*scale || math.Abs(s.StdError-se) > 1e-9*scale {
			t.Errorf("candidate %d: difference %g (want %g), std error %g (want %g)", c, s.Difference, md, s.StdError, se)
		}
		if s.Replaces != (i != 0 && ruleReplaces(losses[0], losses[i])) {
			t.Errorf("candidate %d: replaces %v", c, s.Replaces)
		}
	}
	// The layer returned is the kept candidate's, matrix for matrix and byte for byte.
	mg, err := got.t.Matrices()
	must(t, err)
	mc, err := cand[chosen].t.Matrices()
	must(t, err)
	cg, sg, err := got.q.Data()
	must(t, err)
	cc, sc, err := cand[chosen].q.Data()
	must(t, err)
	kg, _, _, _ := got.t.Info()
	kc, _, _, _ := cand[chosen].t.Info()
	if !sameFloats32(mg, mc) || kg != kc || string(cg) != string(cc) || string(sg) != string(sc) {
		t.Errorf("the guarded layer is not candidate %d's", chosen)
	}
	return r.Kept
}

func TestGuardReportAgreesWithSeparatelyBuiltCandidates(t *testing.T) {
	ctx := cpu(t)
	w := guardWeight()
	cal := guardTokens(gNCal, 4, 0.05, 11)
	shifted := guardTokens(gNVal, 0.05, 4, 12)
	same := guardTokens(gNVal, 4, 0.05, 13)
	cand := guardCandidates(t, ctx, guardCalibrator(t, ctx, cal, nil), w)
	o := searchedOptions(t, 0) // the default hold-out off: validation tokens still guard

	got := quantizeLayer(t, ctx, guardCalibrator(t, ctx, cal, shifted), WUSH, w, o)
	if kept := checkGuarded(t, ctx, got, cand, w, shifted, GuardValidation); kept == GuardSearched {
		t.Error("shifted validation tokens should make the searched layer lose (else nothing is tested)")
	}
	got = quantizeLayer(t, ctx, guardCalibrator(t, ctx, cal, same), WUSH, w, o)
	checkGuarded(t, ctx, got, cand, w, same, GuardValidation)

	// A checkpoint does not carry the report.
	path := filepath.Join(t.TempDir(), "guarded.safetensors")
	wr, err := NewCheckpointWriter()
	must(t, err)
	must(t, wr.AddLayer("l", got.t, got.q))
	must(t, wr.Write(path, nil))
	wr.Close()
	ck, err := OpenCheckpoint(path)
	must(t, err)
	defer ck.Close()
	lt, lq, err := ck.LoadLayer("l")
	must(t, err)
	defer lt.Close()
	defer lq.Close()
	if r, err := lt.Guard(); err != nil || r != nil {
		t.Errorf("a loaded transform reports a guard: %+v %v", r, err)
	}
}

// The default guard, without validation tokens, holds out the odd rows of the token sample (read
// from the exported state, wush.h's layout version 2).
func TestDefaultGuardHoldsOutTheOddSampleTokens(t *testing.T) {
	ctx := cpu(t)
	w := guardWeight()
	c := guardCalibrator(t, ctx, guardTokens(gNCal, 4, 0.05, 11), nil)
	on := searchedOptions(t, 1)
	if n, err := on.SampleSize(); err != nil || n != 256 {
		t.Fatalf("sample size %d %v", n, err)
	}
	cand := guardCandidates(t, ctx, c, w)
	got := quantizeLayer(t, ctx, c, WUSH, w, on)
	state, err := c.ExportState()
	must(t, err)
	base := 6 + gDIn*32
	k, rows := int(state[base]), int(state[base+1])
	if k != 256 || rows != 256 {
		t.Fatalf("sample k %d rows %d", k, rows)
	}
	values := state[base+2+k:]
	held := make([]float32, 0, 128*gDIn)
	for r := 0; r < 128; r++ {
		for _, v := range values[(2*r+1)*gDIn : (2*r+2)*gDIn] {
			held = append(held, float32(v))
		}
	}
	checkGuarded(t, ctx, got, cand, w, held, GuardHoldOut)
}

func TestLayersWithoutAGuardReportNone(t *testing.T) {
	ctx := cpu(t)
	w := guardWeight()
	c := guardCalibrator(t, ctx, guardTokens(gNCal, 4, 0.05, 11), nil)
	noGuard := func(what string, tr *Transform) {
		if r, err := tr.Guard(); err != nil || r != nil {
			t.Errorf("%s: reports %+v %v", what, r, err)
		}
		_, err := tr.GuardCandidate(GuardPlain)
		var e *Error
		if !errors.As(err, &e) || e.Status != ErrInvalidArgument || !strings.HasPrefix(e.Message, "wush_transform_guard_candidate: ") {
			t.Errorf("%s: candidate query: %v", what, err)
		}
	}
	noGuard("plain wush", quantizeLayer(t, ctx, c, WUSH, w, nil).t)
	noGuard("search, hold-out off", quantizeLayer(t, ctx, c, WUSH, w, searchedOptions(t, 0)).t)
	b, err := BuildTransform(ctx, c, w, gDOut, WUSH, nil)
	must(t, err)
	defer b.Close()
	noGuard("built", b)
	f, err := FixedTransform(Hadamard, gDIn, 32, nil)
	must(t, err)
	defer f.Close()
	noGuard("fixed", f)
	// An unknown candidate is the library's refusal even with a guard.
	g := quantizeLayer(t, ctx, c, WUSH, w, searchedOptions(t, 1))
	if _, err := g.t.GuardCandidate(GuardShrunk); err != nil {
		t.Errorf("shrunk: %v", err)
	}
	if _, err := g.t.GuardCandidate(GuardCandidate(6)); statusOf(err) != ErrInvalidArgument {
		t.Errorf("candidate 6: %v", err)
	}
	// A closed transform.
	g.t.Close()
	if _, err := g.t.Guard(); err != errClosed {
		t.Errorf("closed: %v", err)
	}
}

func TestACopiedCheckpointSurvivesItsFile(t *testing.T) {
	ctx := cpu(t)
	w := guardWeight()
	c := guardCalibrator(t, ctx, guardTokens(gNCal, 4, 0.05, 11), nil)
	l := quantizeLayer(t, ctx, c, WUSH, w, nil)
	path := filepath.Join(t.TempDir(), "copy.safetensors")
	wr, err := NewCheckpointWriter()
	must(t, err)
	must(t, wr.AddLayer("fc", l.t, l.q))
	must(t, wr.Write(path, nil))
	wr.Close()
	mapped, err := OpenCheckpointMode(path, CheckpointMap)
	must(t, err)
	mapped.Close()
	ck, err := OpenCheckpointMode(path, CheckpointCopy)
	must(t, err)
	defer ck.Close()
	must(t, os.Remove(path)) // the copy does not use the file again
	lt, lq, err := ck.LoadLayer("fc")
	must(t, err)
	defer lt.Close()
	defer lq.Close()
	c1, s1, _ := lq.Data()
	c2, s2, _ := l.q.Data()
	m1, _ := lt.Matrices()
	m2, _ := l.t.Matrices()
	if string(c1) != string(c2) || string(s1) != string(s2) || !sameFloats32(m1, m2) {
		t.Error("the layer loaded from the copy differs from the one written")
	}
	if _, err := OpenCheckpointMode(path, CheckpointCopy); statusOf(err) != ErrIO || !strings.Contains(err.Error(), "copy.safetensors") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := OpenCheckpointMode(path, CheckpointMode(7)); statusOf(err) != ErrInvalidArgument {
		t.Errorf("unknown mode: %v", err)
	}
}

// LinearRunBias: y is the bias-free output plus the bias, added here in float32 (bit for bit),
// and for a BFloat16 y that sum rounded to nearest even; a nil bias is Run; a bias of the wrong
// length or with a NaN is refused.
func TestLinearRunBias(t *testing.T) {
	ctx := cpu(t)
	l := calibrated(t, ctx)
	tr, q, err := LayerQuantize(ctx, l.cal, WUSH, MXFP4, RTN, l.weight, l.dOut, nil)
	must(t, err)
	lin, err := NewLinear(ctx, tr, q)
	must(t, err)
	defer lin.Close()
	x := l.heldout[:5*l.dIn]
	n := len(x) / l.dIn
	wb, err := lin.WorkspaceSize(n)
	must(t, err)
	ws := make([]byte, wb)
	y0, err := lin.Forward(x)
	must(t, err)
	raw := make([]float32, l.dOut)
	for i := range raw {
		raw[i] = float32(i%13)*0.37 - 2
	}
	b16, b := toBF16(raw) // b holds the BFloat16 bias's values: one expectation for both
	want := make([]float32, len(y0))
	for i := range y0 {
		want[i] = y0[i] + b[i%l.dOut]
	}
	y := make([]float32, len(y0))
	must(t, lin.RunBias(x, b, y, ws))
	equalF32(t, "RunBias(float32 bias)", y, want)
	yb := make([]BFloat16, len(y0))
	must(t, LinearRunBias(lin, x, b16, yb, ws))
	checkBF16Output(t, "LinearRunBias(BFloat16 bias -> BFloat16)", yb, want)
	must(t, LinearRunBias[float32, float32, float32](lin, x, nil, y, ws))
	equalF32(t, "RunBias(nil bias)", y, y0)
	if err := lin.RunBias(x, b[1:], y, ws); statusOf(err) != ErrInvalidArgument {
		t.Error("a short bias:", err)
	}
	if err := lin.RunBias(x, b[:0], y, ws); statusOf(err) != ErrInvalidArgument {
		t.Error("an empty bias:", err)
	}
	b[3] = float32(math.NaN())
	if err := lin.RunBias(x, b, y, ws); statusOf(err) != ErrNonFinite || !strings.Contains(err.Error(), "bias") {
		t.Error("a NaN bias:", err)
	}
}

func TestGroupedLayerPartsRunAsTheirRows(t *testing.T) {
	ctx := cpu(t)
	defer ctx.Close()
	l := calibrated(t, ctx)
	defer l.cal.Close()
	tr, q, err := LayerQuantize(ctx, l.cal, WUSH, MXFP4, RTN, l.weight, l.dOut, nil)
	must(t, err)
	path := filepath.Join(t.TempDir(), "grouped.safetensors")
	w, _ := NewCheckpointWriter()
	defer w.Close()
	if statusOf(w.AddGroupedLayer("qk", tr, q, []string{"q", "k"}, []int{128, 100})) != ErrInvalidArgument {
		t.Error("rows that do not sum to d_out were accepted")
	}
	must(t, w.AddGroupedLayer("qk", tr, q, []string{"q", "k"}, []int{128, 384}))
	must(t, w.Write(path, nil))
	ck, err := OpenCheckpoint(path)
	must(t, err)
	defer ck.Close()
	parts, err := ck.LayerParts("qk")
	must(t, err)
	if len(parts) != 2 || parts[1] != (LayerPart{Name: "k", RowBegin: 128, Rows: 384}) {
		t.Fatal("parts", parts)
	}
	whole, err := NewLinear(ctx, tr, q)
	must(t, err)
	defer whole.Close()
	want, err := whole.Forward(l.heldout)
	must(t, err)
	kt, kq, err := ck.LoadLayer("k")
	must(t, err)
	part, err := NewLinear(ctx, kt, kq)
	must(t, err)
	defer part.Close()
	got, err := part.Forward(l.heldout)
	must(t, err)
	for tok := 0; tok < len(l.heldout)/l.dIn; tok++ {
		for r := 0; r < 384; r++ {
			if got[tok*384+r] != want[tok*512+128+r] {
				t.Fatalf("token %d row %d: %v, the group's row says %v", tok, r, got[tok*384+r], want[tok*512+128+r])
			}
		}
	}
}
