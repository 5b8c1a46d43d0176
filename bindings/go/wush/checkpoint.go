package wush

// Checkpoints (wush.h: "Checkpoints"): transforms and pre-quantized weights in a safetensors
// file (docs/CHECKPOINT.md).

// #include <stdlib.h>
// #include <wush/wush.h>
import "C"

import (
	"runtime"
	"unsafe"
)

// CheckpointWriter is a checkpoint being written. It keeps the added transforms and qweights
// reachable until Write (the C checkpoint references them); closing one of them explicitly
// before Write makes Write fail with ErrInvalidArgument.
type CheckpointWriter struct {
	p    *C.wush_checkpoint
	refs []interface{}
}

// NewCheckpointWriter is wush_checkpoint_create.
func NewCheckpointWriter() (*CheckpointWriter, error) {
	var p *C.wush_checkpoint
	if err := call(func() C.wush_status { return C.wush_checkpoint_create(&p) }); err != nil {
		return nil, err
	}
	w := &CheckpointWriter{p: p}
	runtime.SetFinalizer(w, (*CheckpointWriter).Close)
	return w, nil
}

// Close releases the writer.
func (w *CheckpointWriter) Close() {
	if w.p != nil {
		C.wush_checkpoint_destroy(w.p)
		w.p = nil
		w.refs = nil
		runtime.SetFinalizer(w, nil)
	}
}

