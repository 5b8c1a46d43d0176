//! Tests of the wush crate against the installed libwush (run by tests/bindings/run_bindings.sh).
//!
//! Oracles are independent of the code under test: MXFP4 bytes from the header's rules written
//! out here, decoded values from a decoder written here, and runtime outputs against float64
//! products computed here.

use std::path::PathBuf;
use wush::*;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wush-rust-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

// ---- independent format reference (include/wush/wush.h, "Scale rules") ------------------------

const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Round |y| to the E2M1 grid, ties to the even index.
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

/// MXFP4 (the WUSH paper's rule): e = floor(log2(amax)), code = RNE(x * 3 / 2^e).
fn mxfp4_group(x: &[f32]) -> (u8, Vec<u8>) {
    let amax = x.iter().map(|v| (*v as f64).abs()).fold(0.0, f64::max);
    if amax == 0.0 {
        return (0, x.iter().map(|v| if v.is_sign_negative() { 8 } else { 0 }).collect());
    }
    let e = (amax.log2().floor() as i32).clamp(-127, 127);
    let codes = x.iter().map(|&v| {
        let y = v as f64 * 3.0 / 2f64.powi(e);
        e2m1_code(y.abs()) | if v.is_sign_negative() { 8 } else { 0 }
    }).collect();
    ((e + 127) as u8, codes)
}

fn nibble(codes: &[u8], i: usize) -> u8 {
    (codes[i / 2] >> (4 * (i % 2))) & 15
}

fn e2m1_value(c: u8) -> f64 {
    let v = E2M1[(c & 7) as usize];
    if c & 8 != 0 { -v } else { v }
}

fn e4m3_value(b: u8) -> f64 {
    let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
    let mag = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
    if b & 0x80 != 0 { -mag } else { mag }
}

/// A decoder of all four formats written from the header's table (independent of the library).
fn decode(format: Format, codes: &[u8], scales: &[u8], n: usize) -> Vec<f64> {
    let g = match format { Format::Nvfp4 => 16, _ => 32 };
    (0..n).map(|i| {
        let (c, grp) = (nibble(codes, i), i / g);
        match format {
            Format::Mxfp4 => e2m1_value(c) * 2f64.powi(scales[grp] as i32 - 127) / 3.0,
            Format::Mxfp4Ocp => e2m1_value(c) * 2f64.powi(scales[grp] as i32 - 127),
            Format::Nvfp4 => e2m1_value(c) * e4m3_value(scales[grp]) / 10.0,
            Format::Int4 => {
                let q = if c >= 8 { c as i32 - 16 } else { c as i32 };
                let s = f32::from_bits((u16::from_le_bytes([scales[2 * grp], scales[2 * grp + 1]]) as u32) << 16);
                (q as f64 + 0.5) * s as f64
            }
        }
    }).collect()
}

fn sample(n: usize, seed: u32) -> Vec<f32> {
    // A small LCG: varied magnitudes (outliers every 37th element), both signs, exact zeros.
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n).map(|i| {
        s = s.wrapping_mul(1664525).wrapping_add(1013904223);
        let u = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
        if i % 29 == 0 { 0.0 } else if i % 37 == 0 { u * 40.0 } else { u * 3.0 }
    }).collect()
}

// ---- rows ----------------------------------------------------------------------------------------

#[test]
fn mxfp4_rows_match_the_header_rules() {
    let ctx = Context::cpu().unwrap();
    let (rows, d_in) = (4, 96);
    let mut x = sample(rows * d_in, 1);
    x[1] = -0.0; // -0.0 keeps its sign: code 8
    x[2 * d_in..2 * d_in + 32].iter_mut().for_each(|v| *v = 0.0); // an all-zero group
    let (codes, scales) = ctx.quantize_rows(Format::Mxfp4, &x, d_in).unwrap();
    for (g, chunk) in x.chunks(32).enumerate() {
        let (s, c) = mxfp4_group(chunk);
        assert_eq!(scales[g], s, "scale of group {g}");
        for (k, &want) in c.iter().enumerate() {
            assert_eq!(nibble(&codes, g * 32 + k), want, "code {} of group {g} (x = {})", k, chunk[k]);
        }
    }
    let y = ctx.dequantize_rows(Format::Mxfp4, &codes, &scales, rows, d_in).unwrap();
    let want = decode(Format::Mxfp4, &codes, &scales, rows * d_in);
    for i in 0..y.len() {
        assert_eq!(y[i] as f64, want[i] as f32 as f64, "decoded element {i}");
    }
}

