#!/usr/bin/env python3
"""The Python flow on a GPU (issue 30): QuantizedLinear and wush.load_quantized(device="cuda")
through libwush's CUDA backend. Exits 77 (skipped, never passed) without a CUDA device in torch or
without the library's CUDA backend (the module libwush-cuda.so beside libwush.so).

- A layer prepared on a CUDA context gives, for F32, BF16 and F16 CUDA tensors, what the same
  layer prepared on the CPU context gives for the same values (the codes are the CPU's bytes on
  both; only the float32 accumulation order differs: relative error under 1e-5, plus the output
  dtype's rounding), with the bias, on torch's default stream, on another stream, and replayed
  from a torch CUDA graph (replay equal to eager, bit for bit).
- A tiny Llama quantized by `quantize-model`, loaded with device="cuda", gives the logits of the
  same folder loaded on the CPU (relative error under 1e-4 over the whole model) and generates.

    test_python_cuda.py [--library PATH_TO_LIBWUSH]
"""
import contextlib
import io
import os
import shutil
import sys
import tempfile

import script_setup

script_setup.setup()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import torch  # noqa: E402
except ImportError:
    print("SKIPPED: no torch in this interpreter")
    sys.exit(77)

import wush  # noqa: E402
import wush.torch as wt  # noqa: E402

SKIP = 77
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def cuda_context():
    if not torch.cuda.is_available():
        print("SKIPPED: torch sees no CUDA device")
        sys.exit(SKIP)
    try:
        return wush.Context("cuda", torch.cuda.current_device())
    except wush.WushError as e:
        print(f"SKIPPED: libwush has no usable CUDA backend here: {e}")
        sys.exit(SKIP)


def layer_pair(ctx, fmt, d_in=256, d_out=192):
    """The same WUSH layer (with a bias) prepared on the CPU and on `ctx`."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, d_in, generator=g)
    w = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
    bias = torch.randn(d_out, generator=g)
    with wush.Calibrator(d_in, wush.format_group_size(fmt), "block_diagonal") as cal:
        cal.add(x.numpy())
        t, q = wush.layer_quantize(cal, w.numpy(), "wush", fmt, "rtn")
    return wt.QuantizedLinear(t, q, bias), wt.QuantizedLinear(t, q, bias, ctx)


def check_layers(ctx):
    for fmt in ("mxfp4", "nvfp4", "int4"):
        cpu, gpu = layer_pair(ctx, fmt)
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 8e-3), (torch.float16, 1e-3)):
            for m in (1, 17, 300):
                x = torch.randn(m, cpu.in_features).to(dtype)
                want = cpu(x)
                got = gpu(x.cuda())
                check(got.is_cuda and got.dtype == dtype and got.shape == want.shape,
                      f"{fmt} {dtype} m={m}: a CUDA tensor of the input's dtype and shape")
                err = rel(got, want)
                check(err < tol, f"{fmt} {dtype} m={m}: CUDA vs CPU layer, relative error {err:.2e} < {tol}")
        # Another stream: the library enqueues on torch's current stream.
        x = torch.randn(64, cpu.in_features).cuda()
        eager = gpu(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            on_s = gpu(x)
        torch.cuda.current_stream().wait_stream(s)
        check(torch.equal(on_s, eager), f"{fmt}: on another stream, the same output")
        # A torch CUDA graph: captured once, replayed on new input, equal to eager bit for bit.
        static_x = torch.zeros_like(x)
        gpu(static_x)  # warm-up (workspace sized) before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = gpu(static_x)
        x2 = torch.randn_like(x)
        static_x.copy_(x2)
        graph.replay()
        torch.cuda.synchronize()
        check(torch.equal(static_y, gpu(x2)), f"{fmt}: CUDA graph replay equals eager")


def check_model():
    from tiny_model import make_text, make_tiny_llama
    from wush.__main__ import main as cli
    tmp = tempfile.mkdtemp(prefix="wush-pycuda-")
    try:
        tiny = make_tiny_llama(os.path.join(tmp, "tiny"), train_steps=50)
        calib = os.path.join(tmp, "calib.txt")
        with open(calib, "w") as f:
            f.write(make_text(3000, 1))
        out = os.path.join(tmp, "q")
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = cli(["quantize-model", tiny, "--calib", calib, "--out", out, "--seq-len", "64", "--max-samples", "8"])
        check(rc == 0, f"quantize-model: exit {rc} {err.getvalue()[-300:]}")
        if rc != 0:
            return
        ids = torch.randint(3, 300, (2, 40))
        with torch.no_grad():
            cpu_logits = wush.load_quantized(out)(ids).logits
            model = wush.load_quantized(out, device="cuda")
            n_cuda = sum(isinstance(m, wt.QuantizedLinear) and m._cuda for m in model.modules())
            check(n_cuda > 0, f"load_quantized(device='cuda'): {n_cuda} quantized layers on the CUDA context")
            gpu_logits = model(ids.cuda()).logits
            err = rel(gpu_logits, cpu_logits)
            check(gpu_logits.is_cuda and err < 1e-4, f"tiny Llama on CUDA vs CPU: logits relative error {err:.2e}")
            gen = model.generate(ids[:1, :8].cuda(), max_new_tokens=6, do_sample=False, pad_token_id=0)
            check(gen.shape[1] == 14, f"generate() on CUDA: {gen.shape[1] - 8} new tokens")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    torch.manual_seed(0)
    ctx = cuda_context()
    print(f"device: {torch.cuda.get_device_name()}")
    check_layers(ctx)
    check_model()
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
