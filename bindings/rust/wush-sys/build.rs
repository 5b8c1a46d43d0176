//! Finds the installed libwush through pkg-config (wush.pc) and tells cargo how to link it.
//!
//! The pkg-config crate emits the library's search path and `-lwush` (which propagate to every
//! crate that depends on this one) and honors PKG_CONFIG_PATH, PKG_CONFIG and friends. The
//! library directory and include directory are passed on as `links` metadata: a dependent
//! crate's build script reads them as DEP_WUSH_LIBDIR / DEP_WUSH_INCLUDE (the `wush` crate uses
//! DEP_WUSH_LIBDIR to put an rpath into its own tests and examples).

fn main() {
    // The header/library ABI major must match the declarations: libwush.so.<major>. An older
    // minor could lack functions declared here, so the installed version must be at least ours.
    let want = env!("CARGO_PKG_VERSION");
    let major: u32 = want.split('.').next().unwrap().parse().unwrap();
    let lib = match pkg_config::Config::new()
        .atleast_version(want)
        .cargo_metadata(true)
        .probe("wush")
    {
        Ok(lib) => lib,
        Err(e) => panic!(
            "wush-sys: libwush >= {want} not found through pkg-config ({e}).\n\
             Install libwush and point PKG_CONFIG_PATH at <prefix>/lib/pkgconfig (docs/BINDINGS.md)."
        ),
    };
    let found_major: u32 = lib.version.split('.').next().unwrap_or("").parse().unwrap_or(u32::MAX);
    if found_major != major {
        panic!("wush-sys: found libwush {} but these declarations are for ABI major {major}", lib.version);
    }
    if let Some(dir) = lib.link_paths.first() {
        println!("cargo:libdir={}", dir.display());
    }
    if let Some(dir) = lib.include_paths.first() {
        println!("cargo:include={}", dir.display());
    }
    println!("cargo:version={}", lib.version);
}
