#!/usr/bin/env python3
"""results.json and verdict.json of `scripts/device-check.sh --prebuilt` (issue #58, item 6).

Reads the stage table (name, status, exit status, seconds, limit; one tab-separated line each),
the accumulator probe's line, and the JSON of the one `wush bench --device cuda --variants` process
(rows tagged with their variant and repetition, each with the median, min and max of its samples).

results.json: the device, the commit, the stages, the probe, every bench row as measured, and the
ncu evidence of which kernel ran (profiled or not).
verdict.json: per opt-in, whether its GPU tests passed; per measured shape its time against the
default variant (median ratio, and the ratio's range from the samples' spread), against cuBLAS
BF16 and against the target; and whether it should become the default by the promotion rules:
  stream_decode  the default for m <= 32 if >= 1.2x the decode path on every measured shape beyond
                 the spread (the default's fastest sample over the opt-in's slowest) and racecheck
                 is clean (and its tests pass);
  tc_quantize    the default for m >= 17 with BF16/F16 input if the probe passes on that card and
                 it is >= 1.5x the CUDA-core kernel beyond the spread on every shape from m = 128;
  bf16_prefill   the default only where it beats the reference path beyond the spread ("where").
Without a device every row says "no device". Exit status 1 when the inputs are unreadable.
Usage: device_verdict.py --stages F --probe F --bench F [--ncu F] --device NAME --commit C --results F --verdict F
       device_verdict.py --self-test    (the promotion rules on made-up rows)
"""
import argparse
import json
import os
import re
import statistics
import sys

NO_DEVICE = "no device"
OPT_INS = ("stream_decode", "tc_quantize", "bf16_prefill")
VARIANT_OF = {"stream_decode": "stream_decode=1", "tc_quantize": "tc_quantize=1", "bf16_prefill": "bf16_prefill=1"}
TEST_STAGE = {"stream_decode": "optin-stream-decode", "tc_quantize": "optin-tc-quantize",
              "bf16_prefill": "optin-bf16-prefill"}
# The kernel each opt-in puts in place (wush_linear_last_kernels' names): a row of the variant
# whose kernels lack it did not run the opt-in at that shape.
KERNEL_OF = {"stream_decode": "gemm.stream_decode", "tc_quantize": "quantize.tensor_core",
             "bf16_prefill": "gemm.bf16_prefill"}
RULES = {
    "stream_decode": "default for m <= 32 if >= 1.2x the decode path on every measured shape beyond the spread "
                     "(default's min / opt-in's max; GEMM-only rows where measured), its tests pass and racecheck "
                     "is clean",
    "tc_quantize": "default for m >= 17 (BF16/F16 input) if the probe passes on this card, its tests pass and it is "
                   ">= 1.5x the CUDA-core kernel beyond the spread on every measured shape from m = 128",
    "bf16_prefill": "default only on the shapes where it beats the reference path beyond the spread, its tests "
                    "passing",
}


def targets(kind, m):
    """The targets of docs/PERFORMANCE.md (issue #32): forward against cuBLAS BF16 (x), quantize
    as a fraction of a device-to-device copy's time."""
    if kind == "forward":
        return {1: 3.0, 16: 2.5, 4096: 1 / 1.1}.get(m)
    if kind == "quantize" and m == 4096:
        return 0.6
    return None


def read_stages(path):
    stages = []
    with open(path) as f:
        for line in f:
            name, status, rc, seconds, limit = line.rstrip("\n").split("\t")
            stages.append({"stage": name, "status": status, "rc": int(rc) if rc else None,
                           "seconds": int(seconds), "limit_s": int(limit)})
    return stages


def read_probe(path):
    line = open(path).read().strip() if os.path.exists(path) else ""
    if not line:
        return {"result": "not run", "line": ""}
    return {"result": "pass" if line.endswith("PASS") else "fail", "line": line}


