#!/usr/bin/env python3
"""The Python host's share of one QuantizedLinear call at m = 1 (a decode step): the layer's
forward against the bare library call for the same prepared layer (``wush_linear_run`` through
ctypes, every argument built once, the output and workspace preallocated: the floor), in the same
run. Blocks of --calls calls of each alternate (so a busy machine's noise falls on both), --blocks
times; per call, microseconds: the median and min over the blocks of forward, floor and their
difference (the host share). SmolLM2-135M's layer shapes by default, MXFP4 WUSH, no bias (as
SmolLM2's linears), x of shape (1, 1, d_in) in float32 and bfloat16.

  python3 bench/bench_python_layer_call.py --library build/dev/capi/libwush.so

--package DIR imports wush from DIR instead of this checkout's python/ (an older copy, to compare).
"""
import argparse
import ctypes
import os
import pathlib
import statistics
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", help="libwush.so to load (else the package's or WUSH_LIBRARY's)")
    p.add_argument("--package", help="directory to import wush from (default: this checkout's python/)")
    p.add_argument("--shapes", default="576x576,576x192,576x1536,1536x576", help="d_in x d_out, comma-separated")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--bias", action="store_true", help="layers with a bias (wush_linear_run_bias as the floor)")
    p.add_argument("--threads", type=int, default=1, help="torch's and the layer's threads")
    p.add_argument("--calls", type=int, default=1000, help="calls per timed block")
    p.add_argument("--blocks", type=int, default=20, help="timed blocks of each, alternating")
    a = p.parse_args()
    if a.library:
        os.environ["WUSH_LIBRARY"] = a.library
    sys.path.insert(0, a.package or str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import torch
    import wush
    import wush.torch as wt
    from wush import _ffi
    torch.set_num_threads(a.threads)
    lib = _ffi.lib()
    print(f"wush from {os.path.dirname(wush.__file__)}, library {_ffi.library_path}, torch {torch.__version__}, "
          f"{a.threads} thread(s), {a.blocks} blocks x {a.calls} calls, bias={a.bias}")
    print(f"{'shape':>10} {'dtype':>8} | {'forward us':>17} | {'floor us':>17} | {'host share us':>17}")
    print(f"{'':>10} {'':>8} | {'median':>8} {'min':>8} | {'median':>8} {'min':>8} | {'median':>8} {'min':>8}")
    g = torch.Generator().manual_seed(0)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    wdt = {torch.float32: int(wush.DType.F32), torch.bfloat16: int(wush.DType.BF16)}
    for shape in a.shapes.split(","):
        d_in, d_out = (int(v) for v in shape.split("x"))
        calib = torch.randn(256, d_in, generator=g)
        w = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
        with wush.Calibrator(d_in, 32, "block_diagonal") as cal:
            cal.add(calib.numpy())
            t, q = wush.layer_quantize(cal, w.numpy(), "wush", "mxfp4", "rtn")
        bias = torch.randn(d_out, generator=g) if a.bias else None
        layer = wt.QuantizedLinear(t, q, bias, wt.cpu_context(a.threads))
        rt = layer.runtime
        for name in a.dtypes.split(","):
            dtype = dt[name]
            x = torch.randn(1, 1, d_in, generator=g).to(dtype)
            y = torch.empty(1, d_out, dtype=dtype)
            ws = torch.empty(max(rt.workspace_size(1), 1), dtype=torch.uint8)
            # The floor: a function pointer without argtypes, every argument a prebuilt ctypes object.
            vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
            if bias is None:
                fn = lib["wush_linear_run"]
                args = (rt.ctx.ptr, rt.ptr, ci(wdt[dtype]), vp(x.data_ptr()), sz(1), ci(wdt[dtype]),
                        vp(y.data_ptr()), sz(d_out), vp(ws.data_ptr()), sz(ws.numel()))
            else:
                b = layer.bias.detach()
                fn = lib["wush_linear_run_bias"]
                args = (rt.ctx.ptr, rt.ptr, ci(wdt[dtype]), vp(x.data_ptr()), sz(1), ci(wdt[b.dtype]),
                        vp(b.data_ptr()), sz(d_out), ci(wdt[dtype]), vp(y.data_ptr()), sz(d_out),
                        vp(ws.data_ptr()), sz(ws.numel()))
            fn.restype = ctypes.c_int
            with torch.no_grad():
                ref = layer(x)
                if fn(*args) != 0:
                    raise SystemExit(f"floor call failed: {lib.wush_last_error()}")
                if not torch.equal(ref.reshape(1, d_out), y):
                    raise SystemExit(f"{shape} {name}: forward and the bare call disagree")
                fwd, flo = [], []
                calls = range(a.calls)
                for _ in range(3):  # warm-up
                    for _ in calls:
                        layer(x)
                        fn(*args)
                for _ in range(a.blocks):
                    t0 = time.perf_counter()
                    for _ in calls:
                        layer(x)
                    t1 = time.perf_counter()
                    for _ in calls:
                        fn(*args)
                    t2 = time.perf_counter()
                    fwd.append((t1 - t0) / a.calls * 1e6)
                    flo.append((t2 - t1) / a.calls * 1e6)
            diff = [f - b for f, b in zip(fwd, flo)]
            print(f"{shape:>10} {name:>8} | {statistics.median(fwd):8.2f} {min(fwd):8.2f} | "
                  f"{statistics.median(flo):8.2f} {min(flo):8.2f} | {statistics.median(diff):8.2f} "
                  f"{min(fwd) - min(flo):8.2f}", flush=True)


if __name__ == "__main__":
    main()
