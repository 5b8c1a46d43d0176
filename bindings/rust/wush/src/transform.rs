//! Transforms (`wush.h`: "Transforms"): [`Transform`], its kinds and the search's per-layer guard
//! report.

use std::fmt;
use std::ptr::{self, NonNull};

use crate::calibrator::Calibrator;
use crate::context::Context;
use crate::error::{c_string, check, checked_alloc, checked_elems, enum_out, expect_len, static_str, Error, Result};
use crate::options::{opt_ptr, Options};
use crate::sys;
use crate::types::Element;
#[cfg(doc)] // names in the documentation's links
use crate::{layer_quantize, OptionId, Status};

c_enum! {
    /// Per-block transform kinds (`wush_transform_kind`).
    TransformKind { Identity = sys::WUSH_TRANSFORM_IDENTITY, Hadamard = sys::WUSH_TRANSFORM_HADAMARD,
                    Random = sys::WUSH_TRANSFORM_RANDOM, Wus = sys::WUSH_TRANSFORM_WUS, Wush = sys::WUSH_TRANSFORM_WUSH }
}

c_enum! {
    /// Where the search's per-layer guard took its held-out tokens (`wush_guard_source`, without
    /// `WUSH_GUARD_NONE`: no guard is [`Transform::guard`] returning `None`).
    GuardSource { Validation = sys::WUSH_GUARD_VALIDATION, HoldOut = sys::WUSH_GUARD_HOLD_OUT,
                  HoldOutSequences = sys::WUSH_GUARD_HOLD_OUT_SEQUENCES,
                  HoldOutDocuments = sys::WUSH_GUARD_HOLD_OUT_DOCUMENTS }
}
c_enum! {
    /// The guard's candidate layers (`wush_guard_candidate`), all built by the same method and seed.
    GuardCandidate {
        /// The searched WUS/WUSH layer (the kind asked for, with the search).
        Searched = sys::WUSH_GUARD_SEARCHED,
        /// The kind asked for without the search (Algorithm 1).
        Plain = sys::WUSH_GUARD_PLAIN,
        Identity = sys::WUSH_GUARD_IDENTITY,
        Hadamard = sys::WUSH_GUARD_HADAMARD,
        Random = sys::WUSH_GUARD_RANDOM,
        /// The kind asked for without the search, its moments shrunk (damping max(lambda, 1)).
        Shrunk = sys::WUSH_GUARD_SHRUNK,
    }
}

impl GuardCandidate {
    /// Every candidate, in the header's order (its C values 0..=5).
    pub const ALL: [GuardCandidate; 6] = [GuardCandidate::Searched, GuardCandidate::Plain, GuardCandidate::Identity,
                                          GuardCandidate::Hadamard, GuardCandidate::Random, GuardCandidate::Shrunk];
}

impl TransformKind {
    /// `wush_transform_kind_name`: "i", "h", "r", "wus" or "wush".
    pub fn name(self) -> &'static str {
        // SAFETY: static string or NULL.
        unsafe { static_str(sys::wush_transform_kind_name(self.to_c())) }.unwrap_or("")
    }
    /// `wush_transform_kind_from_name` (also "identity", "hadamard", "random").
    pub fn from_name(name: &str) -> Result<TransformKind> {
        let c = c_string(name, "transform name")?;
        let mut k = 0;
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_transform_kind_from_name(c.as_ptr(), &mut k) })?;
        enum_out(k, TransformKind::from_c, "transform kind")
    }
}

impl std::str::FromStr for TransformKind {
    type Err = Error;
    /// [`TransformKind::from_name`].
    fn from_str(s: &str) -> Result<TransformKind> {
        TransformKind::from_name(s)
    }
}

/// A transform as the tools spell it (`"wush"`, `"wush+s"`, `"h"`, ...): a kind, and whether the
/// per-block search ([`OptionId::Search`]) is asked for (the `+s` suffix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransformSpec {
    pub kind: TransformKind,
    pub search: bool,
}

impl TransformSpec {
    /// `wush_transform_spec_from_name`: a name [`TransformKind::from_name`] accepts
    /// (case-insensitive), optionally followed by `"+s"`. Thread-safe.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] with the library's message for an unknown name, or for a search
    /// of a data-free kind (`"i+s"`, `"h+s"`, `"r+s"`: only WUS and WUSH have free parameters to
    /// search; the message says which). A name with a NUL byte is this crate's error.
    pub fn from_name(name: &str) -> Result<TransformSpec> {
        let c = c_string(name, "transform name")?;
        let (mut k, mut s) = (0, 0);
        // SAFETY: valid string and output pointers; both are written only on success.
        check(unsafe { sys::wush_transform_spec_from_name(c.as_ptr(), &mut k, &mut s) })?;
        Ok(TransformSpec { kind: enum_out(k, TransformKind::from_c, "transform kind")?, search: s != 0 })
    }
}

impl std::str::FromStr for TransformSpec {
    type Err = Error;
    /// [`TransformSpec::from_name`].
    fn from_str(s: &str) -> Result<TransformSpec> {
        TransformSpec::from_name(s)
    }
}

