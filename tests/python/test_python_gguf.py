#!/usr/bin/env python3
"""GGUF in (issue 57, item 1): `python -m wush quantize-model` and `eval-model` take a GGUF file,
or a folder holding one, as the model.

The GGUF is written here with the `gguf` package's GGUFWriter from the tiny Llama of
tiny_model.py (its tensors under llama.cpp's names, q/k rows in llama.cpp's order, its byte-level
BPE vocabulary and merges as a "gpt2" tokenizer), in a mix of the types a real file holds:
F32 (embedding, norms), F16, Q8_0 (the output layer), Q4_1 and Q4_0 (the blocks' linear layers).

- quantize-model with default flags on the file: the output folder is the usual one, written from
  the file's metadata (config.json of a LlamaForCausalLM of the tiny's shape with the wush
  quantization_config, generation_config.json with its special tokens, a tokenizer that encodes
  text as the tiny's own did), every tensor not quantized stored as transformers dequantized it,
  bit for bit (F32 ones equal the tiny's, Q8_0's equal gguf.dequantize of the written blocks); no
  staging folder left beside it; wush.load_quantized and, after `import wush`, transformers'
  AutoModelForCausalLM.from_pretrained run it with the same logits; eval-model on the file gives
  a perplexity close to the tiny's own (the dequantized model is the tiny model) and the folder's;
  `python -m wush run OUT --prompt` generates;
- a folder holding exactly one .gguf file is the same model; several .gguf files are refused
  naming them;
- refused in one line, exit 2, before anything is written: an architecture transformers does not
  read from GGUF (named), a tensor type it does not dequantize (named), a truncated file, a file
  of garbage, an empty file (no traceback: the child process's stderr is one line).
"""
import atexit
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

import script_setup

script_setup.setup()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

try:
    import gguf  # noqa: E402
except ImportError:
    print("FAILED: the PyPI package gguf is missing from this interpreter: run scripts/install-deps.sh")
    sys.exit(1)

import wush  # noqa: E402
import wush.torch as wt  # noqa: E402
from cli_run import cli_run  # noqa: E402
from tiny_model import make_text, make_tiny_llama  # noqa: E402

