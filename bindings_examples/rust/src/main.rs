//! libwush from Rust with no crates: the C functions are declared by hand below.
//!
//! Quantizes a 2 x 64 f32 matrix to MXFP4 and back through the C API and checks every code,
//! scale byte and decoded value against an independent reference written from the rules in
//! include/wush/wush.h. Prints "rust binding: OK" or lists the mismatches and exits 1.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_uint, c_void};
use std::process::ExitCode;

// ---- the part of include/wush/wush.h this program uses --------------------------------------

/// Opaque `wush_context`; only ever used behind a pointer.
#[repr(C)]
pub struct WushContext {
    _private: [u8; 0],
}

// C enums are passed as `int`; the values are pinned by the header.
type WushStatus = c_int;
const WUSH_OK: WushStatus = 0;
const WUSH_ERR_INVALID_ARGUMENT: WushStatus = 1;

type WushFormat = c_int;
const WUSH_FORMAT_MXFP4: WushFormat = 0;

type WushDtype = c_int;
const WUSH_DTYPE_F32: WushDtype = 0;

type WushBackend = c_int;
const WUSH_BACKEND_CPU: WushBackend = 0;

/// The ABI major this program was written against (the SONAME is libwush.so.<major>).
const EXPECTED_MAJOR: c_uint = 0;

extern "C" {
    fn wush_version() -> c_uint;
    fn wush_status_string(status: WushStatus) -> *const c_char;
    fn wush_last_error() -> *const c_char;
    fn wush_format_group_size(format: WushFormat, group_size: *mut usize) -> WushStatus;
    fn wush_format_buffer_sizes(
        format: WushFormat,
        n_rows: usize,
        d_in: usize,
        codes_bytes: *mut usize,
        scales_bytes: *mut usize,
    ) -> WushStatus;
    fn wush_context_create(backend: WushBackend, device: c_int, ctx: *mut *mut WushContext)
        -> WushStatus;
    fn wush_context_destroy(ctx: *mut WushContext);
    fn wush_quantize_rows(
        ctx: *mut WushContext,
        format: WushFormat,
        dtype: WushDtype,
        x: *const c_void,
        n_rows: usize,
        d_in: usize,
        codes: *mut c_void,
        codes_bytes: usize,
        scales: *mut c_void,
        scales_bytes: usize,
    ) -> WushStatus;
    fn wush_dequantize_rows(
        ctx: *mut WushContext,
        format: WushFormat,
        codes: *const c_void,
        codes_bytes: usize,
        scales: *const c_void,
        scales_bytes: usize,
        n_rows: usize,
        d_in: usize,
        y: *mut f32,
        y_count: usize,
    ) -> WushStatus;
}

fn c_str(p: *const c_char) -> String {
    if p.is_null() {
        return "<NULL>".to_string();
    }
    // SAFETY: the library returns NUL-terminated strings that stay valid until the next call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn status_name(st: WushStatus) -> String {
    c_str(unsafe { wush_status_string(st) })
}

fn last_error() -> String {
    c_str(unsafe { wush_last_error() })
}

/// Owns a context; destroys it when dropped.
struct Context(*mut WushContext);

impl Context {
    fn cpu() -> Result<Context, String> {
        let mut ctx: *mut WushContext = std::ptr::null_mut();
        let st = unsafe { wush_context_create(WUSH_BACKEND_CPU, 0, &mut ctx) };
        if st != WUSH_OK {
            return Err(format!("wush_context_create: {}: {}", status_name(st), last_error()));
        }
        Ok(Context(ctx))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        unsafe { wush_context_destroy(self.0) };
    }
}

// ---- independent MXFP4 reference (header: e = floor(log2(amax)), code = RNE_e2m1(x*3/2^e)) ---

const N_ROWS: usize = 2;
const D_IN: usize = 64;
const GROUP: usize = 32;
const N_GROUPS: usize = N_ROWS * D_IN / GROUP;

const E2M1_MAGNITUDE: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// 2^e exactly.
fn pow2(e: i32) -> f64 {
    let mut p = 1.0f64;
    for _ in 0..e.max(0) {
        p *= 2.0;
    }
    for _ in 0..(-e).max(0) {
        p *= 0.5;
    }
    p
}

/// floor(log2(a)) for a finite a > 0, exactly.
fn floor_log2(mut a: f64) -> i32 {
    let mut e = 0;
    while a >= 2.0 {
        a *= 0.5;
        e += 1;
    }
    while a < 1.0 {
        a *= 2.0;
        e -= 1;
    }
    e
}

