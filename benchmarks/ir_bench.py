"""Parse, verify and print times for a 20,000-op module shaped like an 80-layer decoder.

    python benchmarks/ir_bench.py [--layers 80] [--ops 20000] [--repeat 3] [--profile parse|verify|print]

Each layer holds its weights (`core.weight`), two RMS norms, the q/k/v/o projections, attention
and a gated MLP, written with `llm` ops where they are registered and in core ops otherwise, then
padded with the elementwise/cast/reshape chains an ONNX export emits, so that the module has
exactly `--ops` ops. Symbolic `?batch`/`?seq` dims, attributes and HF-style locations make the
text look like a frontend's output. Prints the median of `--repeat` runs for each phase (target:
each under 0.5 s on the 2-core reference machine) and the op count.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from llmir_core.builder import Builder, new_module
from llmir_core.dialects.registry import get_op
from llmir_core.ir.core import Function, Module, Value
from llmir_core.ir.dims import SymDim
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import DType, TensorType
from llmir_core.verifier import verify

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 576, 9, 3, 64, 1536
B, S = SymDim.name("batch"), SymDim.name("seq")


def _has(name: str) -> bool:
    return get_op(name) is not None


def _weight(b: Builder, name: str, shape: tuple[int, ...], offset: int) -> Value:
    t = TensorType(shape, DType.f32)
    nbytes = 4
    for d in shape:
        nbytes *= d
    op = b.create(
        "core.weight",
        [],
        {"file": "model.bin", "name": name, "offset": offset, "nbytes": nbytes},
        result_types=[t],
        names=["w"],
    )
    return op.results[0]


def _rms_norm(b: Builder, x: Value, w: Value) -> Value:
    if _has("llm.rms_norm"):
        return b.op("llm.rms_norm", x, w, eps=1e-5)
    sq = b.op("core.mul", x, x)
    if _has("core.reduce_mean"):
        ms = b.op("core.reduce_mean", sq, axes=(-1,), keepdims=True)
    else:  # mean over the last dim as a matmul with a 1/n column
        inv = b.op("core.constant", value=_dense_full((HIDDEN, 1), 1.0 / HIDDEN))
        ms = b.op("core.matmul", sq, inv)
    eps = b.op("core.constant", value=_dense_full((), 1e-5))
    r = b.op("core.rsqrt", b.op("core.add", ms, eps))
    return b.op("core.mul", b.op("core.mul", x, r), w)


def _dense_full(shape: tuple[int, ...], v: float) -> Any:
    import numpy as np

    from llmir_core.ir.attrs import DenseAttr

    return DenseAttr(np.full(shape, v, np.float32))


def _attention(b: Builder, h: Value, wq: Value, wk: Value, wv: Value) -> Value:
    q = b.op("core.matmul", h, wq, transpose_b=True)
    k = b.op("core.matmul", h, wk, transpose_b=True)
    v = b.op("core.matmul", h, wv, transpose_b=True)
    q4 = b.op("core.reshape", q, shape=(B, S, HEADS, HEAD_DIM))
    k4 = b.op("core.reshape", k, shape=(B, S, KV_HEADS, HEAD_DIM))
    v4 = b.op("core.reshape", v, shape=(B, S, KV_HEADS, HEAD_DIM))
    if _has("core.transpose") and _has("llm.scaled_dot_product_attention"):
        qt = b.op("core.transpose", q4, perm=(0, 2, 1, 3))
        kt = b.op("core.transpose", k4, perm=(0, 2, 1, 3))
        vt = b.op("core.transpose", v4, perm=(0, 2, 1, 3))
        o = b.op("llm.scaled_dot_product_attention", qt, kt, vt, causal=True)
        o = b.op("core.transpose", o, perm=(0, 2, 1, 3))
    else:  # per-position grouped scores in core ops: [b, s, kv, 3*64] x [b, s, kv, 64]^T
        qg = b.op("core.reshape", q4, shape=(B, S, KV_HEADS, 3, HEAD_DIM))
        kg = b.op("core.reshape", k4, shape=(B, S, KV_HEADS, 1, HEAD_DIM))
        vg = b.op("core.reshape", v4, shape=(B, S, KV_HEADS, 1, HEAD_DIM))
        scores = b.op("core.matmul", qg, kg, transpose_b=True)
        scale = b.op("core.constant", value=_dense_full((), HEAD_DIM**-0.5))
        p = b.op("core.sigmoid", b.op("core.mul", scores, scale))
        o = b.op("core.matmul", p, vg)
    return b.op("core.reshape", o, shape=(B, S, HIDDEN))


def _mlp(b: Builder, h: Value, wg: Value, wu: Value, wd: Value) -> Value:
    if _has("llm.gated_mlp"):
        return b.op("llm.gated_mlp", h, wg, wu, wd)
    g = b.op("core.silu", b.op("core.matmul", h, wg, transpose_b=True))
    u = b.op("core.matmul", h, wu, transpose_b=True)
    return b.op("core.matmul", b.op("core.mul", g, u), wd, transpose_b=True)


def _pad_chain(b: Builder, x: Value, n: int) -> Value:
    """n ops of the cast/scale/reshape noise an exporter emits; returns a value of x's type."""
    half = b.op("core.constant", value=_dense_full((), 0.5))
    n -= 1
    while n >= 4:
        y = b.op("core.cast", x, to=DType.f16)
        y = b.op("core.cast", y, to=DType.f32)
        y = b.op("core.mul", y, half)
        x = b.op("core.add", x, y)
        n -= 4
    for _ in range(n):
        x = b.op("core.tanh", x)
    return x


