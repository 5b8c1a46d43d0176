//! Safe Rust API of libwush (`include/wush/wush.h`), over the raw declarations of `wush-sys`.
//!
//! - One owning type per handle, released by `Drop`: [`Context`], [`Calibrator`], [`Options`],
//!   [`Transform`], [`QWeight`], [`CheckpointWriter`] / [`Checkpoint`], [`TensorFile`],
//!   [`Linear`]. Where the C API needs one object to outlive another, a lifetime says so (a
//!   [`Linear`] borrows its [`Context`]; a [`CheckpointWriter`] borrows the transforms and
//!   qweights it will write), so handles can be dropped in any order the compiler accepts.
//! - Every failure is an [`Error`] carrying the status and `wush_last_error()`'s message.
//! - Tensors are slices; sizes the C API takes separately are derived from them and checked.
//! - `Send`/`Sync` follow the header's thread rules; each type's documentation says why.
//! - The CPU path needs no `unsafe`. CUDA contexts take device pointers, through the `unsafe`
//!   `*_device` methods only: the safe slice methods refuse a CUDA context.
//!
//! The header is the reference for what each call computes; the method documentation here
//! names the C function it calls.

use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::path::Path;
use std::ptr::{self, NonNull};

pub use wush_sys as sys;

// ---- errors ------------------------------------------------------------------------------------

/// The status of a failed call (the header's `wush_status`, without `WUSH_OK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    InvalidArgument,
    OutOfMemory,
    Unsupported,
    NonFinite,
    BufferTooSmall,
    Numerical,
    Io,
    CorruptFile,
    Cuda,
    Cancelled,
    Internal,
    NotFound,
    /// A status this crate does not know (a newer library appended it).
    Other(i32),
}

impl Status {
    fn from_c(st: sys::wush_status) -> Status {
        match st {
            sys::WUSH_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::WUSH_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::WUSH_ERR_UNSUPPORTED => Status::Unsupported,
            sys::WUSH_ERR_NON_FINITE => Status::NonFinite,
            sys::WUSH_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::WUSH_ERR_NUMERICAL => Status::Numerical,
            sys::WUSH_ERR_IO => Status::Io,
            sys::WUSH_ERR_CORRUPT_FILE => Status::CorruptFile,
            sys::WUSH_ERR_CUDA => Status::Cuda,
            sys::WUSH_ERR_CANCELLED => Status::Cancelled,
            sys::WUSH_ERR_INTERNAL => Status::Internal,
            sys::WUSH_ERR_NOT_FOUND => Status::NotFound,
            other => Status::Other(other),
        }
    }

    /// The C value of the status.
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::WUSH_ERR_INVALID_ARGUMENT,
            Status::OutOfMemory => sys::WUSH_ERR_OUT_OF_MEMORY,
            Status::Unsupported => sys::WUSH_ERR_UNSUPPORTED,
            Status::NonFinite => sys::WUSH_ERR_NON_FINITE,
            Status::BufferTooSmall => sys::WUSH_ERR_BUFFER_TOO_SMALL,
            Status::Numerical => sys::WUSH_ERR_NUMERICAL,
            Status::Io => sys::WUSH_ERR_IO,
            Status::CorruptFile => sys::WUSH_ERR_CORRUPT_FILE,
            Status::Cuda => sys::WUSH_ERR_CUDA,
            Status::Cancelled => sys::WUSH_ERR_CANCELLED,
            Status::Internal => sys::WUSH_ERR_INTERNAL,
            Status::NotFound => sys::WUSH_ERR_NOT_FOUND,
            Status::Other(c) => c,
        }
    }

    /// The library's name for the status, e.g. "WUSH_ERR_NON_FINITE" (`wush_status_string`).
    pub fn name(self) -> &'static str {
        // SAFETY: wush_status_string returns a static NUL-terminated string for any int.
        unsafe { static_str(sys::wush_status_string(self.code())) }.unwrap_or("WUSH_ERR_UNKNOWN")
    }
}

