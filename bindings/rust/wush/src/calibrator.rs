//! Calibration (`wush.h`: "Calibration"): [`Calibrator`], streaming second moments of a layer's
//! input activations.

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use crate::context::Context;
use crate::error::{check, checked_alloc, rows_of, Result};
use crate::sys;
use crate::types::{DType, Element};

c_enum! {
    /// What a calibrator accumulates (`wush_moment_mode`).
    MomentMode { BlockDiagonal = sys::WUSH_MOMENTS_BLOCK_DIAGONAL, Full = sys::WUSH_MOMENTS_FULL }
}

/// Streaming second moments of a layer's input activations (`wush_calibrator`).
///
/// `Send + Sync`: the header lets distinct threads use distinct objects, and lets calls that
/// only read an object (the `const wush_calibrator*` functions: counts, moments, export) run
/// concurrently; those take `&self`. The calls that modify it ("do not share it between threads
/// without a lock") take `&mut self`, which Rust makes exclusive.
pub struct Calibrator {
    pub(crate) raw: NonNull<sys::wush_calibrator>,
    pub(crate) d_in: usize,
    group_size: usize,
}

// SAFETY: see the type's documentation.
unsafe impl Send for Calibrator {}
unsafe impl Sync for Calibrator {}

impl Calibrator {
    /// `wush_calibrator_create` for activations of width `d_in` in blocks of `group_size`.
    pub fn new(d_in: usize, group_size: usize, mode: MomentMode) -> Result<Calibrator> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid output pointer.
        check(unsafe { sys::wush_calibrator_create(d_in, group_size, mode.to_c(), &mut raw) })?;
        Ok(Calibrator { raw: NonNull::new(raw).expect("NULL calibrator"), d_in, group_size })
    }
    pub fn as_ptr(&self) -> *const sys::wush_calibrator {
        self.raw.as_ptr()
    }
    pub fn d_in(&self) -> usize {
        self.d_in
    }
    pub fn group_size(&self) -> usize {
        self.group_size
    }
    /// `wush_calibrator_add`: adds the tokens of `x` (rows of d_in). CPU contexts.
    pub fn add<T: Element>(&mut self, ctx: &Context, x: &[T]) -> Result<()> {
        ctx.require_host("wush_calibrator_add")?;
        let n = rows_of(x.len(), self.d_in, "x")?;
        // SAFETY: host context; x holds n * d_in elements.
        check(unsafe {
            sys::wush_calibrator_add(ctx.as_ptr(), self.raw.as_ptr(), T::DTYPE.to_c(), x.as_ptr().cast(), n)
        })
    }
    /// `wush_calibrator_add_sequences`: adds `x`, whole sequences of `sequence_length` tokens (rows
    /// of d_in) back to back; the token sample remembers each sampled token's sequence, so the
    /// search's guard can hold out whole sequences. CPU contexts.
    pub fn add_sequences<T: Element>(&mut self, ctx: &Context, x: &[T], sequence_length: usize) -> Result<()> {
        ctx.require_host("wush_calibrator_add_sequences")?;
        let n = rows_of(x.len(), self.d_in, "x")?;
        // SAFETY: host context; x holds n * d_in elements.
        check(unsafe {
            sys::wush_calibrator_add_sequences(ctx.as_ptr(), self.raw.as_ptr(), T::DTYPE.to_c(), x.as_ptr().cast(), n,
                                               sequence_length)
        })
    }
    /// `wush_calibrator_add_document`: adds `x` (rows of d_in), every row of the caller's document
    /// `document` (one document's windows, added in several calls, share the id); the search's
    /// guard can then hold out whole documents. CPU contexts.
    pub fn add_document<T: Element>(&mut self, ctx: &Context, x: &[T], document: u64) -> Result<()> {
        ctx.require_host("wush_calibrator_add_document")?;
        let n = rows_of(x.len(), self.d_in, "x")?;
        // SAFETY: host context; x holds n * d_in elements.
        check(unsafe {
            sys::wush_calibrator_add_document(ctx.as_ptr(), self.raw.as_ptr(), T::DTYPE.to_c(), x.as_ptr().cast(), n,
                                              document)
        })
    }
    /// `wush_calibrator_add` on a CUDA context.
    ///
    /// # Safety
    /// `x` is a device pointer on the context's device to `n_tokens * d_in` elements of `dtype`.
    pub unsafe fn add_device(&mut self, ctx: &Context, dtype: DType, x: *const c_void, n_tokens: usize) -> Result<()> {
        check(sys::wush_calibrator_add(ctx.as_ptr(), self.raw.as_ptr(), dtype.to_c(), x, n_tokens))
    }
    /// `wush_calibrator_add_validation`: offers held-out tokens to the validation sample. CPU contexts.
    pub fn add_validation<T: Element>(&mut self, ctx: &Context, x: &[T]) -> Result<()> {
        ctx.require_host("wush_calibrator_add_validation")?;
        let n = rows_of(x.len(), self.d_in, "x")?;
        // SAFETY: host context; x holds n * d_in elements.
        check(unsafe {
            sys::wush_calibrator_add_validation(ctx.as_ptr(), self.raw.as_ptr(), T::DTYPE.to_c(), x.as_ptr().cast(), n)
        })
    }
    /// `wush_calibrator_add_validation` on a CUDA context.
    ///
    /// # Safety
    /// As [`Calibrator::add_device`].
    pub unsafe fn add_validation_device(&mut self, ctx: &Context, dtype: DType, x: *const c_void, n_tokens: usize)
                                        -> Result<()> {
        check(sys::wush_calibrator_add_validation(ctx.as_ptr(), self.raw.as_ptr(), dtype.to_c(), x, n_tokens))
    }
    /// `wush_calibrator_merge`: adds `from`'s sums into `self`.
    pub fn merge(&mut self, from: &Calibrator) -> Result<()> {
        // SAFETY: live handles; the borrows make them distinct.
        check(unsafe { sys::wush_calibrator_merge(self.raw.as_ptr(), from.raw.as_ptr()) })
    }
    /// `wush_calibrator_token_count`.
    pub fn token_count(&self) -> Result<u64> {
        let mut n = 0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_calibrator_token_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
    /// `wush_calibrator_second_moment`: block `block`'s G x G moment, row-major.
    pub fn second_moment(&self, block: usize) -> Result<Vec<f64>> {
        let mut m = vec![0f64; checked_alloc::<f64>(self.group_size, self.group_size, "G x G moment")?];
        // SAFETY: the buffer holds the count passed.
        check(unsafe { sys::wush_calibrator_second_moment(self.raw.as_ptr(), block, m.as_mut_ptr(), m.len()) })?;
        Ok(m)
    }
    /// `wush_calibrator_state_size` + `wush_calibrator_export_state`: the state for all-reduce.
    pub fn export_state(&self) -> Result<Vec<f64>> {
        let mut n = 0;
        // SAFETY: live handle, valid output pointer; then a buffer of the size returned.
        check(unsafe { sys::wush_calibrator_state_size(self.raw.as_ptr(), &mut n) })?;
        let mut s = vec![0f64; checked_alloc::<f64>(n, 1, "calibrator state")?];
        check(unsafe { sys::wush_calibrator_export_state(self.raw.as_ptr(), s.as_mut_ptr(), s.len()) })?;
        Ok(s)
    }
    /// `wush_calibrator_import_state`.
    pub fn import_state(&mut self, state: &[f64]) -> Result<()> {
        // SAFETY: the size passed is the slice's length.
        check(unsafe { sys::wush_calibrator_import_state(self.raw.as_ptr(), state.as_ptr(), state.len()) })
    }
    /// `wush_calibrator_set_sample_size`.
    pub fn set_sample_size(&mut self, n_tokens: usize) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::wush_calibrator_set_sample_size(self.raw.as_ptr(), n_tokens) })
    }
    /// `wush_calibrator_sample_count`.
    pub fn sample_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_calibrator_sample_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
    /// `wush_calibrator_set_validation_size`.
    pub fn set_validation_size(&mut self, n_tokens: usize) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::wush_calibrator_set_validation_size(self.raw.as_ptr(), n_tokens) })
    }
    /// `wush_calibrator_validation_count`.
    pub fn validation_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_calibrator_validation_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
}

impl Drop for Calibrator {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::wush_calibrator_destroy(self.raw.as_ptr()) }
    }
}

debug_handle!(Calibrator);
