#!/usr/bin/env python3
"""One W4A4 layer (QuantizedLinear, libwush's CPU runtime) against torch's bfloat16 nn.Linear of
the same shape, each timed alone and right after a torch bfloat16 matmul: the second pair shows
what torch's OpenMP workers, still spinning after their operation, take from the library's work
pool (libgomp spins GOMP_SPINCOUNT times before it sleeps). The layer runs on torch's OpenMP team
(wush.torch's default on a torch built with OpenMP) and, for comparison in the same run, on the
library's own pool (openmp_team=False). Medians of --reps calls, microseconds.

  python3 bench/bench_python_layer_after_torch.py --library build/dev/capi/libwush.so
"""
import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))


def median_us(fn, reps):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", help="libwush.so to load (else the package's or WUSH_LIBRARY's)")
    p.add_argument("--d-in", type=int, default=1024)
    p.add_argument("--d-out", type=int, default=2816)
    p.add_argument("--m", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=200)
    a = p.parse_args()
    if a.library:
        os.environ["WUSH_LIBRARY"] = a.library
    import torch
    import wush
    import wush.torch as wt
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, a.d_in, generator=g)
    w = torch.randn(a.d_out, a.d_in, generator=g) / a.d_in ** 0.5
    with wush.Calibrator(a.d_in, 32, "block_diagonal") as cal:
        cal.add(x.numpy())
        t, q = wush.layer_quantize(cal, w.numpy(), "wush", "mxfp4", "rtn")
    ours = wt.QuantizedLinear(t, q, None)  # wush.torch's CPU context: torch's OpenMP team when torch runs OpenMP
    own = wt.QuantizedLinear(t, q, None, wush.Context("cpu", openmp_team=False))  # the library's own pool
    theirs = torch.nn.Linear(a.d_in, a.d_out, bias=False).to(torch.bfloat16)
    xb = torch.randn(a.m, a.d_in).bfloat16()
    big, wb = torch.randn(512, 1024).bfloat16(), torch.randn(1024, 1024).bfloat16()
    with torch.no_grad():
        before = median_us(lambda: big @ wb, a.reps)
        r = {"torch_bf16": median_us(lambda: theirs(xb), a.reps), "wush": median_us(lambda: ours(xb), a.reps),
             "torch_bf16_after_op": median_us(lambda: (big @ wb, theirs(xb)), a.reps) - before,
             "wush_after_op": median_us(lambda: (big @ wb, ours(xb)), a.reps) - before,
             "wush_own_pool": median_us(lambda: own(xb), a.reps),
             "wush_own_pool_after_op": median_us(lambda: (big @ wb, own(xb)), a.reps) - before}
    print(f"m={a.m} {a.d_out}x{a.d_in}, GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT', 'default')}: "
          f"alone: torch bf16 {r['torch_bf16']:.0f} us, wush {r['wush']:.0f} us "
          f"(ratio {r['torch_bf16'] / r['wush']:.2f}); right after a torch op: torch bf16 "
          f"{r['torch_bf16_after_op']:.0f} us, wush {r['wush_after_op']:.0f} us "
          f"(ratio {r['torch_bf16_after_op'] / r['wush_after_op']:.2f}); the library's own pool instead of "
          f"torch's OpenMP team: alone {r['wush_own_pool']:.0f} us, after a torch op "
          f"{r['wush_own_pool_after_op']:.0f} us")


if __name__ == "__main__":
    main()
