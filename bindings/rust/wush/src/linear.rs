//! Prepared layers (`wush.h`: "Prepared layers"): [`Linear`], a transform and a qweight bound to one
//! context.

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use crate::context::Context;
use crate::error::{check, checked_alloc, enum_out, rows_of, Result};
use crate::qweight::QWeight;
use crate::sys;
use crate::transform::Transform;
use crate::types::{DType, Element, Format, OutputElement};

/// A transform and a qweight prepared once on a context (`wush_linear`).
///
/// It borrows its [`Context`]: the header requires destroying the layer before the context.
/// It does not borrow the transform and qweight (the header: they may be destroyed).
/// `Send + Sync`: its calls are serialized per context by the library and the kernels only read
/// the layer, so it may be shared like its context.
pub struct Linear<'ctx> {
    raw: NonNull<sys::wush_linear>,
    ctx: &'ctx Context,
    d_out: usize,
    d_in: usize,
    format: Format,
}

// SAFETY: see the type's documentation.
unsafe impl Send for Linear<'_> {}
unsafe impl Sync for Linear<'_> {}

impl<'ctx> Linear<'ctx> {
    /// `wush_linear_create`.
    pub fn new(ctx: &'ctx Context, transform: &Transform, qweight: &QWeight) -> Result<Linear<'ctx>> {
        let mut raw = ptr::null_mut();
        // SAFETY: live handles, valid output pointer.
        check(unsafe { sys::wush_linear_create(ctx.as_ptr(), transform.raw.as_ptr(), qweight.raw.as_ptr(), &mut raw) })?;
        let raw = NonNull::new(raw).expect("NULL linear");
        let (mut o, mut i, mut f) = (0, 0, 0);
        // SAFETY: live handle, valid output pointers.
        let st = unsafe { sys::wush_linear_info(raw.as_ptr(), &mut o, &mut i, &mut f) };
        let mut l = Linear { raw, ctx, d_out: o, d_in: i, format: Format::Mxfp4 };
        check(st)?;
        l.format = enum_out(f, Format::from_c, "format")?;
        Ok(l)
    }
    pub fn as_ptr(&self) -> *mut sys::wush_linear {
        self.raw.as_ptr()
    }
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }
    /// `wush_linear_info`: (d_out, d_in, format).
    pub fn info(&self) -> (usize, usize, Format) {
        (self.d_out, self.d_in, self.format)
    }
    /// `wush_linear_workspace_size` for up to `n_tokens` tokens.
    pub fn workspace_size(&self, n_tokens: usize) -> Result<usize> {
        let mut b = 0;
        // SAFETY: live handles, valid output pointer.
        check(unsafe { sys::wush_linear_workspace_size(self.ctx.as_ptr(), self.raw.as_ptr(), n_tokens, &mut b) })?;
        Ok(b)
    }
    /// `wush_linear_quantize`: the activation side alone. CPU contexts.
    pub fn quantize<T: Element>(&self, x: &[T], codes: &mut [u8], scales: &mut [u8]) -> Result<()> {
        self.ctx.require_host("wush_linear_quantize")?;
        let n = rows_of(x.len(), self.d_in, "x")?;
        // SAFETY: host context; x holds n * d_in elements; outputs are sized by their lengths.
        unsafe { self.quantize_raw(T::DTYPE, x.as_ptr().cast(), n, codes.as_mut_ptr().cast(), codes.len(),
                                   scales.as_mut_ptr().cast(), scales.len()) }
    }
    /// `wush_linear_run`: y (n_tokens x d_out) for x (n_tokens x d_in), with a caller's
    /// workspace of [`Linear::workspace_size`] bytes. Allocates nothing. CPU contexts.
    pub fn run<T: Element, O: OutputElement>(&self, x: &[T], y: &mut [O], workspace: &mut [u8]) -> Result<()> {
        self.ctx.require_host("wush_linear_run")?;
        let n = rows_of(x.len(), self.d_in, "x")?;
        // SAFETY: host context; x holds n * d_in elements; outputs are sized by their lengths.
        unsafe { self.run_raw(T::DTYPE, x.as_ptr().cast(), n, O::DTYPE, y.as_mut_ptr().cast(), y.len(),
                              workspace.as_mut_ptr().cast(), workspace.len()) }
    }
    /// `wush_linear_run_bias`: [`Linear::run`] plus `bias` (d_out values of any [`Element`] type,
    /// else `InvalidArgument`), added in float32 before the rounding to y's type. CPU contexts.
    pub fn run_bias<T: Element, B: Element, O: OutputElement>(&self, x: &[T], bias: &[B], y: &mut [O],
                                                              workspace: &mut [u8]) -> Result<()> {
        self.ctx.require_host("wush_linear_run_bias")?;
        let n = rows_of(x.len(), self.d_in, "x")?;
        // SAFETY: host context; x holds n * d_in elements, bias bias.len() (checked against d_out by
        // the library before it is read); outputs are sized by their lengths.
        unsafe {
            self.run_bias_raw(T::DTYPE, x.as_ptr().cast(), n, B::DTYPE, bias.as_ptr().cast(), bias.len(), O::DTYPE,
                              y.as_mut_ptr().cast(), y.len(), workspace.as_mut_ptr().cast(), workspace.len())
        }
    }
    /// `wush_linear_run_quantized` (experimental): the GEMM half of [`Linear::run`], on `n_tokens`
    /// rows of activations that [`Linear::quantize`] wrote. CPU contexts.
    pub fn run_quantized<O: OutputElement>(&self, codes: &[u8], scales: &[u8], n_tokens: usize, y: &mut [O],
                                           workspace: &mut [u8]) -> Result<()> {
        self.ctx.require_host("wush_linear_run_quantized")?;
        // SAFETY: host context; every buffer is passed with its length, which the library checks
        // against n_tokens before reading or writing.
        unsafe {
            self.run_quantized_raw(codes.as_ptr().cast(), codes.len(), scales.as_ptr().cast(), scales.len(), n_tokens,
                                   O::DTYPE, y.as_mut_ptr().cast(), y.len(), workspace.as_mut_ptr().cast(),
                                   workspace.len())
        }
    }
    /// `wush_linear_last_kernels` (experimental): the kernels the layer's last call ran, e.g.
    /// "cpu.quantize.avx2 cpu.gemm.avx2" or "quantize.small_m gemm.decode"; "" before the first.
    pub fn last_kernels(&self) -> Result<String> {
        let mut buf = [0u8; 64]; // the header: 64 bytes are always enough
        // SAFETY: live handle; the buffer holds the size passed.
        check(unsafe { sys::wush_linear_last_kernels(self.raw.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
    /// [`Linear::run`] with new f32 output and workspace (convenient, allocates).
    pub fn forward<T: Element>(&self, x: &[T]) -> Result<Vec<f32>> {
        let n = rows_of(x.len(), self.d_in, "x")?;
        let mut ws = vec![0u8; checked_alloc::<u8>(self.workspace_size(n)?, 1, "workspace")?];
        let mut y = vec![0f32; checked_alloc::<f32>(n, self.d_out, "y")?];
        self.run(x, &mut y, &mut ws)?;
        Ok(y)
    }
    /// `wush_linear_quantize` on a CUDA context (stream-ordered, allocation-free).
    ///
    /// # Safety
    /// `x`, `codes` and `scales` are device pointers on the context's device to n_tokens * d_in
    /// elements of `dtype`, `codes_bytes` and `scales_bytes` bytes; they stay valid until the
    /// work enqueued on the context's stream has finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn quantize_device(&self, dtype: DType, x: *const c_void, n_tokens: usize, codes: *mut c_void,
                                  codes_bytes: usize, scales: *mut c_void, scales_bytes: usize) -> Result<()> {
        self.quantize_raw(dtype, x, n_tokens, codes, codes_bytes, scales, scales_bytes)
    }
    /// `wush_linear_run` on a CUDA context (stream-ordered, allocation-free, graph-capturable).
    ///
    /// # Safety
    /// `x`, `y` and `workspace` are device pointers on the context's device to n_tokens * d_in
    /// elements of `x_dtype`, `y_count` elements of `y_dtype` and `workspace_bytes` bytes; they
    /// stay valid until the work enqueued on the context's stream has finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_device(&self, x_dtype: DType, x: *const c_void, n_tokens: usize, y_dtype: DType, y: *mut c_void,
                             y_count: usize, workspace: *mut c_void, workspace_bytes: usize) -> Result<()> {
        self.run_raw(x_dtype, x, n_tokens, y_dtype, y, y_count, workspace, workspace_bytes)
    }
    /// `wush_linear_run_bias` on a CUDA context (stream-ordered, allocation-free, graph-capturable).
    ///
    /// # Safety
    /// As [`Linear::run_device`]; `bias` is a device pointer to `bias_count` (= d_out) elements of
    /// `bias_dtype`, or null for no bias, valid until the enqueued work has finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_bias_device(&self, x_dtype: DType, x: *const c_void, n_tokens: usize, bias_dtype: DType,
                                  bias: *const c_void, bias_count: usize, y_dtype: DType, y: *mut c_void,
                                  y_count: usize, workspace: *mut c_void, workspace_bytes: usize) -> Result<()> {
        self.run_bias_raw(x_dtype, x, n_tokens, bias_dtype, bias, bias_count, y_dtype, y, y_count, workspace,
                          workspace_bytes)
    }
    /// `wush_linear_run_quantized` (experimental) on a CUDA context (stream-ordered,
    /// allocation-free, graph-capturable).
    ///
    /// # Safety
    /// `codes`, `scales`, `y` and `workspace` are device pointers on the context's device to
    /// `codes_bytes`, `scales_bytes`, `y_count` elements of `y_dtype` and `workspace_bytes` bytes;
    /// they stay valid until the work enqueued on the context's stream has finished.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn run_quantized_device(&self, codes: *const c_void, codes_bytes: usize, scales: *const c_void,
                                       scales_bytes: usize, n_tokens: usize, y_dtype: DType, y: *mut c_void,
                                       y_count: usize, workspace: *mut c_void, workspace_bytes: usize) -> Result<()> {
        self.run_quantized_raw(codes, codes_bytes, scales, scales_bytes, n_tokens, y_dtype, y, y_count, workspace,
                               workspace_bytes)
    }
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_quantized_raw(&self, c: *const c_void, cb: usize, s: *const c_void, sb: usize, n: usize, yd: DType,
                                y: *mut c_void, yc: usize, ws: *mut c_void, wb: usize) -> Result<()> {
        check(sys::wush_linear_run_quantized(self.ctx.as_ptr(), self.raw.as_ptr(), c, cb, s, sb, n, yd.to_c(), y, yc,
                                             ws, wb))
    }
    #[allow(clippy::too_many_arguments)]
    unsafe fn quantize_raw(&self, dtype: DType, x: *const c_void, n: usize, codes: *mut c_void, cb: usize,
                           scales: *mut c_void, sb: usize) -> Result<()> {
        check(sys::wush_linear_quantize(self.ctx.as_ptr(), self.raw.as_ptr(), dtype.to_c(), x, n, codes, cb, scales, sb))
    }
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_raw(&self, xd: DType, x: *const c_void, n: usize, yd: DType, y: *mut c_void, yc: usize,
                      ws: *mut c_void, wb: usize) -> Result<()> {
        check(sys::wush_linear_run(self.ctx.as_ptr(), self.raw.as_ptr(), xd.to_c(), x, n, yd.to_c(), y, yc, ws, wb))
    }
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_bias_raw(&self, xd: DType, x: *const c_void, n: usize, bd: DType, b: *const c_void, bc: usize,
                           yd: DType, y: *mut c_void, yc: usize, ws: *mut c_void, wb: usize) -> Result<()> {
        check(sys::wush_linear_run_bias(self.ctx.as_ptr(), self.raw.as_ptr(), xd.to_c(), x, n, bd.to_c(), b, bc,
                                        yd.to_c(), y, yc, ws, wb))
    }
}

impl Drop for Linear<'_> {
    fn drop(&mut self) {
        // SAFETY: owned handle; its context is still alive (borrowed).
        unsafe { sys::wush_linear_destroy(self.raw.as_ptr()) }
    }
}

debug_handle!(Linear<'_>);
