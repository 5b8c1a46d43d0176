//! Pre-quantized weights and the layerwise loss (`wush.h`: "Pre-quantized weights and the layerwise
//! loss"): [`QWeight`], [`layer_quantize`] and [`Context::layer_loss`].

use std::fmt;
use std::ptr::{self, NonNull};

use crate::calibrator::Calibrator;
use crate::context::Context;
use crate::error::{bytes, c_string, check, checked_elems, enum_out, expect_len, rows_of, static_str, Error, Result};
use crate::options::{opt_ptr, Options};
use crate::sys;
use crate::transform::{Transform, TransformKind};
use crate::types::{Element, Format};
#[cfg(doc)] // names in the documentation's links
use crate::{Checkpoint, MomentMode, Status};

c_enum! {
    /// Weight quantization methods (`wush_method`).
    Method { Rtn = sys::WUSH_METHOD_RTN, Gptq = sys::WUSH_METHOD_GPTQ }
}

impl Method {
    /// `wush_method_name`: the static lower-case name, "rtn" or "gptq" (the name a checkpoint
    /// records a layer's method under). Thread-safe.
    pub fn name(self) -> &'static str {
        // SAFETY: static string or NULL (NULL only for a value that is not a method).
        unsafe { static_str(sys::wush_method_name(self.to_c())) }.unwrap_or("")
    }
    /// `wush_method_from_name`: parses a name as [`Method::name`] returns it, case-insensitive.
    /// Thread-safe.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] with the library's message for an unknown name (or one with a
    /// NUL byte, this crate's check).
    pub fn from_name(name: &str) -> Result<Method> {
        let c = c_string(name, "method name")?;
        let mut m = 0;
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_method_from_name(c.as_ptr(), &mut m) })?;
        enum_out(m, Method::from_c, "method")
    }
}

impl std::str::FromStr for Method {
    type Err = Error;
    /// [`Method::from_name`].
    fn from_str(s: &str) -> Result<Method> {
        Method::from_name(s)
    }
}

impl fmt::Display for Method {
    /// [`Method::name`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What [`QWeight::info`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QWeightInfo {
    pub format: Format,
    pub method: Method,
    pub d_out: usize,
    pub d_in: usize,
}

/// Pre-quantized layer weights (`wush_qweight`).
///
/// `Send + Sync`: only read after creation; the header lets any number of threads use one at
/// once. One loaded from a [`Checkpoint`] keeps the file mapped itself, so it needs no lifetime.
pub struct QWeight {
    pub(crate) raw: NonNull<sys::wush_qweight>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for QWeight {}
unsafe impl Sync for QWeight {}

impl QWeight {
    pub(crate) fn wrap(raw: *mut sys::wush_qweight) -> QWeight {
        QWeight { raw: NonNull::new(raw).expect("NULL qweight") }
    }
    pub fn as_ptr(&self) -> *const sys::wush_qweight {
        self.raw.as_ptr()
    }
    /// `wush_qweight_create`: quantizes `weight` (d_out x d_in) after the transform's weight side.
    pub fn new<T: Element>(ctx: &Context, transform: &Transform, format: Format, method: Method, weight: &[T],
                           d_out: usize, options: Option<&Options>) -> Result<QWeight> {
        expect_len(weight.len(), checked_elems(d_out, transform.d_in, "weight")?, "weight")?;
        let mut raw = ptr::null_mut();
        // SAFETY: weight holds d_out * d_in elements; valid output pointer.
        check(unsafe {
            sys::wush_qweight_create(ctx.as_ptr(), transform.raw.as_ptr(), format.to_c(), method.to_c(),
                                     T::DTYPE.to_c(), weight.as_ptr().cast(), d_out, transform.d_in,
                                     opt_ptr(options), &mut raw)
        })?;
        Ok(QWeight::wrap(raw))
    }
    /// `wush_qweight_info`.
    pub fn info(&self) -> Result<QWeightInfo> {
        let (mut f, mut m, mut o, mut i) = (0, 0, 0, 0);
        // SAFETY: live handle, valid output pointers.
        check(unsafe { sys::wush_qweight_info(self.raw.as_ptr(), &mut f, &mut m, &mut o, &mut i) })?;
        Ok(QWeightInfo { format: enum_out(f, Format::from_c, "format")?, method: enum_out(m, Method::from_c, "method")?,
                         d_out: o, d_in: i })
    }
    /// `wush_qweight_data`: (codes, scales), borrowed from the qweight.
    pub fn data(&self) -> Result<(&[u8], &[u8])> {
        let (mut c, mut cb, mut s, mut sb) = (ptr::null(), 0, ptr::null(), 0);
        // SAFETY: live handle; the pointers stay valid until the qweight is destroyed, which the
        // returned borrows of self prevent.
        check(unsafe { sys::wush_qweight_data(self.raw.as_ptr(), &mut c, &mut cb, &mut s, &mut sb) })?;
        unsafe { Ok((bytes(c, cb, "qweight codes")?, bytes(s, sb, "qweight scales")?)) }
    }
}

impl Drop for QWeight {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::wush_qweight_destroy(self.raw.as_ptr()) }
    }
}

