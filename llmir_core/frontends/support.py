"""What the LLM importers support, as markdown generated from their tables.

`support_markdown()` renders the architectures (`hf.ARCHITECTURES`, `gguf.ARCHITECTURES`), rope
types (`rope.ROPE_TYPES`), tokenizers (`runtime.tokenizer.TOKENIZER_MODELS`,
`runtime.pretokenize.PRE_NAMES`) and GGUF tensor types (`ir.types.GGUF_QUANTS`) that
docs/llm-import.md shows between its GENERATED markers; `scripts/gen_llm_import_docs.py` writes
it and a test fails when the page and the code disagree. Each architecture needs a line in
`ARCH_NOTES`: a new one without it is an error, so the page cannot fall behind the importer.
"""

from __future__ import annotations

BEGIN = "<!-- BEGIN GENERATED: llmir_core/frontends/support.py (scripts/gen_llm_import_docs.py) -->"
END = "<!-- END GENERATED -->"

# architecture (HF model_type, or GGUF general.architecture when it has its own name) -> what differs
ARCH_NOTES: dict[str, str] = {
    "llama": "the reference decoder (GGUF: rotary over adjacent pairs, the converter's row permutation kept)",
    "mistral": "`sliding_window` on every layer (GGUF: written as `llama`, window dropped by llama.cpp)",
    "qwen2": "q/k/v biases; sliding window on layers `>= max_window_layers` when `use_sliding_window`",
    "qwen3": "per-head RMSNorm of q and k, explicit `head_dim`",
    "phi3": "fused `qkv_proj` / `gate_up_proj` imported as row blocks; `partial_rotary_factor`; longrope",
    "gemma2": "RMSNorm by (1 + w), four norms per layer, tanh-GELU, sqrt(hidden) embedding scale, "
    "`query_pre_attn_scalar`, attention and final soft-capping, sliding window on even layers",
    "gemma3_text": "gemma2's layout without soft-capping by default, plus q/k RMSNorm; local (sliding) and "
    "global layers from `layer_types` / `sliding_window_pattern`, each with its own rope "
    "(`rope_local_base_freq`, or `rope_parameters` per layer type)",
    "gemma3": "GGUF gemma3: local layers by `attention.sliding_window_pattern` (llama.cpp's default: every "
    "6th layer global) with `rope.freq_base_swa` (default 10000)",
    "mixtral": "`llm.moe` in every layer: softmax top-k of `num_local_experts`, renormalised "
    "(GGUF: `llama` with `expert_count`)",
    "qwen2_moe": "`llm.moe` on sparse layers (`decoder_sparse_step`, `mlp_only_layers`), `norm_topk_prob`, "
    "shared expert gated by sigmoid(`shared_expert_gate`)",
    "qwen3_moe": "`llm.moe` with qwen3 attention; `norm_topk_prob`",
    "deepseek_v2": "multi-head latent attention (q/kv LoRA, interleaved rope on `qk_rope_head_dim`, the "
    "normed latent and rope key cached); `llm.moe` from `first_k_dense_replace` on, greedy or "
    "group-limited (`n_group`, `topk_group`) top-k times `routed_scaling_factor`, shared experts",
    "qwen2moe": "GGUF qwen2_moe: stacked `ffn_*_exps`, shared expert `ffn_*_shexp`, weights not renormalised",
    "qwen3moe": "GGUF qwen3_moe: stacked `ffn_*_exps`, weights renormalised (as llama.cpp)",
}

_PLAIN_TYPES = ("F32", "F16", "BF16")


def _row(*cells: str) -> str:
    return "| " + " | ".join(cells) + " |"


def _architectures() -> list[str]:
    from .gguf import ARCHITECTURES as GGUF_ARCHS
    from .hf import ARCHITECTURES as HF_ARCHS

    names = list(dict.fromkeys([*HF_ARCHS, *GGUF_ARCHS]))
    missing = [n for n in names if n not in ARCH_NOTES]
    if missing:
        raise ValueError(f"support.ARCH_NOTES has no line for architecture(s) {', '.join(missing)}")
    out = ["| architecture | Hugging Face | GGUF | what differs |", "|---|---|---|---|"]
    for n in names:
        gguf_name = (
            f"`{n}`" if n in GGUF_ARCHS else "`llama`" if n in ("mistral", "mixtral") else ""
        )
        out.append(_row(f"`{n}`", "yes" if n in HF_ARCHS else "", gguf_name, ARCH_NOTES[n]))
    return out


def _rope_types() -> list[str]:
    from .rope import ROPE_TYPES

    out = ["| rope type (`rope_parameters` / `rope_scaling`) | frequencies |", "|---|---|"]
    for name, fn in ROPE_TYPES.items():
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        out.append(_row(f"`{name}`", doc))
    return out


def _tokenizers() -> list[str]:
    from llmir_core.runtime.pretokenize import PRE_NAMES, PRE_TOKENIZERS
    from llmir_core.runtime.tokenizer import TOKENIZER_MODELS

    out = [
        "GGUF `tokenizer.ggml.model`: "
        + ", ".join(f"`{m}`" for m in TOKENIZER_MODELS)
        + " (and any Hugging Face `tokenizer.json`).",
        "",
        "| `tokenizer.ggml.pre` | llama.cpp kind | split regexes | BOS by default | whole-token pieces unmerged |",
        "|---|---|---|---|---|",
    ]
    by_kind: dict[str, list[str]] = {}
    for name, kind in PRE_NAMES.items():
        by_kind.setdefault(kind, []).append(name)
    for kind, names in by_kind.items():
        p = PRE_TOKENIZERS[kind]
        out.append(
            _row(
                ", ".join(f"`{n}`" for n in names),
                f"`{p.kind}`",
                str(len(p.regexes)),
                "yes" if p.add_bos else "",
                "yes" if p.ignore_merges else "",
            )
        )
    return out


def _quant_types() -> list[str]:
    from llmir_core.ir.types import GGUF_QUANTS

    kept = ", ".join(q.upper() for q in GGUF_QUANTS)
    return [
        "| GGUF tensor types | imported as |",
        "|---|---|",
        _row(", ".join(_PLAIN_TYPES), "the dtype (F16/BF16 followed by `core.cast` to f32)"),
        _row(kept, "packed `!quant.*` tensors and `llm.dequantize` (kept quantized)"),
    ]


def support_markdown() -> str:
    """The generated section of docs/llm-import.md (between BEGIN and END, markers excluded)."""
    parts = [
        "### Architectures",
        "",
        *_architectures(),
        "",
        "### Rope types",
        "",
        *_rope_types(),
        "",
        "### Tokenizers",
        "",
        *_tokenizers(),
        "",
        "### Quantized tensors",
        "",
        *_quant_types(),
    ]
    return "\n".join(parts) + "\n"


def splice(page: str, body: str) -> str:
    """The page with its generated section replaced by `body`."""
    if BEGIN not in page or END not in page:
        raise ValueError("docs/llm-import.md has no GENERATED markers")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}{END}{tail}"


__all__ = ["support_markdown", "splice", "ARCH_NOTES", "BEGIN", "END"]
