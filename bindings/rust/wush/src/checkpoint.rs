//! Checkpoints (`wush.h`: "Checkpoints"): [`CheckpointWriter`] and [`Checkpoint`], transforms and
//! pre-quantized weights in a safetensors file (docs/CHECKPOINT.md).

use std::marker::PhantomData;
use std::path::Path;
use std::ptr::{self, NonNull};

use crate::error::{borrowed_str, c_path, c_string, check, Result};
use crate::options::{opt_ptr, Options};
use crate::qweight::QWeight;
use crate::sys;
use crate::transform::Transform;
#[cfg(doc)] // names in the documentation's links
use crate::Status;

c_enum! {
    /// How [`Checkpoint::open_mode`] holds a checkpoint's bytes (`wush_checkpoint_mode`).
    CheckpointMode {
        /// Memory-mapped, read on demand ([`Checkpoint::open`]).
        Map = sys::WUSH_CHECKPOINT_MAP,
        /// Read whole into memory at the open; the file is not used again.
        Copy = sys::WUSH_CHECKPOINT_COPY,
    }
}

/// A checkpoint being written (`wush_checkpoint_create`, `_add_layer`, `_write`).
///
/// The C checkpoint references the transforms and qweights added to it until it is written, so
/// the writer borrows them for `'a`. `Send` (it only holds shared borrows of `Sync` objects), not
/// `Sync`: the header makes only an *opened* checkpoint's reads thread-safe.
pub struct CheckpointWriter<'a> {
    raw: NonNull<sys::wush_checkpoint>,
    _layers: PhantomData<&'a (Transform, QWeight)>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for CheckpointWriter<'_> {}

impl<'a> CheckpointWriter<'a> {
    /// `wush_checkpoint_create`.
    pub fn new() -> Result<CheckpointWriter<'a>> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid output pointer.
        check(unsafe { sys::wush_checkpoint_create(&mut raw) })?;
        Ok(CheckpointWriter { raw: NonNull::new(raw).expect("NULL checkpoint"), _layers: PhantomData })
    }
    /// `wush_checkpoint_add_layer`.
    pub fn add_layer(&mut self, name: &str, transform: &'a Transform, qweight: &'a QWeight) -> Result<()> {
        let c = c_string(name, "layer name")?;
        // SAFETY: live handles, kept alive for 'a by the borrow.
        check(unsafe { sys::wush_checkpoint_add_layer(self.raw.as_ptr(), c.as_ptr(), transform.raw.as_ptr(),
                                                      qweight.raw.as_ptr()) })
    }
    /// `wush_checkpoint_add_grouped_layer`: layers that read one input, built as one layer over
    /// their concatenated rows; `parts` names them in row order with their row counts.
    pub fn add_grouped_layer(&mut self, name: &str, transform: &'a Transform, qweight: &'a QWeight,
                             parts: &[(&str, usize)]) -> Result<()> {
        let c = c_string(name, "layer name")?;
        let names = parts.iter().map(|(n, _)| c_string(n, "part name")).collect::<Result<Vec<_>>>()?;
        let name_ptrs: Vec<_> = names.iter().map(|n| n.as_ptr()).collect();
        let rows: Vec<usize> = parts.iter().map(|&(_, r)| r).collect();
        // SAFETY: live handles kept alive for 'a by the borrow; the arrays outlive the call.
        check(unsafe {
            sys::wush_checkpoint_add_grouped_layer(self.raw.as_ptr(), c.as_ptr(), transform.raw.as_ptr(),
                                                   qweight.raw.as_ptr(), parts.len(), name_ptrs.as_ptr(),
                                                   rows.as_ptr())
        })
    }
    /// `wush_checkpoint_layer_count`.
    pub fn layer_count(&self) -> Result<usize> {
        layer_count(self.raw.as_ptr())
    }
    /// The parts of layer `name` (empty for a plain layer).
    pub fn layer_parts(&self, name: &str) -> Result<Vec<LayerPart>> {
        layer_parts(self.raw.as_ptr(), name)
    }
    /// `wush_checkpoint_write`: all layers to `path`, atomically.
    pub fn write(&mut self, path: impl AsRef<Path>, options: Option<&Options>) -> Result<()> {
        let p = c_path(path.as_ref())?;
        // SAFETY: live handle, valid string.
        check(unsafe { sys::wush_checkpoint_write(self.raw.as_ptr(), p.as_ptr(), opt_ptr(options)) })
    }
}

impl Drop for CheckpointWriter<'_> {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::wush_checkpoint_destroy(self.raw.as_ptr()) }
    }
}

fn layer_count(raw: *const sys::wush_checkpoint) -> Result<usize> {
    let mut n = 0;
    // SAFETY: live handle, valid output pointer.
    check(unsafe { sys::wush_checkpoint_layer_count(raw, &mut n) })?;
    Ok(n)
}

/// A part of a grouped layer (`wush_checkpoint_layer_part`): the layer it stands for and its
/// output rows `row_begin..row_begin + rows` of the grouped layer's forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPart {
    pub name: String,
    pub row_begin: usize,
    pub rows: usize,
}