impl fmt::Display for TransformSpec {
    /// The tools' spelling: the kind's short name, then `+s` with the search ("wush+s").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.kind.name(), if self.search { "+s" } else { "" })
    }
}

/// A layer's per-block transforms (`wush_transform`).
///
/// `Send + Sync`: a transform is only read after it is built, and the header lets any number of
/// threads use one at once.
pub struct Transform {
    pub(crate) raw: NonNull<sys::wush_transform>,
    pub(crate) d_in: usize,
}

// SAFETY: see the type's documentation.
unsafe impl Send for Transform {}
unsafe impl Sync for Transform {}

impl Transform {
    pub(crate) fn wrap(raw: *mut sys::wush_transform) -> Result<Transform> {
        let raw = NonNull::new(raw).expect("NULL transform");
        let mut d_in = 0;
        // SAFETY: a live handle just created.
        let st = unsafe { sys::wush_transform_info(raw.as_ptr(), ptr::null_mut(), &mut d_in, ptr::null_mut()) };
        let t = Transform { raw, d_in };
        check(st)?;
        Ok(t)
    }
    pub fn as_ptr(&self) -> *const sys::wush_transform {
        self.raw.as_ptr()
    }
    /// `wush_transform_build`: `weight` is d_out x d_in (d_in the calibrator's).
    pub fn build<T: Element>(ctx: &Context, calibrator: &Calibrator, weight: &[T], d_out: usize, kind: TransformKind,
                             options: Option<&Options>) -> Result<Transform> {
        expect_len(weight.len(), checked_elems(d_out, calibrator.d_in, "weight")?, "weight")?;
        let mut raw = ptr::null_mut();
        // SAFETY: weight holds d_out * d_in elements; valid output pointer.
        check(unsafe {
            sys::wush_transform_build(ctx.as_ptr(), calibrator.raw.as_ptr(), T::DTYPE.to_c(), weight.as_ptr().cast(),
                                      d_out, calibrator.d_in, kind.to_c(), opt_ptr(options), &mut raw)
        })?;
        Transform::wrap(raw)
    }
    /// `wush_transform_create_fixed`: a data-free transform (identity, Hadamard, random).
    pub fn fixed(kind: TransformKind, d_in: usize, group_size: usize, options: Option<&Options>) -> Result<Transform> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid output pointer.
        check(unsafe { sys::wush_transform_create_fixed(kind.to_c(), d_in, group_size, opt_ptr(options), &mut raw) })?;
        Transform::wrap(raw)
    }
    /// `wush_transform_info`: (kind, d_in, group size).
    pub fn info(&self) -> Result<(TransformKind, usize, usize)> {
        let (mut k, mut d, mut g) = (0, 0, 0);
        // SAFETY: live handle, valid output pointers.
        check(unsafe { sys::wush_transform_info(self.raw.as_ptr(), &mut k, &mut d, &mut g) })?;
        Ok((enum_out(k, TransformKind::from_c, "transform kind")?, d, g))
    }
    pub fn d_in(&self) -> usize {
        self.d_in
    }
    /// `wush_transform_matrices`: (C, G, G) float32 activation-side matrices.
    pub fn matrices(&self) -> Result<Vec<f32>> {
        let (_, d, g) = self.info()?;
        let mut m = vec![0f32; checked_alloc::<f32>(d, g, "C x G x G matrices")?];
        // SAFETY: the buffer holds the count passed.
        check(unsafe { sys::wush_transform_matrices(self.raw.as_ptr(), m.as_mut_ptr(), m.len()) })?;
        Ok(m)
    }
    /// `wush_transform_fallback_blocks`: the blocks that fell back to a data-free transform.
    pub fn fallback_blocks(&self) -> Result<Vec<usize>> {
        let mut n = 0;
        // SAFETY: live handle; the first call only counts, the second fills a buffer of that size.
        check(unsafe { sys::wush_transform_fallback_blocks(self.raw.as_ptr(), &mut n, ptr::null_mut(), 0) })?;
        let mut b = vec![0usize; checked_alloc::<usize>(n, 1, "fallback blocks")?];
        check(unsafe { sys::wush_transform_fallback_blocks(self.raw.as_ptr(), &mut n, b.as_mut_ptr(), b.len()) })?;
        b.truncate(n);
        Ok(b)
    }
    /// `wush_transform_guard` + `wush_transform_guard_candidate`: what the search's per-layer guard
    /// ([`OptionId::Search`], [`OptionId::SearchGuard`]) compared and kept when
    /// [`layer_quantize`] made this transform, or `None` when no guard ran (no search, a
    /// data-free kind, the default hold-out off or too small a token sample, or a transform that
    /// [`layer_quantize`] did not make: built, fixed or loaded from a checkpoint). Only reads the
    /// transform: callable from several threads at once, as the header allows.
    ///
    /// # Errors
    /// The library's error for a call that fails (a bad handle cannot occur here); a source or
    /// candidate value this crate does not know (a newer library) is [`Status::Unsupported`].
    pub fn guard(&self) -> Result<Option<GuardReport>> {
        let (mut source, mut n, mut kept) = (sys::WUSH_GUARD_NONE, 0usize, sys::WUSH_GUARD_SEARCHED);
        // SAFETY: live handle, valid output pointers.
        check(unsafe { sys::wush_transform_guard(self.raw.as_ptr(), &mut source, &mut n, &mut kept) })?;
        if source == sys::WUSH_GUARD_NONE {
            return Ok(None);
        }
        let mut candidates = Vec::with_capacity(GuardCandidate::ALL.len());
        for c in GuardCandidate::ALL {
            let (mut loss, mut difference, mut std_error, mut replaces) = (0.0, 0.0, 0.0, 0);
            // SAFETY: live handle, a known candidate, valid output pointers.
            check(unsafe {
                sys::wush_transform_guard_candidate(self.raw.as_ptr(), c.to_c(), &mut loss, &mut difference,
                                                    &mut std_error, &mut replaces)
            })?;
            candidates.push(GuardScore { candidate: c, loss, difference, std_error, replaces: replaces != 0 });
        }
        let (mut undecided, mut which, mut n_sequences) = (0, sys::WUSH_GUARD_SEARCHED, 0usize);
        // SAFETY: live handle, valid output pointers.
        check(unsafe {
            sys::wush_transform_guard_undecided(self.raw.as_ptr(), &mut undecided, &mut which, &mut n_sequences)
        })?;
        Ok(Some(GuardReport {
            source: enum_out(source, GuardSource::from_c, "guard source")?,
            n_tokens: n,
            n_sequences,
            kept: enum_out(kept, GuardCandidate::from_c, "guard candidate")?,
            candidates,
            undecided: if undecided != 0 { Some(enum_out(which, GuardCandidate::from_c, "guard candidate")?) } else { None },
        }))
    }
    /// `wush_transform_guard_candidate` for one candidate, as the library answers it: an error
    /// ([`Status::InvalidArgument`], the library's message) when no guard ran for this transform.
    /// Thread-safe (read only).
    pub fn guard_candidate(&self, c: GuardCandidate) -> Result<GuardScore> {
        let (mut loss, mut difference, mut std_error, mut replaces) = (0.0, 0.0, 0.0, 0);
        // SAFETY: live handle, valid output pointers.
        check(unsafe {
            sys::wush_transform_guard_candidate(self.raw.as_ptr(), c.to_c(), &mut loss, &mut difference, &mut std_error,
                                                &mut replaces)
        })?;
        Ok(GuardScore { candidate: c, loss, difference, std_error, replaces: replaces != 0 })
    }
    /// `wush_transform_singular_values`: C x G doubles, row b = block b.
    pub fn singular_values(&self) -> Result<Vec<f64>> {
        let mut s = vec![0f64; checked_alloc::<f64>(self.d_in, 1, "singular values")?];
        // SAFETY: the buffer holds the count passed.
        check(unsafe { sys::wush_transform_singular_values(self.raw.as_ptr(), s.as_mut_ptr(), s.len()) })?;
        Ok(s)
    }
}

