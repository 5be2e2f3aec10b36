"""Tiny random-weight models of every supported architecture, made with transformers (test-only).

`make_model(arch, folder)` saves config.json + model.safetensors (+ generation_config.json) and
returns the torch model in eval mode. Weights are re-drawn so activations and logits are O(1)
(transformers' 0.02-std init gives near-tied logits, which would make greedy parity fragile).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 128
BASE: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=96,
    bos_token_id=1,
    eos_token_id=2,
)

# arch name -> (transformers model_type, config overrides)
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "llama3-rope": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    "llama-linear": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}},
    ),
    "llama-wide": ("llama", {"hidden_size": 256, "intermediate_size": 256, "num_hidden_layers": 1}),
    "mistral": ("mistral", {"sliding_window": 8}),
    "qwen2": ("qwen2", {"num_hidden_layers": 3}),
    "qwen3": ("qwen3", {"head_dim": 32}),
    "phi3": ("phi3", {"partial_rotary_factor": 0.5, "num_key_value_heads": 4, "pad_token_id": 0}),
    "gemma2": (
        "gemma2",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 8,
            "final_logit_softcapping": 3.0,
            "attn_logit_softcapping": 2.0,
            "num_hidden_layers": 3,
            "pad_token_id": 0,
        },
    ),
    "qwen2-yarn": (
        "qwen2",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 24,
            }
        },
    ),
    "llama-yarn-mscale": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 5000.0,
                "factor": 8.0,
                "original_max_position_embeddings": 16,
                "mscale": 1.0,
                "mscale_all_dim": 0.5,
                "beta_fast": 16,
                "beta_slow": 2,
            }
        },
    ),
    "llama-dynamic": (
        "llama",
        {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "phi3-longrope": (
        "phi3",
        {
            "num_key_value_heads": 4,
            "pad_token_id": 0,
            "original_max_position_embeddings": 24,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                "long_factor": [1.0, 1.5, 2.2, 3.4, 5.0, 7.5, 11.0, 16.0],
            },
        },
    ),
    "gemma3": (
        "gemma3_text",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 24,
            "sliding_window": 8,
            "num_hidden_layers": 3,
            "pad_token_id": 0,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
            },
        },
    ),
    "mixtral": (
        "mixtral",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    ),
    "qwen2-moe": (
        "qwen2_moe",
        {
            "num_hidden_layers": 3,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "mlp_only_layers": [1],
            "norm_topk_prob": False,
        },
    ),
    "qwen2-moe-all": (
        "qwen2_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "norm_topk_prob": False,
        },
    ),
    "qwen3-moe": (
        "qwen3_moe",
        {
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "moe_intermediate_size": 40,
            "norm_topk_prob": True,
            "head_dim": 32,
        },
    ),
    # expert widths that are multiples of 32: GGUF q4_0/q8_0 experts (ffn_down_exps' rows too)
    "qwen3-moe-q": (
        "qwen3_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "norm_topk_prob": True,
            "head_dim": 32,
        },
    ),
    # 256-wide experts: GGUF K-quant experts (blocks of 256 along every row)
    "qwen3-moe-k": (
        "qwen3_moe",
        {
            "hidden_size": 256,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 256,
            "norm_topk_prob": True,
            "head_dim": 64,
        },
    ),
    # multi-head latent attention (no q LoRA, as DeepSeek-V2-Lite), greedy routing, 2 shared experts
    "deepseek-v2-lite": (
        "deepseek_v2",
        {
            "num_key_value_heads": 4,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 6,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
        },
    ),
    # q LoRA, group-limited routing with a routed scaling factor
    "deepseek-v2": (
        "deepseek_v2",
        {
            "num_key_value_heads": 4,
            "q_lora_rank": 24,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 24,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "n_shared_experts": 1,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 2.5,
        },
    ),
}
# architectures whose rope changes with the position (longrope): compared against transformers'
# own cached decoding, not one forward over the whole sequence
STEPWISE = {"phi3-longrope"}


def make_model(arch: str, folder: Path, seed: int = 0, legacy_config: bool = False) -> Any:
    """Create, save and return a tiny model; `legacy_config` rewrites config.json in 4.x form."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, over = ARCHS[arch]
    cfg = AutoConfig.for_model(model_type, **{**BASE, **over})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                base = 0.0 if model_type in ("gemma2", "gemma3_text") else 1.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / np.sqrt(p.shape[-1]))
    model.save_pretrained(folder)
    if legacy_config:
        to_legacy_config(folder / "config.json")
    return model


