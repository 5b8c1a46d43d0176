#!/usr/bin/env python3
"""libwush from Python through ctypes (standard library only, no numpy).

Finds the installed library with `pkg-config --variable=libdir wush` (set PKG_CONFIG_PATH to
<prefix>/lib/pkgconfig), loads libwush.so.<major> from there, quantizes a 2 x 64 float32 matrix
to MXFP4 and back through the C API, and checks every code, scale byte and decoded value against
an independent reference written from the rules in include/wush/wush.h.

Prints "python binding: OK" or lists the mismatches and exits 1.
"""

import ctypes
import math
import os
import subprocess
import sys
from array import array

# The ABI major this program was written against (the SONAME is libwush.so.<major>).
EXPECTED_MAJOR = 0

# Enum values pinned by the header; C enums travel as int.
WUSH_OK = 0
WUSH_ERR_INVALID_ARGUMENT = 1
WUSH_FORMAT_MXFP4 = 0
WUSH_DTYPE_F32 = 0
WUSH_BACKEND_CPU = 0

N_ROWS, D_IN, GROUP = 2, 64, 32
N_GROUPS = N_ROWS * D_IN // GROUP


def load_library():
    pkg_config = os.environ.get("PKG_CONFIG", "pkg-config")
    try:
        libdir = subprocess.run([pkg_config, "--variable=libdir", "wush"], check=True,
                                capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", "") or str(e)
        raise SystemExit(f"python binding: FAIL: `{pkg_config} --variable=libdir wush`: {err.strip()}"
                         " (is PKG_CONFIG_PATH set to <prefix>/lib/pkgconfig?)")
    path = os.path.join(libdir, f"libwush.so.{EXPECTED_MAJOR}")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise SystemExit(f"python binding: FAIL: cannot load {path}: {e}")

    c_size_p = ctypes.POINTER(ctypes.c_size_t)
    signatures = {
        # name: (restype, argtypes)
        "wush_version": (ctypes.c_uint, []),
        "wush_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "wush_last_error": (ctypes.c_char_p, []),
        "wush_format_group_size": (ctypes.c_int, [ctypes.c_int, c_size_p]),
        "wush_format_buffer_sizes": (ctypes.c_int, [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t,
                                                    c_size_p, c_size_p]),
        # wush_context* is opaque: c_void_p keeps the full pointer width.
        "wush_context_create": (ctypes.c_int, [ctypes.c_int, ctypes.c_int,
                                               ctypes.POINTER(ctypes.c_void_p)]),
        "wush_context_destroy": (None, [ctypes.c_void_p]),
        "wush_quantize_rows": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                                              ctypes.c_void_p, ctypes.c_size_t,
                                              ctypes.c_void_p, ctypes.c_size_t]),
        "wush_dequantize_rows": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int,
                                                ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.c_size_t, ctypes.c_size_t,
                                                ctypes.POINTER(ctypes.c_float), ctypes.c_size_t]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


# ---- independent MXFP4 reference (header: e = floor(log2(amax)), code = RNE_e2m1(x*3/2^e)) ----

E2M1_MAGNITUDE = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def floor_log2(a):
    """floor(log2(a)) for a finite a > 0, exactly (frexp gives a = m * 2^k with m in [0.5, 1))."""
    return math.frexp(a)[1] - 1


def e2m1_magnitude_code(a):
    """|y| to the nearest E2M1 magnitude index, ties to the even index (mantissa bit 0)."""
    if a <= 0.25:
        return 0
    if a < 0.75:
        return 1
    if a <= 1.25:
        return 2
    if a < 1.75:
        return 3
    if a <= 2.5:
        return 4
    if a < 3.5:
        return 5
    if a <= 5.0:
        return 6
    return 7


def reference_group(x):
    """Scale byte, codes and decoded values of one group (x: float32 values as Python floats)."""
    amax = max(abs(v) for v in x)
    if amax == 0.0:
        return 0, [0] * len(x), [0.0] * len(x)
    e = min(max(floor_log2(amax), -127), 127)
    codes, decoded = [], []
    for v in x:
        y = math.ldexp(v * 3.0, -e)  # exact: v is a float32, so v * 3 fits a double
        mag = e2m1_magnitude_code(abs(y))
        negative = math.copysign(1.0, v) < 0  # -0.0 keeps its sign: code 8
        codes.append((8 if negative else 0) | mag)
        decoded.append((-1.0 if negative else 1.0) * math.ldexp(E2M1_MAGNITUDE[mag], e) / 3.0)
    return e + 127, codes, decoded


# Group 0 (amax 4.0 -> e = 2, scale byte 129), with its codes worked out by hand.
GROUP0 = [0.0, -0.0, 4.0, -4.0, 1.0, -1.0, 2.0, 0.5,
          0.25, 0.3333333432674408, 0.3333333134651184, 1.6666666269302368,
          1.666666746139526, 2.3333332538604736, 2.3333334922790527, 3.3333332538604736,
          3.3333334922790527, 3.9, -2.5, 0.1, -0.1, 3.0, -3.0, 2.6666667461395264,
          1.25, 1.5, -0.75, 0.6, 2.2, -3.5, 3.6, 0.75]
# x*3/4 -> nearest E2M1 (ties to even) -> code; e.g. 1.0 -> 0.75 (tie) -> 1.0 -> code 2.
GROUP0_CODES = [0, 8, 5, 13, 2, 10, 3, 1, 0, 1, 0, 2, 3, 3, 4, 4,
                5, 5, 12, 0, 8, 4, 12, 4, 2, 2, 9, 1, 3, 13, 5, 1]


def close_enough(got, want):
    if want == 0.0:
        return got == 0.0
    return abs(got - want) <= 1e-6 * abs(want)


