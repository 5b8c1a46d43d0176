//! Puts an rpath to the library directory that wush-sys found (DEP_WUSH_LIBDIR) into this
//! crate's own tests and examples, so they run without LD_LIBRARY_PATH. (A `-sys` crate's link
//! arguments do not reach the binaries of the crates that use it; an application sets its own
//! rpath the same way, or uses the loader's search path: docs/BINDINGS.md.)
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_WUSH_LIBDIR");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").map(|os| os == "linux").unwrap_or(false);
    if let (true, Ok(dir)) = (linux, std::env::var("DEP_WUSH_LIBDIR")) {
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg-examples=-Wl,-rpath,{dir}");
    }
}
