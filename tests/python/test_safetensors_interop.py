#!/usr/bin/env python3
"""Files written by the reference safetensors implementation (PyPI `safetensors`) read by libwush.

  - every tensor (F32, F16, BF16 and other dtypes, scalars, empty tensors) comes back through the
    C API (wush_tensor_file_*) with the package's name, dtype, shape and bytes, in data order;
  - metadata: none, empty, and several keys;
  - `wush eval` on the same values stored as F32, F16 and BF16 gives the same loss, which equals a
    numpy oracle of the identity-transform MXFP4 loss written from the format rules.
"""
import json

from interop_common import (TempDirTest, bf16_bits, decode_reference, main, np, quantize_reference, raw_header,
                            raw_tensors, run_dump, run_wush, save_tensors, unhex)

D_OUT, D_IN, N_TOKENS = 24, 64, 96
N_HELD = N_TOKENS // 4  # `wush eval` holds out the last quarter by default


def bf16_exact(a):
    """float32 values exactly representable in bfloat16 and in float16 (so that F32, F16 and BF16
    files hold the same numbers)."""
    a = np.asarray(a, dtype=np.float32)
    b = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)  # truncate to bfloat16
    b = np.where(np.abs(b) < 2.0 ** -14, 0.0, b).astype(np.float32)  # stay in float16's normal range
    assert np.array_equal(b.astype(np.float16).astype(np.float32), b)
    return b


