//! The abi-upgrade check's Rust program (tests/bindings/run_bindings.sh, check `abi-upgrade`).
//!
//! It uses only calls that existed in the previous release (abi/previous/wush.h), through raw
//! `wush-sys` declarations, and is built twice: once with wush-sys generated from the previous
//! release's header, once from the installed (new) header. Both builds run against the NEW
//! installed library. Each checks its results against oracles written here (float64 formulas,
//! the header's MXFP4 rule, names and sizes the previous header documents) and prints a report;
//! the script requires the reports of both builds, and of the Go program that does the same
//! (tests/bindings/abi_upgrade/go), to be identical.
//!
//!     wush-upgrade-check DIR      (DIR: where the checkpoint is written)
//!
//! Exit 0 when every check passed, 1 otherwise.

use core::ffi::{c_char, c_void, CStr};
use std::ffi::CString;
use std::ptr;
use wush_sys::*;

const N_TOKENS: usize = 256;
const D_IN: usize = 64;
const D_OUT: usize = 32;
const G: usize = 32; // MXFP4's group size (the header's table: 32, 16 for NVFP4)

struct Report {
    lines: Vec<String>,
    failures: usize,
}

impl Report {
    fn put(&mut self, key: &str, value: String) {
        self.lines.push(format!("{key} {value}"));
    }
    fn check(&mut self, what: &str, ok: bool, detail: String) {
        if !ok {
            eprintln!("FAIL: {what}: {detail}");
            self.failures += 1;
        }
        self.put(&format!("check.{what}"), if ok { "ok".into() } else { "FAILED".into() });
    }
    fn status(&mut self, what: &str, st: wush_status) -> bool {
        let ok = st == WUSH_OK;
        let msg = if ok { String::new() } else { last_error() };
        self.check(what, ok, format!("{} ({msg})", status_name(st)));
        ok
    }
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::from("(null)");
    }
    // SAFETY: the library returns NUL-terminated strings that live at least until the next call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
fn last_error() -> String {
    // SAFETY: no arguments.
    cstr(unsafe { wush_last_error() })
}
fn status_name(st: wush_status) -> String {
    // SAFETY: any value is accepted.
    cstr(unsafe { wush_status_string(st) })
}

/// FNV-1a over bytes: the report shows results as hashes, so two builds compare exactly.
fn fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h = (h ^ *b as u64).wrapping_mul(0x100000001b3);
    }
    format!("{h:016x}")
}
fn fnv_f32(v: &[f32]) -> String {
    fnv(&v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>())
}
fn fnv_f64(v: &[f64]) -> String {
    fnv(&v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect::<Vec<u8>>())
}

/// The data: a 64-bit LCG's top 24 bits as floats in [-1, 1), exactly representable.
fn data(seed: u64, n: usize, scale_period: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (s >> 40) as f64 / 16777216.0 * 2.0 - 1.0;
            (u * (1 + i % scale_period) as f64) as f32
        })
        .collect()
}

// The header's MXFP4 rule ("Scale rules"): e = floor(log2(amax)) clamped to [-127, 127], scale
// byte e + 127, code = RNE(x * 3 / 2^e) on the E2M1 grid (sign bit 8), low nibble first.
const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
fn e2m1_code(a: f64) -> u8 {
    let mut best = 0usize;
    for i in 1..8 {
        let (d, db) = ((a - E2M1[i]).abs(), (a - E2M1[best]).abs());
        if d < db || (d == db && i % 2 == 0) {
            best = i;
        }
    }
    best as u8
}
fn mxfp4_reference(x: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let mut codes = vec![0u8; x.len() / 2];
    let mut scales = Vec::new();
    for (g, grp) in x.chunks(G).enumerate() {
        let amax = grp.iter().map(|v| (*v as f64).abs()).fold(0.0, f64::max);
        let e = if amax == 0.0 { -127 } else { (amax.log2().floor() as i32).clamp(-127, 127) };
        scales.push((e + 127) as u8);
        for (j, &v) in grp.iter().enumerate() {
            let c = if amax == 0.0 { 0 } else { e2m1_code((v as f64 * 3.0 / 2f64.powi(e)).abs()) }
                | if v.is_sign_negative() && amax != 0.0 { 8 } else { 0 };
            let i = g * G + j;
            codes[i / 2] |= c << (4 * (i % 2));
        }
    }
    (codes, scales)
}