/// A failed call: the status and the message (`wush_last_error()` of the failing call, or a
/// message of this crate for a check it made before calling the library).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    pub fn status(&self) -> Status {
        self.status
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    /// The error of a call that just returned `st` on this thread. The message is copied at
    /// once: the library's string lives only until its next call on this thread.
    fn last(st: sys::wush_status) -> Error {
        // SAFETY: wush_last_error never returns NULL and the string is valid until the next
        // libwush call on this thread; it is copied here before any other call.
        let message = unsafe { CStr::from_ptr(sys::wush_last_error()) }.to_string_lossy().into_owned();
        Error { status: Status::from_c(st), message }
    }
    fn invalid(message: impl Into<String>) -> Error {
        Error { status: Status::InvalidArgument, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

fn check(st: sys::wush_status) -> Result<()> {
    if st == sys::WUSH_OK {
        Ok(())
    } else {
        Err(Error::last(st))
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string that lives for the rest of the program.
unsafe fn static_str(p: *const std::os::raw::c_char) -> Option<&'static str> {
    if p.is_null() {
        None
    } else {
        CStr::from_ptr(p).to_str().ok()
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string valid for `'a`.
unsafe fn borrowed_str<'a>(p: *const std::os::raw::c_char) -> &'a str {
    if p.is_null() {
        ""
    } else {
        // The library writes UTF-8 (names are validated as UTF-8 when files are opened).
        CStr::from_ptr(p).to_str().unwrap_or("")
    }
}

fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))
}

fn c_path(p: &Path) -> Result<CString> {
    let s = p.to_str().ok_or_else(|| Error::invalid(format!("path {} is not UTF-8", p.display())))?;
    c_string(s, "path")
}

/// Number of rows of `len` elements taken `width` at a time, or an error when they do not tile.
fn rows_of(len: usize, width: usize, what: &str) -> Result<usize> {
    if width == 0 || len % width != 0 {
        return Err(Error::invalid(format!("{what} holds {len} elements, not a multiple of its row width {width}")));
    }
    Ok(len / width)
}

fn expect_len(len: usize, want: usize, what: &str) -> Result<()> {
    if len != want {
        return Err(Error::invalid(format!("{what} holds {len} elements, expected {want}")));
    }
    Ok(())
}

// ---- enums -------------------------------------------------------------------------------------

macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $c:path),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var),* }
        impl $name {
            /// The C value.
            pub fn to_c(self) -> std::os::raw::c_int {
                match self { $($name::$var => $c),* }
            }
            /// The variant of a C value, or None for a value this crate does not know.
            pub fn from_c(v: std::os::raw::c_int) -> Option<$name> {
                $(if v == $c { return Some($name::$var); })*
                None
            }
        }
    };
}

