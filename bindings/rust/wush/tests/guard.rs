//! Tests of the names and spec parsing (`wush_method_name`, `wush_method_from_name`,
//! `wush_transform_spec_from_name`), the per-layer guard report (`wush_transform_guard`,
//! `wush_transform_guard_candidate`), `wush_checkpoint_open_mode` and `wush_context_backend`
//! through the safe crate, against the installed libwush (run by tests/bindings/run_bindings.sh).
//!
//! Oracles independent of the code under test: the spellings the header documents, written out
//! here; the library's own message read with a raw `wush-sys` call and `wush_last_error()`; the
//! guard's numbers recomputed from candidate layers built separately (without any guard) and
//! scored with `layer_loss` on the held-out tokens, one token at a time for the paired statistics;
//! the guard's rule (wush.h, WUSH_OPTION_SEARCH_GUARD) written again here.

use std::ffi::{CStr, CString};
use wush::*;

// ---- names ---------------------------------------------------------------------------------------

/// The library's message for a raw call that fails, read right after it on this thread.
fn raw_message(st: sys::wush_status) -> String {
    assert_ne!(st, sys::WUSH_OK);
    // SAFETY: never NULL; copied before any other call.
    unsafe { CStr::from_ptr(sys::wush_last_error()) }.to_string_lossy().into_owned()
}

fn raw_method_error(name: &str) -> String {
    let c = CString::new(name).unwrap();
    let mut m = 0;
    // SAFETY: valid string and output pointer.
    raw_message(unsafe { sys::wush_method_from_name(c.as_ptr(), &mut m) })
}

fn raw_spec_error(name: &str) -> String {
    let c = CString::new(name).unwrap();
    let (mut k, mut s) = (0, 0);
    // SAFETY: valid string and output pointers.
    raw_message(unsafe { sys::wush_transform_spec_from_name(c.as_ptr(), &mut k, &mut s) })
}

