"""DeepSeek-V2 (`deepseek_v2`, e.g. DeepSeek-V2-Lite) in Hugging Face folders: multi-head latent
attention (MLA) and its mixture of experts, as transformers 5 computes them.

Attention (`self_attn`): q = q_proj(x), or q_b_proj(rms(q_a_proj(x))) with `q_lora_rank`, split
per head into a no-rope part (`qk_nope_head_dim`) and a rope part (`qk_rope_head_dim`);
kv_a_proj_with_mqa(x) splits into the latent c (`kv_lora_rank`, RMS-normed by kv_a_layernorm)
and one shared rope key. Rotary pairs are interleaved (transformers multiplies complex numbers).
The cache holds what transformers caches: the normed latent (`key`, one head of kv_lora_rank)
and the rotated shared key (`value`, one head of qk_rope_head_dim); each step expands the whole
cache through kv_b_proj into per-head no-rope keys and values (`v_head_dim`). Scores are scaled
by qk_head_dim^-0.5 (times yarn's mscale(factor, mscale_all_dim)^2 for a non-default rope).

MoE (`mlp`, layers >= `first_k_dense_replace`): softmax scores of `mlp.gate`, greedy top-k or,
with `topk_method = group_limited_greedy`, only among the `topk_group` best of `n_group` groups;
the kept scores times `routed_scaling_factor` (never renormalised: transformers' DeepSeek-V2
router ignores `norm_topk_prob`), plus `n_shared_experts` experts as one shared gated MLP.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmir_core.ir.core import Value

from .llm_graph import MoeSpec

if TYPE_CHECKING:
    from .hf import _Cfg
    from .llm_graph import DecoderConfig, _Graph

_RMS_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: DeepseekV2RMSNorm's default, not rms_norm_eps


@dataclass(frozen=True)
class MlaSpec:
    q_lora_rank: int  # 0: a plain q_proj
    kv_lora_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int


def _pos(cfg: _Cfg, key: str, allow_zero: bool = False) -> int:
    v = cfg.get(key)
    if v is None and allow_zero:
        return 0
    if not isinstance(v, int) or isinstance(v, bool) or v < (0 if allow_zero else 1):
        raise cfg.fail(key, f"must be a positive integer, got {v!r}")
    return v


def configure_mla(cfg: _Cfg, dc: DecoderConfig) -> None:
    """Set dc's MLA fields: the spec, rope over the rope part (interleaved), the score scale."""
    from .hf import _layer_types, rope_specs

    if cfg.get("attention_bias"):
        raise cfg.fail("attention_bias", "is true, which is not supported for deepseek_v2")

    m = MlaSpec(
        q_lora_rank=_pos(cfg, "q_lora_rank", allow_zero=True),
        kv_lora_rank=_pos(cfg, "kv_lora_rank"),
        nope_dim=_pos(cfg, "qk_nope_head_dim"),
        rope_dim=_pos(cfg, "qk_rope_head_dim"),
        v_dim=_pos(cfg, "v_head_dim"),
    )
    if m.rope_dim % 2:
        raise cfg.fail("qk_rope_head_dim", f"({m.rope_dim}) must be even")
    dc.mla = m
    dc.head_dim = m.nope_dim + m.rope_dim
    specs = rope_specs(cfg, m.rope_dim, _layer_types(cfg, dc.layers))
    dc.rope = [dataclasses.replace(s, interleaved=True) for s in specs]
    scale = dc.head_dim**-0.5
    rp = cfg.data.get("rope_parameters") or cfg.data.get("rope_scaling") or {}
    if isinstance(rp, dict) and rp.get("rope_type", rp.get("type", "default")) != "default":
        all_dim = rp.get("mscale_all_dim") or 0
        factor = float(rp.get("factor") or 1.0)
        if all_dim and factor > 1:
            mscale = 0.1 * all_dim * math.log(factor) + 1.0
            scale *= mscale * mscale
    dc.attn_scale = scale


def mla_shapes(dc: DecoderConfig) -> dict[str, tuple[int, ...]]:
    m: MlaSpec = dc.mla
    h, heads = dc.hidden, dc.heads
    q = heads * (m.nope_dim + m.rope_dim)
    return {
        "self_attn.q_proj": (q, h),
        "self_attn.q_a_proj": (m.q_lora_rank, h),
        "self_attn.q_a_layernorm": (m.q_lora_rank,),
        "self_attn.q_b_proj": (q, m.q_lora_rank),
        "self_attn.kv_a_proj_with_mqa": (m.kv_lora_rank + m.rope_dim, h),
        "self_attn.kv_a_layernorm": (m.kv_lora_rank,),
        "self_attn.kv_b_proj": (heads * (m.nope_dim + m.v_dim), m.kv_lora_rank),
        "self_attn.o_proj": (h, heads * m.v_dim),
    }


def _rms(g: _Graph, x: Value, key: str, layer: int) -> Value:
    g.at(key, layer)
    w = g.src.weight(g.b, key, layer)
    g.at(key, layer)
    return g.b.op("llm.rms_norm", x, w, eps=_RMS_EPS, offset=0.0)