c_enum! {
    /// The 4-bit block formats (`wush_format`).
    Format { Mxfp4 = sys::WUSH_FORMAT_MXFP4, Nvfp4 = sys::WUSH_FORMAT_NVFP4, Int4 = sys::WUSH_FORMAT_INT4,
             Mxfp4Ocp = sys::WUSH_FORMAT_MXFP4_OCP }
}
c_enum! {
    /// Element types of dense tensors (`wush_dtype`).
    DType { F32 = sys::WUSH_DTYPE_F32, F16 = sys::WUSH_DTYPE_F16, Bf16 = sys::WUSH_DTYPE_BF16 }
}
c_enum! {
    /// Where a context runs (`wush_backend`).
    Backend { Cpu = sys::WUSH_BACKEND_CPU, Cuda = sys::WUSH_BACKEND_CUDA }
}
c_enum! {
    /// Context parameters (`wush_context_parameter`).
    ContextParameter { NumThreads = sys::WUSH_CONTEXT_NUM_THREADS, CpuIsa = sys::WUSH_CONTEXT_CPU_ISA }
}
c_enum! {
    /// SIMD kernel sets of the CPU runtime (`wush_cpu_isa`).
    CpuIsa { Auto = sys::WUSH_CPU_ISA_AUTO, Scalar = sys::WUSH_CPU_ISA_SCALAR, Avx2 = sys::WUSH_CPU_ISA_AVX2,
             Avx512Vnni = sys::WUSH_CPU_ISA_AVX512_VNNI }
}
c_enum! {
    /// Option ids of [`Options`] (`wush_option`).
    OptionId { Damping = sys::WUSH_OPTION_DAMPING, Seed = sys::WUSH_OPTION_SEED,
               TransformDtype = sys::WUSH_OPTION_TRANSFORM_DTYPE, Search = sys::WUSH_OPTION_SEARCH,
               SearchTokens = sys::WUSH_OPTION_SEARCH_TOKENS, SearchGuard = sys::WUSH_OPTION_SEARCH_GUARD }
}
c_enum! {
    /// What a calibrator accumulates (`wush_moment_mode`).
    MomentMode { BlockDiagonal = sys::WUSH_MOMENTS_BLOCK_DIAGONAL, Full = sys::WUSH_MOMENTS_FULL }
}
c_enum! {
    /// Per-block transform kinds (`wush_transform_kind`).
    TransformKind { Identity = sys::WUSH_TRANSFORM_IDENTITY, Hadamard = sys::WUSH_TRANSFORM_HADAMARD,
                    Random = sys::WUSH_TRANSFORM_RANDOM, Wus = sys::WUSH_TRANSFORM_WUS, Wush = sys::WUSH_TRANSFORM_WUSH }
}
c_enum! {
    /// Weight quantization methods (`wush_method`).
    Method { Rtn = sys::WUSH_METHOD_RTN, Gptq = sys::WUSH_METHOD_GPTQ }
}
c_enum! {
    /// Where the search's per-layer guard took its held-out tokens (`wush_guard_source`, without
    /// `WUSH_GUARD_NONE`: no guard is [`Transform::guard`] returning `None`).
    GuardSource { Validation = sys::WUSH_GUARD_VALIDATION, HoldOut = sys::WUSH_GUARD_HOLD_OUT }
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
    }
}
c_enum! {
    /// How [`Checkpoint::open_mode`] holds a checkpoint's bytes (`wush_checkpoint_mode`).
    CheckpointMode {
        /// Memory-mapped, read on demand ([`Checkpoint::open`]).
        Map = sys::WUSH_CHECKPOINT_MAP,
        /// Read whole into memory at the open; the file is not used again.
        Copy = sys::WUSH_CHECKPOINT_COPY,
    }
}

impl GuardCandidate {
    /// Every candidate, in the header's order (its C values 0..=4).
    pub const ALL: [GuardCandidate; 5] = [GuardCandidate::Searched, GuardCandidate::Plain, GuardCandidate::Identity,
                                          GuardCandidate::Hadamard, GuardCandidate::Random];
}

fn enum_out<T>(v: std::os::raw::c_int, from: fn(std::os::raw::c_int) -> Option<T>, what: &str) -> Result<T> {
    from(v).ok_or_else(|| Error { status: Status::Unsupported, message: format!("unknown {what} value {v}") })
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

// ---- element types -----------------------------------------------------------------------------

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

// ---- version -----------------------------------------------------------------------------------

/// `wush_version`: the loaded library's version, MAJOR * 10000 + MINOR * 100 + PATCH.
pub fn version() -> u32 {
    // SAFETY: never fails.
    unsafe { sys::wush_version() }
}

/// `wush_version_string`: the loaded library's "MAJOR.MINOR.PATCH".
pub fn version_string() -> &'static str {
    // SAFETY: a static string.
    unsafe { static_str(sys::wush_version_string()) }.unwrap_or("")
}

/// Checks that the loaded library serves the declarations this crate was built with: the same
/// ABI major (the SONAME) and at least the header's version (a newer minor only adds). An
/// application that may meet an older libwush.so.0 at run time than it was built against calls
/// this once; [`Context::new`] calls it too.
pub fn check_version() -> Result<()> {
    let (got, want) = (version(), sys::WUSH_VERSION_NUMBER);
    if got / 10000 != want / 10000 || got < want {
        return Err(Error {
            status: Status::Unsupported,
            message: format!("libwush {} is loaded but these bindings need {}.{}.x >= {}",
                             version_string(), want / 10000, want / 100 % 100, want),
        });
    }
    Ok(())
}