#[test]
fn every_format_decodes_as_its_table_says_and_close_to_the_input() {
    let ctx = Context::cpu().unwrap();
    let (rows, d_in) = (3, 64);
    let x = sample(rows * d_in, 2);
    for format in [Format::Mxfp4, Format::Mxfp4Ocp, Format::Nvfp4, Format::Int4] {
        let (codes, scales) = ctx.quantize_rows(format, &x, d_in).unwrap();
        assert_eq!((codes.len(), scales.len()), format.buffer_sizes(rows, d_in).unwrap());
        let y = ctx.dequantize_rows(format, &codes, &scales, rows, d_in).unwrap();
        let want = decode(format, &codes, &scales, rows * d_in);
        let mut err = 0.0;
        let mut norm = 0.0;
        for i in 0..y.len() {
            assert!((y[i] as f64 - want[i]).abs() <= 1e-6 * want[i].abs(), "{format:?} element {i}");
            err += (y[i] as f64 - x[i] as f64).powi(2);
            norm += (x[i] as f64).powi(2);
        }
        // 4-bit round trips of this outlier-heavy sample lose 5-25% (INT4 clips the outliers); a mixed-up layout
        // loses about everything (relative error near 1 or above).
        assert!(err / norm < 0.4, "{format:?}: relative error {}", err / norm);
    }
}

#[test]
fn f16_and_bf16_inputs_quantize_like_their_f32_values() {
    let ctx = Context::cpu().unwrap();
    let x: Vec<f32> = sample(64, 3).iter().map(|v| Bf16::from_f32(*v).to_f32()).collect();
    let bf: Vec<Bf16> = x.iter().map(|v| Bf16::from_f32(*v)).collect();
    assert_eq!(ctx.quantize_rows(Format::Nvfp4, &x, 64).unwrap(), ctx.quantize_rows(Format::Nvfp4, &bf, 64).unwrap());
    // 1.5 and -2.0 in binary16 bits, exactly representable in f32 too.
    let h = [F16(0x3e00), F16(0xc000)].repeat(16);
    let f = [1.5f32, -2.0].repeat(16);
    assert_eq!(ctx.quantize_rows(Format::Mxfp4, &h, 32).unwrap(), ctx.quantize_rows(Format::Mxfp4, &f, 32).unwrap());
}

#[test]
fn format_queries() {
    assert_eq!(Format::from_name("NVFP4").unwrap(), Format::Nvfp4);
    assert_eq!(Format::Int4.name(), "int4");
    assert_eq!((Format::Mxfp4.group_size(), Format::Nvfp4.group_size()), (32, 16));
    assert_eq!(Format::Int4.scale_bytes(), 2);
    assert_eq!(Format::Nvfp4.tensor_factor(), 0.1f32);
    assert_eq!(DType::Bf16.size(), 2);
    assert_eq!(TransformKind::from_name("hadamard").unwrap(), TransformKind::Hadamard);
    assert_eq!(TransformKind::Wush.name(), "wush");
    assert!(CpuIsa::Scalar.supported());
    assert_eq!(version() / 10000, sys::WUSH_VERSION_MAJOR);
    assert!(version() >= sys::WUSH_VERSION_NUMBER);
    check_version().unwrap();
    assert!(example_layer_names().contains(&"small_256x512"));
    assert_eq!(example_layer_shape("small_256x512").unwrap(), (512, 256));
}