torch.set_num_threads(2)
TMP = tempfile.mkdtemp(prefix="wush-pygguf-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
TINY = make_tiny_llama(os.path.join(TMP, "tiny"), train_steps=150)
CALIB, HELD = os.path.join(TMP, "calib.txt"), os.path.join(TMP, "held.txt")
pathlib.Path(CALIB).write_text(make_text(4000, 1))
pathlib.Path(HELD).write_text(make_text(3000, 2))
ENV = dict(os.environ, PYTHONPATH=str(script_setup.ROOT / "python"), PYTHONDONTWRITEBYTECODE="1")
Q = gguf.GGMLQuantizationType

# Per tensor of the tiny Llama, the GGUF type written (F32 where not named).
TYPES = {"output.weight": Q.Q8_0, "blk.0.attn_q.weight": Q.Q4_1, "blk.0.attn_k.weight": Q.Q4_1,
         "blk.0.attn_v.weight": Q.Q4_1, "blk.0.attn_output.weight": Q.Q4_1, "blk.0.ffn_gate.weight": Q.Q4_1,
         "blk.0.ffn_up.weight": Q.Q4_1, "blk.0.ffn_down.weight": Q.Q4_1, "blk.1.attn_q.weight": Q.Q4_0,
         "blk.1.attn_k.weight": Q.Q4_0, "blk.1.attn_v.weight": Q.Q8_0, "blk.1.attn_output.weight": Q.F16,
         "blk.1.ffn_gate.weight": Q.Q4_0, "blk.1.ffn_up.weight": Q.Q4_0, "blk.1.ffn_down.weight": Q.Q8_0}


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf order of the q/k rows (transformers undoes it on load)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch="llama", extra=None, name="tiny"):
    """The tiny Llama as a GGUF file (module docstring); ``extra``: more (name, array) tensors."""
    cfg = read_json(os.path.join(TINY, "config.json"))
    sd = {k: v.float().numpy() for k, v in load_file(os.path.join(TINY, "model.safetensors")).items()}
    tj = read_json(os.path.join(TINY, "tokenizer.json"))
    vocab = dict(tj["model"]["vocab"])
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    specials = {t["content"] for t in tj.get("added_tokens", []) if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0)))
    w.add_rope_dimension_count(cfg["hidden_size"] // cfg["num_attention_heads"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    written = {}
    for hf, gg in names.items():
        a = sd[hf]
        if gg.endswith("attn_q.weight"):
            a = permute(a, cfg["num_attention_heads"])
        elif gg.endswith("attn_k.weight"):
            a = permute(a, cfg["num_key_value_heads"])
        t = TYPES.get(gg, Q.F32)
        if t == Q.F32:
            w.add_tensor(gg, np.ascontiguousarray(a, dtype=np.float32))
        elif t == Q.F16:
            w.add_tensor(gg, np.ascontiguousarray(a, dtype=np.float16))
        else:
            w.add_tensor(gg, gguf.quantize(np.ascontiguousarray(a, dtype=np.float32), t), raw_dtype=t)
        written[gg] = t
    for gg, a in (extra or []):
        w.add_tensor(gg, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


GGUF_DIR = os.path.join(TMP, "gguf")
os.makedirs(GGUF_DIR)
GGUF = os.path.join(GGUF_DIR, "tiny-mixed.gguf")
WRITTEN = write_gguf(GGUF)




def child(*args):
    """(exit status, stdout, stderr) of `python -m wush ARGS` in a child process."""
    r = subprocess.run([sys.executable, "-m", "wush", *[str(a) for a in args]], env=ENV, capture_output=True,
                       text=True, timeout=600)
    return r.returncode, r.stdout, r.stderr


def folder_tensors(folder):
    tensors = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".safetensors") and fn != "wush_checkpoint.safetensors":
            tensors.update(load_file(os.path.join(folder, fn)))
    return tensors


def gguf_tensor(path, name):
    """A tensor of the file as gguf dequantizes it, in transformers' (rows, columns) shape."""
    r = gguf.GGUFReader(path)
    t = next(t for t in r.tensors if t.name == name)
    return torch.from_numpy(np.array(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32))


class GgufIn(unittest.TestCase):
    def test_quantize_eval_run(self):
        out = os.path.join(TMP, "out")
        rc, res, err = cli_run("quantize-model", GGUF, "--calib", CALIB, "--out", out)
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["gguf"]["architecture"], "llama")
        self.assertEqual(res["gguf"]["tensor_types"], {"F32": 6, "F16": 1, "Q4_0": 4, "Q4_1": 7, "Q8_0": 3})
        self.assertEqual(res["layers"], 14)
        self.assertIn("GGUF, architecture llama", err)
        self.assertEqual([f for f in os.listdir(TMP) if f.startswith(".wush")], [], "a staging folder was left")

        # The folder, written from the file's metadata.
        cfg = read_json(os.path.join(out, "config.json"))
        tiny_cfg = read_json(os.path.join(TINY, "config.json"))
        self.assertEqual(cfg["architectures"], ["LlamaForCausalLM"])
        for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings"):
            self.assertEqual(cfg[k], tiny_cfg[k], k)
        self.assertEqual(cfg["quantization_config"]["quant_method"], "wush")
        self.assertFalse(cfg["tie_word_embeddings"])
        gen = read_json(os.path.join(out, "generation_config.json"))
        self.assertEqual((gen["bos_token_id"], gen["eos_token_id"]), (0, 1))
        self.assertTrue(os.path.exists(os.path.join(out, "tokenizer.json")))
        from transformers import AutoTokenizer
        text = make_text(200, 9)
        self.assertEqual(AutoTokenizer.from_pretrained(out)(text)["input_ids"],
                         AutoTokenizer.from_pretrained(TINY)(text)["input_ids"])
        info = read_json(os.path.join(out, "wush_quantization.json"))
        self.assertIn("tokenizer.json", info["copied_files"])

        # Every tensor not quantized, as transformers dequantized it, bit for bit.
        got = folder_tensors(out)
        tiny = load_file(os.path.join(TINY, "model.safetensors"))
        for k in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight",
                  "model.layers.1.post_attention_layernorm.weight"):
            self.assertEqual(got[k].dtype, torch.float32, k)
            self.assertTrue(torch.equal(got[k], tiny[k]), k)
        lm = gguf_tensor(GGUF, "output.weight")
        self.assertTrue(torch.equal(got["lm_head.weight"], lm))
        self.assertFalse(torch.equal(lm, tiny["lm_head.weight"]))  # Q8_0: dequantized, not the tiny's
        self.assertEqual(got["model.layers.0.self_attn.q_proj.weight"].tolist(), [64, 64])  # in the checkpoint

        # Loaded and run: wush.load_quantized and transformers after `import wush`, the same model.
        from transformers import AutoModelForCausalLM
        ids = torch.tensor([AutoTokenizer.from_pretrained(out)(text)["input_ids"][:48]])
        a = wt.load_quantized(out)
        b = AutoModelForCausalLM.from_pretrained(out)
        self.assertTrue(any(isinstance(m, wt.QuantizedLinear) for m in b.modules()))
        with torch.no_grad():
            la, lb = a(ids).logits, b(ids).logits
        self.assertTrue(torch.equal(la, lb))
        del a, b

        # eval-model on the file: the dequantized model is the tiny one, up to the 4/8-bit blocks.
        rc, ev, err = cli_run("eval-model", GGUF, "--text", HELD, "--quantized", out)
        self.assertEqual(rc, 0, err)
        rc, ev_tiny, err = cli_run("eval-model", TINY, "--text", HELD)
        self.assertEqual(rc, 0, err)
        self.assertTrue(math.isfinite(ev["ppl"]) and math.isfinite(ev["ppl_quantized"]), ev)
        self.assertLess(abs(ev["ppl"] / ev_tiny["ppl"] - 1), 0.05, (ev, ev_tiny))
        self.assertLess(ev["ppl"], 100)  # trained: far below the vocabulary's 320
        self.assertLess(ev["ppl_quantized"], ev["ppl"] * 1.5, ev)

        rc, so, err = child("run", out, "--prompt", "the model weights", "--max-new-tokens", "8")
        self.assertEqual(rc, 0, err)
        gen = json.loads(so.strip().splitlines()[-1])
        self.assertEqual(gen["new_tokens"], 8)
        self.assertTrue(gen["generated"].strip(), gen)

    def test_folder_with_one_or_several(self):
        one = os.path.join(TMP, "one")
        os.makedirs(one)
        os.symlink(GGUF, os.path.join(one, "model.gguf"))
        rc, a, err = cli_run("eval-model", one, "--text", HELD, "--max-samples", "4")
        self.assertEqual(rc, 0, err)
        rc, b, err = cli_run("eval-model", GGUF, "--text", HELD, "--max-samples", "4")
        self.assertEqual(rc, 0, err)
        self.assertEqual(a["ppl"], b["ppl"])
        several = os.path.join(TMP, "several")
        os.makedirs(several)
        for n in ("a.gguf", "b.gguf"):
            os.symlink(GGUF, os.path.join(several, n))
        for cmd in (["quantize-model", several, "--calib", CALIB, "--out", os.path.join(TMP, "o-several")],
                    ["eval-model", several, "--text", HELD]):
            rc, _, err = cli_run(*cmd)
            self.assertEqual(rc, 2, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertIn("a.gguf", err)
            self.assertIn("b.gguf", err)
        self.assertFalse(os.path.exists(os.path.join(TMP, "o-several")))

    def refused(self, path, *needles):
        """quantize-model and eval-model on ``path``: exit 2, one line naming ``needles``, nothing written."""
        out = os.path.join(TMP, "o-refused")
        for cmd in (["quantize-model", path, "--calib", CALIB, "--out", out], ["eval-model", path, "--text", HELD]):
            rc, _, err = cli_run(*cmd)
            self.assertEqual(rc, 2, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            for n in needles:
                self.assertIn(n, err)
            self.assertFalse(os.path.exists(out))
            self.assertEqual([f for f in os.listdir(TMP) if f.startswith(".wush")], [])
        return err

    def test_architecture_refused(self):
        path = os.path.join(TMP, "arch", "bert.gguf")
        os.makedirs(os.path.dirname(path))
        w = gguf.GGUFWriter(path, "bert")
        w.add_block_count(2)
        w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        err = self.refused(path, "architecture bert", "not one transformers reads")
        self.assertIn("llama", err)  # what it reads, listed

    def test_tensor_type_refused(self):
        path = os.path.join(TMP, "types", "i8.gguf")
        os.makedirs(os.path.dirname(path))
        write_gguf(path, extra=[("blk.0.extra.weight", np.ones((4, 32), np.int8))])
        err = self.refused(path, "I8", "blk.0.extra.weight", "not dequantized")
        self.assertIn("Q4_1", err)  # what it dequantizes, listed

    def test_damaged_files_refused(self):
        data = pathlib.Path(GGUF).read_bytes()
        cases = {"cut.gguf": (data[: len(data) * 2 // 3], "damaged or truncated GGUF file"),
                 "header-only.gguf": (data[:600], "damaged or truncated GGUF file"),
                 "garbage.gguf": (np.random.default_rng(0).bytes(5000), "not a GGUF file"),
                 "empty.gguf": (b"", "an empty file")}
        for fn, (blob, why) in cases.items():
            with self.subTest(fn):
                path = os.path.join(TMP, "damaged", fn)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                pathlib.Path(path).write_bytes(blob)
                self.refused(path, fn, why)
        # In a child process: stderr is the one line, no traceback.
        rc, so, err = child("quantize-model", os.path.join(TMP, "damaged", "cut.gguf"), "--calib", CALIB,
                            "--out", os.path.join(TMP, "o-child"))
        self.assertEqual(rc, 2, err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertNotIn("Traceback", err)
        self.assertIn("damaged or truncated GGUF file", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