// ---- context -----------------------------------------------------------------------------------

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
    fn require_host(&self, what: &str) -> Result<()> {
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
        let (mut codes, mut scales) = (vec![0u8; cb], vec![0u8; sb]);
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
        let n = n_rows.checked_mul(d_in).ok_or_else(|| Error::invalid("n_rows * d_in overflows"))?;
        let mut y = vec![0f32; n];
        self.dequantize_rows_into(format, codes, scales, n_rows, d_in, &mut y)?;
        Ok(y)
    }

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
        expect_len(weight.len(), info.d_out * info.d_in, "weight")?;
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

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: owned handle; every Linear borrowing it is gone (the borrow checker).
        unsafe { sys::wush_context_destroy(self.raw.as_ptr()) }
    }
}

// ---- options -----------------------------------------------------------------------------------

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

fn opt_ptr(o: Option<&Options>) -> *const sys::wush_options {
    o.map_or(ptr::null(), |o| o.as_ptr())
}

impl Drop for Options {
    fn drop(&mut self) {
        // SAFETY: owned handle; the callback box is dropped after it.
        unsafe { sys::wush_options_destroy(self.raw.as_ptr()) }
    }
}

// ---- calibrator --------------------------------------------------------------------------------

/// Streaming second moments of a layer's input activations (`wush_calibrator`).
///
/// `Send + Sync`: the header lets distinct threads use distinct objects, and lets calls that
/// only read an object (the `const wush_calibrator*` functions: counts, moments, export) run
/// concurrently; those take `&self`. The calls that modify it ("do not share it between threads
/// without a lock") take `&mut self`, which Rust makes exclusive.
pub struct Calibrator {
    raw: NonNull<sys::wush_calibrator>,
    d_in: usize,
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
        let mut m = vec![0f64; self.group_size * self.group_size];
        // SAFETY: the buffer holds the count passed.
        check(unsafe { sys::wush_calibrator_second_moment(self.raw.as_ptr(), block, m.as_mut_ptr(), m.len()) })?;
        Ok(m)
    }
    /// `wush_calibrator_state_size` + `wush_calibrator_export_state`: the state for all-reduce.
    pub fn export_state(&self) -> Result<Vec<f64>> {
        let mut n = 0;
        // SAFETY: live handle, valid output pointer; then a buffer of the size returned.
        check(unsafe { sys::wush_calibrator_state_size(self.raw.as_ptr(), &mut n) })?;
        let mut s = vec![0f64; n];
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

// ---- transforms --------------------------------------------------------------------------------

/// A layer's per-block transforms (`wush_transform`).
///
/// `Send + Sync`: a transform is only read after it is built, and the header lets any number of
/// threads use one at once.
pub struct Transform {
    raw: NonNull<sys::wush_transform>,
    d_in: usize,
}

// SAFETY: see the type's documentation.
unsafe impl Send for Transform {}
unsafe impl Sync for Transform {}

impl Transform {
    fn wrap(raw: *mut sys::wush_transform) -> Result<Transform> {
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
        expect_len(weight.len(), d_out * calibrator.d_in, "weight")?;
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
        let mut m = vec![0f32; d * g];
        // SAFETY: the buffer holds the count passed.
        check(unsafe { sys::wush_transform_matrices(self.raw.as_ptr(), m.as_mut_ptr(), m.len()) })?;
        Ok(m)
    }
    /// `wush_transform_fallback_blocks`: the blocks that fell back to a data-free transform.
    pub fn fallback_blocks(&self) -> Result<Vec<usize>> {
        let mut n = 0;
        // SAFETY: live handle; the first call only counts, the second fills a buffer of that size.
        check(unsafe { sys::wush_transform_fallback_blocks(self.raw.as_ptr(), &mut n, ptr::null_mut(), 0) })?;
        let mut b = vec![0usize; n];
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
        Ok(Some(GuardReport {
            source: enum_out(source, GuardSource::from_c, "guard source")?,
            n_tokens: n,
            kept: enum_out(kept, GuardCandidate::from_c, "guard candidate")?,
            candidates,
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
        let mut s = vec![0f64; self.d_in];
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
    /// The candidate returned: the lowest loss among those that replace, else
    /// [`GuardCandidate::Searched`].
    pub kept: GuardCandidate,
    /// Every candidate's score, in [`GuardCandidate::ALL`]'s order.
    pub candidates: Vec<GuardScore>,
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

// ---- qweights ----------------------------------------------------------------------------------

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
    raw: NonNull<sys::wush_qweight>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for QWeight {}
unsafe impl Sync for QWeight {}

impl QWeight {
    fn wrap(raw: *mut sys::wush_qweight) -> QWeight {
        QWeight { raw: NonNull::new(raw).expect("NULL qweight") }
    }
    pub fn as_ptr(&self) -> *const sys::wush_qweight {
        self.raw.as_ptr()
    }
    /// `wush_qweight_create`: quantizes `weight` (d_out x d_in) after the transform's weight side.
    pub fn new<T: Element>(ctx: &Context, transform: &Transform, format: Format, method: Method, weight: &[T],
                           d_out: usize, options: Option<&Options>) -> Result<QWeight> {
        expect_len(weight.len(), d_out * transform.d_in, "weight")?;
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
        unsafe { Ok((bytes(c, cb), bytes(s, sb))) }
    }
}

/// # Safety
/// `p` points to `n` readable bytes for `'a` (or n == 0).
unsafe fn bytes<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p.cast(), n)
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
    expect_len(weight.len(), d_out * calibrator.d_in, "weight")?;
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

// ---- prepared layers ---------------------------------------------------------------------------

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
    /// [`Linear::run`] with new f32 output and workspace (convenient, allocates).
    pub fn forward<T: Element>(&self, x: &[T]) -> Result<Vec<f32>> {
        let n = rows_of(x.len(), self.d_in, "x")?;
        let mut ws = vec![0u8; self.workspace_size(n)?];
        let mut y = vec![0f32; n * self.d_out];
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
}

impl Drop for Linear<'_> {
    fn drop(&mut self) {
        // SAFETY: owned handle; its context is still alive (borrowed).
        unsafe { sys::wush_linear_destroy(self.raw.as_ptr()) }
    }
}

// ---- checkpoints -------------------------------------------------------------------------------

/// A checkpoint being written (`wush_checkpoint_create`, `_add_layer`, `_write`).
///
/// The C checkpoint references the transforms and qweights added to it until it is written, so
/// the writer borrows them for `'a`. `Send` (it only holds shared borrows of `Sync` objects), not
/// `Sync`: the header makes only an *opened* checkpoint's reads thread-safe.
pub struct CheckpointWriter<'a> {
    raw: NonNull<sys::wush_checkpoint>,
    _layers: PhantomData<&'a (Transform, QWeight)>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for CheckpointWriter<'_> {}

impl<'a> CheckpointWriter<'a> {
    /// `wush_checkpoint_create`.
    pub fn new() -> Result<CheckpointWriter<'a>> {
        let mut raw = ptr::null_mut();
        // SAFETY: valid output pointer.
        check(unsafe { sys::wush_checkpoint_create(&mut raw) })?;
        Ok(CheckpointWriter { raw: NonNull::new(raw).expect("NULL checkpoint"), _layers: PhantomData })
    }
    /// `wush_checkpoint_add_layer`.
    pub fn add_layer(&mut self, name: &str, transform: &'a Transform, qweight: &'a QWeight) -> Result<()> {
        let c = c_string(name, "layer name")?;
        // SAFETY: live handles, kept alive for 'a by the borrow.
        check(unsafe { sys::wush_checkpoint_add_layer(self.raw.as_ptr(), c.as_ptr(), transform.raw.as_ptr(),
                                                      qweight.raw.as_ptr()) })
    }
    /// `wush_checkpoint_layer_count`.
    pub fn layer_count(&self) -> Result<usize> {
        layer_count(self.raw.as_ptr())
    }
    /// `wush_checkpoint_write`: all layers to `path`, atomically.
    pub fn write(&mut self, path: impl AsRef<Path>, options: Option<&Options>) -> Result<()> {
        let p = c_path(path.as_ref())?;
        // SAFETY: live handle, valid string.
        check(unsafe { sys::wush_checkpoint_write(self.raw.as_ptr(), p.as_ptr(), opt_ptr(options)) })
    }
}

impl Drop for CheckpointWriter<'_> {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::wush_checkpoint_destroy(self.raw.as_ptr()) }
    }
}

fn layer_count(raw: *const sys::wush_checkpoint) -> Result<usize> {
    let mut n = 0;
    // SAFETY: live handle, valid output pointer.
    check(unsafe { sys::wush_checkpoint_layer_count(raw, &mut n) })?;
    Ok(n)
}

/// An opened, validated, memory-mapped checkpoint (`wush_checkpoint_open`).
///
/// `Send + Sync`: the header makes an opened checkpoint's reads (names, loading layers)
/// thread-safe. Loaded qweights keep the file mapped after the checkpoint is dropped.
pub struct Checkpoint {
    raw: NonNull<sys::wush_checkpoint>,
}

// SAFETY: see the type's documentation.
unsafe impl Send for Checkpoint {}
unsafe impl Sync for Checkpoint {}

impl Checkpoint {
    /// `wush_checkpoint_open`.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_checkpoint_open(p.as_ptr(), &mut raw) })?;
        Ok(Checkpoint { raw: NonNull::new(raw).expect("NULL checkpoint") })
    }
    /// `wush_checkpoint_open_mode`: [`Checkpoint::open`] with a choice of how the file's bytes
    /// are held. [`CheckpointMode::Copy`] reads the whole file into memory owned by the library
    /// and validates that copy: truncating, rewriting or deleting the file afterwards changes
    /// nothing that was opened (and cannot raise SIGBUS). [`CheckpointMode::Map`] is
    /// [`Checkpoint::open`]. Thread-safe.
    ///
    /// # Errors
    /// [`Status::Io`] (including a file that shrinks while it is read), [`Status::OutOfMemory`],
    /// [`Status::CorruptFile`] naming the first violation, each with the library's message.
    pub fn open_mode(path: impl AsRef<Path>, mode: CheckpointMode) -> Result<Checkpoint> {
        let p = c_path(path.as_ref())?;
        let mut raw = ptr::null_mut();
        // SAFETY: valid string and output pointer.
        check(unsafe { sys::wush_checkpoint_open_mode(p.as_ptr(), mode.to_c(), &mut raw) })?;
        Ok(Checkpoint { raw: NonNull::new(raw).expect("NULL checkpoint") })
    }
    /// `wush_checkpoint_layer_count`.
    pub fn layer_count(&self) -> Result<usize> {
        layer_count(self.raw.as_ptr())
    }
    /// `wush_checkpoint_layer_name`.
    pub fn layer_name(&self, index: usize) -> Result<&str> {
        let mut p = ptr::null();
        // SAFETY: live handle; the name lives until the checkpoint is destroyed (borrow of self).
        check(unsafe { sys::wush_checkpoint_layer_name(self.raw.as_ptr(), index, &mut p) })?;
        Ok(unsafe { borrowed_str(p) })
    }
    /// Every layer name, in file order.
    pub fn layer_names(&self) -> Result<Vec<String>> {
        (0..self.layer_count()?).map(|i| self.layer_name(i).map(str::to_owned)).collect()
    }
    /// `wush_checkpoint_load_layer`: the layer's transform and qweight (codes used in place).
    pub fn load_layer(&self, name: &str) -> Result<(Transform, QWeight)> {
        let c = c_string(name, "layer name")?;
        let (mut t, mut q) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: live handle, valid string and output pointers.
        check(unsafe { sys::wush_checkpoint_load_layer(self.raw.as_ptr(), c.as_ptr(), &mut t, &mut q) })?;
        let q = QWeight::wrap(q);
        Ok((Transform::wrap(t)?, q))
    }
    /// `wush_checkpoint_export_fp_quant`: the FP-Quant / transformers layout.
    pub fn export_fp_quant(&self, path: impl AsRef<Path>, config_path: Option<&Path>, options: Option<&Options>)
                           -> Result<()> {
        let p = c_path(path.as_ref())?;
        let cfg = config_path.map(c_path).transpose()?;
        // SAFETY: live handle, valid strings.
        check(unsafe {
            sys::wush_checkpoint_export_fp_quant(self.raw.as_ptr(), p.as_ptr(),
                                                 cfg.as_ref().map_or(ptr::null(), |c| c.as_ptr()), opt_ptr(options))
        })
    }
}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        // SAFETY: owned handle.
        unsafe { sys::wush_checkpoint_destroy(self.raw.as_ptr()) }
    }
}

