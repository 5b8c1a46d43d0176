#!/usr/bin/env python3
"""End-to-end test of `wush eval` and the checkpoint commands, Python standard library only.

Usage: test_eval_cli.py PATH/TO/wush

The oracle for the identity-transform loss is written here from the format rules of docs/BLOCK_FORMATS.md
(MXFP4 default rule: e = floor(log2(amax)), code = RNE_e2m1(x * 3 / 2^e), value = code * 2^e / 3),
in float64, independent of the library. The files are written with a minimal safetensors writer
below, so the library's reader meets files it did not write.
"""
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

WUSH = sys.argv[1]
FAILED = []

D_OUT, D_IN, N_TOKENS = 24, 64, 192  # the last quarter (48 tokens) is held out by default
N_HELD = N_TOKENS // 4


def check(cond, what):
    if not cond:
        FAILED.append(what)
        print("FAILED:", what, file=sys.stderr)


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (rows, cols, list of floats)} stored as F32."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (rows, cols, values) in tensors.items():
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": [rows, cols], "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def as_f32(values):
    return list(struct.unpack("<%df" % len(values), struct.pack("<%df" % len(values), *values)))


def layer(seed):
    """A layer whose activations have a few outlier channels (so that transforms matter)."""
    rng = random.Random(seed)
    w = as_f32([rng.gauss(0.0, 1.0) / math.sqrt(D_IN) for _ in range(D_OUT * D_IN)])
    outliers = {3: 25.0, 40: 12.0}
    x = as_f32([rng.gauss(0.0, 1.0) * outliers.get(j, 1.0) for _ in range(N_TOKENS) for j in range(D_IN)])
    return w, x


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def rne_e2m1(v):
    """Nearest E2M1 value to v (|v| <= 6 here), ties to the even code."""
    a = abs(v)
    best = min(range(8), key=lambda i: (abs(E2M1[i] - a), i % 2))
    return math.copysign(E2M1[best], v)


def mxfp4_dequantized(row):
    out = []
    for g in range(0, len(row), 32):
        group = row[g:g + 32]
        amax = max(abs(v) for v in group)
        if amax == 0.0:
            out.extend([0.0] * 32)
            continue
        e = math.frexp(amax)[1] - 1  # floor(log2(amax)) from the float's exponent
        out.extend(rne_e2m1(v * 3.0 / 2.0 ** e) * 2.0 ** e / 3.0 for v in group)
    return out


def identity_mxfp4_loss(w, x):
    wq = [mxfp4_dequantized(w[o * D_IN:(o + 1) * D_IN]) for o in range(D_OUT)]
    total = 0.0
    for t in range(N_TOKENS - N_HELD, N_TOKENS):
        xt = x[t * D_IN:(t + 1) * D_IN]
        xq = mxfp4_dequantized(xt)
        for o in range(D_OUT):
            wo = w[o * D_IN:(o + 1) * D_IN]
            y = math.fsum(a * b for a, b in zip(xt, wo))
            yq = math.fsum(a * b for a, b in zip(xq, wq[o]))
            total += (yq - y) ** 2
    return total / (D_OUT * N_HELD)