#[test]
fn every_declared_function_is_exported() {
    // Taking every address links every symbol: a function the library lacks fails the build.
    let all = sys::all_functions();
    assert!(all.len() >= 80);
    for (name, addr) in all {
        assert_ne!(addr, 0, "{name}");
    }
}

// ---- errors --------------------------------------------------------------------------------------

#[test]
fn bad_input_is_an_error_with_the_library_message() {
    let ctx = Context::cpu().unwrap();
    // d_in not a multiple of the group size: the library's check and message.
    let e = ctx.quantize_rows(Format::Mxfp4, &[1.0f32; 40], 20).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(!e.message().is_empty());
    assert!(e.to_string().starts_with("WUSH_ERR_INVALID_ARGUMENT: "), "{e}");
    // A buffer one byte short.
    let mut codes = vec![0u8; 31];
    let mut scales = vec![0u8; 2];
    let e = ctx.quantize_rows_into(Format::Mxfp4, &[1.0f32; 64], 32, &mut codes, &mut scales).unwrap_err();
    assert_eq!(e.status(), Status::BufferTooSmall);
    // NaN: the message names the row and column.
    let mut x = vec![1.0f32; 64];
    x[40] = f32::NAN;
    let e = ctx.quantize_rows(Format::Mxfp4, &x, 32).unwrap_err();
    assert_eq!(e.status(), Status::NonFinite);
    assert!(e.message().contains('1') && e.message().contains('8'), "{}", e.message());
    // A slice that is not whole rows: this crate's own check.
    assert_eq!(ctx.quantize_rows(Format::Mxfp4, &[1.0f32; 40], 32).unwrap_err().status(), Status::InvalidArgument);
    assert!(Format::from_name("fp5").is_err());
}

#[test]
fn corrupt_and_missing_files_are_errors() {
    let e = Checkpoint::open(tmp("does-not-exist.safetensors")).unwrap_err();
    assert_eq!(e.status(), Status::Io);
    assert!(e.message().contains("does-not-exist"), "{}", e.message());
    let bad = tmp("corrupt.safetensors");
    std::fs::write(&bad, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}").unwrap();
    let e = Checkpoint::open(&bad).unwrap_err();
    assert_eq!(e.status(), Status::CorruptFile);
    assert!(!e.message().is_empty());
    assert_eq!(TensorFile::open(&bad).unwrap_err().status(), Status::CorruptFile);
}

// ---- the whole flow ------------------------------------------------------------------------------

struct Layer {
    weight: Vec<f32>,
    heldout: Vec<f32>,
    d_out: usize,
    d_in: usize,
}

fn calibrated(ctx: &Context) -> (Layer, Calibrator) {
    let l = example_layer("small_256x512", 7, 512, 64).unwrap();
    let mut cal = Calibrator::new(l.d_in, Format::Mxfp4.group_size(), MomentMode::BlockDiagonal).unwrap();
    // Two batches, and a second calibrator merged in: the same sums as one stream.
    cal.add(ctx, &l.calibration[..256 * l.d_in]).unwrap();
    let mut other = Calibrator::new(l.d_in, 32, MomentMode::BlockDiagonal).unwrap();
    other.add(ctx, &l.calibration[256 * l.d_in..]).unwrap();
    cal.merge(&other).unwrap();
    assert_eq!(cal.token_count().unwrap(), 512);
    (Layer { weight: l.weight, heldout: l.heldout, d_out: l.d_out, d_in: l.d_in }, cal)
}

