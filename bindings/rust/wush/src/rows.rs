//! Quantizing and dequantizing rows, no transform (`wush.h`: "Quantizing and dequantizing rows"):
//! methods of [`Context`].

use crate::context::Context;
use crate::error::{check, checked_alloc, rows_of, Result};
use crate::sys;
use crate::types::{Element, Format};

impl Context {
    /// `wush_quantize_rows`: quantizes the rows of `x` (row width `d_in`) into `codes` and
    /// `scales` (sizes from [`Format::buffer_sizes`]). Host memory on every backend.
    pub fn quantize_rows_into<T: Element>(&self, format: Format, x: &[T], d_in: usize, codes: &mut [u8],
                                          scales: &mut [u8]) -> Result<()> {
        let n_rows = rows_of(x.len(), d_in, "x")?;
        // SAFETY: x holds n_rows * d_in elements; the output sizes are the slices' lengths.
        check(unsafe {
            sys::wush_quantize_rows(self.as_ptr(), format.to_c(), T::DTYPE.to_c(), x.as_ptr().cast(), n_rows, d_in,
                                    codes.as_mut_ptr().cast(), codes.len(), scales.as_mut_ptr().cast(), scales.len())
        })
    }

    /// [`Context::quantize_rows_into`] into new buffers: (codes, scales).
    pub fn quantize_rows<T: Element>(&self, format: Format, x: &[T], d_in: usize) -> Result<(Vec<u8>, Vec<u8>)> {
        let n_rows = rows_of(x.len(), d_in, "x")?;
        let (cb, sb) = format.buffer_sizes(n_rows, d_in)?;
        let (mut codes, mut scales) =
            (vec![0u8; checked_alloc::<u8>(cb, 1, "codes")?], vec![0u8; checked_alloc::<u8>(sb, 1, "scales")?]);
        self.quantize_rows_into(format, x, d_in, &mut codes, &mut scales)?;
        Ok((codes, scales))
    }

    /// `wush_dequantize_rows`: decodes `n_rows` rows of width `d_in` into `y`.
    pub fn dequantize_rows_into(&self, format: Format, codes: &[u8], scales: &[u8], n_rows: usize, d_in: usize,
                                y: &mut [f32]) -> Result<()> {
        // SAFETY: every size passed is the length of its slice; the library checks them.
        check(unsafe {
            sys::wush_dequantize_rows(self.as_ptr(), format.to_c(), codes.as_ptr().cast(), codes.len(),
                                      scales.as_ptr().cast(), scales.len(), n_rows, d_in, y.as_mut_ptr(), y.len())
        })
    }

    /// [`Context::dequantize_rows_into`] into a new vector of n_rows * d_in floats.
    pub fn dequantize_rows(&self, format: Format, codes: &[u8], scales: &[u8], n_rows: usize, d_in: usize)
                           -> Result<Vec<f32>> {
        let mut y = vec![0f32; checked_alloc::<f32>(n_rows, d_in, "n_rows x d_in")?];
        self.dequantize_rows_into(format, codes, scales, n_rows, d_in, &mut y)?;
        Ok(y)
    }
}
