#!/usr/bin/env python3
"""`wush export --fp-quant` against a numpy re-implementation of the forward pass of the
FP-Quant / HF-transformers "fp_quant" integration (quantized path, abs_max activations).

What that integration does with a quantized linear layer, as re-implemented here from its
documented behaviour (docs/CHECKPOINT.md and the fp_quant integration in Hugging Face transformers), not from libwush:
  - the token's activations, in groups of G = hadamard_group_size along d_in, are multiplied by
    forward_hadamard_matrix: a row block x_j (1 x G) becomes x_j @ M_j, where M_j is the whole
    (G, G) matrix, or column block j of a (G, d_in) matrix (the WUSH fork);
  - those are quantized "abs_max" with the activation global scale s_a (act_global_scale):
    MXFP4: group scale 2^floor(log2(amax)) (E8M0), elements RNE_e2m1(x * s_a / 2^e);
    NVFP4: group scale E4M3(s_a * amax / 6), elements RNE_e2m1(x * s_a / scale);
  - the GEMM multiplies the decoded elements x group scales of activations and of qweight/scales,
    with alpha = 1 / (weight_global_scale * act_global_scale).

The layer outputs must equal libwush's own forward of the checkpoint the export came from, built
from library calls (wush_interop_dump forward), and the layerwise loss they give must equal
`wush eval --checkpoint`. A wrongly oriented matrix is shown to fail that comparison.
"""
import json

from interop_common import (E4M3, GROUP, TempDirTest, bf16_decode, bf16_rne, e2m1_decode, e2m1_rne, e4m3_decode,
                            e4m3_rne, e8m0_decode, hadamard, layer_data, main, np, raw_tensors, run_dump, run_wush,
                            save_tensors, unhex, unpack_nibbles)

LAYERS = {"model.layers.0.self_attn.o_proj": (40, 128), "model.layers.1.mlp.up_proj": (64, 64)}
N_TOKENS, N_HELD = 192, 64