/// |y| to the nearest E2M1 magnitude index, ties to the even index (mantissa bit 0).
fn e2m1_magnitude_code(a: f64) -> u8 {
    if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    }
}

/// Scale byte, codes and decoded values of one group.
fn reference_group(x: &[f32]) -> (u8, Vec<u8>, Vec<f64>) {
    let amax = x.iter().map(|v| (*v as f64).abs()).fold(0.0f64, f64::max);
    if amax == 0.0 {
        return (0, vec![0; x.len()], vec![0.0; x.len()]);
    }
    let e = floor_log2(amax).clamp(-127, 127);
    let mut codes = Vec::with_capacity(x.len());
    let mut decoded = Vec::with_capacity(x.len());
    for &v in x {
        let y = v as f64 * 3.0 / pow2(e); // exact in f64
        let mag = e2m1_magnitude_code(y.abs());
        let negative = v.is_sign_negative(); // -0.0 keeps its sign: code 8
        codes.push(if negative { 8 | mag } else { mag });
        let sign = if negative { -1.0 } else { 1.0 };
        decoded.push(sign * E2M1_MAGNITUDE[mag as usize] * pow2(e) / 3.0);
    }
    ((e + 127) as u8, codes, decoded)
}

/// Group 0 (amax 4.0 -> e = 2, scale byte 129), with its codes worked out by hand.
const GROUP0: [f32; GROUP] = [
    0.0, -0.0, 4.0, -4.0, 1.0, -1.0, 2.0, 0.5,
    0.25, 0.3333333432674408, 0.3333333134651184, 1.6666666269302368,
    1.666666746139526, 2.3333332538604736, 2.3333334922790527, 3.3333332538604736,
    3.3333334922790527, 3.9, -2.5, 0.1, -0.1, 3.0, -3.0, 2.6666667461395264,
    1.25, 1.5, -0.75, 0.6, 2.2, -3.5, 3.6, 0.75,
];
/// x*3/4 -> nearest E2M1 (ties to even) -> code; e.g. 1.0 -> 0.75 (tie) -> 1.0 -> code 2.
const GROUP0_CODES: [u8; GROUP] = [
    0, 8, 5, 13, 2, 10, 3, 1, 0, 1, 0, 2, 3, 3, 4, 4, 5, 5, 12, 0, 8, 4, 12, 4, 2, 2, 9, 1, 3, 13,
    5, 1,
];

fn close_enough(got: f32, want: f64) -> bool {
    if want == 0.0 {
        return got == 0.0;
    }
    (got as f64 - want).abs() <= 1e-6 * want.abs()
}

