package wush

// #include <wush/wush.h>
import "C"

import "fmt"

// PackageVersion is the libwush version this package was written against (include/wush/wush.h's
// WUSH_VERSION_*); tests/bindings/test_rust_sys_header.py checks that they agree. The package
// needs a libwush.so.<major> of the same major and at least this version (CheckVersion).
const PackageVersion = "0.3.0"

// Version is wush_version: the loaded library's MAJOR*10000 + MINOR*100 + PATCH.
func Version() uint { return uint(C.wush_version()) }

// VersionString is wush_version_string.
func VersionString() string { return C.GoString(C.wush_version_string()) }

// HeaderVersion is the version of the wush.h this package was compiled against.
const HeaderVersion = uint(C.WUSH_VERSION_NUMBER)

// CheckVersion reports an error when the loaded library has another ABI major than the header
// the package was built with, or is older than it. NewContext calls it.
func CheckVersion() error {
	got := Version()
	if got/10000 != HeaderVersion/10000 || got < HeaderVersion {
		return &Error{Status: ErrUnsupported, Message: fmt.Sprintf(
			"libwush %s is loaded but the package was built against %d", VersionString(), HeaderVersion)}
	}
	return nil
}