def fp_quant_forward(x, t, prefix, config, transpose_matrix=False):
    """y (n, d_out) of one exported layer for activations x (n, d_in), plus the activation codes
    and scale bytes."""
    q = config["quantization_config"]
    fmt, g = q["forward_dtype"], q["hadamard_group_size"]
    qweight = np.frombuffer(t[prefix + "qweight"][2], dtype=np.uint8).reshape(t[prefix + "qweight"][1])
    d_out, d_in = qweight.shape[0], qweight.shape[1] * 2
    scales = np.frombuffer(t[prefix + "scales"][2], dtype=np.uint8).reshape(d_out, d_in // g)
    m = bf16_decode(np.frombuffer(t[prefix + "forward_hadamard_matrix"][2], dtype="<u2")).astype(np.float64)
    m = m.reshape(t[prefix + "forward_hadamard_matrix"][1])
    s_w = float(np.frombuffer(t[prefix + "weight_global_scale"][2], dtype="<f4")[0])
    s_a = float(np.frombuffer(t[prefix + "act_global_scale"][2], dtype="<f4")[0])

    n = x.shape[0]
    xt = np.empty((n, d_in))
    for j in range(d_in // g):
        mj = m if m.shape[1] == g else m[:, j * g:(j + 1) * g]
        if transpose_matrix:
            mj = mj.T
        xt[:, j * g:(j + 1) * g] = x[:, j * g:(j + 1) * g].astype(np.float64) @ mj
    xt = xt.astype(np.float32).astype(np.float64).reshape(n, d_in // g, g)  # float32 activations

    amax = np.abs(xt).max(axis=-1, keepdims=True)
    if fmt == "mxfp4":
        _, ex = np.frexp(amax)
        xs_bytes = np.clip(ex - 1 + 127, 0, 254).astype(np.uint8)
        xs = e8m0_decode(xs_bytes)
        ws = e8m0_decode(scales)
    else:
        xs_bytes = e4m3_rne(s_a * amax / 6.0)
        xs = E4M3[xs_bytes]
        ws = e4m3_decode(scales)
    x_codes = e2m1_rne(xt * s_a / xs)
    x_deq = (e2m1_decode(x_codes) * xs).reshape(n, d_in)
    w_deq = (e2m1_decode(unpack_nibbles(qweight, d_in)).reshape(d_out, d_in // g, g) * ws[..., None]).reshape(d_out,
                                                                                                          d_in)
    y = (x_deq @ w_deq.T) / (s_w * s_a)
    magnitude = (np.abs(x_deq) @ np.abs(w_deq).T) / (s_w * s_a)  # sum of |terms|, for error bounds
    return y, x_codes.reshape(n, d_in), xs_bytes.reshape(n, d_in // g), magnitude


class FpQuantExport(TempDirTest):
    def setUp(self):
        super().setUp()
        self.w, self.x = {}, {}
        for i, (name, (d_out, d_in)) in enumerate(LAYERS.items()):
            self.w[name], self.x[name] = layer_data(300 + i, d_out, d_in, N_TOKENS)
        save_tensors(self.path("w.safetensors"), {k: ("F32", v) for k, v in self.w.items()})
        save_tensors(self.path("x.safetensors"), {k: ("F32", v) for k, v in self.x.items()})

    def quantize(self, fmt, transform, dtype="bf16"):
        ck = self.path("ck_%s_%s_%s.safetensors" % (fmt, transform, dtype))
        run_wush("quantize", "--weights", self.path("w.safetensors"), "--activations", self.path("x.safetensors"),
                 "--format", fmt, "--transform", transform, "--transform-dtype", dtype, "--out", ck)
        return ck

    def check_export(self, fmt, transform):
        g = GROUP[fmt]
        init = {"wush": "wush", "h": "hadamard", "i": "identity"}[transform]
        ck = self.quantize(fmt, transform)
        model, cfg_path = self.path("model_%s_%s.safetensors" % (fmt, transform)), self.path("config.json")
        run_wush("export", "--fp-quant", "--checkpoint", ck, "--out", model, "--config", cfg_path)
        with open(cfg_path) as f:
            config = json.load(f)
        self.assertEqual(config["quantization_config"], {
            "quant_method": "fp_quant", "forward_dtype": fmt, "forward_method": "abs_max",
            "hadamard_group_size": g, "transform_init": init, "backward_dtype": "bf16",
            "store_master_weights": False, "pseudoquantization": False, "modules_to_not_convert": ["lm_head"]})

        t = raw_tensors(model)
        suffixes = ("qweight", "scales", "forward_hadamard_matrix", "backward_hadamard_matrix",
                    "weight_global_scale", "act_global_scale")
        self.assertEqual(set(t), {n + "." + s for n in LAYERS for s in suffixes})
        ck_dump = {l["name"]: l for l in run_dump("checkpoint", ck)["layers"]}
        # libwush's eval of the checkpoint on the held-out tokens, for the loss comparison
        ev = run_wush("eval", "--checkpoint", ck, "--weights", self.path("w.safetensors"), "--activations",
                      self.path("x.safetensors"), "--heldout-tokens", N_HELD, "--json")
        lib_loss = {r["layer"]: r["loss"] for r in json.loads(ev.stdout)["results"]}

        for name, (d_out, d_in) in LAYERS.items():
            p = name + "."
            width = d_in if init == "wush" else g
            self.assertEqual(t[p + "qweight"][:2], ("U8", [d_out, d_in // 2]))
            self.assertEqual(t[p + "scales"][:2], ("U8", [d_out, d_in // g]))
            self.assertEqual(t[p + "forward_hadamard_matrix"][:2], ("BF16", [g, width]))
            self.assertEqual(t[p + "backward_hadamard_matrix"], t[p + "forward_hadamard_matrix"])
            global_scale = {"mxfp4": 3.0, "nvfp4": 10.0}[fmt]
            for s in ("weight_global_scale", "act_global_scale"):
                self.assertEqual(t[p + s][:2], ("F32", [1]))
                self.assertEqual(np.frombuffer(t[p + s][2], dtype="<f4")[0], global_scale)
            # the weights are the checkpoint's, unchanged
            self.assertEqual(t[p + "qweight"][2], unhex(ck_dump[name]["codes"]))
            self.assertEqual(t[p + "scales"][2], unhex(ck_dump[name]["scales"]))
            m = bf16_decode(np.frombuffer(t[p + "forward_hadamard_matrix"][2], dtype="<u2")).reshape(g, width)
            if init == "hadamard":
                np.testing.assert_array_equal(m, bf16_rne(hadamard(g)).astype(np.float32))
            elif init == "identity":
                np.testing.assert_array_equal(m, np.eye(g, dtype=np.float32))

            x = self.x[name][N_TOKENS - N_HELD:]
            y, x_codes, x_scales, magnitude = fp_quant_forward(x, t, p, config)

            # libwush's forward of the checkpoint, from library calls
            xpath = self.path("x_%s.f32" % d_in)
            x.astype("<f4").tofile(xpath)
            ours = run_dump("forward", ck, name, xpath, N_HELD)
            y_ours = np.frombuffer(unhex(ours["y"]), dtype="<f8").reshape(N_HELD, d_out)
            codes_ours = unpack_nibbles(np.frombuffer(unhex(ours["x_codes"]), dtype=np.uint8), d_in)
            scales_ours = np.frombuffer(unhex(ours["x_scales"]), dtype=np.uint8).reshape(N_HELD, d_in // g)
            # Both sides round the same float64 products to float32; summation order may differ in
            # the last bit, which can move an element across a rounding boundary: allow very few.
            self.assertLessEqual(np.mean(codes_ours != x_codes), 1e-3, "activation codes differ")
            self.assertLessEqual(np.mean(scales_ours != x_scales), 1e-3, "activation scales differ")
            same = np.all(codes_ours == x_codes, axis=1) & np.all(scales_ours == x_scales, axis=1)
            self.assertGreaterEqual(np.mean(same), 0.9)
            # libwush decodes both operands to float32 (each term off by at most ~2^-23 relative)
            err = np.abs(y - y_ours)[same]
            bound = 2.0 ** -22 * magnitude[same] + 1e-300
            self.assertLessEqual(np.max(err / bound), 1.0, "outputs differ beyond float32 rounding")

            # the layerwise loss of these outputs equals libwush's own evaluation of the checkpoint
            y_ref = x.astype(np.float64) @ self.w[name].astype(np.float64).T
            loss = np.sum((y - y_ref) ** 2) / (d_out * N_HELD)
            self.assertLessEqual(abs(loss - lib_loss[name]), 1e-5 * lib_loss[name],
                                 "%s: fp_quant forward loss %r, wush eval --checkpoint %r" % (name, loss,
                                                                                             lib_loss[name]))

            # the comparison can fail: the transposed matrix (T_j instead of T_j^T) does not match
            if init == "wush":
                y_wrong, _, _, _ = fp_quant_forward(x, t, p, config, transpose_matrix=True)
                wrong_loss = np.sum((y_wrong - y_ref) ** 2) / (d_out * N_HELD)
                self.assertGreater(abs(wrong_loss - lib_loss[name]), 0.5 * lib_loss[name])

    def test_mxfp4(self):
        for transform in ("wush", "h", "i"):
            with self.subTest(transform=transform):
                self.check_export("mxfp4", transform)

    def test_nvfp4(self):
        for transform in ("h",):
            with self.subTest(transform=transform):
                self.check_export("nvfp4", transform)

    def test_unsupported(self):
        # NVFP4 with WUSH: the per-block layout no fp_quant consumer loads for NVFP4.
        for fmt, transform, dtype in (("int4", "h", "bf16"), ("mxfp4", "wus", "bf16"), ("mxfp4", "wush", "f32"),
                                      ("nvfp4", "wush", "bf16")):
            with self.subTest(format=fmt, transform=transform, dtype=dtype):
                ck = self.quantize(fmt, transform, dtype)
                out = self.path("refused.safetensors")
                p = run_wush("export", "--fp-quant", "--checkpoint", ck, "--out", out, expect_ok=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("WUSH_ERR_UNSUPPORTED", p.stderr)
                self.assertFalse(__import__("os").path.exists(out))


if __name__ == "__main__":
    main()