// ---- tensor files ------------------------------------------------------------------------------

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
            let shape = if ndim == 0 { &[][..] } else { std::slice::from_raw_parts(shape, ndim) };
            Ok(Tensor { name: borrowed_str(name), dtype: borrowed_str(dtype), shape, data: bytes(data, nbytes) })
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

// ---- built-in example layers -------------------------------------------------------------------

/// A built-in example layer ([`example_layer`]).
pub struct ExampleLayer {
    pub d_out: usize,
    pub d_in: usize,
    /// d_out x d_in.
    pub weight: Vec<f32>,
    /// n_calibration x d_in.
    pub calibration: Vec<f32>,
    /// n_heldout x d_in.
    pub heldout: Vec<f32>,
}

/// `wush_example_layer_count` + `wush_example_layer_name`: the built-in layer names.
pub fn example_layer_names() -> Vec<&'static str> {
    // SAFETY: static names for every index below the count.
    let n = unsafe { sys::wush_example_layer_count() };
    (0..n).filter_map(|i| unsafe { static_str(sys::wush_example_layer_name(i)) }).collect()
}

/// `wush_example_layer_shape`: (d_out, d_in).
pub fn example_layer_shape(name: &str) -> Result<(usize, usize)> {
    let c = c_string(name, "layer name")?;
    let (mut o, mut i) = (0, 0);
    // SAFETY: valid string and output pointers.
    check(unsafe { sys::wush_example_layer_shape(c.as_ptr(), &mut o, &mut i) })?;
    Ok((o, i))
}

