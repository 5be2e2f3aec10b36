"""A small HF -> GGUF converter for the tests, following llama.cpp's convert_hf_to_gguf.py.

Names come from the gguf package's own TensorNameMap; llama's Q/K rows are permuted for
llama.cpp's rotary layout (`permute` below is the converter's), gemma2's norm weights get +1,
llama 3 rope scaling becomes the `rope_freqs` tensor, 1-D tensors stay F32, and 2-D tensors are
written in the requested type (llama.cpp keeps the embedding/output matrix Q8_0 in Q4_0 files
when its width is not a multiple of 256). `write_gguf` returns the weights as the file holds them,
dequantized and un-permuted, keyed by HF name, so a torch model can be loaded with exactly the
values the GGUF file encodes.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

_ARCH = {
    "llama": "LLAMA",
    "mistral": "LLAMA",
    "qwen2": "QWEN2",
    "qwen3": "QWEN3",
    "phi3": "PHI3",
    "gemma2": "GEMMA2",
    "mixtral": "LLAMA",
    "qwen2_moe": "QWEN2MOE",
    "qwen3_moe": "QWEN3MOE",
    "gemma3_text": "GEMMA3",
}
_EXPERT = re.compile(
    r"^(model\.layers\.\d+\.(?:block_sparse_moe|mlp)\.experts)\.(\d+)\.(\w+)\.weight$"
)


def stack_experts(
    state: dict[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    """Per-expert HF tensors stacked [experts, out, in] under `...experts.NAME.weight` (as
    convert_hf_to_gguf.py does); also the per-expert names of each stacked tensor, in order."""
    out: dict[str, np.ndarray] = {}
    parts: dict[str, dict[int, str]] = {}
    for name, arr in state.items():
        m = _EXPERT.match(name)
        if m is None:
            out[name] = arr
            continue
        parts.setdefault(f"{m[1]}.{m[3]}.weight", {})[int(m[2])] = name
    members = {k: [v[i] for i in sorted(v)] for k, v in parts.items()}
    for k, names in members.items():
        out[k] = np.stack([np.asarray(state[n], np.float32) for n in names])
    return out, members


def permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama3_rope_factors(rp: dict[str, Any], head_dim: int) -> np.ndarray:
    base, factor = rp["rope_theta"], rp["factor"]
    low, high, old = (
        rp["low_freq_factor"],
        rp["high_freq_factor"],
        rp["original_max_position_embeddings"],
    )
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _qtype_for(name: str, arr: np.ndarray, policy: str | dict[str, str]) -> str:
    if arr.ndim == 1:
        return "F32"
    if isinstance(policy, dict):
        for pat, q in policy.items():
            if pat in name:
                return q
        return policy.get("*", "F32")
    if policy == "Q4_0" and name in ("token_embd.weight", "output.weight") and arr.shape[-1] % 256:
        return "Q8_0"
    return policy


def write_gguf(  # noqa: C901 (a test writer: one branch per GGUF field kind)
    folder: Path,
    state: dict[str, np.ndarray],
    out: Path,
    policy: str | dict[str, str] = "F32",
    tokenizer: dict[str, Any] | None | bool = None,
    raw: dict[str, tuple[np.ndarray, str]] | None = None,
    split_max_tensors: int = 0,
) -> dict[str, np.ndarray]:
    """Write `state` (HF names -> float32 arrays) of the model in `folder` as GGUF at `out`.

    `raw` gives pre-encoded blocks for some GGUF tensors (name -> (uint8 bytes [rows, row_bytes],
    type name)): how the tests write K-quants, which the gguf package cannot encode.
    """
    import gguf

    cfg = json.loads((folder / "config.json").read_text())
    mt = cfg["model_type"]
    arch = getattr(gguf.MODEL_ARCH, _ARCH[mt])
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    n_layers = cfg["num_hidden_layers"]
    heads, kv = (
        cfg["num_attention_heads"],
        cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
    )
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    rp = cfg.get("rope_parameters") or {
        "rope_theta": cfg.get("rope_theta", 10000.0),
        **(cfg.get("rope_scaling") or {}),
    }
    local_rp = None
    if (
        mt == "gemma3_text"
    ):  # per layer type: the global layers' rope is the model's, the local base apart
        local_rp, rp = rp["sliding_attention"], rp["full_attention"]
    # split_max_tensors > 0: shards OUT-00001-of-0000N.gguf as llama.cpp's gguf-split writes them
    w = gguf.GGUFWriter(str(out), arch_name, split_max_tensors=split_max_tensors)
    w.add_name("tiny-" + mt)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    partial = rp.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0
    w.add_rope_dimension_count(int(head_dim * partial))
    if cfg.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if rp.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rp["factor"])
    if rp.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(
            rp.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        )
    longrope = rp.get("rope_type") == "longrope"
    if longrope:  # as convert_hf_to_gguf.py's Phi3MiniModel: factor tensors, attention factor
        orig = cfg.get("original_max_position_embeddings") or rp["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / orig
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0
        )
        w.add_rope_scaling_orig_ctx_len(orig)
    if mt == "phi3" and cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if mt == "gemma3_text":
        w.add_sliding_window(cfg["sliding_window"])
        w.add_sliding_window_pattern([t == "sliding_attention" for t in cfg["layer_types"]])
        w.add_rope_freq_base_swa(local_rp["rope_theta"])
        if cfg["query_pre_attn_scalar"] != head_dim:
            w.add_float32(f"{arch_name}.attention.scale", cfg["query_pre_attn_scalar"] ** -0.5)
    if mt == "gemma2":
        w.add_sliding_window(cfg["sliding_window"])
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        if (
            cfg["query_pre_attn_scalar"] != head_dim
        ):  # not written by llama.cpp (it assumes head_dim)
            w.add_float32(f"{arch_name}.attention.scale", cfg["query_pre_attn_scalar"] ** -0.5)
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if cfg.get("moe_intermediate_size"):
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    _add_tokenizer(w, tokenizer, cfg["vocab_size"])
    state, members = stack_experts(state)

    names = gguf.get_tensor_name_map(arch, n_layers)
    reference: dict[str, np.ndarray] = {}
    tensors: list[tuple[str, np.ndarray, str, str]] = []  # gguf name, data, qtype, hf name
    if rp.get("rope_type") == "llama3":
        tensors.append(("rope_freqs.weight", llama3_rope_factors(rp, head_dim), "F32", ""))
    if longrope:
        tensors.append(
            ("rope_factors_long.weight", np.asarray(rp["long_factor"], np.float32), "F32", "")
        )
        tensors.append(
            ("rope_factors_short.weight", np.asarray(rp["short_factor"], np.float32), "F32", "")
        )
    for hf_name, arr in state.items():
        if mt in ("gemma2", "gemma3_text") and hf_name == "lm_head.weight":
            continue
        arr = np.asarray(arr, dtype=np.float32)
        if hf_name.endswith("shared_expert_gate.weight"):
            arr = arr.reshape(-1)  # llama.cpp's ffn_gate_inp_shexp is {n_embd}
        if mt in ("llama", "mistral", "mixtral"):
            if hf_name.endswith("q_proj.weight"):
                arr = permute(arr, heads, heads)
            elif hf_name.endswith("k_proj.weight"):
                arr = permute(arr, heads, kv)
        if mt in ("gemma2", "gemma3_text") and hf_name.endswith("norm.weight"):
            arr = arr + 1
        gname = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, hf_name
        tensors.append((gname, arr, _qtype_for(gname, arr, policy), hf_name))
    for gname, arr, qname, hf_name in tensors:
        if raw and gname in raw:
            blocks, qname = raw[gname]
            qt = getattr(gguf.GGMLQuantizationType, qname)
            w.add_tensor(gname, blocks, raw_dtype=qt)
            values = gguf.quants.dequantize(blocks, qt)
        elif qname == "F32":
            w.add_tensor(gname, arr)
            values = arr
        elif qname == "F16":
            w.add_tensor(gname, arr.astype(np.float16))
            values = arr.astype(np.float16).astype(np.float32)
        else:
            qt = getattr(gguf.GGMLQuantizationType, qname)
            blocks = gguf.quants.quantize(arr, qt)
            w.add_tensor(gname, blocks, raw_dtype=qt)
            values = gguf.quants.dequantize(blocks, qt)
        if not hf_name:
            continue
        values = np.asarray(values, dtype=np.float32)
        if hf_name in members:  # a stacked expert tensor: one reference per expert
            for e, n in enumerate(members[hf_name]):
                reference[n] = values[e]
            continue
        if hf_name.endswith("shared_expert_gate.weight"):
            values = values.reshape(1, -1)
        if mt in ("llama", "mistral", "mixtral") and hf_name.endswith(
            ("q_proj.weight", "k_proj.weight")
        ):
            values = unpermute(values, heads, heads if "q_proj" in hf_name else kv)
        if mt in ("gemma2", "gemma3_text") and hf_name.endswith("norm.weight"):
            values = np.asarray(state[hf_name], dtype=np.float32)  # F32: (1 + w) rounds alike
        reference[hf_name] = values
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return reference


def _add_tokenizer(w: Any, tok: dict[str, Any] | None | bool, vocab_size: int) -> None:
    if tok is False:  # a file without a tokenizer
        return
    if tok is None or tok is True:  # a placeholder byte-level vocabulary: ids only, no merges
        tok = {
            "model": "gpt2",
            "pre": "gpt-2",
            "tokens": [f"t{i}" for i in range(vocab_size)],
            "token_type": [1] * vocab_size,
            "merges": [],
            "bos_token_id": 1,
            "eos_token_id": 2,
        }
    w.add_tokenizer_model(tok["model"])
    if "pre" in tok:
        w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["token_type"])
    if tok.get("scores") is not None:
        w.add_token_scores(tok["scores"])
    if tok.get("merges"):
        w.add_token_merges(tok["merges"])
    for key, fn in (
        ("bos_token_id", w.add_bos_token_id),
        ("eos_token_id", w.add_eos_token_id),
        ("unknown_token_id", w.add_unk_token_id),
    ):
        if tok.get(key) is not None:
            fn(tok[key])
    if "add_bos_token" in tok:
        w.add_add_bos_token(tok["add_bos_token"])
    if "add_space_prefix" in tok:
        w.add_add_space_prefix(tok["add_space_prefix"])
    if tok.get("chat_template"):
        w.add_chat_template(tok["chat_template"])


def model_state(model: Any) -> dict[str, np.ndarray]:
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def load_reference(model: Any, reference: dict[str, np.ndarray]) -> None:
    """Put the GGUF-encoded values into the torch model (in place)."""
    import torch

    sd = model.state_dict()
    with torch.no_grad():
        for k, v in reference.items():
            sd[k].copy_(torch.from_numpy(v))
        if (
            "lm_head.weight" in sd
            and "lm_head.weight" not in reference
            and getattr(model.config, "tie_word_embeddings", False)
        ):
            sd["lm_head.weight"].copy_(torch.from_numpy(reference["model.embed_tokens.weight"]))
