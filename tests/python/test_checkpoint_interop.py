#!/usr/bin/env python3
"""Checkpoints written by libwush (`wush quantize`) read with the reference safetensors reader.

For MXFP4, NVFP4 and INT4 with the Hadamard and WUSH transforms:
  - the PyPI `safetensors` package (load_file, safe_open, deserialize) opens the file, and its
    tensors are byte-identical to what libwush's C API reports for the same checkpoint;
  - names, dtypes, shapes and metadata follow docs/CHECKPOINT.md;
  - the stored codes and scales are what the format rules of docs/BLOCK_FORMATS.md, implemented
    here in numpy, give for the weights transformed by the inverse-transpose of the stored
    activation transform (an oracle independent of the writer), and libwush's decoding of them
    matches the numpy decoding.
"""
import hashlib
import re

from interop_common import (FACTOR, GROUP, TempDirTest, bf16_decode, decode_reference, hadamard, layer_data, main,
                            np, quantize_reference, raw_header, raw_tensors, run_dump, run_wush, safetensors,
                            save_tensors, unhex, unpack_nibbles)

# name -> (d_out, d_in); dots in names as in real models
LAYERS = {"model.layers.0.self_attn.q_proj": (48, 128), "model.layers.0.mlp.down_proj": (32, 64)}
N_TOKENS = 256