#[test]
fn calibrate_build_prequantize_write_open() {
    let ctx = Context::cpu().unwrap();
    let (l, cal) = calibrated(&ctx);

    // The moment of block 0 against float64 sums written here.
    let m = cal.second_moment(0).unwrap();
    let lay = example_layer("small_256x512", 7, 512, 64).unwrap();
    let mut m01 = 0.0;
    for t in 0..512 {
        m01 += lay.calibration[t * 256] as f64 * lay.calibration[t * 256 + 1] as f64;
    }
    assert!((m[1] - m01 / 512.0).abs() <= 1e-9 * m01.abs().max(1e-30), "{} vs {}", m[1], m01 / 512.0);

    let mut opts = Options::new().unwrap();
    opts.set_double(OptionId::Damping, 0.02).unwrap();
    assert_eq!(opts.get_double(OptionId::Damping).unwrap(), 0.02);
    let t = Transform::build(&ctx, &cal, &l.weight, l.d_out, TransformKind::Wush, Some(&opts)).unwrap();
    assert_eq!(t.info().unwrap(), (TransformKind::Wush, 256, 32));
    let q = QWeight::new(&ctx, &t, Format::Mxfp4, Method::Rtn, &l.weight, l.d_out, Some(&opts)).unwrap();
    assert_eq!(q.info().unwrap(), QWeightInfo { format: Format::Mxfp4, method: Method::Rtn, d_out: 512, d_in: 256 });

    // layer_quantize is transform_build + qweight_create (the header says so): same bytes.
    let (t2, q2) = layer_quantize(&ctx, &cal, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &l.weight, l.d_out,
                                  Some(&opts)).unwrap();
    assert_eq!(q2.data().unwrap(), q.data().unwrap());
    assert_eq!(t2.matrices().unwrap(), t.matrices().unwrap());

    // WUSH beats the data-free Hadamard on held-out tokens (the paper's claim, loosely).
    let loss = ctx.layer_loss(&t, &q, &l.weight, &l.heldout).unwrap();
    let h = Transform::fixed(TransformKind::Hadamard, 256, 32, None).unwrap();
    let qh = QWeight::new(&ctx, &h, Format::Mxfp4, Method::Rtn, &l.weight, l.d_out, None).unwrap();
    let loss_h = ctx.layer_loss(&h, &qh, &l.weight, &l.heldout).unwrap();
    assert!(loss > 0.0 && loss < loss_h, "wush {loss} vs hadamard {loss_h}");
    let loss_rt = ctx.layer_loss_runtime(&t, &q, &l.weight, &l.heldout).unwrap();
    assert!((loss_rt - loss).abs() <= 1e-4 * loss, "{loss_rt} vs {loss}");

    let path = tmp("flow.safetensors");
    {
        let mut w = CheckpointWriter::new().unwrap();
        w.add_layer("model.layers.0.fc", &t, &q).unwrap();
        w.add_layer("model.layers.0.fc_h", &h, &qh).unwrap();
        assert_eq!(w.add_layer("model.layers.0.fc", &t, &q).unwrap_err().status(), Status::InvalidArgument);
        assert_eq!(w.layer_count().unwrap(), 2);
        w.write(&path, None).unwrap();
    }
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.layer_names().unwrap(), ["model.layers.0.fc", "model.layers.0.fc_h"]);
    let (lt, lq) = ck.load_layer("model.layers.0.fc").unwrap();
    assert_eq!(lq.data().unwrap(), q.data().unwrap());
    assert_eq!(lt.matrices().unwrap(), t.matrices().unwrap());
    assert_eq!(ck.load_layer("nope").unwrap_err().status(), Status::NotFound);

    // The same file through the generic safetensors reader.
    let f = TensorFile::open(&path).unwrap();
    assert!(f.len().unwrap() >= 8);
    let codes = f.find("model.layers.0.fc.codes").unwrap().expect("codes tensor");
    assert_eq!((codes.dtype, codes.shape), ("U8", &[512u64, 128][..]));
    assert_eq!(codes.data, q.data().unwrap().0);
    assert!(f.find("missing").unwrap().is_none());
    assert!(f.metadata("no-such-key").unwrap().is_none());
}

