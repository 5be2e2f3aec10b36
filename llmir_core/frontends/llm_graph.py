"""The decoder graph both LLM frontends (hf.py, gguf.py) emit, from a normalized config.

A frontend reads its file format into a `DecoderConfig` (the numbers and switches that tell the
supported architectures apart) and a `WeightSource` (how to emit the `core.weight` op, plus any
cast or dequantize, for each parameter), and `build_decoder` writes one function:

    @main(input_ids [?batch, ?seq] i64, positions [?batch, ?seq] i64,
          past_key_values.{l}.key / .value [?batch, kv_heads, ?past, head_dim] f32 for each layer l)
      -> (logits [?batch, ?seq, vocab] f32,
          present.{l}.key / .value [?batch, kv_heads, ?past+?seq, head_dim] f32 ...)

(the vLLM-style decoder convention `llmir_core.runtime.decoder` drives). The query block is
aligned to the end of the keys (causal attention over past + new tokens); batch rows share one
length (no padding mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llmir_core.builder import Builder
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Value
from llmir_core.ir.dims import SymDim
from llmir_core.ir.types import DType, TensorType

BATCH, SEQ, PAST = SymDim.name("batch"), SymDim.name("seq"), SymDim.name("past")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary embedding of one layer: inverse frequencies (rotary_dim / 2 of them) and layout."""

    inv_freq: tuple[float, ...]  # float32 values
    rotary_dim: int
    interleaved: bool = False  # pairs (2i, 2i+1) rotate together (GGUF llama); else halves
    scaling: float = 1.0  # multiplies cos and sin (yarn-style attention factor; 1 otherwise)
    inv_freq_long: tuple[float, ...] = ()  # longrope: the frequencies of positions >= long_from
    long_from: int = 0


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts MLP layer (`llm.moe`): routed experts, optionally a shared one."""

    experts: int
    top_k: int
    inter: int  # each expert's intermediate size
    norm_topk: bool = True
    scoring: str = "softmax"
    routed_scale: float = 1.0
    shared_inter: int = 0  # the shared expert's intermediate size; 0 = none
    shared_gate: bool = False  # the shared expert's output times sigmoid(x @ shared_router^T)
    n_group: int = 1  # group-limited routing (DeepSeek): expert groups, 1 = none
    topk_group: int = 1  # groups whose experts may be chosen


@dataclass
class DecoderConfig:
    """What tells the supported decoder architectures apart, normalized."""

    arch: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    context: int  # positions the rotary table covers (max_position_embeddings)
    rope: list[RopeSpec]  # one per layer
    activation: str = "silu"  # gated MLP activation: silu | gelu | gelu_tanh
    tie_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k (qwen3)
    norm_offset: float = 0.0  # RMSNorm scales by (weight + offset): gemma stores weight - 1
    sandwich_norms: bool = False  # gemma2: norms after attention and after the MLP too
    embed_scale: float = 0.0  # multiply embeddings (gemma: sqrt(hidden)); 0 = off
    attn_scale: float = 0.0  # 0 = 1 / sqrt(head_dim)
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    sliding_window: list[int] = field(default_factory=list)  # per layer; 0 = full attention
    moe: list[MoeSpec | None] = field(
        default_factory=list
    )  # per layer; None (or empty) = dense MLP
    mla: Any = None  # DeepSeek multi-head latent attention (hf_deepseek.MlaSpec); None = MHA/GQA


class WeightSource(Protocol):
    """Parameters by HF-style key: `model.embed_tokens`, `model.norm`, `lm_head`, and per layer
    `input_layernorm`, `self_attn.q_proj` (+ `.bias`), `self_attn.q_norm`, `mlp.gate_proj`, ...
    `weight` emits the ops and returns an f32 value; `origin` names the op location."""

    def has(self, key: str, layer: int | None = None) -> bool: ...

    def weight(self, b: Builder, key: str, layer: int | None = None) -> Value: ...

    def origin(self, key: str, layer: int | None = None) -> str: ...


def inv_freq_default(theta: float, rotary_dim: int) -> np.ndarray:
    """1 / theta^(2i / d) in float32, as transformers computes it."""
    exponent = np.arange(0, rotary_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(
        rotary_dim
    )
    return (np.float32(1.0) / (np.float32(theta) ** exponent)).astype(np.float32)


def inv_freq_llama3(
    inv: np.ndarray, factor: float, low: float, high: float, old_ctx: int
) -> np.ndarray:
    """Llama 3.1's frequency-dependent scaling (transformers `_compute_llama3_parameters`)."""
    inv = inv.astype(np.float32)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = (np.float32(2 * math.pi) / inv).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(factor), inv).astype(np.float32)
    smooth = ((np.float32(old_ctx) / wavelen - np.float32(low)) / np.float32(high - low)).astype(
        np.float32
    )
    smoothed = ((1 - smooth) * scaled / np.float32(factor) + smooth * scaled).astype(np.float32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


class _Graph:
    def __init__(self, cfg: DecoderConfig, src: WeightSource, b: Builder) -> None:
        self.cfg, self.src, self.b = cfg, src, b
        self._rope: dict[RopeSpec, tuple[Value, Value]] = {}

    def at(self, key: str, layer: int | None = None) -> None:
        self.b.origin = self.src.origin(key, layer)

    def const(self, x: float | int | np.ndarray, dtype: DType = DType.f32) -> Value:
        arr = np.asarray(x, dtype=dtype.to_numpy())
        return self.b.op("core.constant", value=DenseAttr(arr))

    def rope_tables(self, spec: RopeSpec) -> tuple[Value, Value]:
        """cos and sin [context, rotary_dim / 2]: a function of constants (a backend folds it)."""
        if spec in self._rope:
            return self._rope[spec]
        b, n = self.b, self.cfg.context
        b.origin = self.src.origin("model.rotary_emb")
        if spec.inv_freq_long:  # longrope: rows [0, long_from) short factors, the rest long ones
            freqs = b.op(
                "core.concat",
                self.rope_freqs(0, spec.long_from, spec.inv_freq),
                self.rope_freqs(spec.long_from, n, spec.inv_freq_long),
                axis=0,
                name_hint="rope.freqs",
            )
        else:
            freqs = self.rope_freqs(0, n, spec.inv_freq)
        cos, sin = (
            b.op("core.cos", freqs, name_hint="rope.cos"),
            b.op("core.sin", freqs, name_hint="rope.sin"),
        )
        if spec.scaling != 1.0:
            s = self.const(spec.scaling)
            cos, sin = b.op("core.mul", cos, s), b.op("core.mul", sin, s)
        self._rope[spec] = (cos, sin)
        return cos, sin

    def rope_freqs(self, start: int, stop: int, inv_freq: tuple[float, ...]) -> Value:
        """positions [start, stop) times the inverse frequencies: [stop - start, rotary_dim / 2]."""
        b = self.b
        pos = b.op(
            "core.range",
            self.const(start, DType.i64),
            self.const(stop, DType.i64),
            self.const(1, DType.i64),
            name_hint="rope.positions",
        )
        pos = b.op("core.cast", pos, to=DType.f32)
        pos = b.op("core.reshape", pos, shape=(stop - start, 1))
        return b.op(
            "core.mul", pos, self.const(np.array(inv_freq, np.float32)), name_hint="rope.freqs"
        )

    def linear(self, x: Value, key: str, layer: int, bias: bool) -> Value:
        self.at(key, layer)
        w = self.src.weight(self.b, key, layer)
        self.at(key, layer)
        y = self.b.op("core.matmul", x, w, transpose_b=True)
        if bias:
            bv = self.src.weight(self.b, key + ".bias", layer)
            self.at(key, layer)
            y = self.b.op("core.add", y, bv)
        return y

    def norm(self, x: Value, key: str, layer: int | None = None) -> Value:
        self.at(key, layer)
        w = self.src.weight(self.b, key, layer)
        self.at(key, layer)
        return self.b.op(
            "llm.rms_norm", x, w, eps=float(self.cfg.eps), offset=float(self.cfg.norm_offset)
        )

    def heads(self, x: Value, n: int, norm_key: str | None, layer: int) -> Value:
        """[B, S, n*D] -> [B, n, S, D], with an optional per-head RMSNorm before the transpose."""
        b = self.b
        x = b.op("core.reshape", x, shape=(0, 0, n, self.cfg.head_dim))
        if norm_key is not None:
            x = self.norm(x, norm_key, layer)
            self.at("self_attn", layer)
        return b.op("core.transpose", x, perm=(0, 2, 1, 3))

    def attention(
        self, x: Value, layer: int, positions: Value, past_k: Value, past_v: Value
    ) -> tuple[Value, Value, Value]:
        cfg, b = self.cfg, self.b
        if cfg.mla is not None:
            from .hf_deepseek import mla_attention

            return mla_attention(self, x, layer, positions, past_k, past_v)
        bias = cfg.qkv_bias
        q = self.linear(x, "self_attn.q_proj", layer, bias)
        k = self.linear(x, "self_attn.k_proj", layer, bias)
        v = self.linear(x, "self_attn.v_proj", layer, bias)
        self.at("self_attn", layer)
        q = self.heads(q, cfg.heads, "self_attn.q_norm" if cfg.qk_norm else None, layer)
        k = self.heads(k, cfg.kv_heads, "self_attn.k_norm" if cfg.qk_norm else None, layer)
        v = self.heads(v, cfg.kv_heads, None, layer)
        spec = cfg.rope[layer]
        cos, sin = self.rope_tables(spec)
        self.at("self_attn", layer)
        rot: dict[str, Any] = {
            "interleaved": spec.interleaved,
            "rotary_dim": 0 if spec.rotary_dim == cfg.head_dim else spec.rotary_dim,
        }
        q = b.create(
            "llm.rotary_embedding", [q, cos, sin, positions], rot, names=[f"layers.{layer}.q"]
        ).result
        k = b.create(
            "llm.rotary_embedding", [k, cos, sin, positions], rot, names=[f"layers.{layer}.k"]
        ).result
        k_all = b.op("core.concat", past_k, k, axis=2, name_hint=f"present.{layer}.key")
        v_all = b.op("core.concat", past_v, v, axis=2, name_hint=f"present.{layer}.value")
        attrs: dict[str, Any] = {"causal": True}
        if cfg.attn_scale:
            attrs["scale"] = float(cfg.attn_scale)
        if cfg.attn_softcap:
            attrs["softcap"] = float(cfg.attn_softcap)
        window = cfg.sliding_window[layer] if cfg.sliding_window else 0
        if window:
            attrs["sliding_window"] = int(window)
        o = b.create(
            "llm.scaled_dot_product_attention",
            [q, k_all, v_all],
            attrs,
            names=[f"layers.{layer}.attn"],
        ).result
        o = b.op("core.transpose", o, perm=(0, 2, 1, 3))
        o = b.op("core.reshape", o, shape=(0, 0, cfg.heads * cfg.head_dim))
        o = self.linear(o, "self_attn.o_proj", layer, cfg.o_bias)
        return o, k_all, v_all

    def mlp(self, x: Value, layer: int) -> Value:
        spec = self.cfg.moe[layer] if self.cfg.moe else None
        if spec is not None:
            return self.moe(x, layer, spec)
        ws = []
        for p in ("gate", "up", "down"):
            self.at(f"mlp.{p}_proj", layer)
            ws.append(self.src.weight(self.b, f"mlp.{p}_proj", layer))
        self.at("mlp", layer)
        return self.b.op(
            "llm.gated_mlp", x, *ws, activation=self.cfg.activation, name_hint=f"layers.{layer}.mlp"
        )

    def moe(self, x: Value, layer: int, spec: MoeSpec) -> Value:
        """`llm.moe` with weights `moe.router`, stacked `moe.w_gate/w_up/w_down` and the shared
        expert's `moe.shared_gate/up/down` (+ `moe.shared_router`)."""
        keys = ["moe.router", "moe.w_gate", "moe.w_up", "moe.w_down"]
        if spec.shared_inter:
            keys += ["moe.shared_gate", "moe.shared_up", "moe.shared_down"]
            if spec.shared_gate:
                keys.append("moe.shared_router")
        ws = []
        for k in keys:
            self.at(k, layer)
            ws.append(self.src.weight(self.b, k, layer))
        self.at("mlp", layer)
        attrs = {
            "top_k": spec.top_k,
            "scoring": spec.scoring,
            "norm_topk": spec.norm_topk,
            "routed_scale": float(spec.routed_scale),
            "activation": self.cfg.activation,
        }
        if spec.n_group > 1:
            attrs.update(n_group=spec.n_group, topk_group=spec.topk_group)
        return self.b.create("llm.moe", [x, *ws], attrs, names=[f"layers.{layer}.moe"]).result

    def softcap(self, x: Value, cap: float) -> Value:
        c = self.const(cap)
        return self.b.op("core.mul", self.b.op("core.tanh", self.b.op("core.div", x, c)), c)


def build_decoder(cfg: DecoderConfig, src: WeightSource, name: str = "model") -> Module:
    """Emit the decoder function for `cfg`, with weights from `src`."""
    fn = Function("main", [])
    b = Builder(fn)
    g = _Graph(cfg, src, b)
    ids = b.arg("input_ids", TensorType((BATCH, SEQ), DType.i64))
    positions = b.arg("positions", TensorType((BATCH, SEQ), DType.i64))
    past = []
    # MLA caches its latent (key) and rotated shared key part (value), one head each
    kv_heads, k_dim, v_dim = (
        (1, cfg.mla.kv_lora_rank, cfg.mla.rope_dim)
        if cfg.mla is not None
        else (cfg.kv_heads, cfg.head_dim, cfg.head_dim)
    )
    for layer in range(cfg.layers):
        past.append(
            (
                b.arg(
                    f"past_key_values.{layer}.key",
                    TensorType((BATCH, kv_heads, PAST, k_dim), DType.f32),
                ),
                b.arg(
                    f"past_key_values.{layer}.value",
                    TensorType((BATCH, kv_heads, PAST, v_dim), DType.f32),
                ),
            )
        )

    g.at("model.embed_tokens")
    table = src.weight(b, "model.embed_tokens")
    g.at("model.embed_tokens")
    x = b.op("llm.embedding", table, ids, name_hint="embeddings")
    if cfg.embed_scale:
        x = b.op("core.mul", x, g.const(cfg.embed_scale))
    presents: list[Value] = []
    for layer in range(cfg.layers):
        h = g.norm(x, "input_layernorm", layer)
        o, k_all, v_all = g.attention(h, layer, positions, *past[layer])
        presents += [k_all, v_all]
        if cfg.sandwich_norms:
            o = g.norm(o, "post_attention_layernorm", layer)
        g.at("self_attn", layer)
        x = b.op("core.add", x, o, name_hint=f"layers.{layer}.attn_residual")
        h = g.norm(
            x,
            "pre_feedforward_layernorm" if cfg.sandwich_norms else "post_attention_layernorm",
            layer,
        )
        m = g.mlp(h, layer)
        if cfg.sandwich_norms:
            m = g.norm(m, "post_feedforward_layernorm", layer)
        g.at("mlp", layer)
        x = b.op("core.add", x, m, name_hint=f"layers.{layer}.out")
    x = g.norm(x, "model.norm")
    if cfg.tie_embeddings:
        head = table
    else:
        g.at("lm_head")
        head = src.weight(b, "lm_head")
    g.at("lm_head")
    logits = b.op("core.matmul", x, head, transpose_b=True, name_hint="logits")
    if cfg.final_softcap:
        logits = g.softcap(logits, cfg.final_softcap)
    b.ret(logits, *presents)
    return Module(name, [fn], {"llmir.dialects": ("core", "llm")})


__all__ = [
    "DecoderConfig",
    "MoeSpec",
    "RopeSpec",
    "WeightSource",
    "build_decoder",
    "inv_freq_default",
    "inv_freq_llama3",
    "BATCH",
    "SEQ",
    "PAST",
]
