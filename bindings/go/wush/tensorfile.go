package wush

// Tensor files (wush.h: "Tensor files"): safetensors, read-only.

// #include <stdint.h>
// #include <stdlib.h>
// #include <wush/wush.h>
import "C"

import (
	"runtime"
	"unsafe"
)

// Tensor is one tensor of a TensorFile; Data is a copy of its bytes.
type Tensor struct {
	Name, DType string
	Shape       []uint64
	Data        []byte
}

// TensorFile is a validated, memory-mapped safetensors file (safe to share).
type TensorFile struct{ p *C.wush_tensor_file }

// OpenTensorFile is wush_tensor_file_open.
func OpenTensorFile(path string) (*TensorFile, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.wush_tensor_file
	if err := call(func() C.wush_status { return C.wush_tensor_file_open(cs, &p) }); err != nil {
		return nil, err
	}
	f := &TensorFile{p: p}
	runtime.SetFinalizer(f, (*TensorFile).Close)
	return f, nil
}

// Close unmaps the file.
func (f *TensorFile) Close() {
	if f.p != nil {
		C.wush_tensor_file_destroy(f.p)
		f.p = nil
		runtime.SetFinalizer(f, nil)
	}
}

// Count is wush_tensor_file_count.
func (f *TensorFile) Count() (int, error) {
	if f.p == nil {
		return 0, errClosed
	}
	defer runtime.KeepAlive(f)
	var n C.size_t
	err := call(func() C.wush_status { return C.wush_tensor_file_count(f.p, &n) })
	return lenAfter(uint64(n), err, "tensor count")
}

// Tensor is wush_tensor_file_tensor (the data copied out of the mapping).
func (f *TensorFile) Tensor(index int) (Tensor, error) {
	if f.p == nil {
		return Tensor{}, errClosed
	}
	if err := nonNegative("index", index); err != nil {
		return Tensor{}, err
	}
	defer runtime.KeepAlive(f)
	var name, dtype *C.char
	var ndim, nbytes C.size_t
	var shape *C.uint64_t
	var data unsafe.Pointer
	if err := call(func() C.wush_status {
		return C.wush_tensor_file_tensor(f.p, C.size_t(index), &name, &dtype, &ndim, &shape, &data, &nbytes)
	}); err != nil {
		return Tensor{}, err
	}
	nd, err := goLen(uint64(ndim), "tensor dimensions")
	if err != nil {
		return Tensor{}, err
	}
	bytes, err := goBytes(data, uint64(nbytes), "tensor data")
	if err != nil {
		return Tensor{}, err
	}
	t := Tensor{Name: C.GoString(name), DType: C.GoString(dtype), Data: bytes}
	for _, d := range unsafe.Slice(shape, nd) {
		t.Shape = append(t.Shape, uint64(d))
	}
	return t, nil
}

// Find is wush_tensor_file_find; ok is false when there is no such tensor.
func (f *TensorFile) Find(name string) (t Tensor, ok bool, err error) {
	if f.p == nil {
		return Tensor{}, false, errClosed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(f)
	var i C.size_t
	err = call(func() C.wush_status { return C.wush_tensor_file_find(f.p, cs, &i) })
	if e, isErr := err.(*Error); isErr && e.Status == ErrNotFound {
		return Tensor{}, false, nil
	} else if err != nil {
		return Tensor{}, false, err
	}
	index, err := goLen(uint64(i), "tensor index")
	if err != nil {
		return Tensor{}, false, err
	}
	t, err = f.Tensor(index)
	return t, err == nil, err
}

// Metadata is wush_tensor_file_metadata; ok is false when the key is absent.
func (f *TensorFile) Metadata(key string) (value string, ok bool, err error) {
	if f.p == nil {
		return "", false, errClosed
	}
	cs := C.CString(key)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(f)
	var v *C.char
	err = call(func() C.wush_status { return C.wush_tensor_file_metadata(f.p, cs, &v) })
	if e, isErr := err.(*Error); isErr && e.Status == ErrNotFound {
		return "", false, nil
	} else if err != nil {
		return "", false, err
	}
	return C.GoString(v), true, nil
}
