"""A decoder block in the shape torch.onnx.export (opset 16) gives it, built with the Builder: a
decomposed LayerNorm, [in, out] projection weights (ONNX MatMul), HF's rotate_half rotary with
cos/sin tables gathered by position, k and v repeated per head group (unsqueeze + tile +
reshape), scores divided by sqrt(head_dim) plus a trilu(-inf) causal mask, an MLP with biases
and tanh-GELU, residual adds and a final RMSNorm. Used by the -O3 pass tests."""

from __future__ import annotations

import numpy as np

from llmir_core.builder import Builder, new_module
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Value
from llmir_core.ir.dims import SymDim
from llmir_core.ir.types import DType, TensorType

F32, I64 = DType.f32, DType.i64


def exported_block(
    d: int = 32, heads: int = 4, kv: int = 2, max_pos: int = 16, inter: int = 48, seed: int = 0
) -> Module:
    rng = np.random.default_rng(seed)
    B, S = SymDim.name("batch"), SymDim.name("seq")
    hd = d // heads
    m = new_module("exported", ("core", "llm"))
    fn = Function("main", [])
    m.functions.append(fn)
    b = Builder(fn)

    def const(a: np.ndarray | float, dt: DType = F32) -> Value:
        return b.op("core.constant", value=DenseAttr(np.asarray(a, dtype=dt.to_numpy())))

    def param(*shape: int, scale: float = 1.0) -> Value:
        return const((rng.standard_normal(shape) * scale / np.sqrt(shape[0])).astype(np.float32))

    x = b.arg("x", TensorType((B, S, d), F32))
    pos = b.arg("pos", TensorType((B, S), I64))
    # decomposed LayerNorm
    mean = b.op("core.reduce_mean", x, axes=(-1,), keepdims=True)
    c = b.op("core.sub", x, mean)
    var = b.op("core.reduce_mean", b.op("core.pow", c, const(2.0)), axes=(-1,), keepdims=True)
    den = b.op("core.sqrt", b.op("core.add", var, const(1e-5)))
    h = b.op(
        "core.add",
        b.op("core.mul", b.op("core.div", c, den), const(1 + 0.1 * rng.standard_normal(d))),
        const(0.1 * rng.standard_normal(d)),
    )
    # rotary tables (HF: cat(freqs, freqs)) gathered by position
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    freqs = np.outer(np.arange(max_pos), inv)
    emb = np.concatenate([freqs, freqs], -1)
    cos = b.op("core.unsqueeze", b.op("core.gather", const(np.cos(emb)), pos, axis=0), axes=(1,))
    sin = b.op("core.unsqueeze", b.op("core.gather", const(np.sin(emb)), pos, axis=0), axes=(1,))

    def heads_of(y: Value, n: int) -> Value:
        return b.op(
            "core.transpose", b.op("core.reshape", y, shape=(B, S, n, hd)), perm=(0, 2, 1, 3)
        )

    def rotary(t: Value) -> Value:
        x1 = b.op("core.slice", t, starts=(0,), ends=(hd // 2,), axes=(3,), steps=(1,))
        x2 = b.op("core.slice", t, starts=(hd // 2,), ends=(2**63 - 1,), axes=(3,), steps=(1,))
        rot = b.op("core.concat", b.op("core.neg", x2), x1, axis=-1)
        return b.op("core.add", b.op("core.mul", t, cos), b.op("core.mul", rot, sin))

    def repeat(t: Value) -> Value:
        u = b.op("core.unsqueeze", t, axes=(2,))
        return b.op(
            "core.reshape",
            b.op("core.tile", u, repeats=(1, 1, heads // kv, 1, 1)),
            shape=(B, -1, S, hd),
        )

    q = rotary(heads_of(b.op("core.matmul", h, param(d, d)), heads))
    k = repeat(rotary(heads_of(b.op("core.matmul", h, param(d, kv * hd)), kv)))
    v = repeat(heads_of(b.op("core.matmul", h, param(d, kv * hd)), kv))
    # causal mask trilu(-inf, 1) over [seq, seq], its shape read from x
    seq = b.op("core.slice", b.op("core.shape", x), starts=(1,), ends=(2,), axes=(0,), steps=(1,))
    shape = b.op("core.concat", seq, seq, axis=0)
    full = b.create(
        "core.constant_of_shape",
        [shape],
        {"value": DenseAttr(np.array(-np.inf, np.float32))},
        result_types=[TensorType((S, S), F32)],
    ).results[0]
    mask = b.op("core.trilu", full, const(1, I64), upper=True)
    scores = b.op(
        "core.div",
        b.op("core.matmul", q, b.op("core.transpose", k, perm=(0, 1, 3, 2))),
        const(np.sqrt(hd)),
    )
    p = b.op("core.softmax", b.op("core.add", scores, mask), axis=-1)
    a = b.op(
        "core.reshape",
        b.op("core.transpose", b.op("core.matmul", p, v), perm=(0, 2, 1, 3)),
        shape=(B, S, d),
    )
    x2 = b.op(
        "core.add",
        x,
        b.op("core.add", b.op("core.matmul", a, param(d, d)), const(0.1 * rng.standard_normal(d))),
    )
    h2 = b.op("llm.rms_norm", x2, const(np.ones(d)), eps=1e-5)
    f = b.op(
        "core.gelu",
        b.op(
            "core.add",
            b.op("core.matmul", h2, param(d, inter)),
            const(0.1 * rng.standard_normal(inter)),
        ),
        approximate="tanh",
    )
    y = b.op(
        "core.add",
        x2,
        b.op(
            "core.add", b.op("core.matmul", f, param(inter, d)), const(0.1 * rng.standard_normal(d))
        ),
    )
    b.ret(y)
    return m
