//! Contexts (`wush.h`: "Contexts"): [`Context`], its backend and parameters.

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use crate::error::{check, enum_out, Error, Result};
use crate::runtime::CpuIsa;
use crate::sys;
use crate::version::check_version;

c_enum! {
    /// Where a context runs (`wush_backend`).
    Backend { Cpu = sys::WUSH_BACKEND_CPU, Cuda = sys::WUSH_BACKEND_CUDA }
}
c_enum! {
    /// Context parameters (`wush_context_parameter`).
    ContextParameter {
        NumThreads = sys::WUSH_CONTEXT_NUM_THREADS,
        CpuIsa = sys::WUSH_CONTEXT_CPU_ISA,
        OpenmpTeam = sys::WUSH_CONTEXT_OPENMP_TEAM,
        // Experimental (wush.h): the CUDA backend's kernel switches, read when a layer is prepared.
        CudaPrefillMinM = sys::WUSH_CONTEXT_CUDA_PREFILL_MIN_M,
        CudaBlockscaled = sys::WUSH_CONTEXT_CUDA_BLOCKSCALED,
        CudaStreamDecode = sys::WUSH_CONTEXT_CUDA_STREAM_DECODE,
        CudaBf16Prefill = sys::WUSH_CONTEXT_CUDA_BF16_PREFILL,
        CudaTcQuantize = sys::WUSH_CONTEXT_CUDA_TC_QUANTIZE
    }
}

/// A context (`wush_context`): a backend, its device and execution settings.
///
/// `Send + Sync`: the header serializes the calls that take one context inside the library (a
/// second thread waits), so a context may be moved to and shared between threads; all methods
/// take `&self`. For parallel work give each thread its own context. Destruction needs exclusive
/// ownership (`Drop`), which is the header's "must not race with other calls".
pub struct Context {
    raw: NonNull<sys::wush_context>,
    backend: Backend,
}

// SAFETY: see the type's documentation (calls on one context are serialized by the library).
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// `wush_context_create`. For [`Backend::Cpu`] `device` must be 0.
    pub fn new(backend: Backend, device: i32) -> Result<Context> {
        check_version()?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid output pointer.
        check(unsafe { sys::wush_context_create(backend.to_c(), device, &mut raw) })?;
        let mut ctx = Context { raw: NonNull::new(raw).expect("wush_context_create returned NULL"), backend };
        // The backend as the library reports it (`wush_context_backend`), kept for backend().
        let mut b = 0;
        // SAFETY: a live handle just created, valid output pointer.
        check(unsafe { sys::wush_context_backend(ctx.raw.as_ptr(), &mut b) })?;
        ctx.backend = enum_out(b, Backend::from_c, "backend")?;
        Ok(ctx)
    }

    /// A CPU context.
    pub fn cpu() -> Result<Context> {
        Context::new(Backend::Cpu, 0)
    }

    /// The raw handle, for calls through [`sys`]. It stays owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::wush_context {
        self.raw.as_ptr()
    }

    /// The backend, as `wush_context_backend` reported it when the context was created.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Host slices are only valid on a CPU context: on a CUDA context the runtime functions read
    /// and write device pointers (use the `unsafe` `*_device` methods).
    pub(crate) fn require_host(&self, what: &str) -> Result<()> {
        if self.backend != Backend::Cpu {
            return Err(Error::invalid(format!(
                "{what} with host slices needs a CPU context; a CUDA context takes device pointers (the unsafe *_device methods)")));
        }
        Ok(())
    }

    /// `wush_context_set_parameter`.
    pub fn set_parameter(&self, param: ContextParameter, value: i64) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::wush_context_set_parameter(self.as_ptr(), param.to_c(), value) })
    }

    /// `wush_context_get_parameter`.
    pub fn parameter(&self, param: ContextParameter) -> Result<i64> {
        let mut v = 0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_context_get_parameter(self.as_ptr(), param.to_c(), &mut v) })?;
        Ok(v)
    }

    /// Sets [`ContextParameter::NumThreads`] (0 = OpenMP's default).
    pub fn set_num_threads(&self, n: usize) -> Result<()> {
        self.set_parameter(ContextParameter::NumThreads, i64::try_from(n).unwrap_or(i64::MAX))
    }

    /// Sets [`ContextParameter::CpuIsa`].
    pub fn set_cpu_isa(&self, isa: CpuIsa) -> Result<()> {
        self.set_parameter(ContextParameter::CpuIsa, isa.to_c() as i64)
    }

    /// `wush_context_cpu_isa`: the ISA the CPU runtime uses (never [`CpuIsa::Auto`]).
    pub fn cpu_isa(&self) -> Result<CpuIsa> {
        let mut isa = 0;
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_context_cpu_isa(self.as_ptr(), &mut isa) })?;
        enum_out(isa, CpuIsa::from_c, "cpu isa")
    }

    /// `wush_context_describe`, e.g. "cpu (avx2)".
    pub fn describe(&self) -> Result<String> {
        let mut buf = [0u8; 256]; // the header: 256 bytes are always enough
        // SAFETY: live handle; the buffer holds the size passed.
        check(unsafe { sys::wush_context_describe(self.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// `wush_context_synchronize`: waits for the context's stream and reports device-side errors.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: live handle.
        check(unsafe { sys::wush_context_synchronize(self.as_ptr()) })
    }

    /// `wush_context_get_stream`: the context's stream (NULL on a CPU context).
    pub fn stream(&self) -> Result<*mut c_void> {
        let mut s = ptr::null_mut();
        // SAFETY: live handle, valid output pointer.
        check(unsafe { sys::wush_context_get_stream(self.as_ptr(), &mut s) })?;
        Ok(s)
    }

    /// `wush_context_set_stream`.
    ///
    /// # Safety
    /// `stream` is NULL or a `cudaStream_t` of the context's device that stays alive while the
    /// context uses it.
    pub unsafe fn set_stream(&self, stream: *mut c_void) -> Result<()> {
        check(sys::wush_context_set_stream(self.as_ptr(), stream))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: owned handle; every Linear borrowing it is gone (the borrow checker).
        unsafe { sys::wush_context_destroy(self.raw.as_ptr()) }
    }
}

debug_handle!(Context);