def read_ncu(path):
    """Which kernel each ncu run profiled: its '---- ncu:' header and whether a kernel followed."""
    runs, cur = [], None
    if not os.path.exists(path):
        return runs
    for line in open(path, errors="replace"):
        m = re.match(r"---- ncu: variant (\S+), m = (\d+), kernel (\S+)", line)
        if m:
            cur = {"variant": m.group(1), "m": int(m.group(2)), "kernel": m.group(3), "profiled": False, "names": []}
            runs.append(cur)
        elif cur is not None:
            # A profiled launch's header: "  name<...>(args) (gx, gy, gz)x(bx, by, bz), Context ...".
            if re.search(r"\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line):
                cur["profiled"] = True
                cur["names"].append(re.split(r"[<(]", line.strip(), maxsplit=1)[0].split("::")[-1])
    return runs


def agg(rows, prefix):
    """Median of the repetitions' medians; min and max over every sample of every repetition."""
    med = [r.get(f"{prefix}_graph_us") for r in rows]
    med = [v for v in med if isinstance(v, (int, float))]
    if not med:
        return None
    lo = [r.get(f"{prefix}_graph_min_us", r.get(f"{prefix}_graph_us")) for r in rows]
    hi = [r.get(f"{prefix}_graph_max_us", r.get(f"{prefix}_graph_us")) for r in rows]
    return {"median_us": statistics.median(med), "min_us": min(v for v in lo if v is not None),
            "max_us": max(v for v in hi if v is not None), "repetitions": len(med)}


def group(bench_rows):
    g = {}
    for r in bench_rows:
        key = (r["kind"], r["layer"], r["format"], r["m"], r["baseline"], r.get("variant", "default"))
        g.setdefault(key, []).append(r)
    return g


def kernels(rows):
    """The kernels the rows report (wush_linear_last_kernels), each name once, in order."""
    seen = []
    for r in rows:
        for k in (r.get("kernels") or "").split():
            if k not in seen:
                seen.append(k)
    return seen


def compare(g, kind, baseline, variant, keep, kernel=None):
    """Per shape of `kind`: the variant against the default (both from the same process), with
    the kernels each ran; `kernel`: the opt-in's, whose absence from the variant's rows is "ran":
    false."""
    out = []
    for (k, layer, fmt, m, base, var), rows in sorted(g.items(), key=lambda kv: kv[0][:4]):
        if k != kind or base != baseline or var != variant or not keep(fmt, m):
            continue
        d_rows = g.get((k, layer, fmt, m, base, "default"))
        ours, dflt = agg(rows, "ours"), agg(d_rows or [], "ours")
        theirs = agg(rows, "baseline")
        if ours is None or dflt is None:
            continue
        row = {"kind": kind, "layer": layer, "format": fmt, "m": m, "opt_in": ours, "default": dflt,
               "speedup": dflt["median_us"] / ours["median_us"],
               "speedup_range": [dflt["min_us"] / ours["max_us"], dflt["max_us"] / ours["min_us"]],
               "kernels": kernels(rows), "default_kernels": kernels(d_rows)}
        if kernel is not None:
            row["ran"] = kernel in row["kernels"]
        if theirs is not None:
            x = theirs["median_us"] / ours["median_us"]
            row["against_" + baseline] = x
            if kind == "quantize":
                # GB/s against the copy's GB/s: the quantize moves x, codes and scales, the copy 2 x.
                gb = [(r.get("ours_gbps"), r.get("baseline_gbps")) for r in rows]
                gb = [o / b for o, b in gb if isinstance(o, (int, float)) and isinstance(b, (int, float)) and b > 0]
                row["copy_bandwidth_fraction"] = statistics.median(gb) if gb else None
                x = row["copy_bandwidth_fraction"]
            t = targets(kind, m)
            if t is not None and x is not None:
                row["target"] = {"value": t, "met": x >= t,
                                 "measure": "x cuBLAS BF16" if kind == "forward" else "fraction of copy bandwidth"}
        out.append(row)
    return out


def verdict_row(name, stages, probe, g):
    st = {s["stage"]: s["status"] for s in stages}
    tests = st.get(TEST_STAGE[name], "not run")
    v = {"opt_in": name, "variant": VARIANT_OF[name], "rule": RULES[name], "tests": tests}
    if tests == NO_DEVICE:
        v.update(speed=NO_DEVICE, should_become_default=NO_DEVICE)
        return v
    var, kernel = VARIANT_OF[name], KERNEL_OF[name]
    if name == "stream_decode":
        small = lambda f, m: m <= 32  # noqa: E731
        gemm = compare(g, "gemm", "cublas_bf16", var, small, kernel)
        forward = compare(g, "forward", "cublas_bf16", var, small, kernel)
        shapes = gemm or forward  # the rule reads the GEMM alone where it was timed
        ok = bool(shapes) and all(s["speedup_range"][0] >= 1.2 and s["ran"] for s in shapes)
        v["racecheck"] = st.get("racecheck", "not run")
        v["should_become_default"] = ok and tests == "pass" and v["racecheck"] == "pass"
        if gemm:
            v["forward_speed"] = forward
    elif name == "tc_quantize":
        shapes = compare(g, "quantize", "d2d_copy", var, lambda f, m: m >= 17, kernel)
        big = [s for s in shapes if s["m"] >= 128]
        ok = bool(big) and all(s["speedup_range"][0] >= 1.5 and s["ran"] for s in big)
        v["probe"] = probe["result"]
        v["should_become_default"] = ok and tests == "pass" and probe["result"] == "pass"
    else:
        shapes = compare(g, "forward", "cublas_bf16", var, lambda f, m: m > 32 and f in ("mxfp4", "nvfp4"), kernel)
        where = [{"layer": s["layer"], "format": s["format"], "m": s["m"]}
                 for s in shapes if s["speedup_range"][0] > 1.0 and s["ran"]]
        v["where"] = where
        v["should_become_default"] = bool(where) and tests == "pass"
    v["speed"] = shapes if shapes else "not measured"
    v["not_run_at"] = [{"layer": s["layer"], "format": s["format"], "m": s["m"], "kind": s["kind"]}
                       for s in shapes if not s["ran"]]
    if not shapes:
        v["should_become_default"] = False
    return v


def self_test():
    """The promotion rules on made-up rows: each rule must say yes and no where it should."""
    ran = {"default": "", "stream_decode=1": "gemm.stream_decode", "tc_quantize=1": "quantize.tensor_core",
           "bf16_prefill=1": "gemm.bf16_prefill"}

    def row(kind, m, variant, ours, spread, base, rep, fmt="mxfp4", layer="4096x4096"):
        return {"kind": kind, "layer": layer, "format": fmt, "m": m, "variant": variant, "repeat": rep,
                "baseline": "d2d_copy" if kind == "quantize" else "cublas_bf16",
                "kernels": "quantize.small_m " + (ran[variant] or "gemm.decode"),
                "ours_graph_us": ours, "ours_graph_min_us": ours * (1 - spread),
                "ours_graph_max_us": ours * (1 + spread), "baseline_graph_us": base,
                "baseline_graph_min_us": base, "baseline_graph_max_us": base,
                "ours_gbps": 50.0 if kind == "quantize" else None, "baseline_gbps": 100.0 if kind == "quantize" else None}
    rows = []
    for rep in (0, 1):
        for m in (1, 16, 32):
            rows.append(row("forward", m, "default", 10.0, 0.02, 9.0, rep))
            rows.append(row("forward", m, "stream_decode=1", 7.5, 0.02, 9.0, rep))   # 1.33x, beyond the spread
            rows.append(row("gemm", m, "default", 8.0, 0.02, 9.0, rep))
            rows.append(row("gemm", m, "stream_decode=1", 5.5, 0.02, 9.0, rep))      # 1.45x
        for m in (17, 128, 4096):
            rows.append(row("quantize", m, "default", 10.0, 0.02, 5.0, rep))
            rows.append(row("quantize", m, "tc_quantize=1", 7.0, 0.02, 5.0, rep))     # 1.43x: under 1.5x
        rows.append(row("forward", 4096, "default", 100.0, 0.01, 80.0, rep))
        rows.append(row("forward", 4096, "bf16_prefill=1", 90.0, 0.01, 80.0, rep))    # beats the reference
        rows.append(row("forward", 128, "default", 20.0, 0.01, 15.0, rep))
        rows.append(row("forward", 128, "bf16_prefill=1", 20.5, 0.01, 15.0, rep))     # does not
    g = group(rows)
    passed = [{"stage": s, "status": "pass"} for s in TEST_STAGE.values()] + [{"stage": "racecheck", "status": "pass"}]
    probe = {"result": "pass"}
    bad = []
    v = {n: verdict_row(n, passed, probe, g) for n in OPT_INS}
    if v["stream_decode"]["should_become_default"] is not True:
        bad.append("stream decode 1.33x beyond the spread, tests and racecheck clean: not promoted")
    if v["tc_quantize"]["should_become_default"] is not False:
        bad.append("tensor-core quantize at 1.43x: promoted")
    if v["bf16_prefill"]["where"] != [{"layer": "4096x4096", "format": "mxfp4", "m": 4096}]:
        bad.append(f"BF16 prefill where = {v['bf16_prefill']['where']}")
    racy = [s if s["stage"] != "racecheck" else {"stage": "racecheck", "status": "fail"} for s in passed]
    if verdict_row("stream_decode", racy, probe, g)["should_become_default"] is not False:
        bad.append("stream decode promoted with racecheck failing")
    wide = [dict(r, ours_graph_max_us=r["ours_graph_us"] * 1.5) if r["variant"] == "stream_decode=1" else r
            for r in rows]
    if verdict_row("stream_decode", passed, probe, group(wide))["should_become_default"] is not False:
        bad.append("stream decode promoted inside the spread")
    fast_tc = [dict(r, ours_graph_us=5.0, ours_graph_min_us=4.9, ours_graph_max_us=5.1)
               if r["variant"] == "tc_quantize=1" else r for r in rows]
    if verdict_row("tc_quantize", passed, probe, group(fast_tc))["should_become_default"] is not True:
        bad.append("tensor-core quantize at 2x: not promoted")
    if verdict_row("tc_quantize", passed, {"result": "fail"}, group(fast_tc))["should_become_default"] is not False:
        bad.append("tensor-core quantize promoted with the probe failing")
    # The variant's rows say the decode kernel ran: not promoted, and the shapes are listed.
    unrun = [dict(r, kernels="quantize.small_m gemm.decode") if r["variant"] == "stream_decode=1" and r["m"] == 16
             else r for r in rows]
    vu = verdict_row("stream_decode", passed, probe, group(unrun))
    if vu["should_become_default"] is not False or [u["m"] for u in vu["not_run_at"]] != [16]:
        bad.append(f"stream decode promoted where it did not run: {vu['not_run_at']}")
    # The rule reads the GEMM-only rows: a GEMM under 1.2x blocks the promotion whatever the forward.
    slow = [dict(r, ours_graph_us=7.5, ours_graph_min_us=7.4, ours_graph_max_us=7.6)
            if r["variant"] == "stream_decode=1" and r["kind"] == "gemm" else r for r in rows]
    if verdict_row("stream_decode", passed, probe, group(slow))["should_become_default"] is not False:
        bad.append("stream decode promoted on its forward rows with its GEMM at 1.07x")
    s = v["stream_decode"]["forward_speed"][0]
    if abs(s["speedup"] - 10.0 / 7.5) > 1e-9 or abs(s["against_cublas_bf16"] - 9.0 / 7.5) > 1e-9:
        bad.append(f"stream decode speed row {s}")
    if s["kernels"] != ["quantize.small_m", "gemm.stream_decode"] or s["default_kernels"][1] != "gemm.decode":
        bad.append(f"stream decode kernels {s['kernels']} / {s['default_kernels']}")
    if s["target"] != {"value": 3.0, "met": False, "measure": "x cuBLAS BF16"}:
        bad.append(f"m = 1 target {s.get('target')}")
    q = [r for r in v["tc_quantize"]["speed"] if r["m"] == 4096][0]
    if q["copy_bandwidth_fraction"] != 0.5 or q["target"] != {"value": 0.6, "met": False,
                                                              "measure": "fraction of copy bandwidth"}:
        bad.append(f"quantize m = 4096: copy bandwidth fraction {q.get('copy_bandwidth_fraction')}, {q.get('target')}")
    for b in bad:
        print("self-test FAIL:", b)
    print(f"device_verdict self-test: {len(bad)} failures")
    return 1 if bad else 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    p = argparse.ArgumentParser()
    for a in ("--stages", "--probe", "--bench", "--results", "--verdict"):
        p.add_argument(a, required=True)
    p.add_argument("--device", default="")
    p.add_argument("--commit", default="")
    p.add_argument("--ncu", default="")
    args = p.parse_args()
    stages = read_stages(args.stages)
    probe = read_probe(args.probe)
    device = args.device or NO_DEVICE
    bench, bench_error = None, None
    if os.path.exists(args.bench) and os.path.getsize(args.bench) > 0:
        try:
            bench = json.load(open(args.bench))
        except ValueError as e:
            bench_error = f"unreadable: {e}"
    st = {s["stage"]: s["status"] for s in stages}
    if args.device == "":
        probe = {"result": NO_DEVICE, "line": ""}
    rows = bench.get("results", []) if bench else []
    results = {"device": device, "commit": args.commit, "stages": stages, "probe": probe,
               "bench": {k: v for k, v in bench.items() if k != "results"} if bench else None,
               "bench_stage": st.get("bench", "not run"), "bench_error": bench_error, "rows": rows,
               "ncu": read_ncu(args.ncu) if args.ncu else [],
               "kernels_note": "rows carry the variant and the kernels that ran (wush_linear_last_kernels after "
                               "the row's calls); the ncu entries profile one launch of each new kernel"}
    g = group(rows)
    opt_ins = [verdict_row(n, stages, probe, g) for n in OPT_INS]
    all_on = {"opt_in": "all", "variant": "all", "tests": NO_DEVICE if args.device == "" else "see the opt-ins",
              "should_become_default": NO_DEVICE if args.device == "" else "n/a"}
    if args.device:
        all_on["speed"] = (compare(g, "forward", "cublas_bf16", "all", lambda f, m: True)
                           + compare(g, "gemm", "cublas_bf16", "all", lambda f, m: True)
                           + compare(g, "quantize", "d2d_copy", "all", lambda f, m: True)) or "not measured"
    else:
        all_on["speed"] = NO_DEVICE
    failed = [s["stage"] for s in stages if s["status"] in ("fail", "timeout")]
    verdict = {"device": device, "commit": args.commit, "stages_failed": failed, "rows": opt_ins + [all_on]}
    json.dump(results, open(args.results, "w"), indent=1)
    json.dump(verdict, open(args.verdict, "w"), indent=1)
    for v in verdict["rows"]:
        print(f"verdict: {v['opt_in']}: tests {v['tests']}, should become default: {v['should_become_default']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