class WrittenCheckpoints(TempDirTest):
    def make_inputs(self):
        ws, xs = {}, {}
        for i, (name, (d_out, d_in)) in enumerate(LAYERS.items()):
            w, x = layer_data(100 + i, d_out, d_in, N_TOKENS)
            ws[name], xs[name] = w, x
        save_tensors(self.path("w.safetensors"), {k: ("F32", v) for k, v in ws.items()})
        save_tensors(self.path("x.safetensors"), {k: ("F32", v) for k, v in xs.items()})
        return ws, xs

    def quantize(self, fmt, transform):
        out = self.path("ck_%s_%s.safetensors" % (fmt, transform))
        run_wush("quantize", "--weights", self.path("w.safetensors"), "--activations", self.path("x.safetensors"),
                 "--format", fmt, "--transform", transform, "--out", out)
        return out

    def check_checkpoint(self, fmt, transform, weights):
        path = self.quantize(fmt, transform)
        g = GROUP[fmt]
        kind = {"h": "hadamard", "wush": "wush"}[transform]

        # 1. the reference reader: structure and metadata
        raw = raw_tensors(path)
        expected_names = {n + s for n in LAYERS for s in (".codes", ".scales", ".tensor_scale", ".transform")}
        self.assertEqual(set(raw), expected_names)
        with safetensors.safe_open(path, framework="numpy") as f:
            meta = f.metadata()
            self.assertEqual(set(f.keys()), expected_names)
        self.assertEqual(meta["format_version"], "2")
        self.assertRegex(meta["producer"], r"^libwush \d+\.\d+\.\d+$")
        expected_keys = {"format_version", "producer"} | {n + "." + k for n in LAYERS
                                                          for k in ("format", "group_size", "transform", "method",
                                                                    "damping", "sha256")}
        self.assertEqual(set(meta), expected_keys)
        # Each layer's digest is SHA-256 over its four tensors' bytes in the order of docs/CHECKPOINT.md,
        # as hashlib computes it from the reference reader's bytes.
        for n in LAYERS:
            h = hashlib.sha256()
            for suffix in (".codes", ".scales", ".tensor_scale", ".transform"):
                h.update(raw[n + suffix][2])
            self.assertEqual(meta[n + ".sha256"], h.hexdigest(), n)
        if fmt != "int4":  # numpy has no bfloat16: load_file cannot hold INT4's BF16 scales
            arrays = safetensors.numpy.load_file(path)
        header = raw_header(path)
        self.assertEqual(len(header) - ("__metadata__" in header), len(expected_names))

        dump = run_dump("checkpoint", path)
        self.assertEqual(dump["status"], "WUSH_OK")
        # layers in data order of their .codes tensors (the writer keeps the order of the weights
        # file, which the package sorted by name)
        codes_order = sorted((k[:-len(".codes")] for k in header if k.endswith(".codes")),
                             key=lambda n: header[n + ".codes"]["data_offsets"])
        self.assertEqual([l["name"] for l in dump["layers"]], codes_order)
        self.assertEqual(sorted(codes_order), sorted(LAYERS))

        for layer in dump["layers"]:
            name = layer["name"]
            d_out, d_in = LAYERS[name]
            self.assertEqual(meta[name + ".format"], fmt)
            self.assertEqual(meta[name + ".group_size"], str(g))
            self.assertEqual(meta[name + ".transform"], kind)
            self.assertEqual(meta[name + ".method"], "rtn")
            # the lambda the transform was built with; data-free kinds use none (0)
            self.assertEqual(float(meta[name + ".damping"]), 0.01 if kind == "wush" else 0.0)
            self.assertEqual((layer["format"], layer["d_out"], layer["d_in"], layer["group_size"]),
                             (fmt, d_out, d_in, g))

            # dtypes and shapes (docs/CHECKPOINT.md)
            self.assertEqual(raw[name + ".codes"][:2], ("U8", [d_out, d_in // 2]))
            self.assertEqual(raw[name + ".scales"][:2], ("BF16" if fmt == "int4" else "U8", [d_out, d_in // g]))
            self.assertEqual(raw[name + ".tensor_scale"][:2], ("F32", [1]))
            self.assertEqual(raw[name + ".transform"][:2], ("F32", [d_in // g, g, g]))

            # 2. byte-identical to what the C API exposes
            self.assertEqual(raw[name + ".codes"][2], unhex(layer["codes"]))
            self.assertEqual(raw[name + ".scales"][2], unhex(layer["scales"]))
            self.assertEqual(raw[name + ".transform"][2], unhex(layer["matrices"]))
            if fmt != "int4":
                self.assertEqual(arrays[name + ".codes"].tobytes(), unhex(layer["codes"]))
                self.assertEqual(arrays[name + ".scales"].tobytes(), unhex(layer["scales"]))
            factor = np.frombuffer(raw[name + ".tensor_scale"][2], dtype="<f4")[0]
            self.assertEqual(factor, np.float32(FACTOR[fmt]))

            # 3. the transform is what its kind says
            t_act = np.frombuffer(raw[name + ".transform"][2], dtype="<f4").reshape(d_in // g, g, g).astype(np.float64)
            if kind == "hadamard":
                for b in range(d_in // g):
                    np.testing.assert_allclose(t_act[b], hadamard(g), rtol=0, atol=1e-7)

            # 4. the codes and scales are the RTN quantization of T_w w_b with T_w = T_act^{-T}
            w = weights[name].astype(np.float64)
            wt = np.empty_like(w)
            for b in range(d_in // g):
                t_w = np.linalg.inv(t_act[b]).T
                wt[:, b * g:(b + 1) * g] = w[:, b * g:(b + 1) * g] @ t_w.T
            wt = wt.astype(np.float32)  # the library quantizes float32 weights
            want_codes, want_scales = quantize_reference(fmt, wt)
            got_codes = unpack_nibbles(np.frombuffer(raw[name + ".codes"][2], dtype=np.uint8), d_in)
            got_scales = np.frombuffer(raw[name + ".scales"][2], dtype=np.uint8).reshape(want_scales.shape)
            # The float64 inverses (numpy's vs LAPACK's) may differ in the last bits, which could move
            # a value across a float32 rounding boundary: allow a few such elements for WUSH, no more.
            code_mismatch = int(np.sum(got_codes != want_codes))
            scale_mismatch = int(np.sum(np.any(got_scales != want_scales, axis=-1)))
            allowed = 0 if kind == "hadamard" else 4
            self.assertLessEqual(code_mismatch, allowed, "%s %s %s: %d codes differ from the numpy oracle"
                                 % (name, fmt, transform, code_mismatch))
            self.assertLessEqual(scale_mismatch, allowed // 4, "%s %s %s: %d scales differ from the numpy oracle"
                                 % (name, fmt, transform, scale_mismatch))

            # 5. libwush's decoding (wush_dequantize_rows) equals the numpy decoding of the stored bytes
            decoded = decode_reference(fmt, np.frombuffer(raw[name + ".codes"][2], dtype=np.uint8),
                                       np.frombuffer(raw[name + ".scales"][2], dtype=np.uint8), d_in)
            got = np.frombuffer(unhex(layer["dequantized"]), dtype="<f4").reshape(d_out, d_in).astype(np.float64)
            np.testing.assert_allclose(got, decoded, rtol=2.0 ** -23, atol=0)
            # and is close to the transformed weights (a sanity bound on the 4-bit error)
            rel = np.linalg.norm(decoded - wt) / np.linalg.norm(wt)
            self.assertLess(rel, 0.2, "%s %s: relative quantization error %.3f" % (name, fmt, rel))

        # 6. `wush inspect` lists the same layers and shapes
        p = run_wush("inspect", path)
        for name, (d_out, d_in) in LAYERS.items():
            self.assertRegex(p.stdout, r"(?m)^%s\s+%d\s+%d\s+%s\s+%s\s+rtn\s" % (re.escape(name), d_out, d_in, fmt,
                                                                                  transform))

    def test_formats_and_transforms(self):
        weights, _ = self.make_inputs()
        for fmt in ("mxfp4", "nvfp4", "int4"):
            for transform in ("h", "wush"):
                with self.subTest(format=fmt, transform=transform):
                    self.check_checkpoint(fmt, transform, weights)

    def test_bf16_transform_storage(self):
        """--transform-dtype bf16 stores transforms that are exactly bfloat16 values (the precision
        the fp_quant export needs); the reference reader sees F32 tensors holding them."""
        self.make_inputs()
        path = self.path("ck_bf16.safetensors")
        run_wush("quantize", "--weights", self.path("w.safetensors"), "--activations", self.path("x.safetensors"),
                 "--format", "mxfp4", "--transform", "wush", "--transform-dtype", "bf16", "--out", path)
        for name in LAYERS:
            t = safetensors.numpy.load_file(path)[name + ".transform"]
            self.assertEqual(t.dtype, np.float32)
            self.assertTrue(np.all((t.view(np.uint32) & 0xFFFF) == 0), "transform entries are not bfloat16 values")
            self.assertTrue(np.array_equal(bf16_decode(t.view(np.uint32) >> 16), t))


if __name__ == "__main__":
    main()
