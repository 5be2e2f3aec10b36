"""Write examples/decoder.llmir: a tiny 2-layer llama-style decoder in llm ops, canonical text.

hidden 64, 4 query heads and 2 kv heads of 16, MLP 128, vocab 128, tied embeddings, rotary
caches for 128 positions. Inputs: token ids [?batch, ?seq]; output: logits [?batch, ?seq, 128].
Weights are inline constants with values exact in binary (so the text stays short): splats
for the projections, and a deterministic pseudo-random embedding table sin(0.625 * i) built
in the graph, so the logits depend on the tokens.

  python scripts/make_example_decoder.py            # (re)write the file
  python scripts/make_example_decoder.py --check    # exit 1 if the file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from llmir_core.builder import Builder, new_module
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Value
from llmir_core.ir.dims import SymDim
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import DType, TensorType

OUT = Path(__file__).resolve().parent.parent / "examples" / "decoder.llmir"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS, MAX_POS = 64, 4, 2, 16, 128, 128, 2, 128
ROPE_THETA = 256.0  # inv_freq = 2**-j: exact in the text
B, S = SymDim.name("batch"), SymDim.name("seq")


class Gen:
    def __init__(self, b: Builder) -> None:
        self.b = b

    def at(self, origin: str) -> Gen:
        self.b.origin = f"hf:{origin}"
        return self

    def const(
        self, name: str, value: object, shape: tuple[int, ...], dtype: DType = DType.f32
    ) -> Value:
        np_dt = np.int64 if dtype == DType.i64 else np.float32
        arr = np.full(shape, value, dtype=np_dt) if np.isscalar(value) else np.asarray(value, np_dt)
        return self.b.op(
            "core.constant", name_hint=name, value=DenseAttr(arr, TensorType(shape, dtype))
        )

    def op(self, name: str, hint: str, *args: Value, **attrs: object) -> Value:
        return self.b.op(name, *args, name_hint=hint, **attrs)

    def range(self, hint: str, start: Value, limit: Value, step: Value, length: object) -> Value:
        t = TensorType((length,), DType.i64)  # type: ignore[arg-type]
        return self.b.create(
            "core.range", [start, limit, step], result_types=[t], names=[hint]
        ).result


def heads(g: Gen, x: Value, n: int, hint: str) -> Value:
    """[b, s, n*d] -> [b, n, s, d]"""
    x = g.op("core.reshape", f"{hint}_split", x, shape=(B, S, n, HEAD_DIM))
    return g.op("core.transpose", f"{hint}_heads", x, perm=(0, 2, 1, 3))


def layer(g: Gen, i: int, x: Value, cos: Value, sin: Value, pos: Value) -> Value:
    p, n = f"model.layers.{i}", f"l{i}_"
    w_in = g.at(f"{p}.input_layernorm.weight").const(f"{n}ln1_w", 1.0, (HIDDEN,))
    wq = g.at(f"{p}.self_attn.q_proj.weight").const(
        f"{n}wq", 0.015625 + 0.0078125 * i, (HIDDEN, HIDDEN)
    )
    wk = g.at(f"{p}.self_attn.k_proj.weight").const(
        f"{n}wk", 0.03125, (KV_HEADS * HEAD_DIM, HIDDEN)
    )
    wv = g.at(f"{p}.self_attn.v_proj.weight").const(
        f"{n}wv", 0.046875, (KV_HEADS * HEAD_DIM, HIDDEN)
    )
    wo = g.at(f"{p}.self_attn.o_proj.weight").const(f"{n}wo", 0.0390625, (HIDDEN, HIDDEN))
    w_post = g.at(f"{p}.post_attention_layernorm.weight").const(f"{n}ln2_w", 1.0, (HIDDEN,))
    wg = g.at(f"{p}.mlp.gate_proj.weight").const(f"{n}wg", 0.03125, (INTER, HIDDEN))
    wu = g.at(f"{p}.mlp.up_proj.weight").const(f"{n}wu", 0.015625, (INTER, HIDDEN))
    wd = g.at(f"{p}.mlp.down_proj.weight").const(f"{n}wd", -0.0078125, (HIDDEN, INTER))

    h = g.at(f"{p}.input_layernorm").op("llm.rms_norm", f"{n}h", x, w_in, eps=1e-5)
    q = g.at(f"{p}.self_attn.q_proj").op("core.matmul", f"{n}q", h, wq, transpose_b=True)
    k = g.at(f"{p}.self_attn.k_proj").op("core.matmul", f"{n}k", h, wk, transpose_b=True)
    v = g.at(f"{p}.self_attn.v_proj").op("core.matmul", f"{n}v", h, wv, transpose_b=True)
    g.at(f"{p}.self_attn")
    q, k, v = (
        heads(g, q, HEADS, f"{n}q"),
        heads(g, k, KV_HEADS, f"{n}k"),
        heads(g, v, KV_HEADS, f"{n}v"),
    )
    g.at(f"{p}.self_attn.rotary_emb")
    q = g.op("llm.rotary_embedding", f"{n}q_rot", q, cos, sin, pos)
    k = g.op("llm.rotary_embedding", f"{n}k_rot", k, cos, sin, pos)
    g.at(f"{p}.self_attn")
    a = g.op("llm.scaled_dot_product_attention", f"{n}attn", q, k, v, causal=True)
    a = g.op("core.transpose", f"{n}attn_t", a, perm=(0, 2, 1, 3))
    a = g.op("core.reshape", f"{n}attn_merged", a, shape=(B, S, HIDDEN))
    o = g.at(f"{p}.self_attn.o_proj").op("core.matmul", f"{n}o", a, wo, transpose_b=True)
    x = g.at(p).op("core.add", f"{n}resid1", x, o)
    h = g.at(f"{p}.post_attention_layernorm").op("llm.rms_norm", f"{n}h2", x, w_post, eps=1e-5)
    m = g.at(f"{p}.mlp").op("llm.gated_mlp", f"{n}mlp", h, wg, wu, wd)
    return g.at(p).op("core.add", f"{n}out", x, m)


def build() -> str:
    module = new_module("tiny_llama", ("core", "llm"))
    fn = Function("main", [])
    module.functions.append(fn)
    g = Gen(Builder(fn))
    ids = g.b.arg("ids", TensorType((B, S), DType.i64))

    g.at("model.embed_tokens.weight")
    zero, one = g.const("c0", 0, (), DType.i64), g.const("c1", 1, (), DType.i64)
    n_table = g.const("n_table", VOCAB * HIDDEN, (), DType.i64)
    idx = g.op(
        "core.cast",
        "table_idx",
        g.range("table_range", zero, n_table, one, VOCAB * HIDDEN),
        to=DType.f32,
    )
    noise = g.op(
        "core.sin", "table_noise", g.op("core.mul", "table_angle", idx, g.const("freq", 0.625, ()))
    )
    table = g.op("core.reshape", "embed_w", noise, shape=(VOCAB, HIDDEN))

    g.at("model.rotary_emb")
    n_pos = g.const("max_pos", MAX_POS, (), DType.i64)
    pos_f = g.op(
        "core.cast", "pos_f", g.range("pos_range", zero, n_pos, one, MAX_POS), to=DType.f32
    )
    inv_freq = g.const(
        "inv_freq",
        [ROPE_THETA ** (-2 * j / HEAD_DIM) for j in range(HEAD_DIM // 2)],
        (HEAD_DIM // 2,),
    )
    freqs = g.op("core.mul", "freqs", g.op("core.unsqueeze", "pos_col", pos_f, axes=(1,)), inv_freq)
    cos, sin = g.op("core.cos", "cos_cache", freqs), g.op("core.sin", "sin_cache", freqs)
    seq_len = g.op(
        "core.reshape", "seq_len", g.op("core.shape", "ids_shape", ids, start=1, end=2), shape=()
    )
    positions = g.op(
        "core.unsqueeze", "positions", g.range("pos_ids", zero, seq_len, one, S), axes=(0,)
    )

    x = g.at("model.embed_tokens").op("llm.embedding", "x0", table, ids)
    for i in range(LAYERS):
        x = layer(g, i, x, cos, sin, positions)
    w_norm = g.at("model.norm.weight").const("norm_w", 1.0, (HIDDEN,))
    h = g.at("model.norm").op("llm.rms_norm", "final", x, w_norm, eps=1e-5)
    logits = g.at("lm_head").op("core.matmul", "logits", h, table, transpose_b=True)
    g.b.ret(logits)
    return print_module(module)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if the file differs from the generated text"
    )
    args = ap.parse_args()
    text = build()
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python scripts/make_example_decoder.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
