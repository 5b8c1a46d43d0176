#!/usr/bin/env python3
"""Faithful: the runtime's quantized model is the checkpoint's model (issue 57, item 4).

The tiny Llama (tests/python/tiny_model.py) is quantized by `python -m wush quantize-model`
(RTN, WUSH transform; MXFP4, NVFP4 and MXFP4_OCP) and loaded with `wush.load_quantized`: every
quantized layer then runs the library's W4A4 forward. Beside it, a float64 simulation of the same
folder is built without the library:

- every tensor of the folder that is not a quantized layer is loaded into the model class, which
  then runs in float64 torch (embeddings, norms, attention, LM head);
- each quantized linear layer becomes a float64 module reading the checkpoint's tensors with the
  safetensors package and decoding them by the documented rules, written here independently of
  the library and of interop_common: E2M1 nibbles (docs/BLOCK_FORMATS.md), E8M0 / E4M3 scales,
  the stored per-tensor factor (docs/CHECKPOINT.md);
- its forward is docs/RUNTIME.md's `Y = sum_b q(T_w,b W_b)^T q(T_b X_b)`: the stored codes are
  already the transformed weights (docs/CHECKPOINT.md, "What the codes encode"); each token's
  block slice `x_b` becomes `T_b x_b` in float64 and is quantized by the format's scale rule
  (docs/BLOCK_FORMATS.md) with a float64 numpy reference of round-to-nearest-even written here
  (midpoint search for E2M1, exponent arithmetic for E4M3; not `wush._core.quantize_rows`), and
  the product is float64.

On held-out windows the mean per-token KL(sim || runtime) must be below RATIO x KL(FP || runtime)
(FP: the float model before quantization), and KL(FP || runtime) clearly non-zero. What remains
between sim and runtime is float32 arithmetic in the runtime model (torch's layers, the GEMM's
float32 group sums) and the odd activation code it flips; quantization itself is the same.

It can fail: the same folder with every layer's stored transform replaced by the identity (codes
kept, digests rewritten: a valid checkpoint whose runtime skips the activation transform) is
loaded the same way, and its KL to the simulation must not pass the check; nor may the
simulation without activation quantization (W4A16) pass it against the runtime. A check of the
convention the simulation relies on: dequantized codes times T_b give back the float weights up
to 4-bit rounding, far better than the codes alone. Needs torch, transformers, safetensors
(the torch venv). Exit 1 on failure.
"""
import atexit
import hashlib
import os
import shutil
import tempfile
import time
import unittest

import script_setup

script_setup.setup()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import wush  # noqa: E402
from wush.__main__ import token_batches  # noqa: E402
from cli_run import cli_run  # noqa: E402
from tiny_model import make_text, make_tiny_llama  # noqa: E402