class PackageWrittenFiles(TempDirTest):
    def dump_matches(self, path, keys=()):
        """The C API's view of `path` equals the reference reader's, tensor for tensor."""
        dump = run_dump("tensors", path, *keys)
        self.assertEqual(dump["status"], "WUSH_OK", dump)
        raw = raw_tensors(path)
        header = raw_header(path)
        by_offset = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
        self.assertEqual([t["name"] for t in dump["tensors"]], by_offset, "tensors are listed in data order")
        for i, t in enumerate(dump["tensors"]):
            dtype, shape, data = raw[t["name"]]
            self.assertEqual((t["dtype"], t["shape"]), (dtype, shape), t["name"])
            self.assertEqual(unhex(t["bytes"]), data, t["name"])
            self.assertEqual(t["find"], i, "wush_tensor_file_find(%r)" % t["name"])
        return dump

    def test_dtypes_shapes_and_order(self):
        rng = np.random.default_rng(1)
        f32 = rng.standard_normal((3, 5)).astype(np.float32)
        tensors = {
            # names whose alphabetical order differs from the insertion order; the package orders
            # the data by dtype alignment, then name
            "zeta.f32": ("F32", f32),
            "alpha.f16": ("F16", rng.standard_normal((4, 2)).astype(np.float16)),
            "mid.bf16": ("BF16", bf16_bits(bf16_exact(rng.standard_normal(7)))),
            "u8": ("U8", rng.integers(0, 256, (2, 3, 4), dtype=np.uint8)),
            "i8": ("I8", rng.integers(-128, 128, 5, dtype=np.int8)),
            "i16": ("I16", rng.integers(-2 ** 15, 2 ** 15, 3, dtype=np.int16)),
            "u16": ("U16", rng.integers(0, 2 ** 16, 3, dtype=np.uint16)),
            "i32": ("I32", rng.integers(-2 ** 31, 2 ** 31, 3, dtype=np.int32)),
            "u32": ("U32", rng.integers(0, 2 ** 32, 3, dtype=np.uint32)),
            "i64": ("I64", rng.integers(-2 ** 63, 2 ** 63 - 1, 2, dtype=np.int64)),
            "u64": ("U64", rng.integers(0, 2 ** 63, 2, dtype=np.uint64)),
            "f64": ("F64", rng.standard_normal((2, 2))),
            "bool": ("BOOL", np.array([True, False, True])),
            "scalar": ("F32", np.array(2.5, dtype=np.float32)),
            "empty": ("F32", np.zeros((0, 3), dtype=np.float32)),
            "unicode.名前": ("F32", np.ones(1, dtype=np.float32)),
        }
        path = self.path("mixed.safetensors")
        save_tensors(path, tensors, metadata={"format": "np", "k2": "v2 with spaces", "ключ": "значение"})
        dump = self.dump_matches(path, keys=("format", "k2", "ключ", "absent"))
        self.assertEqual(dump["metadata"], {"format": "np", "k2": "v2 with spaces", "ключ": "значение", "absent": None})
        self.assertEqual(len(dump["tensors"]), len(tensors))
        # spot check against the arrays themselves, not only the reference reader
        got = {t["name"]: t for t in dump["tensors"]}
        self.assertEqual(unhex(got["zeta.f32"]["bytes"]), f32.astype("<f4").tobytes())
        self.assertEqual(got["scalar"]["shape"], [])
        self.assertEqual(got["empty"]["shape"], [0, 3])
        self.assertEqual(got["empty"]["bytes"], "")

    def test_metadata_variants(self):
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        for label, meta in (("none", None), ("empty", {}), ("one", {"a": "b"})):
            with self.subTest(metadata=label):
                path = self.path("meta_%s.safetensors" % label)
                save_tensors(path, {"t": ("F32", a)}, metadata=meta)
                header = raw_header(path)
                if label == "none":
                    self.assertNotIn("__metadata__", header)
                dump = self.dump_matches(path, keys=("a",))
                self.assertEqual(dump["metadata"], {"a": "b" if label == "one" else None})

    def test_no_tensors(self):
        path = self.path("nothing.safetensors")
        save_tensors(path, {}, metadata={"only": "metadata"})
        dump = self.dump_matches(path, keys=("only",))
        self.assertEqual(dump["tensors"], [])
        self.assertEqual(dump["metadata"], {"only": "metadata"})

    def test_eval_reads_f32_f16_bf16_alike(self):
        rng = np.random.default_rng(7)
        w = bf16_exact(rng.standard_normal((D_OUT, D_IN)) / 8.0)
        x = rng.standard_normal((N_TOKENS, D_IN))
        x[:, 3] *= 25.0
        x = bf16_exact(x)
        stored = {"F32": lambda a: ("F32", a), "F16": lambda a: ("F16", a.astype(np.float16)),
                  "BF16": lambda a: ("BF16", bf16_bits(a))}
        losses = {}
        for wd in stored:
            for xd in stored:
                wp, xp = self.path("w_%s.safetensors" % wd), self.path("x_%s_%s.safetensors" % (wd, xd))
                save_tensors(wp, {"proj": stored[wd](w)}, metadata={"written_by": "safetensors"})
                save_tensors(xp, {"proj": stored[xd](x)})
                p = run_wush("eval", "--weights", wp, "--activations", xp, "--format", "mxfp4", "--transform", "i",
                             "--json")
                results = json.loads(p.stdout)["results"]
                self.assertEqual(len(results), 1)
                losses[(wd, xd)] = results[0]["loss"]
        self.assertEqual(len(set(losses.values())), 1, "the dtype of the file changed the loss: %r" % losses)

        # the oracle: identity transform, MXFP4 on both sides, on the held-out tokens
        wq = decode_reference("mxfp4", *packed(w), D_IN)
        xh = x[N_TOKENS - N_HELD:].astype(np.float64)
        xq = decode_reference("mxfp4", *packed(xh.astype(np.float32)), D_IN)
        y = xh @ w.astype(np.float64).T
        yq = xq @ wq.T
        want = np.sum((yq - y) ** 2) / (D_OUT * N_HELD)
        got = losses[("F32", "F32")]
        # (libwush multiplies the dequantized operands in float32: agreement to float32 rounding)
        self.assertLessEqual(abs(got - want), 1e-6 * want, "loss %r, numpy oracle %r" % (got, want))


def packed(a):
    codes, scales = quantize_reference("mxfp4", a)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), scales


if __name__ == "__main__":
    main()
