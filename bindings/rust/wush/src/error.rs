//! Status and errors (`wush.h`: "Status and errors"): [`Status`], [`Error`], [`Result`] and the
//! helpers every call goes through.

use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::path::Path;

use crate::sys;

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
    pub(crate) status: Status,
    pub(crate) message: String,
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
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
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

pub(crate) fn check(st: sys::wush_status) -> Result<()> {
    if st == sys::WUSH_OK {
        Ok(())
    } else {
        Err(Error::last(st))
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string that lives for the rest of the program.
pub(crate) unsafe fn static_str(p: *const std::os::raw::c_char) -> Option<&'static str> {
    if p.is_null() {
        None
    } else {
        CStr::from_ptr(p).to_str().ok()
    }
}

/// # Safety
/// `p` is NULL or a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn borrowed_str<'a>(p: *const std::os::raw::c_char) -> &'a str {
    if p.is_null() {
        ""
    } else {
        // The library writes UTF-8 (names are validated as UTF-8 when files are opened).
        CStr::from_ptr(p).to_str().unwrap_or("")
    }
}

pub(crate) fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what} contains a NUL byte")))
}

pub(crate) fn c_path(p: &Path) -> Result<CString> {
    let s = p.to_str().ok_or_else(|| Error::invalid(format!("path {} is not UTF-8", p.display())))?;
    c_string(s, "path")
}

/// Number of rows of `len` elements taken `width` at a time, or an error when they do not tile.
pub(crate) fn rows_of(len: usize, width: usize, what: &str) -> Result<usize> {
    if width == 0 || len % width != 0 {
        return Err(Error::invalid(format!("{what} holds {len} elements, not a multiple of its row width {width}")));
    }
    Ok(len / width)
}

pub(crate) fn expect_len(len: usize, want: usize, what: &str) -> Result<()> {
    if len != want {
        return Err(Error::invalid(format!("{what} holds {len} elements, expected {want}")));
    }
    Ok(())
}

pub(crate) fn enum_out<T>(v: std::os::raw::c_int, from: fn(std::os::raw::c_int) -> Option<T>, what: &str) -> Result<T> {
    from(v).ok_or_else(|| Error { status: Status::Unsupported, message: format!("unknown {what} value {v}") })
}

/// # Safety
/// `p` points to `n` readable bytes for `'a` (or n == 0).
pub(crate) unsafe fn bytes<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p.cast(), n)
    }
}