torch.set_num_threads(2)
TMP = tempfile.mkdtemp(prefix="wush-faithful-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
MODEL = make_tiny_llama(os.path.join(TMP, "tiny"))
CALIB, HELD = os.path.join(TMP, "calib.txt"), os.path.join(TMP, "held.txt")
open(CALIB, "w").write(make_text(6000, 1))
open(HELD, "w").write(make_text(3000, 2))
CHECKPOINT = "wush_checkpoint.safetensors"
# KL(sim || runtime) must be below RATIO x KL(FP || runtime). Measured here (2-core x86-64, AVX-512)
# the ratio is 3e-11 for MXFP4 and MXFP4_OCP (KL at the level of float32 rounding) and 1.5e-6 for
# NVFP4 (presumably the odd activation code near a boundary, flipped by float32 upstream). 1e-3
# leaves a margin of about 700x for other CPUs' and torch builds' float32 summation orders and is
# 100x stricter than the 0.1. A simulation without activation quantization lands at about
# 0.6, transform entries perturbed by a relative 1e-3 at about 0.5, the identity-transform
# mutation above 1000.
RATIO = 1e-3

# ---- the block formats, float64, from docs/BLOCK_FORMATS.md --------------------------------------

GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # E2M1 magnitudes by index (bits 0-2)
MIDPOINTS = (GRID[1:] + GRID[:-1]) / 2
GROUP = {"mxfp4": 32, "nvfp4": 16, "mxfp4_ocp": 32}
INV_FACTOR = {"mxfp4": 3.0, "nvfp4": 10.0, "mxfp4_ocp": 1.0}  # 1 / the per-tensor factor


def rne_e2m1(v):
    """The E2M1 value nearest to v (float64), ties to the even index, saturating at 6."""
    a = np.minimum(np.abs(v), 6.0)
    i = np.searchsorted(MIDPOINTS, a, side="left")  # midpoints strictly below a
    tie = (i < len(MIDPOINTS)) & (a == MIDPOINTS[np.minimum(i, len(MIDPOINTS) - 1)])
    i = np.where(tie & (i % 2 == 1), i + 1, i)  # a tie sits between i and i + 1: the even one
    return np.copysign(GRID[i], v)


def rne_e4m3(v):
    """The OCP E4M3 value nearest to v >= 0 (3 mantissa bits, exponents >= -6, subnormals below),
    ties to even, saturating at 448."""
    _, ex = np.frexp(np.where(v > 0, v, 1.0))
    quantum = np.exp2(np.maximum(ex - 1, -6) - 3)
    return np.minimum(np.round(v / quantum) * quantum, 448.0)  # np.round: half to even


def floor_log2(a):
    _, ex = np.frexp(np.where(a > 0, a, 1.0))  # a = m 2^ex, 0.5 <= m < 1
    return ex - 1


def fake_quantize(fmt, x):
    """Rows of x (n, d_in), float64: each group quantized by fmt's scale rule and decoded again
    (element x group scale x per-tensor factor), all in float64."""
    g = GROUP[fmt]
    xg = x.reshape(x.shape[0], -1, g)
    amax = np.abs(xg).max(axis=-1, keepdims=True)
    if fmt in ("mxfp4", "mxfp4_ocp"):
        e = np.clip(floor_log2(amax) - (2 if fmt == "mxfp4_ocp" else 0), -127, 127)
        s = np.exp2(e.astype(np.float64))  # the E8M0 group scale
        y = rne_e2m1(xg * INV_FACTOR[fmt] / s) * s / INV_FACTOR[fmt]  # code = RNE(x * 3 / 2^e)
    else:  # nvfp4
        s = rne_e4m3(amax * 10.0 / 6.0)  # the E4M3 group scale
        safe = np.where(s > 0, s, 1.0)
        y = np.where(s > 0, rne_e2m1(xg * 10.0 / safe) * s / 10.0, 0.0)  # code = RNE(x * 10 / s)
    return np.where(amax > 0, y, 0.0).reshape(x.shape)


def decode_weights(fmt, codes, scales, tensor_scale):
    """The stored (d_out, d_in/2) nibbles and (d_out, d_in/G) scale bytes -> float64 values."""
    g = GROUP[fmt]
    nib = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(codes.shape[0], -1).astype(np.int64)
    elem = np.where(nib & 8, -1.0, 1.0) * GRID[nib & 7]
    b = scales.astype(np.int64)
    if fmt == "nvfp4":
        e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
        s = np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * np.exp2(e - 7.0))
        s = np.where(b & 0x80, -s, s)
        assert not np.any((b & 0x7F) == 0x7F), "NaN scale"
    else:
        assert not np.any(b == 255), "NaN scale"
        s = np.exp2(b - 127.0)
    return (elem.reshape(codes.shape[0], -1, g) * s[..., None] * float(tensor_scale)).reshape(elem.shape)


# ---- the simulated model -------------------------------------------------------------------------

def read_checkpoint(folder):
    path = os.path.join(folder, CHECKPOINT)
    with safe_open(path, "np") as f:
        meta = f.metadata()
    return load_file(path), meta


def layer_names(meta):
    return sorted(k[:-len(".format")] for k in meta if k.endswith(".format"))