/// One candidate's score in the per-layer guard's decision ([`GuardReport`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardScore {
    pub candidate: GuardCandidate,
    /// Its layer loss on the held-out tokens (as [`Context::layer_loss`] computes it for that
    /// candidate's layer on those tokens).
    pub loss: f64,
    /// Mean over tokens of the paired per-token loss differences, searched - candidate (positive
    /// where the candidate is better); 0 for [`GuardCandidate::Searched`].
    pub difference: f64,
    /// Standard error of that mean (sample standard deviation / sqrt(n_tokens)); 0 for
    /// [`GuardCandidate::Searched`].
    pub std_error: f64,
    /// Whether the candidate met the rule: loss below 0.99 x the searched loss and difference
    /// greater than 2 std_error (never for [`GuardCandidate::Searched`]).
    pub replaces: bool,
}

/// What the search's per-layer guard decided for a layer ([`Transform::guard`]):
/// `wush_transform_guard` and `wush_transform_guard_candidate` of every candidate.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardReport {
    /// Where the held-out tokens came from.
    pub source: GuardSource,
    /// How many held-out tokens were scored.
    pub n_tokens: usize,
    /// How many held-out sequences they came from ([`GuardSource::HoldOutSequences`]; else 0).
    pub n_sequences: usize,
    /// The candidate returned: the lowest loss among those that replace, else
    /// [`GuardCandidate::Searched`].
    pub kept: GuardCandidate,
    /// Every candidate's score, in [`GuardCandidate::ALL`]'s order.
    pub candidates: Vec<GuardScore>,
    /// `wush_transform_guard_undecided`: the lowest candidate whose held-out loss is below 0.99 x
    /// the kept one's but that the rule could not confirm (the held-out tokens cannot tell), if any.
    pub undecided: Option<GuardCandidate>,
}

impl GuardReport {
    /// The score of one candidate.
    pub fn candidate(&self, c: GuardCandidate) -> &GuardScore {
        self.candidates.iter().find(|s| s.candidate == c).expect("every candidate is scored")
    }
}

impl Drop for Transform {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::wush_transform_destroy(self.raw.as_ptr()) }
    }
}

debug_handle!(Transform);