#[test]
fn method_names_are_the_headers_and_round_trip() {
    // wush.h: wush_method_name returns "rtn" or "gptq".
    assert_eq!(Method::Rtn.name(), "rtn");
    assert_eq!(Method::Gptq.name(), "gptq");
    assert_eq!(Method::Gptq.to_string(), "gptq");
    for m in [Method::Rtn, Method::Gptq] {
        assert_eq!(Method::from_name(m.name()).unwrap(), m);
        assert_eq!(m.name().parse::<Method>().unwrap(), m);
        // Case-insensitive.
        assert_eq!(Method::from_name(&m.name().to_uppercase()).unwrap(), m);
    }
    assert_eq!("GpTq".parse::<Method>().unwrap(), Method::Gptq);
    for bad in ["awq", "", "rtn ", "gptq+s"] {
        let e = Method::from_name(bad).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{bad:?}");
        assert!(!e.message().is_empty());
        assert_eq!(e.message(), raw_method_error(bad), "{bad:?}: not the library's message");
    }
    // This crate's own check: a NUL byte never reaches the library.
    assert_eq!(Method::from_name("r\0tn").unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn transform_specs_parse_as_the_header_says() {
    use TransformKind::*;
    // wush.h: a name wush_transform_kind_from_name accepts (case-insensitive; also "identity",
    // "hadamard", "random"), optionally followed by "+s".
    let table: [(&str, TransformKind, bool); 14] = [
        ("i", Identity, false), ("h", Hadamard, false), ("r", Random, false), ("wus", Wus, false),
        ("wush", Wush, false), ("identity", Identity, false), ("hadamard", Hadamard, false),
        ("random", Random, false), ("WUSH", Wush, false), ("Hadamard", Hadamard, false),
        ("wush+s", Wush, true), ("wus+s", Wus, true), ("WUSH+s", Wush, true), ("Wus+s", Wus, true),
    ];
    for (name, kind, search) in table {
        let s = TransformSpec::from_name(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((s.kind, s.search), (kind, search), "{name}");
        assert_eq!(name.parse::<TransformSpec>().unwrap(), s);
        // Display is the tools' spelling, which parses back to the same spec.
        assert_eq!(s.to_string().parse::<TransformSpec>().unwrap(), s);
    }
    assert_eq!(TransformSpec { kind: Wush, search: true }.to_string(), "wush+s");
    assert_eq!(TransformSpec { kind: Hadamard, search: false }.to_string(), "h");
    // A search of a data-free kind is refused, with the library's message; so are unknown names.
    for bad in ["i+s", "h+s", "r+s", "identity+s", "hadamard+s", "random+s", "x+s", "wush+", "wush+t", "", "+s"] {
        let e = TransformSpec::from_name(bad).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{bad:?}");
        assert!(!e.message().is_empty(), "{bad:?}");
        assert_eq!(e.message(), raw_spec_error(bad), "{bad:?}: not the library's message");
    }
    // "the message says which": the refusal of "h+s" is not the unknown-name message.
    assert_ne!(raw_spec_error("h+s"), raw_spec_error("x+s"));
    // TransformKind parses through FromStr as from_name does.
    assert_eq!("hadamard".parse::<TransformKind>().unwrap(), Hadamard);
    assert!("wush+s".parse::<TransformKind>().is_err());
}

#[test]
fn context_backend_is_the_librarys() {
    let ctx = Context::cpu().unwrap();
    assert_eq!(ctx.backend(), Backend::Cpu);
    let mut b = -1;
    // SAFETY: live handle, valid output pointer.
    assert_eq!(unsafe { sys::wush_context_backend(ctx.as_ptr(), &mut b) }, sys::WUSH_OK);
    assert_eq!(b, sys::WUSH_BACKEND_CPU);
}

// ---- the guard -----------------------------------------------------------------------------------

const D_IN: usize = 64;
const D_OUT: usize = 48;
const N_CAL: usize = 512;
const N_VAL: usize = 64;

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(0x2545_F491_4F6C_DD1D))
    }
    fn uniform(&mut self) -> f64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / 9007199254740992.0
    }
    fn gauss(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos()
    }
}

/// Tokens whose channels j % 4 == 0 have standard deviation `loud`, the others `quiet`. The
/// calibration uses (4, 0.05); "shifted" documents swap them, so a transform fitted to the
/// calibration moments amplifies exactly the channels that are now loud.
fn tokens(n: usize, loud: f64, quiet: f64, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n * D_IN).map(|i| (r.gauss() * if i % D_IN % 4 == 0 { loud } else { quiet }) as f32).collect()
}

fn weight() -> Vec<f32> {
    let mut r = Rng::new(7);
    (0..D_OUT * D_IN).map(|_| (r.gauss() * 0.1) as f32).collect()
}

fn calibrator(ctx: &Context, cal: &[f32], val: Option<&[f32]>) -> Calibrator {
    let mut c = Calibrator::new(D_IN, Format::Mxfp4.group_size(), MomentMode::BlockDiagonal).unwrap();
    c.set_sample_size(256).unwrap();
    if let Some(v) = val {
        c.set_validation_size(v.len() / D_IN).unwrap();
    }
    c.add(ctx, cal).unwrap();
    if let Some(v) = val {
        c.add_validation(ctx, v).unwrap();
        assert_eq!(c.validation_count().unwrap(), v.len() / D_IN);
    }
    c
}

/// Search on (128 tokens of the 256-token sample), `guard` = WUSH_OPTION_SEARCH_GUARD.
fn searched_options(guard: i64) -> Options {
    let mut o = Options::new().unwrap();
    o.set_int(OptionId::Search, 1).unwrap();
    o.set_int(OptionId::SearchTokens, 128).unwrap();
    o.set_int(OptionId::SearchGuard, guard).unwrap();
    o
}