class SimLinear(torch.nn.Module):
    """One checkpoint layer in float64: y = fake_quantize(T_b x_b) . decode(codes)^T (+ bias)."""

    def __init__(self, tensors, meta, name, bias, quantize_activations=True):
        super().__init__()
        self.fmt = meta[name + ".format"]
        assert int(meta[name + ".group_size"]) == GROUP[self.fmt], name
        self.t = torch.from_numpy(tensors[name + ".transform"].astype(np.float64))  # (C, G, G)
        self.w = torch.from_numpy(decode_weights(self.fmt, tensors[name + ".codes"], tensors[name + ".scales"],
                                                 tensors[name + ".tensor_scale"][0]))
        self.bias = None if bias is None else bias.detach().double()
        self.quantize_activations = quantize_activations

    def forward(self, x):
        shape = x.shape
        c, g, _ = self.t.shape
        xt = torch.einsum("nbg,bhg->nbh", x.reshape(-1, c, g).double(), self.t).reshape(-1, c * g)  # T_b x_b
        if self.quantize_activations:
            xt = torch.from_numpy(fake_quantize(self.fmt, xt.numpy()))
        y = xt @ self.w.T
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], -1)


def float_model():
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(MODEL, local_files_only=True, torch_dtype=torch.float32).eval()


def simulated_model(folder, quantize_activations=True):
    """The model class with the folder's stored tensors (the quantized layers' stand-ins left out),
    in float64, each checkpoint layer a SimLinear."""
    tensors, meta = read_checkpoint(folder)
    names = layer_names(meta)
    model = float_model()
    stored = {}
    for fn in os.listdir(folder):
        if fn.endswith(".safetensors") and fn != CHECKPOINT:
            stored.update({k: torch.from_numpy(v) for k, v in load_file(os.path.join(folder, fn)).items()})
    stored = {k: v for k, v in stored.items() if k[:-len(".weight")] not in names}
    missing, unexpected = model.load_state_dict(stored, strict=False)
    assert not unexpected, unexpected
    assert sorted(missing) == sorted(n + ".weight" for n in names), missing  # only the quantized weights
    model = model.double()
    for n in names:
        parent, _, child = n.rpartition(".")
        old = model.get_submodule(n)
        setattr(model.get_submodule(parent), child,
                SimLinear(tensors, meta, n, old.bias, quantize_activations=quantize_activations))
    return model


def identity_transform_folder(folder, out):
    """A copy of the folder whose checkpoint stores the identity as every layer's transform (the
    codes, scales and factors unchanged, each digest recomputed): a valid checkpoint on which the
    runtime quantizes the untransformed activations against the transformed weights."""
    shutil.copytree(folder, out)
    tensors, meta = read_checkpoint(folder)
    for n in layer_names(meta):
        c, g, _ = tensors[n + ".transform"].shape
        tensors[n + ".transform"] = np.broadcast_to(np.eye(g, dtype=np.float32), (c, g, g)).copy()
        meta[n + ".transform"] = "identity"
        meta[n + ".sha256"] = hashlib.sha256(b"".join(
            tensors[n + s].tobytes() for s in (".codes", ".scales", ".tensor_scale", ".transform"))).hexdigest()
    save_file(tensors, os.path.join(out, CHECKPOINT), metadata=meta)
    return out


def quantize(fmt):
    out = os.path.join(TMP, f"out-{fmt}")
    rc, _, err = cli_run("quantize-model", MODEL, "--calib", CALIB, "--format", fmt, "--transform", "wush",
                         "--method", "rtn", "--out", out, "--seq-len", "64", "--max-samples", "16")
    assert rc == 0, (fmt, rc, err)
    return out


def log_probs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.double(), dim=-1)


def mean_kl(p_log, q_log):
    """Mean over tokens of KL(P || Q), P and Q given as log-probabilities (float64)."""
    return (p_log.exp() * (p_log - q_log)).sum(-1).mean().item()