/// y = q(T x) deq(W)^T in float64 from the bytes the library wrote, decoded here.
fn float64_product(lin: &Linear, q: &QWeight, x: &[f32]) -> Vec<f64> {
    let (d_out, d_in, format) = lin.info();
    let n = x.len() / d_in;
    let (cb, sb) = format.buffer_sizes(n, d_in).unwrap();
    let (mut ac, mut asc) = (vec![0u8; cb], vec![0u8; sb]);
    lin.quantize(x, &mut ac, &mut asc).unwrap();
    let a = decode(format, &ac, &asc, n * d_in);
    let (wc, ws) = q.data().unwrap();
    let w = decode(format, wc, ws, d_out * d_in);
    let mut y = vec![0f64; n * d_out];
    for t in 0..n {
        for o in 0..d_out {
            y[t * d_out + o] = (0..d_in).map(|k| a[t * d_in + k] * w[o * d_in + k]).sum();
        }
    }
    y
}

#[test]
fn prepared_layer_equals_per_call_forward_and_the_float64_product() {
    let ctx = Context::cpu().unwrap();
    ctx.set_num_threads(2).unwrap();
    assert_eq!(ctx.parameter(ContextParameter::NumThreads).unwrap(), 2);
    let (l, cal) = calibrated(&ctx);
    let (t, q) = layer_quantize(&ctx, &cal, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &l.weight, l.d_out, None)
        .unwrap();
    let lin = Linear::new(&ctx, &t, &q).unwrap();
    assert_eq!(lin.info(), (512, 256, Format::Mxfp4));
    let x = &l.heldout;
    let n = x.len() / l.d_in;

    let y = lin.forward(x).unwrap();
    let mut ws = vec![0u8; ctx.linear_forward_workspace_size(&t, &q, n).unwrap()];
    let mut y_call = vec![0f32; n * l.d_out];
    ctx.linear_forward(&t, &q, x, &mut y_call, &mut ws).unwrap();
    assert_eq!(y, y_call, "prepared and per-call forward differ");

    // quantize_activations + gemm are the two halves of the same forward.
    let (cb, sb) = Format::Mxfp4.buffer_sizes(n, l.d_in).unwrap();
    let (mut ac, mut asc) = (vec![0u8; cb], vec![0u8; sb]);
    ctx.quantize_activations(&t, Format::Mxfp4, x, &mut ac, &mut asc).unwrap();
    let (mut lc, mut ls) = (vec![0u8; cb], vec![0u8; sb]);
    lin.quantize(x, &mut lc, &mut ls).unwrap();
    assert_eq!((&ac, &asc), (&lc, &ls));
    let mut y_gemm = vec![0f32; n * l.d_out];
    ctx.gemm(&q, &ac, &asc, n, &mut y_gemm).unwrap();
    assert_eq!(y, y_gemm);
    // ... and of the prepared layer's split run, which reports the kernels of each half.
    assert!(lin.last_kernels().unwrap().starts_with("cpu.quantize."));
    let mut y_split = vec![0f32; n * l.d_out];
    let mut ws_split = vec![0u8; lin.workspace_size(n).unwrap()];
    lin.run_quantized(&lc, &ls, n, &mut y_split, &mut ws_split).unwrap();
    assert_eq!(y, y_split);
    assert!(lin.last_kernels().unwrap().starts_with("cpu.gemm."));
    assert!(lin.run_quantized(&lc[1..], &ls, n, &mut y_split, &mut ws_split).is_err());

    // Against float64 on the decoded operands: the header promises about 1e-6 (Frobenius).
    let y64 = float64_product(&lin, &q, x);
    let (mut num, mut den) = (0.0, 0.0);
    for i in 0..y.len() {
        num += (y[i] as f64 - y64[i]).powi(2);
        den += y64[i].powi(2);
    }
    assert!((num / den).sqrt() < 1e-5, "relative error {}", (num / den).sqrt());

    // BF16 output is the f32 output rounded.
    let mut ybf = vec![Bf16::default(); n * l.d_out];
    let mut ws = vec![0u8; lin.workspace_size(n).unwrap()];
    lin.run(x, &mut ybf, &mut ws).unwrap();
    for i in 0..y.len() {
        assert_eq!(ybf[i], Bf16::from_f32(y[i]), "bf16 element {i}");
    }
    // A workspace that is too small is an error, not an overrun.
    let mut small = vec![0u8; 1];
    assert_eq!(lin.run(x, &mut y_call, &mut small).unwrap_err().status(), Status::BufferTooSmall);
}

