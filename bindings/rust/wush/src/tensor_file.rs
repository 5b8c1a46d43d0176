//! Tensor files (`wush.h`: "Tensor files"): [`TensorFile`], safetensors, read-only.

use std::path::Path;
use std::ptr::{self, NonNull};

use crate::error::{borrowed_str, bytes, c_path, c_string, check, slice_len, Result, Status};
use crate::sys;

/// One tensor of a [`TensorFile`], borrowed from its mapping.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    pub name: &'a str,
    /// The safetensors dtype string, e.g. "F32", "BF16", "U8".
    pub dtype: &'a str,
    pub shape: &'a [u64],
    /// Little-endian, row-major bytes (alignment is whatever the writer chose).
    pub data: &'a [u8],
}

/// A validated, memory-mapped safetensors file (`wush_tensor_file`).
///
/// `Send + Sync`: read-only; the header makes its queries thread-safe. Tensors borrow it.
pub struct TensorFile {
    raw: NonNull<sys::wush_tensor_file>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for TensorFile {}
unsafe impl Sync for TensorFile {}

impl TensorFile {
    /// `wush_tensor_file_open`.
    pub fn open(path: impl AsRef<Path>) -> Result<TensorFile> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_tensor_file_open(p.as_ptr(), &mut raw) })?;
        Ok(TensorFile { raw: NonNull::new(raw).expect("NULL tensor file") })
    }
    /// `wush_tensor_file_count`.
    pub fn len(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_tensor_file_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
    /// `wush_tensor_file_tensor`: tensor `index` in file order.
    pub fn tensor(&self, index: usize) -> Result<Tensor<'_>> {
        let (mut name, mut dtype, mut ndim, mut shape, mut data, mut nbytes) =
            (ptr::null(), ptr::null(), 0usize, ptr::null(), ptr::null(), 0usize);
        // SAFETY: live handle; the pointers stay valid until the file is destroyed (borrow of self).
        check(unsafe {
            sys::wush_tensor_file_tensor(self.raw.as_ptr(), index, &mut name, &mut dtype, &mut ndim, &mut shape,
                                         &mut data, &mut nbytes)
        })?;
        unsafe {
            let shape = if ndim == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(shape, slice_len(ndim, std::mem::size_of::<u64>(), "tensor shape")?)
            };
            Ok(Tensor { name: borrowed_str(name), dtype: borrowed_str(dtype), shape, data: bytes(data, nbytes, "tensor data")? })
        }
    }
    /// `wush_tensor_file_find`: the tensor called `name`, or None.
    pub fn find(&self, name: &str) -> Result<Option<Tensor<'_>>> {
        let c = c_string(name, "tensor name")?;
        let mut i = 0;
        // SAFETY: live handle, valid string and output pointer.
        match check(unsafe { sys::wush_tensor_file_find(self.raw.as_ptr(), c.as_ptr(), &mut i) }) {
            Ok(()) => self.tensor(i).map(Some),
            Err(e) if e.status == Status::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
    /// `wush_tensor_file_metadata`: the value of `key` in "__metadata__", or None.
    pub fn metadata(&self, key: &str) -> Result<Option<&str>> {
        let c = c_string(key, "metadata key")?;
        let mut v = ptr::null();
        // SAFETY: live handle; the value lives until the file is destroyed (borrow of self).
        match check(unsafe { sys::wush_tensor_file_metadata(self.raw.as_ptr(), c.as_ptr(), &mut v) }) {
            Ok(()) => Ok(Some(unsafe { borrowed_str(v) })),
            Err(e) if e.status == Status::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl Drop for TensorFile {
    fn drop(&mut self) {
        // SAFETY: owned handle; every Tensor borrowing it is gone.
        unsafe { sys::wush_tensor_file_destroy(self.raw.as_ptr()) }
    }
}

debug_handle!(TensorFile);
