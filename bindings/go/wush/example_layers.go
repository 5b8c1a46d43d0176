package wush

// Built-in example layers (wush.h: "Built-in example layers"), the default data of `wush eval`.

// #include <stdint.h>
// #include <stdlib.h>
// #include <wush/wush.h>
import "C"

import "unsafe"

// ExampleLayer is a built-in layer's weight (DOut x DIn) and activations (tokens x DIn).
type ExampleLayer struct {
	DOut, DIn           int
	Weight, Calibration []float32
	Heldout             []float32
}

// ExampleLayerNames is wush_example_layer_count + wush_example_layer_name.
func ExampleLayerNames() []string {
	n := int(C.wush_example_layer_count())
	names := make([]string, 0, n)
	for i := 0; i < n; i++ {
		names = append(names, goStringOrEmpty(C.wush_example_layer_name(C.size_t(i))))
	}
	return names
}

// ExampleLayerShape is wush_example_layer_shape: (d_out, d_in).
func ExampleLayerShape(name string) (dOut, dIn int, err error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	var o, i C.size_t
	if err = call(func() C.wush_status { return C.wush_example_layer_shape(cs, &o, &i) }); err != nil {
		return 0, 0, err
	}
	if dOut, err = goLen(uint64(o), "d_out"); err != nil {
		return 0, 0, err
	}
	if dIn, err = goLen(uint64(i), "d_in"); err != nil {
		return 0, 0, err
	}
	return dOut, dIn, nil
}

// GenerateExampleLayer is wush_example_layer_generate.
func GenerateExampleLayer(name string, seed uint64, nCalibration, nHeldout int) (*ExampleLayer, error) {
	dOut, dIn, err := ExampleLayerShape(name)
	if err != nil {
		return nil, err
	}
	nw, err := elemCount(dOut, dIn, "weight")
	if err != nil {
		return nil, err
	}
	nc, err := elemCount(nCalibration, dIn, "calibration tokens")
	if err != nil {
		return nil, err
	}
	nh, err := elemCount(nHeldout, dIn, "held-out tokens")
	if err != nil {
		return nil, err
	}
	l := &ExampleLayer{DOut: dOut, DIn: dIn, Weight: make([]float32, nw),
		Calibration: make([]float32, nc), Heldout: make([]float32, nh)}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	err = call(func() C.wush_status {
		return C.wush_example_layer_generate(cs, C.uint64_t(seed), C.size_t(nCalibration), C.size_t(nHeldout),
			(*C.float)(ptrOf(l.Weight)), C.size_t(len(l.Weight)), (*C.float)(ptrOf(l.Calibration)),
			C.size_t(len(l.Calibration)), (*C.float)(ptrOf(l.Heldout)), C.size_t(len(l.Heldout)))
	})
	return l, err
}