fn run() -> Result<Vec<String>, String> {
    let mut errors = Vec::new();

    let version = unsafe { wush_version() };
    if version / 10000 != EXPECTED_MAJOR {
        errors.push(format!("loaded library version {version} has another ABI major"));
    }

    // Group 0 hand-checked; group 1 amax 0.75 (e = -1); group 2 amax 7.9 (top value rounds up
    // to 6); group 3 all zeros (scale byte 0).
    let mut x = vec![0.0f32; N_ROWS * D_IN];
    for i in 0..GROUP {
        x[i] = GROUP0[i];
        x[GROUP + i] = ((i * 11) % 23) as f32 - 11.0;
        x[GROUP + i] *= 0.75f32 / 11.0;
        x[2 * GROUP + i] = ((i * 7) % 19) as f32 - 9.0;
        x[2 * GROUP + i] *= 7.9f32 / 9.0;
        x[3 * GROUP + i] = 0.0;
    }
    let mut want_scales = Vec::new();
    let mut want_codes = Vec::new();
    let mut want_y = Vec::new();
    for g in 0..N_GROUPS {
        let (s, c, d) = reference_group(&x[g * GROUP..(g + 1) * GROUP]);
        want_scales.push(s);
        want_codes.extend(c);
        want_y.extend(d);
    }
    // The reference must agree with the hand-worked group before it is trusted for the rest.
    if want_scales != [129, 126, 129, 0] {
        errors.push(format!("reference: unexpected scale bytes {want_scales:?}"));
    }
    if want_codes[..GROUP] != GROUP0_CODES {
        errors.push("reference: group 0 codes differ from the hand table".to_string());
    }

    let mut group_size = 0usize;
    let st = unsafe { wush_format_group_size(WUSH_FORMAT_MXFP4, &mut group_size) };
    if st != WUSH_OK || group_size != GROUP {
        errors.push(format!("wush_format_group_size: {} / {group_size}", status_name(st)));
    }
    let (mut codes_bytes, mut scales_bytes) = (0usize, 0usize);
    let st = unsafe {
        wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, N_ROWS, D_IN, &mut codes_bytes, &mut scales_bytes)
    };
    if st != WUSH_OK || codes_bytes != N_ROWS * D_IN / 2 || scales_bytes != N_GROUPS {
        return Err(format!(
            "wush_format_buffer_sizes: {}, codes {codes_bytes}, scales {scales_bytes}",
            status_name(st)
        ));
    }

    let ctx = Context::cpu()?;
    let mut codes = vec![0u8; codes_bytes];
    let mut scales = vec![0u8; scales_bytes];
    let st = unsafe {
        wush_quantize_rows(
            ctx.0,
            WUSH_FORMAT_MXFP4,
            WUSH_DTYPE_F32,
            x.as_ptr() as *const c_void,
            N_ROWS,
            D_IN,
            codes.as_mut_ptr() as *mut c_void,
            codes.len(),
            scales.as_mut_ptr() as *mut c_void,
            scales.len(),
        )
    };
    if st != WUSH_OK {
        return Err(format!("wush_quantize_rows: {}: {}", status_name(st), last_error()));
    }
    for g in 0..N_GROUPS {
        if scales[g] != want_scales[g] {
            errors.push(format!("group {g}: scale byte {}, expected {}", scales[g], want_scales[g]));
        }
    }
    for i in 0..N_ROWS * D_IN {
        // element 2k in the low nibble, element 2k+1 in the high nibble
        let got = if i % 2 == 0 { codes[i / 2] & 0x0F } else { codes[i / 2] >> 4 };
        if got != want_codes[i] {
            errors.push(format!(
                "element {i} (x = {:e}): code {got}, expected {}",
                x[i], want_codes[i]
            ));
        }
    }

    let mut y = vec![0.0f32; N_ROWS * D_IN];
    let st = unsafe {
        wush_dequantize_rows(
            ctx.0,
            WUSH_FORMAT_MXFP4,
            codes.as_ptr() as *const c_void,
            codes.len(),
            scales.as_ptr() as *const c_void,
            scales.len(),
            N_ROWS,
            D_IN,
            y.as_mut_ptr(),
            y.len(),
        )
    };
    if st != WUSH_OK {
        errors.push(format!("wush_dequantize_rows: {}: {}", status_name(st), last_error()));
    } else {
        for i in 0..N_ROWS * D_IN {
            if !close_enough(y[i], want_y[i]) {
                errors.push(format!("element {i}: decoded {:e}, expected {:e}", y[i], want_y[i]));
            }
        }
    }

    // Failure path: d_in = 48 is not a multiple of G = 32.
    let st = unsafe {
        wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, 1, 48, &mut codes_bytes, &mut scales_bytes)
    };
    if st != WUSH_ERR_INVALID_ARGUMENT {
        errors.push(format!("wush_format_buffer_sizes(d_in = 48) returned {}", status_name(st)));
    }
    codes.fill(0xAB);
    scales.fill(0xCD);
    let st = unsafe {
        wush_quantize_rows(
            ctx.0,
            WUSH_FORMAT_MXFP4,
            WUSH_DTYPE_F32,
            x.as_ptr() as *const c_void,
            1,
            48,
            codes.as_mut_ptr() as *mut c_void,
            codes.len(),
            scales.as_mut_ptr() as *mut c_void,
            scales.len(),
        )
    };
    if st != WUSH_ERR_INVALID_ARGUMENT {
        errors.push(format!("wush_quantize_rows(d_in = 48) returned {}", status_name(st)));
    }
    if last_error().is_empty() {
        errors.push("wush_last_error() is empty after a failure".to_string());
    }
    if status_name(WUSH_ERR_INVALID_ARGUMENT) != "WUSH_ERR_INVALID_ARGUMENT" {
        errors.push("wush_status_string(WUSH_ERR_INVALID_ARGUMENT)".to_string());
    }
    if codes.iter().any(|&b| b != 0xAB) || scales.iter().any(|&b| b != 0xCD) {
        errors.push("a failed wush_quantize_rows wrote to its outputs".to_string());
    }

    drop(ctx);
    unsafe { wush_context_destroy(std::ptr::null_mut()) }; // documented no-op
    Ok(errors)
}

fn main() -> ExitCode {
    match run() {
        Ok(errors) if errors.is_empty() => {
            println!("rust binding: OK");
            ExitCode::SUCCESS
        }
        Ok(errors) => {
            for e in &errors {
                eprintln!("rust binding: FAIL: {e}");
            }
            eprintln!("rust binding: {} mismatch(es)", errors.len());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("rust binding: FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}