// AddLayer is wush_checkpoint_add_layer.
func (w *CheckpointWriter) AddLayer(name string, t *Transform, q *QWeight) error {
	if w.p == nil || t.p == nil || q.p == nil {
		return errClosed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	if err := call(func() C.wush_status { return C.wush_checkpoint_add_layer(w.p, cs, t.p, q.p) }); err != nil {
		return err
	}
	w.refs = append(w.refs, t, q)
	return nil
}

// AddGroupedLayer is wush_checkpoint_add_grouped_layer: layers that read one input, built as one
// layer over their concatenated rows; names and rows give its parts in row order.
func (w *CheckpointWriter) AddGroupedLayer(name string, t *Transform, q *QWeight, names []string, rows []int) error {
	if w.p == nil || t.p == nil || q.p == nil {
		return errClosed
	}
	if len(names) != len(rows) || len(names) == 0 {
		return &Error{Status: ErrInvalidArgument, Message: "names and rows must have the same, non-zero length"}
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	cnames := make([]*C.char, len(names))
	crows := make([]C.size_t, len(rows))
	for i := range names {
		cnames[i] = C.CString(names[i])
		defer C.free(unsafe.Pointer(cnames[i]))
		if rows[i] < 0 {
			return &Error{Status: ErrInvalidArgument, Message: "a part's rows must not be negative"}
		}
		crows[i] = C.size_t(rows[i])
	}
	if err := call(func() C.wush_status {
		return C.wush_checkpoint_add_grouped_layer(w.p, cs, t.p, q.p, C.size_t(len(names)), &cnames[0], &crows[0])
	}); err != nil {
		return err
	}
	w.refs = append(w.refs, t, q)
	return nil
}

// Write is wush_checkpoint_write (atomic). opts may be nil.
func (w *CheckpointWriter) Write(path string, opts *Options) error {
	if w.p == nil {
		return errClosed
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(w)
	defer runtime.KeepAlive(opts)
	return call(func() C.wush_status { return C.wush_checkpoint_write(w.p, cs, optPtr(opts)) })
}

// Checkpoint is an opened, validated, memory-mapped checkpoint (safe to share). Loaded
// qweights keep the file mapped after Close.
type Checkpoint struct{ p *C.wush_checkpoint }

// CheckpointMode is how OpenCheckpointMode holds a checkpoint's bytes (wush_checkpoint_mode).
type CheckpointMode int32

const (
	// CheckpointMap: memory-mapped, read on demand (OpenCheckpoint).
	CheckpointMap CheckpointMode = C.WUSH_CHECKPOINT_MAP
	// CheckpointCopy: read whole into memory at the open; the file is not used again.
	CheckpointCopy CheckpointMode = C.WUSH_CHECKPOINT_COPY
)

// OpenCheckpointMode is wush_checkpoint_open_mode: OpenCheckpoint with a choice of how the
// file's bytes are held. CheckpointCopy reads the whole file into memory owned by the library and
// validates that copy: truncating, rewriting or deleting the file afterwards changes nothing that
// was opened (and cannot raise SIGBUS). CheckpointMap is OpenCheckpoint. Safe to call from
// several goroutines. Errors (*Error, the library's message): ErrInvalidArgument (an unknown
// mode), ErrIO (including a file that shrinks while it is read), ErrOutOfMemory, ErrCorruptFile
// naming the first violation.
func OpenCheckpointMode(path string, mode CheckpointMode) (*Checkpoint, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.wush_checkpoint
	if err := call(func() C.wush_status {
		return C.wush_checkpoint_open_mode(cs, C.wush_checkpoint_mode(mode), &p)
	}); err != nil {
		return nil, err
	}
	c := &Checkpoint{p: p}
	runtime.SetFinalizer(c, (*Checkpoint).Close)
	return c, nil
}

// OpenCheckpoint is wush_checkpoint_open.
func OpenCheckpoint(path string) (*Checkpoint, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var p *C.wush_checkpoint
	if err := call(func() C.wush_status { return C.wush_checkpoint_open(cs, &p) }); err != nil {
		return nil, err
	}
	c := &Checkpoint{p: p}
	runtime.SetFinalizer(c, (*Checkpoint).Close)
	return c, nil
}

// Close releases the checkpoint.
func (c *Checkpoint) Close() {
	if c.p != nil {
		C.wush_checkpoint_destroy(c.p)
		c.p = nil
		runtime.SetFinalizer(c, nil)
	}
}

// LayerNames is wush_checkpoint_layer_count + wush_checkpoint_layer_name, in file order.
func (c *Checkpoint) LayerNames() ([]string, error) {
	if c.p == nil {
		return nil, errClosed
	}
	defer runtime.KeepAlive(c)
	var n C.size_t
	if err := call(func() C.wush_status { return C.wush_checkpoint_layer_count(c.p, &n) }); err != nil {
		return nil, err
	}
	names := make([]string, 0, n)
	for i := C.size_t(0); i < n; i++ {
		var s *C.char
		if err := call(func() C.wush_status { return C.wush_checkpoint_layer_name(c.p, i, &s) }); err != nil {
			return nil, err
		}
		names = append(names, C.GoString(s))
	}
	return names, nil
}

// LayerPart is a part of a grouped layer: the layer it stands for and its output rows
// [RowBegin, RowBegin+Rows) of the grouped layer's forward.
type LayerPart struct {
	Name     string
	RowBegin int
	Rows     int
}

// LayerParts is wush_checkpoint_layer_part_count + wush_checkpoint_layer_part (empty for a plain
// layer).
func (c *Checkpoint) LayerParts(name string) ([]LayerPart, error) {
	if c.p == nil {
		return nil, errClosed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(c)
	var n C.size_t
	if err := call(func() C.wush_status { return C.wush_checkpoint_layer_part_count(c.p, cs, &n) }); err != nil {
		return nil, err
	}
	parts := make([]LayerPart, 0, n)
	for i := C.size_t(0); i < n; i++ {
		var s *C.char
		var begin, rows C.size_t
		if err := call(func() C.wush_status {
			return C.wush_checkpoint_layer_part(c.p, cs, i, &s, &begin, &rows)
		}); err != nil {
			return nil, err
		}
		parts = append(parts, LayerPart{Name: C.GoString(s), RowBegin: int(begin), Rows: int(rows)})
	}
	return parts, nil
}

// LoadLayer is wush_checkpoint_load_layer (a part's name: the group's transform, the part's rows).
func (c *Checkpoint) LoadLayer(name string) (*Transform, *QWeight, error) {
	if c.p == nil {
		return nil, nil, errClosed
	}
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	defer runtime.KeepAlive(c)
	var t *C.wush_transform
	var q *C.wush_qweight
	if err := call(func() C.wush_status { return C.wush_checkpoint_load_layer(c.p, cs, &t, &q) }); err != nil {
		return nil, nil, err
	}
	return wrapTransform(t), wrapQWeight(q), nil
}

// ExportFPQuant is wush_checkpoint_export_fp_quant; configPath "" writes no config file.
func (c *Checkpoint) ExportFPQuant(path, configPath string, opts *Options) error {
	if c.p == nil {
		return errClosed
	}
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var cfg *C.char
	if configPath != "" {
		cfg = C.CString(configPath)
		defer C.free(unsafe.Pointer(cfg))
	}
	defer runtime.KeepAlive(c)
	defer runtime.KeepAlive(opts)
	return call(func() C.wush_status { return C.wush_checkpoint_export_fp_quant(c.p, cs, cfg, optPtr(opts)) })
}