/// `run_bias`: y is the bias-free output plus the bias, added here in f32 (bit for bit), and for a
/// Bf16 y that sum rounded; a bias of the wrong length or with a NaN is refused.
#[test]
fn run_bias_adds_the_bias_before_the_rounding() {
    let ctx = Context::cpu().unwrap();
    let (l, cal) = calibrated(&ctx);
    let (t, q) = layer_quantize(&ctx, &cal, TransformKind::Wush, Format::Int4, Method::Rtn, &l.weight, l.d_out, None)
        .unwrap();
    let lin = Linear::new(&ctx, &t, &q).unwrap();
    let x = &l.heldout[..3 * l.d_in];
    let y0 = lin.forward(x).unwrap();
    // values exact in bf16, so the f32 and Bf16 biases carry the same numbers
    let b16: Vec<Bf16> = (0..l.d_out).map(|j| Bf16::from_f32((j % 11) as f32 * 0.75 - 3.0)).collect();
    let b: Vec<f32> = b16.iter().map(|v| f32::from_bits((v.0 as u32) << 16)).collect();
    let want: Vec<f32> = y0.iter().enumerate().map(|(i, v)| v + b[i % l.d_out]).collect();
    let mut ws = vec![0u8; lin.workspace_size(3).unwrap()];
    let mut y = vec![0f32; y0.len()];
    lin.run_bias(x, &b, &mut y, &mut ws).unwrap();
    assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "f32 bias");
    let mut yb = vec![Bf16::default(); y0.len()];
    lin.run_bias(x, &b16, &mut yb, &mut ws).unwrap();
    for i in 0..yb.len() {
        assert_eq!(yb[i], Bf16::from_f32(want[i]), "bf16 element {i}");
    }
    assert_eq!(lin.run_bias(x, &b[1..], &mut y, &mut ws).unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(lin.run_bias(x, &b[..0], &mut y, &mut ws).unwrap_err().status(), Status::InvalidArgument);
    let mut bad = b.clone();
    bad[5] = f32::NAN;
    let e = lin.run_bias(x, &bad, &mut y, &mut ws).unwrap_err();
    assert_eq!(e.status(), Status::NonFinite);
    assert!(e.to_string().contains("bias"), "{e}");
}

#[test]
fn a_layer_shared_between_threads_gives_the_same_output() {
    let ctx = Context::cpu().unwrap();
    let (l, cal) = calibrated(&ctx);
    let (t, q) = layer_quantize(&ctx, &cal, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &l.weight, l.d_out, None)
        .unwrap();
    let lin = Linear::new(&ctx, &t, &q).unwrap();
    let want = lin.forward(&l.heldout).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..3).map(|_| s.spawn(|| lin.forward(&l.heldout).unwrap())).collect();
        for h in hs {
            assert_eq!(h.join().unwrap(), want);
        }
    });
}

#[test]
fn handles_drop_in_any_order() {
    let ctx = Context::cpu().unwrap();
    let (l, cal) = calibrated(&ctx);
    let (t, q) = layer_quantize(&ctx, &cal, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &l.weight, l.d_out, None)
        .unwrap();
    drop(cal); // the calibrator is not needed by what was built from it
    let path = tmp("order.safetensors");
    let mut w = CheckpointWriter::new().unwrap();
    w.add_layer("fc", &t, &q).unwrap();
    w.write(&path, None).unwrap();
    drop(w);
    let lin = Linear::new(&ctx, &t, &q).unwrap();
    let want = lin.forward(&l.heldout).unwrap();
    drop(t); // a prepared layer does not reference its transform or qweight
    drop(q);
    assert_eq!(lin.forward(&l.heldout).unwrap(), want);
    drop(lin);

    let ck = Checkpoint::open(&path).unwrap();
    let (lt, lq) = ck.load_layer("fc").unwrap();
    drop(ck); // loaded qweights keep the file mapped
    let lin = Linear::new(&ctx, &lt, &lq).unwrap();
    drop(lq);
    drop(lt);
    assert_eq!(lin.forward(&l.heldout).unwrap(), want);
    drop(lin);
    drop(ctx);
}