/// The six candidates in GuardCandidate order, built separately without any guard: the searched
/// WUSH layer (default hold-out off, no validation tokens), plain WUSH, I, H, R (same method,
/// default seed: the library refuses a search of the data-free kinds), and plain WUSH with the
/// shrunk moments as the header defines them (damping max(0.01, 1), the Hessian's 0.01).
fn candidates(ctx: &Context, cal: &Calibrator, w: &[f32]) -> Vec<(Transform, QWeight)> {
    let lq = |kind, o: Option<&Options>| layer_quantize(ctx, cal, kind, Format::Mxfp4, Method::Rtn, w, D_OUT, o).unwrap();
    let off = searched_options(0);
    let mut shrunk = Options::new().unwrap();
    shrunk.set_double(OptionId::HessianDamping, 0.01).unwrap();
    shrunk.set_double(OptionId::Damping, 1.0).unwrap();
    let out = vec![lq(TransformKind::Wush, Some(&off)), lq(TransformKind::Wush, None), lq(TransformKind::Identity, None),
                   lq(TransformKind::Hadamard, None), lq(TransformKind::Random, None),
                   lq(TransformKind::Wush, Some(&shrunk))];
    for (t, _) in &out {
        assert!(t.guard().unwrap().is_none(), "a candidate built without a guard reports one");
    }
    out
}

