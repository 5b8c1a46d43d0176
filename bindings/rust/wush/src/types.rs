//! Element types and block formats (`wush.h`: "Element types and block formats"): [`Format`],
//! [`DType`] and the element types of dense tensors.

use crate::error::{c_string, check, enum_out, static_str, Result};
use crate::sys;

c_enum! {
    /// The 4-bit block formats (`wush_format`).
    Format { Mxfp4 = sys::WUSH_FORMAT_MXFP4, Nvfp4 = sys::WUSH_FORMAT_NVFP4, Int4 = sys::WUSH_FORMAT_INT4,
             Mxfp4Ocp = sys::WUSH_FORMAT_MXFP4_OCP }
}
c_enum! {
    /// Element types of dense tensors (`wush_dtype`).
    DType { F32 = sys::WUSH_DTYPE_F32, F16 = sys::WUSH_DTYPE_F16, Bf16 = sys::WUSH_DTYPE_BF16 }
}

impl Format {
    /// `wush_format_name`: "mxfp4", "nvfp4", "int4" or "mxfp4_ocp".
    pub fn name(self) -> &'static str {
        // SAFETY: static string or NULL.
        unsafe { static_str(sys::wush_format_name(self.to_c())) }.unwrap_or("")
    }
    /// `wush_format_from_name` (case-insensitive).
    pub fn from_name(name: &str) -> Result<Format> {
        let c = c_string(name, "format name")?;
        let mut f = 0;
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_format_from_name(c.as_ptr(), &mut f) })?;
        enum_out(f, Format::from_c, "format")
    }
    /// `wush_format_group_size`: G, the elements per group scale.
    pub fn group_size(self) -> usize {
        let mut g = 0;
        // SAFETY: a known format and a valid output pointer: cannot fail.
        unsafe { sys::wush_format_group_size(self.to_c(), &mut g) };
        g
    }
    /// `wush_format_tensor_factor`: the per-tensor factor (1/3, 1/10 or 1).
    pub fn tensor_factor(self) -> f32 {
        let mut f = 0.0;
        // SAFETY: as above.
        unsafe { sys::wush_format_tensor_factor(self.to_c(), &mut f) };
        f
    }
    /// `wush_format_scale_bytes`: bytes of one group scale.
    pub fn scale_bytes(self) -> usize {
        let mut b = 0;
        // SAFETY: as above.
        unsafe { sys::wush_format_scale_bytes(self.to_c(), &mut b) };
        b
    }
    /// `wush_format_buffer_sizes`: (codes bytes, scales bytes) of an n_rows x d_in matrix.
    pub fn buffer_sizes(self, n_rows: usize, d_in: usize) -> Result<(usize, usize)> {
        let (mut c, mut s) = (0, 0);
        // SAFETY: valid output pointers.
        check(unsafe { sys::wush_format_buffer_sizes(self.to_c(), n_rows, d_in, &mut c, &mut s) })?;
        Ok((c, s))
    }
}

impl DType {
    /// `wush_dtype_size`: bytes per element.
    pub fn size(self) -> usize {
        let mut s = 0;
        // SAFETY: a known dtype and a valid output pointer: cannot fail.
        unsafe { sys::wush_dtype_size(self.to_c(), &mut s) };
        s
    }
}

/// An IEEE binary16 value, as its bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct F16(pub u16);

/// A bfloat16 value (the upper 16 bits of a binary32), as its bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounds to nearest, ties to even (NaN stays NaN).
    pub fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if x.is_nan() {
            return Bf16(((b >> 16) | 0x40) as u16);
        }
        Bf16(((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16)
    }
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

/// An element type of dense input tensors: `f32`, [`F16`] or [`Bf16`].
pub trait Element: sealed::Sealed + Copy + 'static {
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for F16 {
    const DTYPE: DType = DType::F16;
}
impl Element for Bf16 {
    const DTYPE: DType = DType::Bf16;
}

/// An element type the runtime writes outputs in: `f32` or [`Bf16`].
pub trait OutputElement: Element {}
impl OutputElement for f32 {}
impl OutputElement for Bf16 {}
