//! Options and progress (`wush.h`: "Options and progress"): [`Options`].

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use crate::error::{check, Result};
use crate::sys;
#[cfg(doc)] // names in the documentation's links
use crate::Status;

c_enum! {
    /// Option ids of [`Options`] (`wush_option`).
    OptionId { Damping = sys::WUSH_OPTION_DAMPING, Seed = sys::WUSH_OPTION_SEED,
               TransformDtype = sys::WUSH_OPTION_TRANSFORM_DTYPE, Search = sys::WUSH_OPTION_SEARCH,
               SearchTokens = sys::WUSH_OPTION_SEARCH_TOKENS, SearchGuard = sys::WUSH_OPTION_SEARCH_GUARD,
               HessianDamping = sys::WUSH_OPTION_HESSIAN_DAMPING }
}

type ProgressFn = dyn Fn(f64) -> bool + Send + Sync;

/// Settings of the transform and quantization builders (`wush_options`).
///
/// `Send + Sync`: the header makes const use from several threads safe; setters take
/// `&mut self`, so they cannot run while the options are in use. A progress callback must
/// therefore be `Send + Sync` too: builders on several threads may call it at once.
pub struct Options {
    raw: NonNull<sys::wush_options>,
    // Boxed twice so the pointer handed to the library stays put when Options moves.
    progress: Option<Box<Box<ProgressFn>>>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for Options {}
unsafe impl Sync for Options {}

unsafe extern "C" fn progress_trampoline(user: *mut c_void, fraction: f64) -> std::os::raw::c_int {
    // SAFETY: `user` is the Box<ProgressFn> installed by set_progress, alive while the options are.
    let f = &*(user as *const Box<ProgressFn>);
    // A panic must not unwind into C: it stops the operation instead (WUSH_ERR_CANCELLED).
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(fraction))) {
        Ok(true) => 0,
        _ => 1,
    }
}

impl Options {
    /// `wush_options_create`: the defaults.
    pub fn new() -> Result<Options> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid output pointer.
        check(unsafe { sys::wush_options_create(&mut raw) })?;
        Ok(Options { raw: NonNull::new(raw).expect("wush_options_create returned NULL"), progress: None })
    }
    pub fn as_ptr(&self) -> *const sys::wush_options {
        self.raw.as_ptr()
    }
    /// `wush_options_set_double`.
    pub fn set_double(&mut self, id: OptionId, value: f64) -> Result<()> {
        // SAFETY: live handle, exclusive access.
        check(unsafe { sys::wush_options_set_double(self.raw.as_ptr(), id.to_c(), value) })
    }
    /// `wush_options_set_int`.
    pub fn set_int(&mut self, id: OptionId, value: i64) -> Result<()> {
        // SAFETY: live handle, exclusive access.
        check(unsafe { sys::wush_options_set_int(self.raw.as_ptr(), id.to_c(), value) })
    }
    /// `wush_options_get_double`.
    pub fn get_double(&self, id: OptionId) -> Result<f64> {
        let mut v = 0.0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_options_get_double(self.raw.as_ptr(), id.to_c(), &mut v) })?;
        Ok(v)
    }
    /// `wush_options_get_int`.
    pub fn get_int(&self, id: OptionId) -> Result<i64> {
        let mut v = 0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_options_get_int(self.raw.as_ptr(), id.to_c(), &mut v) })?;
        Ok(v)
    }
    /// `wush_options_sample_size`: the token sample a calibrator needs for these options (0
    /// without the search).
    pub fn sample_size(&self) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_options_sample_size(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }
    /// `wush_options_set_progress`: `f(fraction)` returns false to cancel the operation (it then
    /// fails with [`Status::Cancelled`]). A panicking callback cancels too.
    pub fn set_progress<F: Fn(f64) -> bool + Send + Sync + 'static>(&mut self, f: F) -> Result<()> {
        let boxed: Box<Box<ProgressFn>> = Box::new(Box::new(f));
        let user = &*boxed as *const Box<ProgressFn> as *mut c_void;
        // SAFETY: the box outlives its registration: it is kept in self until replaced or dropped,
        // and replacing it re-registers first.
        check(unsafe { sys::wush_options_set_progress(self.raw.as_ptr(), Some(progress_trampoline), user) })?;
        self.progress = Some(boxed);
        Ok(())
    }
    /// Removes the progress callback.
    pub fn clear_progress(&mut self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::wush_options_set_progress(self.raw.as_ptr(), None, ptr::null_mut()) })?;
        self.progress = None;
        Ok(())
    }
}

pub(crate) fn opt_ptr(o: Option<&Options>) -> *const sys::wush_options {
    o.map_or(ptr::null(), |o| o.as_ptr())
}

impl Drop for Options {
    fn drop(&mut self) {
        // SAFETY: owned handle; the callback box is dropped after it.
        unsafe { sys::wush_options_destroy(self.raw.as_ptr()) }
    }
}

debug_handle!(Options);
