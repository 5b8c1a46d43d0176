//! Finds libwush with the `pkg-config` program (no crates) and tells cargo how to link it.
//!
//! Honors PKG_CONFIG (the program to run) and PKG_CONFIG_PATH, like the pkg-config crate does.
//! `-L<dir>` becomes `cargo:rustc-link-search=native=<dir>`, `-l<name>` becomes
//! `cargo:rustc-link-lib=<name>`; on Linux each `-L` directory is also added as an rpath so the
//! binary runs without LD_LIBRARY_PATH.

use std::env;
use std::process::Command;

fn main() {
    for var in ["PKG_CONFIG_PATH", "PKG_CONFIG", "PKG_CONFIG_LIBDIR", "PKG_CONFIG_SYSROOT_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let output = Command::new(&program)
        .args(["--libs", "--cflags", "wush"])
        .output()
        .unwrap_or_else(|e| panic!("could not run `{program}`: {e}"));
    if !output.status.success() {
        panic!(
            "`{program} --libs --cflags wush` failed (is PKG_CONFIG_PATH set to <prefix>/lib/pkgconfig?):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let flags = String::from_utf8(output.stdout).expect("pkg-config printed non-UTF-8 output");

    let linux = env::var("CARGO_CFG_TARGET_OS").map(|os| os == "linux").unwrap_or(false);
    let mut found_lib = false;
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
            if linux {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            }
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={lib}");
            found_lib |= lib == "wush";
        }
        // -I and other compile flags do not matter here: no C is compiled.
    }
    if !found_lib {
        panic!("`{program} --libs wush` did not name -lwush: {flags}");
    }
}
