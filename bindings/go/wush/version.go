package wush

// PackageVersion is the libwush version this package was written against (include/wush/wush.h's
// WUSH_VERSION_*); tests/bindings/test_rust_sys_header.py checks that they agree. The package
// needs a libwush.so.<major> of the same major and at least this version (CheckVersion).
const PackageVersion = "0.3.0"