/// ||a - b||_F / ||b||_F in float64.
fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        num += (*x as f64 - y) * (*x as f64 - y);
        den += y * y;
    }
    (num / den).sqrt()
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: wush-upgrade-check DIR");
    let mut r = Report { lines: Vec::new(), failures: 0 };
    // SAFETY (whole block): every call gets valid pointers to buffers of the sizes passed, and
    // handles are destroyed once, after their last use.
    unsafe {
        // ---- every function of the header this build was made from is exported -----------------
        // (all_functions takes each one's address, so one missing from the library fails the link)
        // (not in the report: the two builds' headers declare different numbers of functions)
        eprintln!("wush-upgrade-check (rust): the {} functions of its header linked", all_functions().len());

        // ---- version, enums and names (facts the previous header documents) ------------------
        let v = wush_version();
        r.put("header_version", WUSH_VERSION_NUMBER.to_string());
        r.check("version_same_major", v / 10000 == WUSH_VERSION_MAJOR, format!("library {v}"));
        r.check("version_not_older", v >= WUSH_VERSION_NUMBER, format!("library {v}"));
        for (f, name, group) in [(WUSH_FORMAT_MXFP4, "mxfp4", 32usize), (WUSH_FORMAT_NVFP4, "nvfp4", 16),
                                 (WUSH_FORMAT_INT4, "int4", 32), (WUSH_FORMAT_MXFP4_OCP, "mxfp4_ocp", 32)] {
            let got = cstr(wush_format_name(f));
            r.check(&format!("format_name.{name}"), got == name, got);
            let mut g = 0usize;
            r.status(&format!("format_group_size.{name}"), wush_format_group_size(f, &mut g));
            r.check(&format!("format_group.{name}"), g == group, g.to_string());
            let mut back: wush_format = -1;
            let c = CString::new(name).unwrap();
            r.status(&format!("format_from_name.{name}"), wush_format_from_name(c.as_ptr(), &mut back));
            r.check(&format!("format_roundtrip.{name}"), back == f, back.to_string());
        }
        for (k, name) in [(WUSH_TRANSFORM_IDENTITY, "i"), (WUSH_TRANSFORM_HADAMARD, "h"), (WUSH_TRANSFORM_RANDOM, "r"),
                          (WUSH_TRANSFORM_WUS, "wus"), (WUSH_TRANSFORM_WUSH, "wush")] {
            let got = cstr(wush_transform_kind_name(k));
            r.check(&format!("kind_name.{name}"), got == name, got);
        }
        for (d, size) in [(WUSH_DTYPE_F32, 4usize), (WUSH_DTYPE_F16, 2), (WUSH_DTYPE_BF16, 2)] {
            let mut s = 0usize;
            r.status(&format!("dtype_size.{d}"), wush_dtype_size(d, &mut s));
            r.check(&format!("dtype_size_value.{d}"), s == size, s.to_string());
        }
        for (st, name) in [(WUSH_OK, "WUSH_OK"), (WUSH_ERR_INVALID_ARGUMENT, "WUSH_ERR_INVALID_ARGUMENT"),
                           (WUSH_ERR_BUFFER_TOO_SMALL, "WUSH_ERR_BUFFER_TOO_SMALL"),
                           (WUSH_ERR_NON_FINITE, "WUSH_ERR_NON_FINITE"), (WUSH_ERR_NOT_FOUND, "WUSH_ERR_NOT_FOUND")] {
            let got = status_name(st);
            r.check(&format!("status_string.{name}"), got == name, got);
        }

        // ---- error text: a refused call names its status and says why --------------------------
        let mut ctx: *mut wush_context = ptr::null_mut();
        let st = wush_context_create(WUSH_BACKEND_CPU, 7, &mut ctx);
        r.check("bad_device_refused", st == WUSH_ERR_INVALID_ARGUMENT && ctx.is_null(), status_name(st));
        let msg = last_error();
        r.check("bad_device_message", !msg.is_empty(), msg);
        r.status("context_create", wush_context_create(WUSH_BACKEND_CPU, 0, &mut ctx));
        let mut backend: wush_backend = -1;
        r.status("context_backend", wush_context_backend(ctx, &mut backend));
        r.check("context_backend_cpu", backend == WUSH_BACKEND_CPU, backend.to_string());

        // ---- options ---------------------------------------------------------------------------
        let mut opts: *mut wush_options = ptr::null_mut();
        r.status("options_create", wush_options_create(&mut opts));
        let mut dv = 0.0f64;
        r.status("options_get_damping", wush_options_get_double(opts, WUSH_OPTION_DAMPING, &mut dv));
        r.put("options.damping_default", format!("{:016x}", dv.to_bits()));
        r.status("options_set_damping", wush_options_set_double(opts, WUSH_OPTION_DAMPING, 0.03125));
        r.status("options_get_damping2", wush_options_get_double(opts, WUSH_OPTION_DAMPING, &mut dv));
        r.check("options_damping_value", dv == 0.03125, dv.to_string());
        r.status("options_set_seed", wush_options_set_int(opts, WUSH_OPTION_SEED, 1234));
        let mut iv = 0i64;
        r.status("options_get_seed", wush_options_get_int(opts, WUSH_OPTION_SEED, &mut iv));
        r.check("options_seed_value", iv == 1234, iv.to_string());
        r.status("options_get_dtype", wush_options_get_int(opts, WUSH_OPTION_TRANSFORM_DTYPE, &mut iv));
        r.check("options_transform_dtype_default", iv == WUSH_DTYPE_F32 as i64, iv.to_string());
        let st = wush_options_set_int(opts, WUSH_OPTION_SEARCH_TOKENS, 8); // bounds [16, 65536]
        r.check("options_out_of_bounds_refused", st == WUSH_ERR_INVALID_ARGUMENT, status_name(st));

        // ---- calibrator ------------------------------------------------------------------------
        let x = data(1, N_TOKENS * D_IN, 7);
        let w = data(2, D_OUT * D_IN, 3);
        let mut cal: *mut wush_calibrator = ptr::null_mut();
        r.status("calibrator_create", wush_calibrator_create(D_IN, G, WUSH_MOMENTS_BLOCK_DIAGONAL, &mut cal));
        r.status("calibrator_add", wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, x.as_ptr().cast(), N_TOKENS));
        let mut count = 0u64;
        r.status("calibrator_token_count", wush_calibrator_token_count(cal, &mut count));
        r.check("calibrator_tokens", count == N_TOKENS as u64, count.to_string());
        for b in 0..D_IN / G {
            let mut m = vec![0f64; G * G];
            r.status(&format!("second_moment.{b}"), wush_calibrator_second_moment(cal, b, m.as_mut_ptr(), m.len()));
            let mut worst = 0f64;
            for i in 0..G {
                for j in 0..G {
                    let col = |t: usize, k: usize| x[t * D_IN + b * G + k] as f64;
                    let want = (0..N_TOKENS).map(|t| col(t, i) * col(t, j)).sum::<f64>() / N_TOKENS as f64;
                    worst = worst.max((m[i * G + j] - want).abs() / (1.0 + want.abs()));
                }
            }
            r.check(&format!("second_moment_formula.{b}"), worst < 1e-9, format!("{worst:e}"));
        }
        let mut state_len = 0usize;
        r.status("calibrator_state_size", wush_calibrator_state_size(cal, &mut state_len));
        let mut state = vec![0f64; state_len];
        r.status("calibrator_export", wush_calibrator_export_state(cal, state.as_mut_ptr(), state.len()));
        r.put("calibrator.state", format!("{state_len} {}", fnv_f64(&state)));

        // ---- quantize_rows against the header's MXFP4 rule; dequantize against the input -------
        let (mut cb, mut sb) = (0usize, 0usize);
        r.status("buffer_sizes", wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, D_OUT, D_IN, &mut cb, &mut sb));
        r.check("buffer_sizes_value", cb == D_OUT * D_IN / 2 && sb == D_OUT * D_IN / G, format!("{cb} {sb}"));
        let (mut codes, mut scales) = (vec![0u8; cb], vec![0u8; sb]);
        r.status("quantize_rows", wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, w.as_ptr().cast(), D_OUT,
            D_IN, codes.as_mut_ptr().cast(), cb, scales.as_mut_ptr().cast(), sb));
        let (rc, rs) = mxfp4_reference(&w);
        r.check("quantize_rows_mxfp4_rule", codes == rc && scales == rs, "bytes differ from the rule".into());
        let mut wd = vec![0f32; D_OUT * D_IN];
        r.status("dequantize_rows", wush_dequantize_rows(ctx, WUSH_FORMAT_MXFP4, codes.as_ptr().cast(), cb,
            scales.as_ptr().cast(), sb, D_OUT, D_IN, wd.as_mut_ptr(), wd.len()));
        let mut dq_ok = true;
        for i in 0..w.len() {
            let (g, c) = (i / G, (codes[i / 2] >> (4 * (i % 2))) & 15);
            let mag = E2M1[(c & 7) as usize] * 2f64.powi(scales[g] as i32 - 127) / 3.0;
            // the decoded value rounded to float32 (the output's type)
            dq_ok &= wd[i] == (if c & 8 != 0 { -mag } else { mag }) as f32;
        }
        r.check("dequantize_rows_values", dq_ok, "a decoded value differs".into());
        let st = wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, w.as_ptr().cast(), D_OUT, D_IN,
            codes.as_mut_ptr().cast(), cb - 1, scales.as_mut_ptr().cast(), sb);
        r.check("quantize_rows_small_buffer", st == WUSH_ERR_BUFFER_TOO_SMALL, status_name(st));
        r.put("quantize_rows", format!("{} {}", fnv(&codes), fnv(&scales)));

        // ---- transform build and qweight ---------------------------------------------------------
        let mut t: *mut wush_transform = ptr::null_mut();
        r.status("transform_build", wush_transform_build(ctx, cal, WUSH_DTYPE_F32, w.as_ptr().cast(), D_OUT, D_IN,
            WUSH_TRANSFORM_WUSH, opts, &mut t));
        let (mut kind, mut tdin, mut tg): (wush_transform_kind, usize, usize) = (-1, 0, 0);
        r.status("transform_info", wush_transform_info(t, &mut kind, &mut tdin, &mut tg));
        r.check("transform_info_values", kind == WUSH_TRANSFORM_WUSH && tdin == D_IN && tg == G,
            format!("{kind} {tdin} {tg}"));
        let mut mats = vec![0f32; D_IN * G];
        r.status("transform_matrices", wush_transform_matrices(t, mats.as_mut_ptr(), mats.len()));
        r.put("transform.matrices", fnv_f32(&mats));
        let mut q: *mut wush_qweight = ptr::null_mut();
        r.status("qweight_create", wush_qweight_create(ctx, t, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32,
            w.as_ptr().cast(), D_OUT, D_IN, opts, &mut q));
        let (mut qf, mut qm, mut qo, mut qi): (wush_format, wush_method, usize, usize) = (-1, -1, 0, 0);
        r.status("qweight_info", wush_qweight_info(q, &mut qf, &mut qm, &mut qo, &mut qi));
        r.check("qweight_info_values", qf == WUSH_FORMAT_MXFP4 && qm == WUSH_METHOD_RTN && qo == D_OUT && qi == D_IN,
            format!("{qf} {qm} {qo} {qi}"));
        let qbytes = |q: *const wush_qweight| -> (Vec<u8>, Vec<u8>) {
            let (mut c, mut s): (*const c_void, *const c_void) = (ptr::null(), ptr::null());
            let (mut cn, mut sn) = (0usize, 0usize);
            if wush_qweight_data(q, &mut c, &mut cn, &mut s, &mut sn) != WUSH_OK || c.is_null() || s.is_null() {
                return (Vec::new(), Vec::new());
            }
            let bytes = |p: *const c_void, n: usize| std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec();
            (bytes(c, cn), bytes(s, sn))
        };
        let (qc, qs) = qbytes(q);
        r.put("qweight.data", format!("{} {} {} {}", qc.len(), qs.len(), fnv(&qc), fnv(&qs)));

        // ---- checkpoint: write, open, load back (the same bytes) ---------------------------------
        let path = CString::new(format!("{dir}/upgrade-rust.safetensors")).unwrap();
        let mut ck: *mut wush_checkpoint = ptr::null_mut();
        r.status("checkpoint_create", wush_checkpoint_create(&mut ck));
        let lname = CString::new("blocks.0.fc").unwrap();
        r.status("checkpoint_add_layer", wush_checkpoint_add_layer(ck, lname.as_ptr(), t, q));
        r.status("checkpoint_write", wush_checkpoint_write(ck, path.as_ptr(), ptr::null()));
        wush_checkpoint_destroy(ck);
        let mut rd: *mut wush_checkpoint = ptr::null_mut();
        r.status("checkpoint_open", wush_checkpoint_open(path.as_ptr(), &mut rd));
        let mut nl = 0usize;
        r.status("checkpoint_layer_count", wush_checkpoint_layer_count(rd, &mut nl));
        let mut np: *const c_char = ptr::null();
        r.status("checkpoint_layer_name", wush_checkpoint_layer_name(rd, 0, &mut np));
        let got_name = cstr(np);
        r.check("checkpoint_layers", nl == 1 && got_name == "blocks.0.fc", format!("{nl} {got_name}"));
        let missing = CString::new("no.such.layer").unwrap();
        let (mut t2, mut q2): (*mut wush_transform, *mut wush_qweight) = (ptr::null_mut(), ptr::null_mut());
        let st = wush_checkpoint_load_layer(rd, missing.as_ptr(), &mut t2, &mut q2);
        r.check("checkpoint_missing_layer", st == WUSH_ERR_NOT_FOUND, status_name(st));
        r.status("checkpoint_load_layer", wush_checkpoint_load_layer(rd, lname.as_ptr(), &mut t2, &mut q2));
        let mut mats2 = vec![0f32; D_IN * G];
        r.status("loaded_matrices", wush_transform_matrices(t2, mats2.as_mut_ptr(), mats2.len()));
        let same_t = mats.iter().zip(&mats2).all(|(a, b)| a.to_bits() == b.to_bits());
        r.check("checkpoint_roundtrip_transform", same_t, "matrices differ".into());
        r.check("checkpoint_roundtrip_qweight", qbytes(q2) == (qc.clone(), qs.clone()), "codes/scales differ".into());

        // ---- prepared layer forward from the loaded layer, against float64 x W^T -----------------
        let mut lin: *mut wush_linear = ptr::null_mut();
        r.status("linear_create", wush_linear_create(ctx, t2, q2, &mut lin));
        let (mut lo, mut li, mut lf): (usize, usize, wush_format) = (0, 0, -1);
        r.status("linear_info", wush_linear_info(lin, &mut lo, &mut li, &mut lf));
        r.check("linear_info_values", lo == D_OUT && li == D_IN && lf == WUSH_FORMAT_MXFP4, format!("{lo} {li} {lf}"));
        let mut wsb = 0usize;
        r.status("linear_workspace_size", wush_linear_workspace_size(ctx, lin, N_TOKENS, &mut wsb));
        let mut ws = vec![0u8; wsb];
        let mut y = vec![0f32; N_TOKENS * D_OUT];
        r.status("linear_run", wush_linear_run(ctx, lin, WUSH_DTYPE_F32, x.as_ptr().cast(), N_TOKENS, WUSH_DTYPE_F32,
            y.as_mut_ptr().cast(), y.len(), ws.as_mut_ptr().cast(), ws.len()));
        let mut exact = vec![0f64; N_TOKENS * D_OUT];
        for t_ in 0..N_TOKENS {
            for o in 0..D_OUT {
                exact[t_ * D_OUT + o] = (0..D_IN).map(|i| x[t_ * D_IN + i] as f64 * w[o * D_IN + i] as f64).sum();
            }
        }
        let err = rel_err(&y, &exact);
        // W4A4 MXFP4 on these inputs: about 0.1-0.15 relative error; 0.25 is the model examples' bound.
        r.check("linear_run_vs_float64", err > 0.0 && err < 0.25, format!("relative error {err}"));
        r.put("linear_run.y", fnv_f32(&y));
        // BF16 output: each element the float32 output rounded to nearest even.
        let mut yb = vec![0u16; N_TOKENS * D_OUT];
        r.status("linear_run_bf16", wush_linear_run(ctx, lin, WUSH_DTYPE_F32, x.as_ptr().cast(), N_TOKENS,
            WUSH_DTYPE_BF16, yb.as_mut_ptr().cast(), yb.len(), ws.as_mut_ptr().cast(), ws.len()));
        let bf16_ok = y.iter().zip(&yb).all(|(a, b)| {
            // |a| lies between the bfloat16 values lo (its binary32 bits truncated) and hi (the next
            // one up); the output is the nearer, ties to the even one, with a's sign.
            let mag = (*a as f64).abs();
            let bl = ((mag as f32).to_bits() >> 16) as u16;
            let lo = f32::from_bits((bl as u32) << 16) as f64;
            let hi = f32::from_bits((bl as u32 + 1) << 16) as f64;
            let want = if mag - lo < hi - mag || (mag - lo == hi - mag && bl % 2 == 0) { bl } else { bl + 1 };
            *b & 0x7fff == want && (*b & 0x8000 != 0) == a.is_sign_negative()
        });
        r.check("linear_run_bf16_is_rounded_f32", bf16_ok, "a BF16 output is not the nearest to the F32 one".into());
        let mut forward = vec![0f32; N_TOKENS * D_OUT];
        let mut fwb = 0usize;
        r.status("forward_workspace", wush_linear_forward_workspace_size(ctx, t, q, N_TOKENS, &mut fwb));
        let mut fws = vec![0u8; fwb];
        r.status("linear_forward", wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, x.as_ptr().cast(), N_TOKENS,
            WUSH_DTYPE_F32, forward.as_mut_ptr().cast(), forward.len(), fws.as_mut_ptr().cast(), fws.len()));
        r.check("linear_forward_matches_prepared", forward == y,
            "wush_linear_forward differs from wush_linear_run".into());
        let st = wush_linear_run(ctx, lin, WUSH_DTYPE_F32, x.as_ptr().cast(), N_TOKENS, WUSH_DTYPE_F32,
            y.as_mut_ptr().cast(), y.len() - 1, ws.as_mut_ptr().cast(), ws.len());
        r.check("linear_run_small_output", st == WUSH_ERR_BUFFER_TOO_SMALL, status_name(st));
        let msg = last_error();
        r.check("linear_run_small_output_message", !msg.is_empty(), msg);
        let mut loss = 0f64;
        r.status("layer_loss", wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, w.as_ptr().cast(), WUSH_DTYPE_F32,
            x.as_ptr().cast(), N_TOKENS, &mut loss));
        r.put("layer_loss", format!("{:016x}", loss.to_bits()));

        wush_linear_destroy(lin);
        wush_transform_destroy(t2);
        wush_qweight_destroy(q2);
        wush_checkpoint_destroy(rd);
        wush_qweight_destroy(q);
        wush_transform_destroy(t);
        wush_calibrator_destroy(cal);
        wush_options_destroy(opts);
        wush_context_destroy(ctx);
    }
    for l in &r.lines {
        println!("{l}");
    }
    eprintln!("wush-upgrade-check (rust, header {}): {} failed of {} lines", WUSH_VERSION_NUMBER, r.failures,
        r.lines.len());
    std::process::exit(if r.failures == 0 { 0 } else { 1 });
}
