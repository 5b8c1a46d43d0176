//! Runtime (`wush.h`: "Runtime"): the CPU ISAs and the per-call fused transform + quantization,
//! W4A4 GEMM and linear forward, methods of [`Context`].

use crate::context::Context;
use crate::error::{check, rows_of, static_str, Result};
use crate::qweight::QWeight;
use crate::sys;
use crate::transform::Transform;
use crate::types::{Element, Format, OutputElement};

c_enum! {
    /// SIMD kernel sets of the CPU runtime (`wush_cpu_isa`).
    CpuIsa { Auto = sys::WUSH_CPU_ISA_AUTO, Scalar = sys::WUSH_CPU_ISA_SCALAR, Avx2 = sys::WUSH_CPU_ISA_AVX2,
             Avx512Vnni = sys::WUSH_CPU_ISA_AVX512_VNNI }
}

impl CpuIsa {
    /// `wush_cpu_isa_name`.
    pub fn name(self) -> &'static str {
        // SAFETY: static string or NULL.
        unsafe { static_str(sys::wush_cpu_isa_name(self.to_c())) }.unwrap_or("")
    }
    /// `wush_cpu_isa_supported`: whether this CPU can run the ISA's kernels.
    pub fn supported(self) -> bool {
        // SAFETY: plain query.
        unsafe { sys::wush_cpu_isa_supported(self.to_c()) != 0 }
    }
}
impl Context {
    /// `wush_quantize_activations`: transforms and quantizes the tokens of `x` (row width the
    /// transform's d_in). CPU contexts.
    pub fn quantize_activations<T: Element>(&self, transform: &Transform, format: Format, x: &[T], codes: &mut [u8],
                                            scales: &mut [u8]) -> Result<()> {
        self.require_host("wush_quantize_activations")?;
        let n_tokens = rows_of(x.len(), transform.d_in, "x")?;
        // SAFETY: host context; x holds n_tokens * d_in elements; output sizes are slice lengths.
        check(unsafe {
            sys::wush_quantize_activations(self.as_ptr(), transform.raw.as_ptr(), format.to_c(), T::DTYPE.to_c(),
                                           x.as_ptr().cast(), n_tokens, transform.d_in, codes.as_mut_ptr().cast(),
                                           codes.len(), scales.as_mut_ptr().cast(), scales.len())
        })
    }

    /// `wush_gemm`: y (m x d_out) = A W_q^T for `m` packed activation rows. CPU contexts.
    pub fn gemm<O: OutputElement>(&self, qweight: &QWeight, a_codes: &[u8], a_scales: &[u8], m: usize,
                                  y: &mut [O]) -> Result<()> {
        self.require_host("wush_gemm")?;
        // SAFETY: host context; every size passed is its slice's length (the library checks).
        check(unsafe {
            sys::wush_gemm(self.as_ptr(), qweight.raw.as_ptr(), a_codes.as_ptr().cast(), a_codes.len(),
                           a_scales.as_ptr().cast(), a_scales.len(), m, O::DTYPE.to_c(), y.as_mut_ptr().cast(), y.len())
        })
    }

    /// `wush_linear_forward_workspace_size`.
    pub fn linear_forward_workspace_size(&self, transform: &Transform, qweight: &QWeight, n_tokens: usize)
                                         -> Result<usize> {
        let mut b = 0;
        // SAFETY: live handles, valid output pointer.
        check(unsafe {
            sys::wush_linear_forward_workspace_size(self.as_ptr(), transform.raw.as_ptr(), qweight.raw.as_ptr(),
                                                    n_tokens, &mut b)
        })?;
        Ok(b)
    }

    /// `wush_linear_forward`: the per-call quantized linear layer. CPU contexts.
    pub fn linear_forward<T: Element, O: OutputElement>(&self, transform: &Transform, qweight: &QWeight, x: &[T],
                                                        y: &mut [O], workspace: &mut [u8]) -> Result<()> {
        self.require_host("wush_linear_forward")?;
        let n_tokens = rows_of(x.len(), transform.d_in, "x")?;
        // SAFETY: host context; x holds n_tokens * d_in elements; other sizes are slice lengths.
        check(unsafe {
            sys::wush_linear_forward(self.as_ptr(), transform.raw.as_ptr(), qweight.raw.as_ptr(), T::DTYPE.to_c(),
                                     x.as_ptr().cast(), n_tokens, O::DTYPE.to_c(), y.as_mut_ptr().cast(), y.len(),
                                     workspace.as_mut_ptr().cast(), workspace.len())
        })
    }
}