fn per_token_losses(ctx: &Context, layer: &(Transform, QWeight), w: &[f32], x: &[f32]) -> Vec<f64> {
    x.chunks(D_IN).map(|tok| ctx.layer_loss(&layer.0, &layer.1, w, tok).unwrap()).collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// (mean, standard error) of the paired differences base - alt.
fn paired(base: &[f64], alt: &[f64]) -> (f64, f64) {
    let d: Vec<f64> = base.iter().zip(alt).map(|(b, a)| b - a).collect();
    let m = mean(&d);
    let var = d.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (d.len() - 1) as f64;
    (m, (var / d.len() as f64).sqrt())
}

/// The rule (wush.h): an alternative replaces the searched layer only when its loss is lower by
/// more than 1% and by more than two standard errors of the per-token differences.
fn replaces(searched: &[f64], alt: &[f64]) -> bool {
    let (md, se) = paired(searched, alt);
    mean(alt) < 0.99 * mean(searched) && md > 2.0 * se
}

fn close(got: f64, want: f64, tol: f64) -> bool {
    (got - want).abs() <= tol
}

/// Checks a guarded layer and its report against the candidates on the held-out tokens `held`;
/// returns the kept candidate.
fn check_guarded(ctx: &Context, got: &(Transform, QWeight), cand: &[(Transform, QWeight)], w: &[f32], held: &[f32],
                 want_source: GuardSource) -> GuardCandidate {
    let n = held.len() / D_IN;
    let losses: Vec<Vec<f64>> = cand.iter().map(|c| per_token_losses(ctx, c, w, held)).collect();
    // The rule's choice: the lowest loss among the candidates that replace, else the searched one.
    let mut chosen = 0;
    for i in 1..5 {
        if replaces(&losses[0], &losses[i]) && mean(&losses[i]) < mean(&losses[chosen]) {
            chosen = i;
        }
    }
    let report = got.0.guard().unwrap().expect("a searched layer with held-out tokens reports its guard");
    assert_eq!(report.source, want_source);
    assert_eq!(report.n_tokens, n);
    assert_eq!(report.kept, GuardCandidate::ALL[chosen], "kept {:?}, the rule says {:?}", report.kept,
               GuardCandidate::ALL[chosen]);
    assert_eq!(report.candidates.len(), 6);
    for (i, c) in GuardCandidate::ALL.into_iter().enumerate() {
        let s = report.candidate(c);
        assert_eq!(s.candidate, c);
        assert_eq!(report.candidates[i], *s);
        assert_eq!(got.0.guard_candidate(c).unwrap(), *s);
        // The loss: layer_loss of the separately built candidate on all held-out tokens at once.
        let want = ctx.layer_loss(&cand[i].0, &cand[i].1, w, held).unwrap();
        assert!(close(s.loss, want, 1e-10 * want), "{c:?}: loss {} vs layer_loss {want}", s.loss);
        assert!(close(s.loss, mean(&losses[i]), 1e-9 * want), "{c:?}: loss {} vs mean of tokens", s.loss);
        let (md, se) = paired(&losses[0], &losses[i]);
        let scale = mean(&losses[0]) + mean(&losses[i]);
        assert!(close(s.difference, md, 1e-9 * scale), "{c:?}: difference {} vs {md}", s.difference);
        assert!(close(s.std_error, se, 1e-9 * scale), "{c:?}: std error {} vs {se}", s.std_error);
        assert_eq!(s.replaces, i != 0 && replaces(&losses[0], &losses[i]), "{c:?}");
    }
    assert_eq!(report.candidate(GuardCandidate::Searched).difference, 0.0);
    assert!(!report.candidate(GuardCandidate::Searched).replaces);
    // The layer returned is the kept candidate's, matrix for matrix and byte for byte.
    assert_eq!(got.0.matrices().unwrap(), cand[chosen].0.matrices().unwrap());
    assert_eq!(got.0.info().unwrap().0, cand[chosen].0.info().unwrap().0);
    assert_eq!(got.1.data().unwrap(), cand[chosen].1.data().unwrap());
    report.kept
}

#[test]
fn guard_report_agrees_with_separately_built_candidates_on_validation_tokens() {
    let ctx = Context::cpu().unwrap();
    let w = weight();
    let cal = tokens(N_CAL, 4.0, 0.05, 11);
    let shifted = tokens(N_VAL, 0.05, 4.0, 12);
    let same = tokens(N_VAL, 4.0, 0.05, 13);
    let cand = candidates(&ctx, &calibrator(&ctx, &cal, None), &w);
    // The default hold-out is off (0): validation tokens, when given, still guard.
    let o = searched_options(0);

    // Validation tokens from shifted documents: the searched layer loses clearly.
    let c = calibrator(&ctx, &cal, Some(&shifted));
    let got = layer_quantize(&ctx, &c, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &w, D_OUT, Some(&o)).unwrap();
    let kept = check_guarded(&ctx, &got, &cand, &w, &shifted, GuardSource::Validation);
    assert_ne!(kept, GuardCandidate::Searched, "the data should make the searched layer lose (else nothing is tested)");

    // Validation tokens from the calibration documents' distribution.
    let c = calibrator(&ctx, &cal, Some(&same));
    let got = layer_quantize(&ctx, &c, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &w, D_OUT, Some(&o)).unwrap();
    check_guarded(&ctx, &got, &cand, &w, &same, GuardSource::Validation);

    // A checkpoint does not carry the report: the loaded transform reports none.
    let path = std::env::temp_dir().join(format!("wush-rust-guard-{}.safetensors", std::process::id()));
    {
        let mut wr = CheckpointWriter::new().unwrap();
        wr.add_layer("l", &got.0, &got.1).unwrap();
        wr.write(&path, None).unwrap();
    }
    let ck = Checkpoint::open(&path).unwrap();
    let (lt, _) = ck.load_layer("l").unwrap();
    assert!(lt.guard().unwrap().is_none());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn default_guard_holds_out_the_odd_sample_tokens() {
    let ctx = Context::cpu().unwrap();
    let w = weight();
    let cal_tokens = tokens(N_CAL, 4.0, 0.05, 11);
    let c = calibrator(&ctx, &cal_tokens, None);
    let on = searched_options(1);
    assert_eq!(on.sample_size().unwrap(), 256); // the search's 128 and as many held out
    let cand = candidates(&ctx, &c, &w);
    let got = layer_quantize(&ctx, &c, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &w, D_OUT, Some(&on)).unwrap();
    // The held-out tokens: the odd rows of the token sample, read from the exported state
    // (wush.h, layout version 2: 6 + D_IN * G values, then [k, m, k priorities, k x d_in values]).
    let state = c.export_state().unwrap();
    let base = 6 + D_IN * Format::Mxfp4.group_size();
    let (k, rows) = (state[base] as usize, state[base + 1] as usize);
    assert_eq!((k, rows), (256, 256));
    let values = &state[base + 2 + k..];
    let held: Vec<f32> = (0..128).flat_map(|t| values[(2 * t + 1) * D_IN..(2 * t + 2) * D_IN].iter().map(|v| *v as f32))
                                 .collect();
    check_guarded(&ctx, &got, &cand, &w, &held, GuardSource::HoldOut);
}

#[test]
fn layers_without_a_guard_report_none() {
    let ctx = Context::cpu().unwrap();
    let w = weight();
    let c = calibrator(&ctx, &tokens(N_CAL, 4.0, 0.05, 11), None);
    let no_guard = |t: &Transform| {
        assert!(t.guard().unwrap().is_none());
        // The candidate query fails, with the library's message.
        let e = t.guard_candidate(GuardCandidate::Plain).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        let mut loss = 0.0;
        // SAFETY: live handle; NULL outputs are allowed.
        let st = unsafe {
            sys::wush_transform_guard_candidate(t.as_ptr(), sys::WUSH_GUARD_PLAIN, &mut loss, std::ptr::null_mut(),
                                                std::ptr::null_mut(), std::ptr::null_mut())
        };
        assert_eq!(e.message(), raw_message(st));
    };
    // Plain WUSH (no search): never guarded.
    let (t, _) = layer_quantize(&ctx, &c, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &w, D_OUT, None).unwrap();
    no_guard(&t);
    // The search with the default hold-out off and no validation tokens.
    let off = searched_options(0);
    let (t, _) = layer_quantize(&ctx, &c, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &w, D_OUT, Some(&off)).unwrap();
    no_guard(&t);
    // Built and fixed transforms.
    no_guard(&Transform::build(&ctx, &c, &w, D_OUT, TransformKind::Wush, None).unwrap());
    no_guard(&Transform::fixed(TransformKind::Hadamard, D_IN, 32, None).unwrap());
}

// ---- checkpoint open modes -----------------------------------------------------------------------

#[test]
fn a_copied_checkpoint_survives_its_file() {
    let ctx = Context::cpu().unwrap();
    let w = weight();
    let c = calibrator(&ctx, &tokens(N_CAL, 4.0, 0.05, 11), None);
    let (t, q) = layer_quantize(&ctx, &c, TransformKind::Wush, Format::Mxfp4, Method::Rtn, &w, D_OUT, None).unwrap();
    let path = std::env::temp_dir().join(format!("wush-rust-copy-{}.safetensors", std::process::id()));
    {
        let mut wr = CheckpointWriter::new().unwrap();
        wr.add_layer("fc", &t, &q).unwrap();
        wr.write(&path, None).unwrap();
    }
    let mapped = Checkpoint::open_mode(&path, CheckpointMode::Map).unwrap();
    let copied = Checkpoint::open_mode(&path, CheckpointMode::Copy).unwrap();
    drop(mapped);
    // The copy does not use the file again: delete it, then load.
    std::fs::remove_file(&path).unwrap();
    assert_eq!(copied.layer_names().unwrap(), ["fc"]);
    let (lt, lq) = copied.load_layer("fc").unwrap();
    assert_eq!(lq.data().unwrap(), q.data().unwrap());
    assert_eq!(lt.matrices().unwrap(), t.matrices().unwrap());
    // A missing file is the library's I/O error, naming the file.
    let e = Checkpoint::open_mode(&path, CheckpointMode::Copy).unwrap_err();
    assert_eq!(e.status(), Status::Io);
    assert!(e.message().contains("wush-rust-copy"), "{}", e.message());
}
