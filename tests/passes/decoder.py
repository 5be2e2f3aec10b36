"""A generated decoder in the decomposed style exporters produce (ONNX / torch.export): RMSNorm
as pow/reduce_mean/add/sqrt/div/mul, weights transposed by explicit ops, SiLU as x*sigmoid(x),
separate Q/K/V projections. Used by the pass tests and benchmarks/optimize_bench.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from llmir_core.builder import Builder, new_module
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Value
from llmir_core.ir.dims import SymDim
from llmir_core.ir.types import DType, TensorType


@dataclass(frozen=True)
class Shape:
    layers: int = 30
    hidden: int = 576
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    inter: int = 1536
    max_pos: int = 64
    eps: float = 1e-5


SMOLLM2_135M = Shape()
TINY = Shape(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, inter=48, max_pos=16)


def build_decoder(s: Shape = TINY) -> Module:
    B, S = SymDim.name("batch"), SymDim.name("seq")
    f32 = DType.f32
    m = new_module("decoder", ("core", "llm"))
    fn = Function("main", [])
    m.functions.append(fn)
    b = Builder(fn)

    def tt(*shape: object) -> TensorType:
        return TensorType(tuple(shape), f32)  # type: ignore[arg-type]

    x = b.arg("x", tt(B, S, s.hidden))
    pos = b.arg("positions", TensorType((B, S), DType.i64))
    cos = b.arg("cos_cache", tt(s.max_pos, s.head_dim // 2))
    sin = b.arg("sin_cache", tt(s.max_pos, s.head_dim // 2))

    def const(v: float) -> Value:
        return b.op("core.constant", value=DenseAttr(np.array(v, dtype=np.float32)))

    def rms(h: Value, w: Value, tag: str) -> Value:
        sq = b.op("core.pow", h, const(2.0))
        ms = b.op("core.reduce_mean", sq, axes=(-1,), keepdims=True)
        den = b.op("core.sqrt", b.op("core.add", ms, const(s.eps)))
        return b.op("core.mul", b.op("core.div", h, den), w, name_hint=tag)

    def proj(h: Value, w: Value) -> Value:
        wt = b.op("core.transpose", w, perm=(1, 0))
        return b.op("core.matmul", h, wt)

    def heads(h: Value, n: int) -> Value:
        r = b.op("core.reshape", h, shape=(B, S, n, s.head_dim))
        return b.op("core.transpose", r, perm=(0, 2, 1, 3))

    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    for i in range(s.layers):
        b.origin = f"hf:model.layers.{i}"
        w_in = b.arg(f"l{i}_input_norm", tt(s.hidden))
        wq = b.arg(f"l{i}_wq", tt(q_out, s.hidden))
        wk = b.arg(f"l{i}_wk", tt(kv_out, s.hidden))
        wv = b.arg(f"l{i}_wv", tt(kv_out, s.hidden))
        wo = b.arg(f"l{i}_wo", tt(s.hidden, q_out))
        w_post = b.arg(f"l{i}_post_norm", tt(s.hidden))
        wg = b.arg(f"l{i}_wg", tt(s.inter, s.hidden))
        wu = b.arg(f"l{i}_wu", tt(s.inter, s.hidden))
        wd = b.arg(f"l{i}_wd", tt(s.hidden, s.inter))
        h = rms(x, w_in, f"l{i}_attn_in")
        q = heads(proj(h, wq), s.heads)
        k = heads(proj(h, wk), s.kv_heads)
        v = heads(proj(h, wv), s.kv_heads)
        q = b.op("llm.rotary_embedding", q, cos, sin, pos)
        k = b.op("llm.rotary_embedding", k, cos, sin, pos)
        a = b.op("llm.scaled_dot_product_attention", q, k, v, causal=True)
        a = b.op("core.reshape", b.op("core.transpose", a, perm=(0, 2, 1, 3)), shape=(B, S, q_out))
        x = b.op("core.add", x, proj(a, wo), name_hint=f"l{i}_resid1")
        h = rms(x, w_post, f"l{i}_mlp_in")
        g = proj(h, wg)
        act = b.op("core.mul", g, b.op("core.sigmoid", g))
        u = proj(h, wu)
        x = b.op("core.add", x, proj(b.op("core.mul", act, u), wd), name_hint=f"l{i}_resid2")
    b.ret(x)
    return m