/// `wush_layer_quantize`: a layer's transform of `kind` and its weights quantized with
/// `method` (RTN, or GPTQ with a [`MomentMode::Full`] calibrator) in one call.
pub fn layer_quantize<T: Element>(ctx: &Context, calibrator: &Calibrator, kind: TransformKind, format: Format,
                                  method: Method, weight: &[T], d_out: usize, options: Option<&Options>)
                                  -> Result<(Transform, QWeight)> {
    expect_len(weight.len(), checked_elems(d_out, calibrator.d_in, "weight")?, "weight")?;
    let (mut t, mut q) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: weight holds d_out * d_in elements; valid output pointers.
    check(unsafe {
        sys::wush_layer_quantize(ctx.as_ptr(), calibrator.raw.as_ptr(), kind.to_c(), format.to_c(), method.to_c(),
                                 T::DTYPE.to_c(), weight.as_ptr().cast(), d_out, calibrator.d_in, opt_ptr(options),
                                 &mut t, &mut q)
    })?;
    let q = QWeight::wrap(q); // owned first, so an error in wrapping the transform still frees it
    Ok((Transform::wrap(t)?, q))
}

impl Context {
    /// `wush_layer_loss`: ||Y_q - Y||^2 / (d_out n_tokens) on held-out tokens `x`, against the
    /// original `weight` (d_out x d_in). Host memory on every backend.
    pub fn layer_loss<W: Element, X: Element>(&self, transform: &Transform, qweight: &QWeight, weight: &[W],
                                              x: &[X]) -> Result<f64> {
        self.loss(false, transform, qweight, weight, x)
    }

    /// `wush_layer_loss_runtime`: as [`Context::layer_loss`], Y_q from the CPU runtime.
    pub fn layer_loss_runtime<W: Element, X: Element>(&self, transform: &Transform, qweight: &QWeight,
                                                      weight: &[W], x: &[X]) -> Result<f64> {
        self.loss(true, transform, qweight, weight, x)
    }

    fn loss<W: Element, X: Element>(&self, runtime: bool, transform: &Transform, qweight: &QWeight, weight: &[W],
                                    x: &[X]) -> Result<f64> {
        let info = qweight.info()?;
        expect_len(weight.len(), checked_elems(info.d_out, info.d_in, "weight")?, "weight")?;
        let n_tokens = rows_of(x.len(), info.d_in, "x")?;
        let f = if runtime { sys::wush_layer_loss_runtime } else { sys::wush_layer_loss };
        let mut loss = 0.0;
        // SAFETY: the weight holds d_out * d_in and x n_tokens * d_in elements (checked above).
        check(unsafe {
            f(self.as_ptr(), transform.raw.as_ptr(), qweight.raw.as_ptr(), W::DTYPE.to_c(), weight.as_ptr().cast(),
              X::DTYPE.to_c(), x.as_ptr().cast(), n_tokens, &mut loss)
        })?;
        Ok(loss)
    }
}

debug_handle!(QWeight);
