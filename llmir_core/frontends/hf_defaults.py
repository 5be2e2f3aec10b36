"""transformers' per-class defaults for the config.json fields a saved file may leave out.

One table for every architecture the HF frontend imports (`hf`, and the mixture-of-experts
families of `hf_moe`): each MoE family starts from its dense base's entry and adds or overrides
what its own config class defaults differently.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "mistral": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096 * 32,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "sliding_window": 4096,
    },
    "qwen2": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "use_sliding_window": False,
        "max_window_layers": 28,
    },
    "phi3": {
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
        "sliding_window": None,
    },
    "gemma2": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "query_pre_attn_scalar": 256,
        "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0,
    },
    "gemma3_text": {
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": 256,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "head_dim": 256,
    },
}
DEFAULTS["qwen3"] = dict(DEFAULTS["qwen2"])  # the same class defaults

# the mixture-of-experts families: their dense base's defaults plus their own
DEFAULTS["mixtral"] = {
    **DEFAULTS["mistral"],
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e6,
    "sliding_window": None,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
_QWEN_MOE = {
    "decoder_sparse_step": 1,
    "norm_topk_prob": False,
    "mlp_only_layers": [],
}
DEFAULTS["qwen2_moe"] = {
    **DEFAULTS["qwen2"],
    **_QWEN_MOE,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
}
DEFAULTS["qwen3_moe"] = {
    **DEFAULTS["qwen3"],
    **_QWEN_MOE,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
}
DEFAULTS["deepseek_v2"] = {
    **DEFAULTS["llama"],
    "first_k_dense_replace": 0,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "n_group": None,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "routed_scaling_factor": 1.0,
    "topk_group": None,
    "topk_method": "greedy",
    "v_head_dim": 128,
    "num_experts_per_tok": None,
    "moe_intermediate_size": 1407,
}

__all__ = ["DEFAULTS"]
