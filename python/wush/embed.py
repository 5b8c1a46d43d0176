"""Sentence embeddings of an encoder: the folder's sentence-transformers pooling and the pooled
last hidden states.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import torch
from torch import nn


def pooling_config(folder: str) -> Dict[str, Any]:
    """The sentence-transformers pooling of a folder (``modules.json`` + its Pooling module's
    config.json): {"mode": "mean"|"cls"|"max", "normalize": bool}; mean pooling, no
    normalization when the folder has no such files."""
    mode, normalize = "mean", False
    modules_path = os.path.join(folder, "modules.json")
    if os.path.exists(modules_path):
        with open(modules_path) as f:
            modules = json.load(f)
        for m in modules:
            kind = m.get("type", "")
            if kind.endswith("Pooling"):
                cfg_path = os.path.join(folder, m.get("path", ""), "config.json")
                if os.path.exists(cfg_path):
                    with open(cfg_path) as f:
                        pc = json.load(f)
                    if pc.get("pooling_mode_cls_token"):
                        mode = "cls"
                    elif pc.get("pooling_mode_max_tokens"):
                        mode = "max"
            elif kind.endswith("Normalize"):
                normalize = True
    return {"mode": mode, "normalize": normalize}


def embed(model: nn.Module, tokenizer: Any, sentences: List[str], pooling: Optional[Dict[str, Any]] = None,
          batch_size: int = 32, max_length: int = 256) -> torch.Tensor:
    """Sentence embeddings (float32, one row per sentence) of an encoder: its last hidden states
    pooled as ``pooling`` (:func:`pooling_config`) says."""
    pooling = pooling or {"mode": "mean", "normalize": False}
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for i in range(0, len(sentences), batch_size):
            enc = tokenizer(sentences[i:i + batch_size], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt").to(device)
            h = model(**enc)[0].float()
            mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
            if pooling["mode"] == "cls":
                e = h[:, 0]
            elif pooling["mode"] == "max":
                e = h.masked_fill(mask == 0, float("-inf")).amax(1)
            else:
                e = (h * mask).sum(1) / mask.sum(1).clamp(min=1)
            if pooling["normalize"]:
                e = torch.nn.functional.normalize(e, dim=-1)
            out.append(e.cpu())
    return torch.cat(out)