def main():
    lib = load_library()
    errors = []
    fail = errors.append

    def status_name(st):
        return lib.wush_status_string(st).decode()

    def last_error():
        return lib.wush_last_error().decode(errors="replace")

    version = lib.wush_version()
    if version // 10000 != EXPECTED_MAJOR:
        fail(f"loaded library version {version} has another ABI major")

    # Group 0 hand-checked; group 1 amax 0.75 (e = -1); group 2 amax 7.9 (top value rounds up
    # to 6); group 3 all zeros (scale byte 0). array('f') rounds every value to float32.
    values = list(GROUP0)
    values += [((i * 11) % 23 - 11) * 0.75 / 11 for i in range(GROUP)]
    values += [((i * 7) % 19 - 9) * 7.9 / 9 for i in range(GROUP)]
    values += [0.0] * GROUP
    x = array("f", values)
    xs = list(x)  # the float32 values actually passed, as Python floats

    want_scales, want_codes, want_y = [], [], []
    for g in range(N_GROUPS):
        s, c, d = reference_group(xs[g * GROUP:(g + 1) * GROUP])
        want_scales.append(s)
        want_codes += c
        want_y += d
    # The reference must agree with the hand-worked group before it is trusted for the rest.
    if want_scales != [129, 126, 129, 0]:
        fail(f"reference: unexpected scale bytes {want_scales}")
    if want_codes[:GROUP] != GROUP0_CODES:
        fail("reference: group 0 codes differ from the hand table")

    group_size = ctypes.c_size_t()
    st = lib.wush_format_group_size(WUSH_FORMAT_MXFP4, ctypes.byref(group_size))
    if st != WUSH_OK or group_size.value != GROUP:
        fail(f"wush_format_group_size: {status_name(st)} / {group_size.value}")
    codes_bytes, scales_bytes = ctypes.c_size_t(), ctypes.c_size_t()
    st = lib.wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, N_ROWS, D_IN, ctypes.byref(codes_bytes),
                                      ctypes.byref(scales_bytes))
    if st != WUSH_OK or codes_bytes.value != N_ROWS * D_IN // 2 or scales_bytes.value != N_GROUPS:
        raise SystemExit(f"python binding: FAIL: wush_format_buffer_sizes: {status_name(st)}, "
                         f"codes {codes_bytes.value}, scales {scales_bytes.value}")

    ctx = ctypes.c_void_p()
    st = lib.wush_context_create(WUSH_BACKEND_CPU, 0, ctypes.byref(ctx))
    if st != WUSH_OK:
        raise SystemExit(f"python binding: FAIL: wush_context_create: {status_name(st)}: {last_error()}")
    try:
        x_buf, _ = x.buffer_info()
        codes = (ctypes.c_uint8 * codes_bytes.value)()
        scales = (ctypes.c_uint8 * scales_bytes.value)()
        st = lib.wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x_buf, N_ROWS, D_IN,
                                    codes, len(codes), scales, len(scales))
        if st != WUSH_OK:
            raise SystemExit(f"python binding: FAIL: wush_quantize_rows: {status_name(st)}: {last_error()}")
        for g in range(N_GROUPS):
            if scales[g] != want_scales[g]:
                fail(f"group {g}: scale byte {scales[g]}, expected {want_scales[g]}")
        for i in range(N_ROWS * D_IN):
            # element 2k in the low nibble, element 2k+1 in the high nibble
            got = codes[i // 2] & 0x0F if i % 2 == 0 else codes[i // 2] >> 4
            if got != want_codes[i]:
                fail(f"element {i} (x = {xs[i]!r}): code {got}, expected {want_codes[i]}")

        y = (ctypes.c_float * (N_ROWS * D_IN))()
        st = lib.wush_dequantize_rows(ctx, WUSH_FORMAT_MXFP4, codes, len(codes), scales, len(scales),
                                      N_ROWS, D_IN, y, len(y))
        if st != WUSH_OK:
            fail(f"wush_dequantize_rows: {status_name(st)}: {last_error()}")
        else:
            for i in range(N_ROWS * D_IN):
                if not close_enough(y[i], want_y[i]):
                    fail(f"element {i}: decoded {y[i]!r}, expected {want_y[i]!r}")

        # Failure path: d_in = 48 is not a multiple of G = 32.
        st = lib.wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, 1, 48, ctypes.byref(codes_bytes),
                                          ctypes.byref(scales_bytes))
        if st != WUSH_ERR_INVALID_ARGUMENT:
            fail(f"wush_format_buffer_sizes(d_in = 48) returned {status_name(st)}")
        ctypes.memset(codes, 0xAB, len(codes))
        ctypes.memset(scales, 0xCD, len(scales))
        st = lib.wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x_buf, 1, 48,
                                    codes, len(codes), scales, len(scales))
        if st != WUSH_ERR_INVALID_ARGUMENT:
            fail(f"wush_quantize_rows(d_in = 48) returned {status_name(st)}")
        if not last_error():
            fail("wush_last_error() is empty after a failure")
        if status_name(WUSH_ERR_INVALID_ARGUMENT) != "WUSH_ERR_INVALID_ARGUMENT":
            fail("wush_status_string(WUSH_ERR_INVALID_ARGUMENT)")
        if any(b != 0xAB for b in codes) or any(b != 0xCD for b in scales):
            fail("a failed wush_quantize_rows wrote to its outputs")
    finally:
        lib.wush_context_destroy(ctx)
    lib.wush_context_destroy(None)  # documented no-op

    if errors:
        for e in errors:
            print(f"python binding: FAIL: {e}", file=sys.stderr)
        print(f"python binding: {len(errors)} mismatch(es)", file=sys.stderr)
        return 1
    print("python binding: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
