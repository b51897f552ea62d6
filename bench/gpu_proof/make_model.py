"""A tiny Llama-architecture model for serving tests: made here, from a seed, in a second.

    python3 make_model.py DIR

writes config.json, generation_config.json, tokenizer.json, tokenizer_config.json and
model.safetensors (bf16, about 2 MB) into DIR.  Needs numpy alone.

What it is: 2 layers, hidden size 256, 4 heads, a word-level vocabulary of 1024 made-up
words.  The embeddings and every layer's weights are random (seeded); only the output head is
set: row j is the normalized embedding of the word that comes before j in a fixed cycle of 40
words.  So, greedily, the layers add a little to the current word's embedding and the head
picks the next word of its cycle: an answer is 40 different words, then the same 40 again.
That gives a chat answer that is not one token over and over (smoke's garble check), and
output that n-gram speculative decoding can draft from once a cycle has gone round (so the
acceptance figure means something).  It says nothing sensible; it is for measuring speed.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

VOCAB, HIDDEN, FFN, LAYERS, HEADS, CYCLE, SEED = 1024, 256, 512, 2, 4, 40, 42
SPECIAL = ["<unk>", "<s>", "</s>"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
                 "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}")


def words(n: int, rng: np.random.Generator) -> list[str]:
    """``n`` different pronounceable made-up words of printable ASCII."""
    cons, vows = "bdfgklmnprstvz", "aeiou"
    out: set[str] = set()
    while len(out) < n:
        k = int(rng.integers(2, 4))
        out.add("".join(cons[rng.integers(len(cons))] + vows[rng.integers(len(vows))]
                        for _ in range(k)))
    return sorted(out)


def bf16(a: np.ndarray) -> bytes:
    """float32 to bfloat16 bytes, rounded to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype("<u2").tobytes()


def save_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        raw = bf16(tensors[name])
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for raw in blobs:
            f.write(raw)


def make(out: Path) -> None:
    rng = np.random.default_rng(SEED)
    out.mkdir(parents=True, exist_ok=True)
    vocab = SPECIAL + ["\u2581" + w for w in words(VOCAB - len(SPECIAL), rng)]

    # the next word of each word: cycles of CYCLE words over the ordinary words (the special
    # words are never chosen: their rows of the head are zero)
    order = rng.permutation(np.arange(len(SPECIAL), VOCAB))
    cycles = [order[s:s + CYCLE] for s in range(0, len(order), CYCLE)]

    embed = rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    unit = embed / np.sqrt((embed ** 2).mean(axis=1, keepdims=True))   # what RMSNorm gives
    head = np.zeros((VOCAB, HIDDEN), dtype=np.float32)
    for cyc in cycles:   # row of the next word = the current word's direction
        head[np.roll(cyc, -1)] = unit[cyc] / np.linalg.norm(unit[cyc], axis=1, keepdims=True)

    small = lambda *shape: (0.02 * rng.standard_normal(shape)).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": embed, "lm_head.weight": head * 4.0,
         "model.norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        for w in ("q", "k", "v", "o"):
            t[p + f"self_attn.{w}_proj.weight"] = small(HIDDEN, HIDDEN)
        t[p + "mlp.gate_proj.weight"] = small(FFN, HIDDEN)
        t[p + "mlp.up_proj.weight"] = small(FFN, HIDDEN)
        t[p + "mlp.down_proj.weight"] = small(HIDDEN, FFN)
    save_safetensors(out / "model.safetensors", t)

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": FFN,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": HEADS, "head_dim": HIDDEN // HEADS,
              "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False,
              "mlp_bias": False}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": 2}, indent=2) + "\n")
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
            "split": True}
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}
                            for i, s in enumerate(SPECIAL)],
           "normalizer": None, "pre_tokenizer": meta, "post_processor": None,
           "decoder": meta,
           "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(vocab)},
                     "unk_token": "<unk>"}}
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
         "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 4096,
         "chat_template": CHAT_TEMPLATE}, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_model.py DIR")
    make(Path(sys.argv[1]))