fn layer_parts(raw: *const sys::wush_checkpoint, name: &str) -> Result<Vec<LayerPart>> {
    let c = c_string(name, "layer name")?;
    let mut n = 0;
    // SAFETY: live handle, valid string and output pointer.
    check(unsafe { sys::wush_checkpoint_layer_part_count(raw, c.as_ptr(), &mut n) })?;
    (0..n)
        .map(|i| {
            let (mut p, mut begin, mut rows) = (ptr::null(), 0, 0);
            // SAFETY: as above; the part's name lives as long as the checkpoint, copied here.
            check(unsafe { sys::wush_checkpoint_layer_part(raw, c.as_ptr(), i, &mut p, &mut begin, &mut rows) })?;
            Ok(LayerPart { name: unsafe { borrowed_str(p) }.to_owned(), row_begin: begin, rows })
        })
        .collect()
}

/// An opened, validated, memory-mapped checkpoint (`wush_checkpoint_open`).
///
/// `Send + Sync`: the header makes an opened checkpoint's reads (names, loading layers)
/// thread-safe. Loaded qweights keep the file mapped after the checkpoint is dropped.
pub struct Checkpoint {
    raw: NonNull<sys::wush_checkpoint>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for Checkpoint {}
unsafe impl Sync for Checkpoint {}

impl Checkpoint {
    /// `wush_checkpoint_open`.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_checkpoint_open(p.as_ptr(), &mut raw) })?;
        Ok(Checkpoint { raw: NonNull::new(raw).expect("NULL checkpoint") })
    }
    /// `wush_checkpoint_open_mode`: [`Checkpoint::open`] with a choice of how the file's bytes
    /// are held. [`CheckpointMode::Copy`] reads the whole file into memory owned by the library
    /// and validates that copy: truncating, rewriting or deleting the file afterwards changes
    /// nothing that was opened (and cannot raise SIGBUS). [`CheckpointMode::Map`] is
    /// [`Checkpoint::open`]. Thread-safe.
    ///
    /// # Errors
    /// [`Status::Io`] (including a file that shrinks while it is read), [`Status::OutOfMemory`],
    /// [`Status::CorruptFile`] naming the first violation, each with the library's message.
    pub fn open_mode(path: impl AsRef<Path>, mode: CheckpointMode) -> Result<Checkpoint> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_checkpoint_open_mode(p.as_ptr(), mode.to_c(), &mut raw) })?;
        Ok(Checkpoint { raw: NonNull::new(raw).expect("NULL checkpoint") })
    }
    /// `wush_checkpoint_layer_count`.
    pub fn layer_count(&self) -> Result<usize> {
        layer_count(self.raw.as_ptr())
    }
    /// `wush_checkpoint_layer_name`.
    pub fn layer_name(&self, index: usize) -> Result<&str> {
        let mut p = ptr::null();
        // SAFETY: live handle; the name lives until the checkpoint is destroyed (borrow of self).
        check(unsafe { sys::wush_checkpoint_layer_name(self.raw.as_ptr(), index, &mut p) })?;
        Ok(unsafe { borrowed_str(p) })
    }
    /// Every layer name, in file order.
    pub fn layer_names(&self) -> Result<Vec<String>> {
        (0..self.layer_count()?).map(|i| self.layer_name(i).map(str::to_owned)).collect()
    }
    /// The parts of layer `name` (`wush_checkpoint_layer_part_count` / `_part`; empty for a
    /// plain layer).
    pub fn layer_parts(&self, name: &str) -> Result<Vec<LayerPart>> {
        layer_parts(self.raw.as_ptr(), name)
    }
    /// `wush_checkpoint_load_layer`: the layer's transform and qweight (codes used in place); a
    /// part's name gives the group's transform with the part's rows.
    pub fn load_layer(&self, name: &str) -> Result<(Transform, QWeight)> {
        let c = c_string(name, "layer name")?;
        let (mut t, mut q) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: live handle, valid string and output pointers.
        check(unsafe { sys::wush_checkpoint_load_layer(self.raw.as_ptr(), c.as_ptr(), &mut t, &mut q) })?;
        let q = QWeight::wrap(q);
        Ok((Transform::wrap(t)?, q))
    }
    /// `wush_checkpoint_export_fp_quant`: the FP-Quant / transformers layout.
    pub fn export_fp_quant(&self, path: impl AsRef<Path>, config_path: Option<&Path>, options: Option<&Options>)
                           -> Result<()> {
        let p = c_path(path.as_ref())?;
        let cfg = config_path.map(c_path).transpose()?;
        // SAFETY: live handle, valid strings.
        check(unsafe {
            sys::wush_checkpoint_export_fp_quant(self.raw.as_ptr(), p.as_ptr(),
                                                 cfg.as_ref().map_or(ptr::null(), |c| c.as_ptr()), opt_ptr(options))
        })
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::wush_checkpoint_destroy(self.raw.as_ptr()) }
    }
}

debug_handle!(CheckpointWriter<'_>, Checkpoint);