#[test]
fn progress_callback_can_cancel() {
    let ctx = Context::cpu().unwrap();
    let (l, cal) = calibrated(&ctx);
    let mut opts = Options::new().unwrap();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    opts.set_progress(move |_| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        false
    }).unwrap();
    let e = Transform::build(&ctx, &cal, &l.weight, l.d_out, TransformKind::Wush, Some(&opts)).unwrap_err();
    assert_eq!(e.status(), Status::Cancelled);
    assert!(calls.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    opts.clear_progress().unwrap();
    Transform::build(&ctx, &cal, &l.weight, l.d_out, TransformKind::Wush, Some(&opts)).unwrap();
}

#[test]
fn calibrator_state_round_trips() {
    let ctx = Context::cpu().unwrap();
    let (_, cal) = calibrated(&ctx);
    let state = cal.export_state().unwrap();
    let mut other = Calibrator::new(256, 32, MomentMode::BlockDiagonal).unwrap();
    other.import_state(&state).unwrap();
    assert_eq!(other.token_count().unwrap(), 512);
    assert_eq!(other.second_moment(3).unwrap(), cal.second_moment(3).unwrap());
    assert_eq!(other.import_state(&state[1..]).unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn cuda_contexts_refuse_host_slices_or_are_unsupported() {
    match Context::new(Backend::Cuda, 0) {
        Err(e) => assert_eq!(e.status(), Status::Unsupported, "{e}"),
        Ok(ctx) => {
            let t = Transform::fixed(TransformKind::Hadamard, 64, 32, None).unwrap();
            let mut c = vec![0u8; 32];
            let mut s = vec![0u8; 2];
            let e = ctx.quantize_activations(&t, Format::Mxfp4, &[0f32; 64], &mut c, &mut s).unwrap_err();
            assert_eq!(e.status(), Status::InvalidArgument);
        }
    }
}

#[allow(dead_code)]
fn thread_rules_are_as_documented() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Context>();
    send_sync::<Calibrator>();
    send_sync::<Options>();
    send_sync::<Transform>();
    send_sync::<QWeight>();
    send_sync::<Checkpoint>();
    send_sync::<TensorFile>();
    send_sync::<Linear<'static>>();
    send::<CheckpointWriter<'static>>();
}

// wush_options_sample_size: the rule wush.h states (0 without the search; the search's tokens,
// doubled while the guard's default hold-out is on).
#[test]
fn sample_size_follows_the_search_and_its_guard() {
    let mut o = Options::new().unwrap();
    assert_eq!(o.sample_size().unwrap(), 0);
    o.set_int(OptionId::Search, 1).unwrap();
    o.set_int(OptionId::SearchTokens, 96).unwrap();
    assert_eq!(o.sample_size().unwrap(), 192);
    o.set_int(OptionId::SearchGuard, 0).unwrap();
    assert_eq!(o.sample_size().unwrap(), 96);
    assert!(o.set_int(OptionId::SearchGuard, 2).is_err());
}

// Sizes whose product overflows usize (d_out x d_in, tokens x d_in): this crate's error naming the
// product, never a panic (a debug build's overflow check) nor a wrapped product (a release build:
// (2^58 + 1) x 64 wraps to the 64 elements given), and nothing allocated for it. Every call is
// tried and every failure listed.
#[test]
fn size_products_overflowing_usize_are_errors() {
    let mut failures = Vec::new();
    let mut overflow = |what: String, f: &dyn Fn() -> Option<Error>| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Err(_) => failures.push(format!("{what}: panicked")),
            Ok(None) => failures.push(format!("{what}: no error")),
            Ok(Some(e)) if e.status() != Status::InvalidArgument
                            || !(e.message().contains("overflow") || e.message().contains("exceed")) =>
                failures.push(format!("{what}: {e}")),
            Ok(Some(_)) => {}
        }
    };
    let ctx = Context::cpu().unwrap();
    let d_in = 64;
    let cal = Calibrator::new(d_in, 32, MomentMode::BlockDiagonal).unwrap();
    let t = Transform::fixed(TransformKind::Hadamard, d_in, 32, None).unwrap();
    let w = vec![0f32; d_in];
    for d_out in [usize::MAX, (1usize << 58) + 1, (usize::MAX / d_in) + 1] {
        overflow(format!("Transform::build, d_out {d_out}"),
                 &|| Transform::build(&ctx, &cal, &w, d_out, TransformKind::Wush, None).err());
        overflow(format!("QWeight::new, d_out {d_out}"),
                 &|| QWeight::new(&ctx, &t, Format::Mxfp4, Method::Rtn, &w, d_out, None).err());
        overflow(format!("layer_quantize, d_out {d_out}"), &|| {
            layer_quantize(&ctx, &cal, TransformKind::Hadamard, Format::Mxfp4, Method::Rtn, &w, d_out, None).err()
        });
    }
    let name = example_layer_names()[0];
    let (_, d) = example_layer_shape(name).unwrap();
    overflow("example_layer, n_calibration usize::MAX".into(), &|| example_layer(name, 1, usize::MAX, 0).err());
    overflow("example_layer, n_heldout usize::MAX / d_in + 1".into(), &|| example_layer(name, 1, 0, usize::MAX / d + 1).err());
    // A product that fits usize but not in isize::MAX bytes of f32 (vec! would panic).
    overflow("example_layer, n_calibration usize::MAX / d_in".into(), &|| example_layer(name, 1, usize::MAX / d, 0).err());
    overflow("dequantize_rows, 2^57 x 32".into(), &|| ctx.dequantize_rows(Format::Mxfp4, &[], &[], 1 << 57, 32).err());
    overflow("dequantize_rows, usize::MAX x 2".into(), &|| ctx.dequantize_rows(Format::Mxfp4, &[], &[], usize::MAX, 2).err());
    assert!(failures.is_empty(), "{} calls failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn grouped_layer_parts_run_as_their_rows() {
    let ctx = Context::cpu().unwrap();
    let (l, cal) = calibrated(&ctx);
    let (t, q) = layer_quantize(&ctx, &cal, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &l.weight, l.d_out, None)
        .unwrap();
    let path = tmp("grouped.safetensors");
    let mut w = CheckpointWriter::new().unwrap();
    assert_eq!(w.add_grouped_layer("qk", &t, &q, &[("q", 128), ("k", 100)]).unwrap_err().status(),
               Status::InvalidArgument); // 228 rows of 512
    w.add_grouped_layer("qk", &t, &q, &[("q", 128), ("k", 384)]).unwrap();
    assert_eq!(w.layer_parts("qk").unwrap()[1], LayerPart { name: "k".into(), row_begin: 128, rows: 384 });
    w.write(&path, None).unwrap();
    let ck = Checkpoint::open(&path).unwrap();
    assert_eq!(ck.layer_names().unwrap(), vec!["qk".to_string()]);
    assert_eq!(ck.layer_parts("qk").unwrap().len(), 2);
    assert_eq!(ck.layer_parts("nope").unwrap_err().status(), Status::NotFound);
    let whole = Linear::new(&ctx, &t, &q).unwrap().forward(&l.heldout).unwrap();
    let (kt, kq) = ck.load_layer("k").unwrap();
    let part = Linear::new(&ctx, &kt, &kq).unwrap().forward(&l.heldout).unwrap();
    let tokens = l.heldout.len() / l.d_in;
    for tok in 0..tokens {
        assert_eq!(&part[tok * 384..(tok + 1) * 384], &whole[tok * 512 + 128..(tok + 1) * 512]);
    }
}
