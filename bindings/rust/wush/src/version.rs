//! Version (`wush.h`: "Version").

use crate::error::{static_str, Error, Result, Status};
use crate::sys;
#[cfg(doc)] // names in the documentation's links
use crate::Context;

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