def build_decoder(layers: int = 80, total_ops: int = 20_000) -> Module:
    m = new_module("decoder", ("core", "llm"))
    fn = Function("main", [])
    m.functions.append(fn)
    b = Builder(fn)
    x = b.arg("x", TensorType((B, S, HIDDEN), DType.f32))
    per_layer = total_ops // layers
    offset = 0
    for i in range(layers):
        start = len(fn.ops)
        b.origin = f"hf:model.layers.{i}"
        shapes = {
            "input_layernorm": (HIDDEN,),
            "q_proj": (HIDDEN, HIDDEN),
            "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
            "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
            "o_proj": (HIDDEN, HIDDEN),
            "post_attention_layernorm": (HIDDEN,),
            "gate_proj": (FFN, HIDDEN),
            "up_proj": (FFN, HIDDEN),
            "down_proj": (HIDDEN, FFN),
        }
        w: dict[str, Value] = {}
        for name, shape in shapes.items():
            w[name] = _weight(b, f"model.layers.{i}.{name}.weight", shape, offset)
            offset += 4 * shape[0] * (shape[1] if len(shape) > 1 else 1)
        b.origin = f"hf:model.layers.{i}.self_attn"
        h = _rms_norm(b, x, w["input_layernorm"])
        a = _attention(b, h, w["q_proj"], w["k_proj"], w["v_proj"])
        x = b.op("core.add", x, b.op("core.matmul", a, w["o_proj"], transpose_b=True))
        b.origin = f"hf:model.layers.{i}.mlp"
        h = _rms_norm(b, x, w["post_attention_layernorm"])
        x = b.op("core.add", x, _mlp(b, h, w["gate_proj"], w["up_proj"], w["down_proj"]))
        want = per_layer if i < layers - 1 else total_ops - start
        used = len(fn.ops) - start
        if want - used >= 1:
            x = _pad_chain(b, x, want - used)
    b.ret(x)
    return m


def _median_time(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds (CPU time is what a busy shared machine distorts least)."""
    wall, cpu = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", choices=("parse", "verify", "print"))
    args = ap.parse_args(argv)

    module = build_decoder(args.layers, args.ops)
    text = print_module(module)
    phases: dict[str, Callable[[], Any]] = {
        "parse": lambda: parse_module(text, "decoder.llmir"),
        "verify": lambda: verify(parsed, check_files=False),
        "print": lambda: print_module(parsed),
    }
    parsed = parse_module(text, "decoder.llmir")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(phases[args.profile])
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        return 0
    diags = verify(parsed, check_files=False)
    if diags:
        print(f"the benchmark module does not verify: {diags[0].render()}", file=sys.stderr)
        return 1
    if print_module(parsed) != text:
        print("print(parse(text)) is not a fixed point", file=sys.stderr)
        return 1
    print(
        f"ops: {parsed.op_count()}  text: {len(text) / 1e6:.1f} MB  "
        f"({args.layers} layers, median of {args.repeat})"
    )
    for name, fn in phases.items():
        wall, cpu = _median_time(fn, args.repeat)
        print(f"{name:7s} {wall:6.3f} s  (cpu {cpu:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
