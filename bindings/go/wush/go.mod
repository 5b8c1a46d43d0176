// SPDX-License-Identifier: Apache-2.0
// LICENSE in this folder is a copy of the repository's: a Go module's zip holds only the files of
// its own folder, and pkg.go.dev shows a module's documentation only with a licence inside it.
module github.com/libwush/libwush/bindings/go/wush

go 1.19
