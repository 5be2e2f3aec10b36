#!/usr/bin/env python3
"""Write a tiny llama-architecture model folder, as Hugging Face saves one.

    python examples/make_tiny_llama.py tiny-llama

The folder holds config.json, generation_config.json, model.safetensors (seeded random weights:
the text it generates is gibberish, but every stage of llmir runs on it exactly as on a real
model), and a byte-level BPE tokenizer trained on a few sentences (tokenizer.json and
tokenizer_config.json with a ChatML chat template). Needs only numpy and tokenizers.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import numpy as np

CORPUS = [
    "llmir takes a language model through a typed, textual intermediate representation.",
    "Every stage is a plain text file you can read, diff and check in.",
    "Optimizations are proved to preserve meaning, or reported with a counterexample.",
    "The quick brown fox jumps over the lazy dog. Hello, world! 0123456789",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there!<|im_end|>",
]
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors format: u64 header length, JSON header, then the raw little-endian data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, arr in tensors.items():
        header[name] = {
            "dtype": "F32",
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for arr in tensors.values():
            fh.write(np.ascontiguousarray(arr, dtype="<f4").tobytes())


def make_tokenizer(vocab: int):  # noqa: ANN201  (tokenizers.Tokenizer)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    folder: Path = args.folder
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(vocab=384)
    vocab = tok.get_vocab_size()
    tok.save(str(folder / "tokenizer.json"))
    h, heads, kv, inter = args.hidden, args.heads, args.kv_heads, args.intermediate
    hd = h // heads
    rng = np.random.default_rng(args.seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(vocab, h)}
    for i in range(args.layers):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
                p + "self_attn.q_proj.weight": w(heads * hd, h),
                p + "self_attn.k_proj.weight": w(kv * hd, h),
                p + "self_attn.v_proj.weight": w(kv * hd, h),
                p + "self_attn.o_proj.weight": w(h, heads * hd),
                p + "post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(h)).astype(
                    np.float32
                ),
                p + "mlp.gate_proj.weight": w(inter, h),
                p + "mlp.up_proj.weight": w(inter, h),
                p + "mlp.down_proj.weight": w(h, inter),
            }
        )
    tensors["model.norm.weight"] = np.ones(h, np.float32)
    tensors["lm_head.weight"] = w(vocab, h)
    write_safetensors(folder / "model.safetensors", tensors)
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": args.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["<|im_end|>"],
        "attention_bias": False,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "generation_config.json").write_text(
        json.dumps(
            {"bos_token_id": ids["<s>"], "eos_token_id": [ids["</s>"], ids["<|im_end|>"]]}, indent=2
        )
        + "\n"
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "unk_token": "<unk>",
                "chat_template": CHATML,
                "model_max_length": 512,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            indent=2,
        )
        + "\n"
    )
    n = sum(a.size for a in tensors.values())
    print(
        f"wrote {folder}: llama, {args.layers} layers, hidden {h}, vocab {vocab}, {n:,} parameters"
    )


if __name__ == "__main__":
    main()