/// `wush_example_layer_generate`: the named layer's weight and activations, from `seed`.
pub fn example_layer(name: &str, seed: u64, n_calibration: usize, n_heldout: usize) -> Result<ExampleLayer> {
    let (d_out, d_in) = example_layer_shape(name)?;
    let c = c_string(name, "layer name")?;
    let mut l = ExampleLayer { d_out, d_in, weight: vec![0.0; d_out * d_in], calibration: vec![0.0; n_calibration * d_in],
                               heldout: vec![0.0; n_heldout * d_in] };
    // SAFETY: every buffer holds the count passed.
    check(unsafe {
        sys::wush_example_layer_generate(c.as_ptr(), seed, n_calibration, n_heldout, l.weight.as_mut_ptr(),
                                         l.weight.len(), l.calibration.as_mut_ptr(), l.calibration.len(),
                                         l.heldout.as_mut_ptr(), l.heldout.len())
    })?;
    Ok(l)
}

// Handles print as their type and address (their contents live in the library).
macro_rules! debug_handle {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:p})", stringify!($t), self.raw.as_ptr())
            }
        }
    )*};
}
debug_handle!(Context, Options, Calibrator, Transform, QWeight, Linear<'_>, CheckpointWriter<'_>, Checkpoint, TensorFile);
