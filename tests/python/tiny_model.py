"""A tiny Llama-shaped model folder built locally (random init, briefly trained on generated text;
a byte-level BPE tokenizer trained on that text): config.json + safetensors + tokenizer files, as a Hugging Face
model directory. Nothing is downloaded."""

import os
import random

WORDS = ("the model weights are quantized to four bits with block transforms that adapt to "
         "the data of each layer and keep the output close to the original one while the "
         "activations are rotated scaled and rounded in groups of thirty two values").split()


def make_text(n_words: int, seed: int) -> str:
    # A Markov-ish word stream: repetitive enough for the model to be non-trivial, seeded.
    rng = random.Random(seed)
    out, i = [], 0
    for _ in range(n_words):
        i = (i + rng.choice((1, 1, 2, 3, 5))) % len(WORDS)
        out.append(WORDS[i])
    return " ".join(out) + "\n"


def make_tiny_llama(path: str, seed: int = 0, n_layers: int = 2, hidden: int = 64, intermediate: int = 128,
                    train_steps: int = 200, **config) -> str:
    """``config``: more LlamaConfig arguments, or others in place of these (e.g. attention_bias=True
    for layers with a bias, tie_word_embeddings=True for an LM head tied to the embeddings)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([make_text(3000, 123)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    args = dict(vocab_size=len(fast), hidden_size=hidden, intermediate_size=intermediate,
                num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=256, tie_word_embeddings=False, torch_dtype="float32",
                bos_token_id=0, eos_token_id=1)
    cfg = LlamaConfig(**{**args, **config})
    model = LlamaForCausalLM(cfg)
    if train_steps:
        # A few hundred Adam steps on the generated text (seconds on 2 cores): the model then
        # predicts it far better than chance, so perplexity shows what quantization costs.
        ids = torch.tensor(fast(make_text(20000, 7))["input_ids"])
        n = len(ids) // 64
        windows = ids[: n * 64].reshape(n, 64)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(seed)
        for _ in range(train_steps):
            b = windows[torch.randint(0, n, (16,), generator=g)]
            loss = model(b, labels=b).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval().save_pretrained(path, safe_serialization=True)
    return path