class Faithful(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(MODEL, local_files_only=True)
        cls.ids = torch.cat(token_batches(tok, HELD, 64, 4))  # four held-out windows of 64 tokens
        cls.fp = log_probs(float_model().double(), cls.ids)

    def check_format(self, fmt):
        t0 = time.monotonic()
        folder = quantize(fmt)
        runtime = wush.load_quantized(folder)
        tensors, meta = read_checkpoint(folder)
        names = layer_names(meta)
        self.assertEqual(len(names), 2 * 7)  # q, k, v, o, gate, up, down per block
        self.assertEqual(sorted(n for n, m in runtime.named_modules() if type(m).__name__ == "QuantizedLinear"), names)
        # The convention the simulation rests on: the codes hold q(T_b^{-T} w_b), so the decoded
        # row blocks times T_b give back W up to 4-bit rounding; without T_b they do not.
        fm, worst = float_model(), (0.0, np.inf)
        for n in names:
            w = fm.get_submodule(n).weight.detach().double().numpy()
            sim = SimLinear(tensors, meta, n, None)
            c, g, _ = sim.t.shape
            dq = sim.w.numpy().reshape(-1, c, g)
            back = np.einsum("obh,bhg->obg", dq, sim.t.numpy()).reshape(w.shape)
            err, err_plain = (np.linalg.norm(back - w) / np.linalg.norm(w),
                              np.linalg.norm(dq.reshape(w.shape) - w) / np.linalg.norm(w))
            self.assertLess(err, 0.25, f"{fmt} {n}: decoded weights x T vs W: {err:.3f}")
            self.assertLess(err, 0.5 * err_plain, f"{fmt} {n}: {err:.3f} vs {err_plain:.3f} without T")
            worst = (max(worst[0], err), min(worst[1], err_plain))

        rt = log_probs(runtime, self.ids)
        sim = log_probs(simulated_model(folder), self.ids)
        kl_sim, kl_fp = mean_kl(sim, rt), mean_kl(self.fp, rt)
        # The mutation: the same checkpoint with the identity as every activation transform.
        broken = wush.load_quantized(identity_transform_folder(folder, os.path.join(TMP, f"identity-{fmt}")))
        kl_broken = mean_kl(sim, log_probs(broken, self.ids))
        # And the simulation without activation quantization (W4A16): the check sees the difference.
        kl_w4a16 = mean_kl(log_probs(simulated_model(folder, quantize_activations=False), self.ids), rt)
        print(f"{fmt}: KL(sim||runtime) {kl_sim:.3e}  KL(FP||runtime) {kl_fp:.3e}  ratio {kl_sim / kl_fp:.2e}  "
              f"identity-transform mutation: KL(sim||runtime') {kl_broken:.3e} ratio {kl_broken / kl_fp:.2e}  "
              f"W4A16 sim: KL {kl_w4a16:.3e} ratio {kl_w4a16 / kl_fp:.2e}  "
              f"weights: |dq T - W|/|W| <= {worst[0]:.3f}, without T >= {worst[1]:.3f}  "
              f"({time.monotonic() - t0:.1f} s)", flush=True)
        self.assertGreater(kl_fp, 1e-4, f"{fmt}: quantization changed the model too little to measure")
        self.assertLess(kl_sim, RATIO * kl_fp, fmt)
        self.assertGreaterEqual(kl_broken, RATIO * kl_fp, f"{fmt}: the check misses a skipped activation transform")
        self.assertGreaterEqual(kl_w4a16, RATIO * kl_fp, f"{fmt}: the check misses the activation quantization")
        return folder, kl_sim, kl_fp

    def test_mxfp4(self):
        folder, _, kl_fp = self.check_format("mxfp4")
        # eval-model's KL (issue 57, item 2) on the same four windows: its mean and its standard
        # error over the windows against this test's own float64 figures (the reference there is
        # the float32 model, here the float64 one: they agree far below the KL itself).
        rc, ev, err = cli_run("eval-model", MODEL, "--text", HELD, "--quantized", folder, "--seq-len", "64",
                              "--max-samples", "4")
        self.assertEqual(rc, 0, err)
        row = ev["quantized"][0]
        rt = log_probs(wush.load_quantized(folder), self.ids)
        per_window = (self.fp.exp() * (self.fp - rt)).sum(-1).mean(-1).numpy()
        se = per_window.std(ddof=1) / np.sqrt(len(per_window))
        print(f"eval-model KL {row['kl']:.6e} +- {row['kl_se']:.3e}; here {per_window.mean():.6e} +- {se:.3e}")
        self.assertAlmostEqual(row["kl"] / per_window.mean(), 1.0, delta=1e-3)
        self.assertAlmostEqual(row["kl_se"] / se, 1.0, delta=1e-2)
        self.assertAlmostEqual(per_window.mean() / kl_fp, 1.0, delta=1e-9)

    def test_nvfp4(self):
        self.check_format("nvfp4")

    def test_mxfp4_ocp(self):
        self.check_format("mxfp4_ocp")


if __name__ == "__main__":
    unittest.main(verbosity=2)
