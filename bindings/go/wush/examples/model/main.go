// Command model runs a small model end to end on libwush's runtime: it loads a checkpoint
// written by `wush quantize`, prepares its layers once, runs tokens through them (fc1, ReLU,
// fc2) and compares with the float64 formula on the original weights.
//
//	python3 bindings/examples/tiny_model.py DIR
//	wush quantize --weights DIR/weights.safetensors --activations DIR/activations.safetensors \
//	    --format mxfp4 --transform wush --out DIR/checkpoint.safetensors
//	go run ./examples/model DIR/checkpoint.safetensors DIR/weights.safetensors DIR/activations.safetensors
package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/libwush/libwush/bindings/go/wush"
)

// tensorF32 reads a 2-D F32 tensor: rows, cols, values.
func tensorF32(f *wush.TensorFile, name string) (int, int, []float32, error) {
	t, ok, err := f.Find(name)
	if err != nil || !ok {
		return 0, 0, nil, fmt.Errorf("tensor %s: found %v, %v", name, ok, err)
	}
	if t.DType != "F32" || len(t.Shape) != 2 {
		return 0, 0, nil, fmt.Errorf("%s: expected a 2-D F32 tensor, got %s %v", name, t.DType, t.Shape)
	}
	v := make([]float32, len(t.Data)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
	}
	return int(t.Shape[0]), int(t.Shape[1]), v, nil
}

// matmulT is y = x w^T in float64 (x: n x dIn, w: dOut x dIn).
func matmulT(x []float64, w []float32, dIn, dOut int) []float64 {
	n := len(x) / dIn
	y := make([]float64, n*dOut)
	for t := 0; t < n; t++ {
		for o := 0; o < dOut; o++ {
			s := 0.0
			for k := 0; k < dIn; k++ {
				s += x[t*dIn+k] * float64(w[o*dIn+k])
			}
			y[t*dOut+o] = s
		}
	}
	return y
}

func relErr(got []float32, want []float64) float64 {
	num, den := 0.0, 0.0
	for i := range got {
		num += math.Pow(float64(got[i])-want[i], 2)
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

func run(ckPath, wPath, xPath string) (float64, error) {
	ctx, err := wush.NewCPUContext()
	if err != nil {
		return 0, err
	}
	defer ctx.Close()
	desc, _ := ctx.Describe()
	fmt.Printf("libwush %s on %s\n", wush.VersionString(), desc)

	// Prepare every layer once; the checkpoint and loaded objects may be closed afterwards.
	ck, err := wush.OpenCheckpoint(ckPath)
	if err != nil {
		return 0, err
	}
	var layers []*wush.Linear
	for _, name := range []string{"fc1", "fc2"} {
		t, q, err := ck.LoadLayer(name)
		if err != nil {
			return 0, err
		}
		lin, err := wush.NewLinear(ctx, t, q)
		if err != nil {
			return 0, err
		}
		defer lin.Close()
		kind, _, _, _ := t.Info()
		fmt.Printf("%s: %d x %d, %s %s\n", name, lin.DOut, lin.DIn, lin.Format.Name(), kind.Name())
		t.Close()
		q.Close()
		layers = append(layers, lin)
	}
	ck.Close()

	wf, err := wush.OpenTensorFile(wPath)
	if err != nil {
		return 0, err
	}
	defer wf.Close()
	_, w1In, w1, err := tensorF32(wf, "fc1")
	if err != nil {
		return 0, err
	}
	w2Out, w2In, w2, err := tensorF32(wf, "fc2")
	if err != nil {
		return 0, err
	}
	xf, err := wush.OpenTensorFile(xPath)
	if err != nil {
		return 0, err
	}
	defer xf.Close()
	_, _, xAll, err := tensorF32(xf, "fc1")
	if err != nil {
		return 0, err
	}
	x := xAll[:64*w1In] // 64 tokens
	n := len(x) / w1In

	// Quantized path: fc1 -> ReLU -> fc2 through the prepared layers, one workspace.
	wsBytes := 0
	for _, l := range layers {
		b, err := l.WorkspaceSize(n)
		if err != nil {
			return 0, err
		}
		if b > wsBytes {
			wsBytes = b
		}
	}
	ws := make([]byte, wsBytes)
	h := make([]float32, n*layers[0].DOut)
	if err := layers[0].Run(x, h, ws); err != nil {
		return 0, err
	}
	hRelu := make([]float32, len(h))
	hRelu64 := make([]float64, len(h))
	for i, v := range h {
		hRelu[i] = float32(math.Max(float64(v), 0))
		hRelu64[i] = float64(hRelu[i])
	}
	y := make([]float32, n*w2Out)
	if err := layers[1].Run(hRelu, y, ws); err != nil {
		return 0, err
	}

	// The float64 formula on the original weights.
	x64 := make([]float64, len(x))
	for i, v := range x {
		x64[i] = float64(v)
	}
	h64 := matmulT(x64, w1, w1In, layers[0].DOut)
	for i := range h64 {
		h64[i] = math.Max(h64[i], 0)
	}
	fmt.Printf("fc1 relative error vs float64:              %.4f\n", relErr(hRelu, h64))
	fmt.Printf("fc2 relative error vs float64 (same input): %.4f\n", relErr(y, matmulT(hRelu64, w2, w2In, w2Out)))
	model := relErr(y, matmulT(h64, w2, w2In, w2Out))
	fmt.Printf("model relative error vs float64:            %.4f\n", model)
	return model, nil
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: model CHECKPOINT WEIGHTS ACTIVATIONS")
		os.Exit(2)
	}
	model, err := run(os.Args[1], os.Args[2], os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "go model example:", err)
		os.Exit(1)
	}
	// 4-bit weights and activations keep the model within several percent; a broken path
	// (wrong layout, wrong layer) gives errors near 1.
	if model > 0.25 {
		fmt.Fprintf(os.Stderr, "go model example: the quantized model is off by %.3f\n", model)
		os.Exit(1)
	}
	fmt.Println("go model example: OK")
}
