package wush

// Sizes between the library and Go: the library counts in size_t (uint64 here), Go slices in int.
// A plain conversion would wrap or truncate a large count silently (C.GoBytes takes a C.int: a
// 4 GiB + 16 B tensor came back as 16 bytes, a 2 GiB + 16 B one panicked), and Go's int product
// of two sizes wraps on overflow; these refuse what they cannot represent instead.

import (
	"fmt"
	"math"
	"strings"
	"unsafe"
)

// goLen is n, a count the library reported, as a Go length: an error (never a truncated value)
// when n is over math.MaxInt.
func goLen(n uint64, what string) (int, error) {
	if n > math.MaxInt {
		return 0, &Error{Status: ErrUnsupported,
			Message: fmt.Sprintf("%s: %d does not fit a Go length (at most %d)", what, n, math.MaxInt)}
	}
	return int(n), nil
}

// goBytes copies n bytes at p, memory of the library, into a new slice. A count no Go slice can
// hold is an error, never a panic or a truncated copy.
func goBytes(p unsafe.Pointer, n uint64, what string) (b []byte, err error) {
	size, err := goLen(n, what)
	if err != nil {
		return nil, err
	}
	if size == 0 {
		return []byte{}, nil // as C.GoBytes(p, 0)
	}
	if p == nil {
		return nil, &Error{Status: ErrInternal, Message: fmt.Sprintf("%s: %d bytes at NULL", what, n)}
	}
	defer func() {
		// make panics (a runtime error, recovered here) for a length over the largest allocation
		// the runtime allows, which is below math.MaxInt on 64-bit systems.
		if r := recover(); r != nil {
			b, err = nil, &Error{Status: ErrOutOfMemory, Message: fmt.Sprintf("%s: cannot copy %d bytes: %v", what, n, r)}
		}
	}()
	b = make([]byte, size)
	// Not `make` directly followed by `copy`: the compiler fuses that pair into one call that
	// skips the length check, and an impossible length is then a fatal out-of-memory error.
	src := unsafe.Slice((*byte)(p), size)
	copy(b, src)
	return b, nil
}

// elemCount is a*b, the element count of an a x b matrix: an error for a negative factor or a
// product over math.MaxInt instead of Go's wrapped int product.
func elemCount(a, b int, what string) (int, error) {
	if a < 0 || b < 0 {
		return 0, invalid("%s: negative size %d x %d", what, a, b)
	}
	if a != 0 && b > math.MaxInt/a {
		return 0, invalid("%s: %d x %d elements overflow int", what, a, b)
	}
	return a * b, nil
}

// expectElems checks that a slice of n elements holds a rows x width matrix.
func expectElems(n, rows, width int, what string) error {
	want, err := elemCount(rows, width, what)
	if err != nil {
		return err
	}
	if n != want {
		return invalid("%s holds %d elements, expected %d", what, n, want)
	}
	return nil
}

// nonNegative checks sizes and indices the caller passes before they become a C size_t, where a
// negative int would wrap to a count near 2^64. names are theirs, comma-separated, in ns's order.
func nonNegative(names string, ns ...int) error {
	for i, n := range ns {
		if n < 0 {
			return invalid("%s is negative (%d)", strings.Split(names, ", ")[i], n)
		}
	}
	return nil
}

// int32Arg checks an int the caller passes before it becomes a C int (32 bits), which would
// truncate it to another value.
func int32Arg(what string, n int) error {
	if n < math.MinInt32 || n > math.MaxInt32 {
		return invalid("%s %d does not fit a C int", what, n)
	}
	return nil
}

// lenAfter is goLen of a count a call wrote, once the call succeeded.
func lenAfter(n uint64, err error, what string) (int, error) {
	if err != nil {
		return 0, err
	}
	return goLen(n, what)
}
