// Package wush is the Go API of libwush (include/wush/wush.h): WUSH transforms and 4-bit
// (MXFP4/NVFP4/INT4) quantization, calibration, checkpoints and the W4A4 runtime.
//
// cgo reads the installed header itself (`#cgo pkg-config: wush`), so the declarations cannot
// drift from the library the package is built against. docs/BINDINGS.md says how the library is
// found and how versions work.
//
// Handles (Context, Calibrator, Options, Transform, QWeight, CheckpointWriter, Checkpoint,
// TensorFile, Linear) are released by Close, or by a finalizer when they become unreachable.
// Close may be called in any order: a Context closed while prepared layers (Linear) still use
// it is released when the last of them is closed. Methods of a closed handle return an error.
//
// Errors are *Error values carrying the status and wush_last_error()'s message. libwush keeps
// that message per OS thread, so every call locks its goroutine to its thread between the call
// and reading the message.
//
// Goroutines, as the header's thread rules allow: a Context may be used from several goroutines
// at once (the library serializes calls on one context); Transform, QWeight, Checkpoint,
// TensorFile and Linear are only read and may be shared freely; Calibrator and Options may be
// read concurrently but their modifying methods (Add*, Merge, Import, Set*) need the caller's
// exclusion. Close must not race with other calls on the same handle.
//
// CPU contexts take Go slices. CUDA contexts take device pointers, through the methods named
// *Device, which take unsafe.Pointer: the slice methods refuse a CUDA context.
//
// Element types: the methods take float32 slices; beside each one that reads or writes tensors
// is a generic function named after its receiver and method (Go methods take no type
// parameters) over Element (float32, Float16, BFloat16) and OutputElement (float32, BFloat16):
// LinearRun, LinearForward, LinearQuantize, ContextQuantizeActivations, ContextGemm,
// ContextLinearForward, ContextLayerLoss, CalibratorAdd, CalibratorAddValidation.
// BuildTransform, NewQWeight and LayerQuantize are generic over the weight's type themselves.
package wush

// The files of the package follow the sections of include/wush/wush.h: errors.go (status and
// errors), types.go (element types and block formats), context.go, rows.go, options.go (and
// progress.go), calibrator.go, transform.go, qweight.go, runtime.go, linear.go (prepared layers),
// checkpoint.go, example_layers.go, tensorfile.go and version.go; sizes.go converts sizes between
// the library (size_t) and Go (int). This file holds the package's cgo flags: cgo applies them to
// every file of the package.

// #cgo pkg-config: wush
// #include <wush/wush.h>
import "C"