def mla_attention(
    g: _Graph, x: Value, layer: int, positions: Value, past_k: Value, past_v: Value
) -> tuple[Value, Value, Value]:
    """MLA over the latent cache: (output, present latent, present rope key)."""
    cfg, b = g.cfg, g.b
    m: MlaSpec = cfg.mla
    heads, qk = cfg.heads, m.nope_dim + m.rope_dim
    if m.q_lora_rank:
        q = g.linear(x, "self_attn.q_a_proj", layer, False)
        q = g.linear(
            _rms(g, q, "self_attn.q_a_layernorm", layer), "self_attn.q_b_proj", layer, False
        )
    else:
        q = g.linear(x, "self_attn.q_proj", layer, False)
    kv = g.linear(x, "self_attn.kv_a_proj_with_mqa", layer, False)
    g.at("self_attn", layer)
    q = b.op("core.transpose", b.op("core.reshape", q, shape=(0, 0, heads, qk)), perm=(0, 2, 1, 3))
    q_nope, q_rot = b.create(
        "core.split", [q], {"axis": -1, "sizes": (m.nope_dim, m.rope_dim)}
    ).results
    latent, k_rot = b.create(
        "core.split", [kv], {"axis": -1, "sizes": (m.kv_lora_rank, m.rope_dim)}
    ).results
    latent = _rms(g, latent, "self_attn.kv_a_layernorm", layer)
    g.at("self_attn", layer)
    latent = b.op("core.unsqueeze", latent, axes=(1,))  # [B, 1, S, kv_lora_rank]
    k_rot = b.op("core.unsqueeze", k_rot, axes=(1,))  # [B, 1, S, rope]
    cos, sin = g.rope_tables(cfg.rope[layer])
    g.at("self_attn", layer)
    rot: dict[str, Any] = {"interleaved": True, "rotary_dim": 0}
    q_rot = b.create("llm.rotary_embedding", [q_rot, cos, sin, positions], rot).result
    k_rot = b.create("llm.rotary_embedding", [k_rot, cos, sin, positions], rot).result
    k_all = b.op("core.concat", past_k, latent, axis=2, name_hint=f"present.{layer}.key")
    r_all = b.op("core.concat", past_v, k_rot, axis=2, name_hint=f"present.{layer}.value")
    kv_b = g.linear(b.op("core.squeeze", k_all, axes=(1,)), "self_attn.kv_b_proj", layer, False)
    g.at("self_attn", layer)
    kv_b = b.op(
        "core.transpose",
        b.op("core.reshape", kv_b, shape=(0, 0, heads, m.nope_dim + m.v_dim)),
        perm=(0, 2, 1, 3),
    )  # [B, H, T, nope + v]
    k_nope, v = b.create("core.split", [kv_b], {"axis": -1, "sizes": (m.nope_dim, m.v_dim)}).results
    k = b.op("core.concat", k_nope, b.op("core.tile", r_all, repeats=(1, heads, 1, 1)), axis=-1)
    q = b.op("core.concat", q_nope, q_rot, axis=-1, name_hint=f"layers.{layer}.q")
    o = b.create(
        "llm.scaled_dot_product_attention",
        [q, k, v],
        {"causal": True, "scale": float(cfg.attn_scale)},
        names=[f"layers.{layer}.attn"],
    ).result
    o = b.op("core.transpose", o, perm=(0, 2, 1, 3))
    o = b.op("core.reshape", o, shape=(0, 0, heads * m.v_dim))
    o = g.linear(o, "self_attn.o_proj", layer, False)
    return o, k_all, r_all


def deepseek_moe_layers(cfg: _Cfg, layers: int, experts: int, top_k: int) -> list[MoeSpec | None]:
    """DeepSeek-V2's MoE layers (from first_k_dense_replace on) and their routing."""
    method = cfg.get("topk_method") or "greedy"
    if method not in ("greedy", "group_limited_greedy"):
        raise cfg.fail(
            "topk_method",
            f"is '{method}', which is not supported",
            hint="supported: greedy, group_limited_greedy (DeepSeek-V2)",
        )
    groups, topk_group = 1, 1
    if method == "group_limited_greedy":
        groups, topk_group = _pos(cfg, "n_group"), _pos(cfg, "topk_group")
        if experts % groups or not 1 <= topk_group <= groups:
            raise cfg.fail(
                "topk_group",
                f"({topk_group}) and n_group ({groups}) must satisfy 1 <= topk_group <= n_group, "
                f"n_group dividing the {experts} experts",
            )
        if top_k > topk_group * (experts // groups):
            raise cfg.fail(
                "num_experts_per_tok",
                f"({top_k}) exceeds the experts of the topk_group best groups "
                f"({topk_group * (experts // groups)})",
            )
    scale = cfg.get("routed_scaling_factor")
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
        raise cfg.fail("routed_scaling_factor", f"must be a positive number, got {scale!r}")
    inter = _pos(cfg, "moe_intermediate_size")
    shared = _pos(cfg, "n_shared_experts", allow_zero=True)
    spec = MoeSpec(
        experts,
        top_k,
        inter,
        norm_topk=False,
        routed_scale=float(scale),
        shared_inter=inter * shared,
        n_group=groups,
        topk_group=topk_group,
    )
    first = _pos(cfg, "first_k_dense_replace", allow_zero=True)
    return [spec if i >= first else None for i in range(layers)]


__all__ = ["MlaSpec", "configure_mla", "mla_attention", "mla_shapes", "deepseek_moe_layers"]