def run(*args, expect_ok=True):
    p = subprocess.run([WUSH, *args], capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        check(False, "wush %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr.strip()[-500:]))
    return p


def results_by_key(stdout):
    doc = json.loads(stdout)
    return {(r["layer"], r["format"], r["transform"], r["method"]): r["loss"] for r in doc["results"]}


def main():
    tmp = tempfile.mkdtemp(prefix="wush_cli_test_")
    w, x = layer(7)
    wpath, xpath = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "x.safetensors")
    write_safetensors(wpath, {"proj": (D_OUT, D_IN, w)}, {"note": "written by test_eval_cli.py"})
    write_safetensors(xpath, {"proj": (N_TOKENS, D_IN, x)})

    # 1. eval on files: every requested cell present, JSON only on stdout, losses finite.
    p = run("eval", "--weights", wpath, "--activations", xpath, "--format", "mxfp4,nvfp4,int4",
            "--transform", "i,h,wush", "--json")
    res = results_by_key(p.stdout) if p.returncode == 0 else {}
    for fmt in ("mxfp4", "nvfp4", "int4"):
        for tr in ("i", "h", "wush"):
            loss = res.get(("proj", fmt, tr, "rtn"))
            check(loss is not None and math.isfinite(loss) and loss > 0, "eval cell proj/%s/%s: %r" % (fmt, tr, loss))
    check(len(res) == 9, "eval printed %d results, expected 9" % len(res))

    # 2. the identity MXFP4 loss equals the independent float64 oracle.
    want = identity_mxfp4_loss(w, x)
    got = res.get(("proj", "mxfp4", "i", "rtn"))
    check(got is not None and abs(got - want) <= 1e-6 * want, "identity mxfp4 loss %r, oracle %r" % (got, want))

    # 3. with outlier channels, the data-aware transform beats the identity (the paper's claim,
    #    held-out tokens) for MXFP4 and INT4.
    for fmt in ("mxfp4", "int4"):
        i, wu = res.get(("proj", fmt, "i", "rtn")), res.get(("proj", fmt, "wush", "rtn"))
        check(i is not None and wu is not None and wu < i, "%s: wush loss %r not below identity %r" % (fmt, wu, i))

    # 4. quantize -> inspect -> eval --checkpoint: the stored identity checkpoint measures the same
    #    loss on the held-out tokens as eval (the identity transform does not depend on calibration).
    ck = os.path.join(tmp, "ck.safetensors")
    run("quantize", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "i",
        "--out", ck)
    p = run("inspect", ck)
    check("proj" in p.stdout and "mxfp4" in p.stdout, "inspect does not list layer proj/mxfp4: %r" % p.stdout)
    p = run("eval", "--checkpoint", ck, "--weights", wpath, "--activations", xpath,
            "--heldout-tokens", str(N_HELD), "--json")
    if p.returncode == 0:
        ck_loss = list(results_by_key(p.stdout).values())
        check(len(ck_loss) == 1 and abs(ck_loss[0] - want) <= 1e-6 * want,
              "checkpoint loss %r, oracle %r" % (ck_loss, want))

    # 5. GPTQ: `--method all` gives both methods, GPTQ-WUSH beats RTN-WUSH on held-out tokens;
    #    a GPTQ checkpoint records its method.
    p = run("eval", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "wush",
            "--method", "all", "--json")
    res = results_by_key(p.stdout) if p.returncode == 0 else {}
    rtn, gptq = res.get(("proj", "mxfp4", "wush", "rtn")), res.get(("proj", "mxfp4", "wush", "gptq"))
    check(len(res) == 2 and rtn is not None and gptq is not None and gptq < rtn,
          "eval --method all: %r" % res)
    ck_gptq = os.path.join(tmp, "ck_gptq.safetensors")
    run("quantize", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "wush",
        "--method", "gptq", "--out", ck_gptq)
    p = run("inspect", ck_gptq)
    check("gptq" in p.stdout, "inspect of a GPTQ checkpoint does not say gptq: %r" % p.stdout)

    # 6. --validation-tokens V: the V tokens before the held-out ones are the search guard's
    #    validation tokens, not calibration tokens: the plain WUSH column equals an eval of a file
    #    without those rows, and the guarded wush+s column is a finite loss.
    n_val = 64
    n_cal = N_TOKENS - N_HELD - n_val
    x_cut = x[: n_cal * D_IN] + x[(n_cal + n_val) * D_IN:]
    cut_path = os.path.join(tmp, "x_without_validation.safetensors")
    write_safetensors(cut_path, {"proj": (N_TOKENS - n_val, D_IN, x_cut)})
    p = run("eval", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "wush,wush+s",
            "--heldout-tokens", str(N_HELD), "--validation-tokens", str(n_val), "--json")
    with_val = results_by_key(p.stdout) if p.returncode == 0 else {}
    p = run("eval", "--weights", wpath, "--activations", cut_path, "--format", "mxfp4", "--transform", "wush",
            "--heldout-tokens", str(N_HELD), "--json")
    cut = results_by_key(p.stdout) if p.returncode == 0 else {}
    key = ("proj", "mxfp4", "wush", "rtn")
    check(key in with_val and with_val.get(key) == cut.get(key),
          "wush with --validation-tokens %r, without the validation rows %r" % (with_val.get(key), cut.get(key)))
    guarded = with_val.get(("proj", "mxfp4", "wush+s", "rtn"))
    check(guarded is not None and math.isfinite(guarded) and guarded > 0, "guarded wush+s loss %r" % guarded)

    # 7. quantize --transform wush+s stores the searched layer `eval` measures: a checkpoint
    #    quantized on the calibration rows alone (plus --validation-tokens: the last rows only
    #    validate) has, on the held-out rows, the loss eval reports for its wush+s column with the
    #    same split; the search changed the layer (its loss differs from plain WUSH's); and
    #    validation rows unlike the calibration rows (the first half of the channels loud, the
    #    rest near zero: there WUSH+s loses to I and H by about a third, clearly beyond the
    #    guard's paired test on 64 tokens) make the guard replace it.
    #    --search-tokens reaches both commands the same way: on a 16-token sample quantize and
    #    eval still agree, and the choice differs from the default sample's.
    rng = random.Random(11)
    # (Loud channels of constant magnitude: per-token losses that vary less than Gaussian ones.)
    odd = as_f32([rng.choice((-30.0, 30.0)) if j < D_IN // 2 else rng.gauss(0.0, 0.1)
                  for _ in range(n_val) for j in range(D_IN)])
    x_odd = x[: n_cal * D_IN] + odd + x[(n_cal + n_val) * D_IN:]
    files = {}
    for tag, rows in (("same", x), ("odd", x_odd)):
        files[tag] = (os.path.join(tmp, "x_%s.safetensors" % tag), os.path.join(tmp, "x_%s_cal.safetensors" % tag))
        write_safetensors(files[tag][0], {"proj": (N_TOKENS, D_IN, rows)})
        write_safetensors(files[tag][1], {"proj": (N_TOKENS - N_HELD, D_IN, rows[: (N_TOKENS - N_HELD) * D_IN])})
    searched_by_case, kept_by_case = {}, {}
    for fmt, method, val, tokens in (("mxfp4", "rtn", "", ""), ("nvfp4", "gptq", "", ""), ("mxfp4", "rtn", "same", ""),
                                     ("mxfp4", "rtn", "odd", ""), ("mxfp4", "rtn", "", "16")):
        full, cal = files[val or "same"]
        ck_s = os.path.join(tmp, "ck_search_%s_%s_%s_%s.safetensors" % (fmt, method, val, tokens))
        extra = (("--validation-tokens", str(n_val)) if val else ()) + (("--search-tokens", tokens) if tokens else ())
        gj = os.path.join(tmp, "guard_%s_%s_%s_%s.json" % (fmt, method, val, tokens))
        p = run("quantize", "--weights", wpath, "--activations", cal, "--format", fmt, "--transform", "wush+s",
                "--method", method, "--out", ck_s, "--guard-json", gj, *extra)
        # The per-layer guard report: printed (the layer's line) and recorded (--guard-json), its
        # source and token count as configured, and the kept candidate the rule's on the recorded
        # losses and flags (the lowest loss among those that met the margin, else the searched).
        check(p.returncode == 0 and "proj" in p.stdout and "kept" in p.stdout, "quantize's guard table: %r" % p.stdout)
        try:
            with open(gj) as f:
                rep = json.load(f)["layers"]
        except (OSError, ValueError, KeyError) as e:
            rep = []
            check(False, "--guard-json: %r" % e)
        # Without validation rows the sample is all N_TOKENS - N_HELD calibration rows (fewer than
        # the default search's 2 x 1024), half of them held out; a 16-token search keeps a
        # 32-token sample, too small for a guard (at least 32 held out).
        want = ("validation", n_val) if val else ("none", 0) if tokens else ("hold_out", (N_TOKENS - N_HELD) // 2)
        if len(rep) == 1 and want[0] == "none":
            check((rep[0]["guard"], rep[0]["tokens"]) == want, "guard source/tokens %r, want %r" % (rep[0], want))
            searched_kept = None
        elif len(rep) == 1:
            r = rep[0]
            check((r["guard"], r["tokens"]) == want, "guard source/tokens %r, want %r" % (r, want))
            c = r["candidates"]
            rule = min([k for k in c if c[k]["replaces"]], key=lambda k: c[k]["loss"], default="searched")
            check(r["kept"] == rule and not c["searched"]["replaces"], "kept %r, the rule %r: %r" % (r["kept"], rule, c))
            searched_kept = r["kept"]
        else:
            check(False, "--guard-json: one guarded layer expected: %r" % rep)
            searched_kept = None
        kept_by_case[val or fmt + method + tokens] = searched_kept
        p = run("eval", "--checkpoint", ck_s, "--weights", wpath, "--activations", full,
                "--heldout-tokens", str(N_HELD), "--json")
        stored = list(results_by_key(p.stdout).values()) if p.returncode == 0 else []
        p = run("eval", "--weights", wpath, "--activations", full, "--format", fmt, "--transform", "wush,wush+s",
                "--method", method, "--heldout-tokens", str(N_HELD), "--json", *extra)
        res = results_by_key(p.stdout) if p.returncode == 0 else {}
        searched, plain = res.get(("proj", fmt, "wush+s", method)), res.get(("proj", fmt, "wush", method))
        searched_by_case[val or fmt + method + tokens] = searched
        check(len(stored) == 1 and searched is not None and stored[0] == searched,
              "quantize wush+s %s %s %s: stored layer's loss %r, eval's wush+s %r" % (fmt, method, val, stored, searched))
        check(searched is not None and searched != plain,
              "%s %s %s: wush+s %r equals plain wush %r (the search changed nothing)" % (fmt, method, val, searched, plain))
    check(searched_by_case["odd"] != searched_by_case["same"],
          "the guard kept the searched layer on validation rows unlike the calibration rows: %r" % searched_by_case)
    check(kept_by_case["odd"] not in (None, "searched"), "the report says the searched layer was kept: %r" % kept_by_case)
    check(searched_by_case["mxfp4rtn16"] != searched_by_case["mxfp4rtn"],
          "--search-tokens 16 chose as the default sample did: %r" % searched_by_case)

    # 7b. --sequence-length: the calibration rows are whole sequences (9 of 16 here), and the
    #     guard holds out whole ones (about half the rows); quantize names the undecided layers
    #     in one line at the end, as its JSON records them (the rule from the recorded losses:
    #     some candidate below 0.99 x the kept one's loss that did not replace); eval's JSON
    #     says what the `+s` column's guard held out; a length that does not divide the rows fails.
    full, cal = files["same"]
    ck_q = os.path.join(tmp, "ck_seq.safetensors")
    gj = os.path.join(tmp, "guard_seq.json")
    p = run("quantize", "--weights", wpath, "--activations", cal, "--format", "mxfp4", "--transform", "wush+s",
            "--out", ck_q, "--guard-json", gj, "--sequence-length", "16")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("undecided: ")]
    check(p.returncode == 0 and len(lines) == 1 and p.stdout.splitlines()[-1] == lines[0],
          "quantize --sequence-length: one undecided line at the end: %r" % p.stdout)
    try:
        with open(gj) as f:
            r = json.load(f)["layers"][0]
        c = r["candidates"]
        lower = [k for k in c if k != r["kept"] and c[k]["loss"] < 0.99 * c[r["kept"]]["loss"]]
        check(r["guard"] == "hold_out_sequences" and 1 <= r["sequences"] < 9 and 32 <= r["tokens"] <= 112,
              "sequence hold-out report %r" % r)
        check(r["undecided"] == bool(lower) and (lines[0] == "undecided: none") == (not lower),
              "undecided %r vs the rule %r, line %r" % (r["undecided"], lower, lines))
    except (OSError, ValueError, KeyError, IndexError) as e:
        check(False, "--guard-json with --sequence-length: %r" % e)
    p = run("eval", "--weights", wpath, "--activations", full, "--format", "mxfp4", "--transform", "wush+s",
            "--method", "rtn", "--heldout-tokens", str(N_HELD), "--json", "--sequence-length", "16")
    try:
        rows = json.loads(p.stdout)["results"]
        check(rows[0]["guard"]["source"] == "hold_out_sequences", "eval's guard field %r" % rows[0])
    except (ValueError, KeyError, IndexError) as e:
        check(False, "eval --sequence-length: %r (%r)" % (e, p.stdout))
    p = run("quantize", "--weights", wpath, "--activations", cal, "--format", "mxfp4", "--transform", "wush+s",
            "--out", ck_q, "--sequence-length", "17", expect_ok=False)
    check(p.returncode != 0 and "sequence" in p.stderr, "--sequence-length 17 of 144 rows: %r" % p.stderr)

    # 7c. --documents: the calibration rows are documents of these lengths (3 of 48 here, and one
    #     list that adds up to the rows), and the guard holds out whole documents and says so;
    #     lengths that do not add up, or --documents with --sequence-length, are usage errors.
    for docs, n_docs in (("48", 3), ("16,32,96", 3)):
        p = run("quantize", "--weights", wpath, "--activations", cal, "--format", "mxfp4", "--transform", "wush+s",
                "--out", ck_q, "--guard-json", gj, "--documents", docs)
        try:
            with open(gj) as f:
                r = json.load(f)["layers"][0]
            check(p.returncode == 0 and r["guard"] == "hold_out_documents" and 1 <= r["sequences"] < n_docs,
                  "document hold-out report (--documents %s) %r" % (docs, r))
            check(" documents " in p.stdout, "quantize's guard table names the documents: %r" % p.stdout)
        except (OSError, ValueError, KeyError, IndexError) as e:
            check(False, "--guard-json with --documents %s: %r" % (docs, e))
    for bad_args in (["--documents", "50"], ["--documents", "48,48"], ["--documents", "48", "--sequence-length", "16"]):
        p = run("quantize", "--weights", wpath, "--activations", cal, "--format", "mxfp4", "--transform", "wush+s",
                "--out", ck_q, *bad_args, expect_ok=False)
        check(p.returncode == 2 and "--documents" in p.stderr, "%r: a usage error naming --documents: %r"
              % (bad_args, p.stderr))

    # 8. bad input: clear message on stderr, non-zero exit, nothing on stdout.
    bad = os.path.join(tmp, "truncated.safetensors")
    with open(ck, "rb") as f:
        data = f.read()
    with open(bad, "wb") as f:
        f.write(data[: len(data) // 2])
    for args in (("inspect", bad),
                 ("eval", "--weights", os.path.join(tmp, "missing.safetensors"), "--activations", xpath),
                 ("eval", "--layers", "no_such_layer"),
                 ("eval", "--format", "fp8"),
                 ("eval", "--layers", "small_256x512", "--method", "obq"),
                 ("eval", "--weights", wpath, "--activations", xpath, "--validation-tokens", str(N_TOKENS - N_HELD)),
                 ("eval", "--layers", "small_256x512", "--validation-tokens", "70000"),
                 ("quantize", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "wush",
                  "--method", "awq", "--out", os.path.join(tmp, "never.safetensors")),
                 ("quantize", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "h+s",
                  "--out", os.path.join(tmp, "never.safetensors")),
                 ("quantize", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "wush",
                  "--validation-tokens", "8", "--out", os.path.join(tmp, "never.safetensors")),
                 ("quantize", "--weights", wpath, "--activations", xpath, "--format", "mxfp4", "--transform", "wush+s",
                  "--validation-tokens", str(N_TOKENS), "--out", os.path.join(tmp, "never.safetensors")),
                 ("eval", "--layers", "small_256x512", "--transform", "i+s"),
                 ("eval", "--layers", "small_256x512", "--transform", "wush", "--search-tokens", "64"),
                 ("eval", "--layers", "small_256x512", "--transform", "wush+s", "--search-tokens", "8"),
                 ("frobnicate",)):
        p = run(*args, expect_ok=False)
        check(p.returncode != 0 and p.stderr.strip() != "" and p.stdout.strip() == "",
              "wush %s: exit %d, stderr %r" % (" ".join(args), p.returncode, p.stderr[-200:]))

    print("cli_eval: %d failures" % len(FAILED))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