def to_legacy_config(path: Path) -> None:
    """Rewrite a transformers-5 config.json with the 4.x fields rope_theta / rope_scaling."""
    data = json.loads(path.read_text())
    rp = data.pop("rope_parameters", None) or {}
    data["rope_theta"] = rp.pop("rope_theta", 10000.0)
    partial = rp.pop("partial_rotary_factor", None)
    if partial is not None and partial != 1.0:
        data["partial_rotary_factor"] = partial
    rtype = rp.pop("rope_type", "default")
    data["rope_scaling"] = None if rtype == "default" else {"rope_type": rtype, **rp}
    data.pop("layer_types", None)
    path.write_text(json.dumps(data, indent=2))


def hf_step(model: Any, ids: np.ndarray, cache: Any) -> tuple[np.ndarray, Any]:
    """One forward with transformers' own cache: (logits [b, s, vocab] float32, new cache)."""
    import torch

    with torch.no_grad():
        t = torch.tensor(ids, dtype=torch.long)
        try:
            out = model(input_ids=t, cache=cache, use_cache=True)
        except TypeError:  # transformers 4.x names it past_key_values
            out = model(input_ids=t, past_key_values=cache, use_cache=True)
    new = getattr(out, "cache", None)
    if new is None:
        new = out.past_key_values
    return out.logits.float().numpy(), new


def hf_greedy(model: Any, prompt: np.ndarray, steps: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Greedy decoding with transformers' cache: per-step logits (prefill first) and the tokens."""
    logits, cache = hf_step(model, prompt, None)
    all_logits = [logits]
    tokens = []
    for _ in range(steps):
        nxt = logits[:, -1].argmax(-1)[:, None]
        tokens.append(nxt)
        logits, cache = hf_step(model, nxt, cache)
        all_logits.append(logits)
    return all_logits, np.concatenate(tokens, axis=1)


def ir_greedy(module: Any, prompt: np.ndarray, steps: int) -> tuple[list[np.ndarray], np.ndarray]:
    """The same greedy loop through the reference interpreter and the module's own cache outputs."""
    from llmir_core.interp import Interpreter

    interp = Interpreter(module)
    fn = module.main
    batch = prompt.shape[0]
    cache = [
        np.zeros((batch, a.type.shape[1], 0, a.type.shape[3]), np.float32) for a in fn.args[2:]
    ]
    length = 0

    def step(ids: np.ndarray) -> np.ndarray:
        nonlocal cache, length
        seq = ids.shape[1]
        pos = np.broadcast_to(np.arange(length, length + seq, dtype=np.int64), ids.shape)
        feeds = {"input_ids": ids.astype(np.int64), "positions": np.ascontiguousarray(pos)}
        feeds.update({a.name: c for a, c in zip(fn.args[2:], cache)})
        out = interp.run(feeds)
        cache = list(out[1:])
        length += seq
        return np.asarray(out[0])

    logits = step(prompt)
    all_logits = [logits]
    tokens = []
    for _ in range(steps):
        nxt = logits[:, -1].argmax(-1)[:, None]
        tokens.append(nxt)
        logits = step(nxt)
        all_logits.append(logits)
    return all_logits, np.concatenate(tokens, axis=1) if tokens else np.zeros((batch, 0), np.int64)


def check_against_full_forward(
    model: Any, prompt: np.ndarray, ir_logits: list[np.ndarray], ir_tokens: np.ndarray
) -> list[float]:
    """Check a cached greedy run against ONE transformers forward over prompt + generated tokens.

    transformers' logits at position p equal those its own cached decoding would give there, so
    this checks every step's logits (returns the relative differences) and that greedy decoding
    picks the same tokens (asserted), for the cost of one forward.
    """
    full, _ = hf_step(model, np.concatenate([prompt, ir_tokens], axis=1), None)
    p = prompt.shape[1]
    want = [full[:, :p]] + [full[:, p - 1 + k : p + k] for k in range(1, len(ir_logits))]
    hf_next = full[:, p - 1 : p - 1 + ir_tokens.shape[1]].argmax(-1)
    np.testing.assert_array_equal(
        hf_next, ir_tokens, err_msg="greedy tokens differ from transformers'"
    )
    return [rel_diff(a, b) for a, b in zip(ir_logits, want)]


def rel_diff(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a - ref| / max |ref|: the acceptance measure (fp32: <= 1e-4)."""
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))
