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

// Sizes: a product of two sizes panics on overflow in a debug build and wraps in a release build,
// and a slice longer than isize::MAX bytes is undefined behaviour; these return this crate's error
// instead, before anything is allocated or read.

/// `a * b`, the element count of an a x b matrix, or an error naming `what` when it overflows usize.
pub(crate) fn checked_elems(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| Error::invalid(format!("{what}: {a} x {b} elements overflow usize")))
}

/// The element count of a new `Vec<T>` of a x b elements: [`checked_elems`], and an error where
/// its bytes would exceed isize::MAX (`vec!` panics there with "capacity overflow").
pub(crate) fn checked_alloc<T>(a: usize, b: usize, what: &str) -> Result<usize> {
    let n = checked_elems(a, b, what)?;
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(n),
        _ => Err(Error::invalid(format!("{what}: {a} x {b} elements of {} bytes exceed isize::MAX bytes",
                                        std::mem::size_of::<T>()))),
    }
}

/// `n`, a count of elements of `elem_size` bytes that the library reported, as a slice length:
/// an error where they span more than isize::MAX bytes, which no Rust slice may
/// (`std::slice::from_raw_parts` requires it).
pub(crate) fn slice_len(n: usize, elem_size: usize, what: &str) -> Result<usize> {
    match n.checked_mul(elem_size) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(n),
        _ => Err(Error {
            status: Status::Unsupported,
            message: format!("{what}: {n} elements of {elem_size} bytes exceed isize::MAX bytes, the largest slice"),
        }),
    }
}

/// # Safety
/// `p` points to `n` readable bytes for `'a` (or n == 0).
pub(crate) unsafe fn bytes<'a>(p: *const c_void, n: usize, what: &str) -> Result<&'a [u8]> {
    if n == 0 || p.is_null() {
        Ok(&[])
    } else {
        Ok(std::slice::from_raw_parts(p.cast(), slice_len(n, 1, what)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Sizes at and past 2^31, 2^32 and the top of usize (the library's size_t).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn checked_elems_is_the_product_or_an_error() {
        let ok = [(0, usize::MAX, 0), ((1 << 31) + 16, 1, (1 << 31) + 16), ((1 << 32) + 16, 1, (1 << 32) + 16),
                  ((1 << 31) + 16, 2, (1 << 32) + 32), ((1 << 32) - 1, (1 << 32) + 1, usize::MAX),
                  (usize::MAX, 1, usize::MAX)];
        for (a, b, want) in ok {
            assert_eq!(checked_elems(a, b, "m").unwrap(), want, "{a} x {b}");
        }
        for (a, b) in [((1usize << 32) + 16, 1usize << 32), (1 << 32, 1 << 32), (usize::MAX, 2), (usize::MAX, usize::MAX),
                       ((1 << 58) + 1, 64)] {
            let e = checked_elems(a, b, "weight").unwrap_err();
            assert_eq!(e.status(), Status::InvalidArgument, "{a} x {b}");
            assert!(e.message().contains("weight") && e.message().contains("overflow"), "{}", e.message());
        }
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn checked_alloc_refuses_more_than_isize_max_bytes() {
        assert_eq!(checked_alloc::<f32>((1 << 32) + 16, 1, "y").unwrap(), (1 << 32) + 16);
        assert_eq!(checked_alloc::<f32>(1 << 61, 1, "y").unwrap_err().status(), Status::InvalidArgument); // 2^63 bytes
        assert_eq!(checked_alloc::<f32>((1 << 61) - 1, 1, "y").unwrap(), (1 << 61) - 1);
        assert_eq!(checked_alloc::<f64>(1 << 32, 1 << 32, "m").unwrap_err().status(), Status::InvalidArgument);
        assert_eq!(checked_alloc::<u8>(isize::MAX as usize, 1, "b").unwrap(), isize::MAX as usize);
        assert!(checked_alloc::<u8>(isize::MAX as usize + 1, 1, "b").is_err());
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn slice_len_refuses_what_no_slice_can_hold() {
        for (n, size) in [((1usize << 31) + 16, 1usize), ((1 << 32) + 16, 1), ((1 << 32) + 16, 8), (isize::MAX as usize, 1),
                          ((1 << 60) - 1, 8)] {
            assert_eq!(slice_len(n, size, "data").unwrap(), n);
        }
        for (n, size) in [(isize::MAX as usize + 1, 1usize), (usize::MAX, 1), (1 << 60, 8), (1 << 61, 8), (usize::MAX, 8)] {
            assert_eq!(slice_len(n, size, "data").unwrap_err().status(), Status::Unsupported, "{n} x {size}");
        }
    }

    #[test]
    fn bytes_of_an_impossible_length_are_an_error_not_a_slice() {
        let data = [1u8, 2, 3];
        let p = data.as_ptr().cast::<c_void>();
        // SAFETY: p points to 3 bytes; the lengths past isize::MAX are refused before any read.
        unsafe {
            assert_eq!(bytes(p, 3, "data").unwrap(), &data[..]);
            assert_eq!(bytes(p, 0, "data").unwrap(), &[] as &[u8]);
            assert!(bytes(p, isize::MAX as usize + 1, "data").is_err());
            assert!(bytes(p, usize::MAX, "data").is_err());
        }
    }
}
