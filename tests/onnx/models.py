"""Small ONNX models built with onnx.helper for the ONNX frontend/backend tests (seeded)."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def _model(nodes, inputs, outputs, inits=(), opset=23, ms=False, name="g") -> onnx.ModelProto:
    ops = [h.make_opsetid("", opset)] + ([h.make_opsetid("com.microsoft", 1)] if ms else [])
    g = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=ops, producer_name="llmir-tests")
    m.ir_version = 10
    return m


def mlp(seed: int = 0, hidden: int = 64) -> onnx.ModelProto:
    """RMSNorm -> up -> SiLU -> down -> residual, dims batch/seq symbolic."""
    rng = np.random.default_rng(seed)
    inits = [
        nh.from_array(rng.standard_normal((hidden, 2 * hidden)).astype(np.float32) * 0.1, "w_up"),
        nh.from_array(rng.standard_normal((2 * hidden, hidden)).astype(np.float32) * 0.1, "w_down"),
        nh.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "norm.weight"),
    ]
    nodes = [
        h.make_node("RMSNormalization", ["x", "norm.weight"], ["n"], epsilon=1e-6, name="norm"),
        h.make_node("MatMul", ["n", "w_up"], ["a"], name="mlp/up"),
        h.make_node("Sigmoid", ["a"], ["s"], name="mlp/sig"),
        h.make_node("Mul", ["a", "s"], ["b"], name="mlp/silu"),
        h.make_node("MatMul", ["b", "w_down"], ["c"], name="mlp/down"),
        h.make_node("Add", ["x", "c"], ["y"], name="residual"),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", hidden])],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", hidden])],
        inits,
        name="mlp",
    )


def llm23(
    seed: int = 0, d: int = 32, heads: int = 4, kv: int = 2, max_pos: int = 64
) -> onnx.ModelProto:
    """A decoder attention block from opset-23 ops: RMSNormalization, RotaryEmbedding, Attention."""
    rng = np.random.default_rng(seed)
    hd = d // heads
    f = np.float32
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    inits = [
        nh.from_array((1 + 0.1 * rng.standard_normal(d)).astype(f), "ln.w"),
        nh.from_array((rng.standard_normal((d, d)) * 0.2).astype(f), "wq"),
        nh.from_array((rng.standard_normal((d, kv * hd)) * 0.2).astype(f), "wk"),
        nh.from_array((rng.standard_normal((d, kv * hd)) * 0.2).astype(f), "wv"),
        nh.from_array((rng.standard_normal((d, d)) * 0.2).astype(f), "wo"),
        nh.from_array(np.cos(ang).astype(f), "cos"),
        nh.from_array(np.sin(ang).astype(f), "sin"),
        nh.from_array(np.array([0, 0, heads, hd], np.int64), "shape_q"),
        nh.from_array(np.array([0, 0, kv, hd], np.int64), "shape_kv"),
        nh.from_array(np.array([0, 0, d], np.int64), "shape_o"),
    ]
    nodes = [h.make_node("RMSNormalization", ["x", "ln.w"], ["n"], epsilon=1e-5, name="attn_norm")]
    for nm, w, shp in (("q", "wq", "shape_q"), ("k", "wk", "shape_kv"), ("v", "wv", "shape_kv")):
        nodes += [
            h.make_node("MatMul", ["n", w], [f"{nm}2"], name=f"{nm}_proj"),
            h.make_node("Reshape", [f"{nm}2", shp], [f"{nm}3"], name=f"{nm}_reshape"),
            h.make_node("Transpose", [f"{nm}3"], [f"{nm}4"], perm=[0, 2, 1, 3], name=f"{nm}_heads"),
        ]
    nodes += [
        h.make_node("RotaryEmbedding", ["q4", "cos", "sin", "pos"], ["qr"], name="q_rope"),
        h.make_node("RotaryEmbedding", ["k4", "cos", "sin", "pos"], ["kr"], name="k_rope"),
        h.make_node("Attention", ["qr", "kr", "v4"], ["a"], is_causal=1, name="attention"),
        h.make_node("Transpose", ["a"], ["a2"], perm=[0, 2, 1, 3], name="o_heads"),
        h.make_node("Reshape", ["a2", "shape_o"], ["a3"], name="o_reshape"),
        h.make_node("MatMul", ["a3", "wo"], ["o"], name="o_proj"),
        h.make_node("Add", ["x", "o"], ["y"], name="residual"),
    ]
    inputs = [
        h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", d]),
        h.make_tensor_value_info("pos", T.INT64, ["batch", "seq"]),
    ]
    return _model(
        nodes,
        inputs,
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", d])],
        inits,
        name="llm23",
    )


def contrib(
    seed: int = 0, d: int = 32, heads: int = 4, kv: int = 2, block: int = 16, max_pos: int = 64
) -> onnx.ModelProto:
    """com.microsoft ops an LLM export uses: SimplifiedLayerNormalization, MatMulNBits,
    RotaryEmbedding, GroupQueryAttention, SkipSimplifiedLayerNormalization."""
    rng = np.random.default_rng(seed)
    hd = d // heads
    f = np.float32
    inits = [
        nh.from_array((1 + 0.1 * rng.standard_normal(d)).astype(f), "ln1.w"),
        nh.from_array((1 + 0.1 * rng.standard_normal(d)).astype(f), "ln2.w"),
    ]
    nodes = [
        h.make_node(
            "SimplifiedLayerNormalization", ["x", "ln1.w"], ["n"], epsilon=1e-6, axis=-1, name="ln1"
        )
    ]

    def nbits(name: str, n_out: int, k_in: int, inp: str, out: str, zp: bool) -> None:
        nb = k_in // block
        b = rng.integers(0, 256, (n_out, nb, block // 2), dtype=np.uint8)
        sc = rng.random(n_out * nb).astype(f) * 0.05 + 0.01
        inits.extend([nh.from_array(b, f"{name}.B"), nh.from_array(sc, f"{name}.scales")])
        ins = [inp, f"{name}.B", f"{name}.scales"]
        if zp:
            zpv = rng.integers(0, 256, (n_out * ((nb + 1) // 2),), dtype=np.uint8)
            inits.append(nh.from_array(zpv, f"{name}.zp"))
            ins.append(f"{name}.zp")
        nodes.append(
            h.make_node(
                "MatMulNBits",
                ins,
                [out],
                domain="com.microsoft",
                K=k_in,
                N=n_out,
                bits=4,
                block_size=block,
                name=name,
            )
        )

    nbits("q_proj", d, d, "n", "q", zp=True)
    nbits("k_proj", kv * hd, d, "n", "k", zp=False)
    nbits("v_proj", kv * hd, d, "n", "v", zp=True)
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    inits += [
        nh.from_array(np.cos(ang).astype(f), "cos"),
        nh.from_array(np.sin(ang).astype(f), "sin"),
    ]
    nodes += [
        h.make_node(
            "RotaryEmbedding",
            ["q", "pos", "cos", "sin"],
            ["qr"],
            domain="com.microsoft",
            num_heads=heads,
            name="q_rope",
        ),
        h.make_node(
            "RotaryEmbedding",
            ["k", "pos", "cos", "sin"],
            ["kr"],
            domain="com.microsoft",
            num_heads=kv,
            name="k_rope",
        ),
        h.make_node(
            "GroupQueryAttention",
            ["qr", "kr", "v", "past_k", "past_v", "seqlens_k", "total_len"],
            ["a", "present_k", "present_v"],
            domain="com.microsoft",
            num_heads=heads,
            kv_num_heads=kv,
            name="gqa",
        ),
    ]
    nbits("o_proj", d, d, "a", "o", zp=False)
    nodes.append(
        h.make_node(
            "SkipSimplifiedLayerNormalization",
            ["o", "x", "ln2.w"],
            ["y", "", "", "res"],
            domain="com.microsoft",
            epsilon=1e-6,
            name="ln2",
        )
    )
    inputs = [
        h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", d]),
        h.make_tensor_value_info("pos", T.INT64, ["batch", "seq"]),
        h.make_tensor_value_info("past_k", T.FLOAT, ["batch", kv, "past", hd]),
        h.make_tensor_value_info("past_v", T.FLOAT, ["batch", kv, "past", hd]),
        h.make_tensor_value_info("seqlens_k", T.INT32, ["batch"]),
        h.make_tensor_value_info("total_len", T.INT32, []),
    ]
    outputs = [
        h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", d]),
        h.make_tensor_value_info("res", T.FLOAT, ["batch", "seq", d]),
        h.make_tensor_value_info("present_k", T.FLOAT, ["batch", kv, "total", hd]),
        h.make_tensor_value_info("present_v", T.FLOAT, ["batch", kv, "total", hd]),
    ]
    return _model(nodes, inputs, outputs, inits, ms=True, name="contrib")


def contrib_inputs(
    batch: int = 2,
    seq: int = 5,
    past: int = 3,
    d: int = 32,
    kv: int = 2,
    hd: int = 8,
    seed: int = 1,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    total = past + seq
    return {
        "x": rng.standard_normal((batch, seq, d)).astype(np.float32),
        "pos": np.tile(np.arange(past, total, dtype=np.int64), (batch, 1)),
        "past_k": rng.standard_normal((batch, kv, past, hd)).astype(np.float32),
        "past_v": rng.standard_normal((batch, kv, past, hd)).astype(np.float32),
        "seqlens_k": np.full((batch,), total - 1, np.int32),
        "total_len": np.array(total, np.int32),
    }


def save(model: onnx.ModelProto, path: str, external: bool = False) -> str:
    if external:
        onnx.save(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=os.path.basename(path) + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save(model, path)
    return path


def gqa_rotary(
    d: int = 64, heads: int = 4, kv: int = 2, max_pos: int = 64, packed: bool = False
) -> onnx.ModelProto:
    """com.microsoft GroupQueryAttention with do_rotary (onnxruntime needs head_size % 16 == 0);
    `packed`: one [q | k | v] input (llmir's own builds and onnxruntime-genai's use that form)."""
    m = _gqa_rotary(d, heads, kv, max_pos)
    if packed:
        hd = d // heads
        g = m.graph
        node = g.node[0]
        node.input[0], node.input[1], node.input[2] = "qkv", "", ""
        rest = [i for i in g.input if i.name not in ("q", "k", "v")]
        del g.input[:]
        g.input.extend(
            [h.make_tensor_value_info("qkv", T.FLOAT, ["batch", "seq", d + 2 * kv * hd]), *rest]
        )
    return m


def _gqa_rotary(d: int, heads: int, kv: int, max_pos: int) -> onnx.ModelProto:
    hd = d // heads
    inv = 1.0 / (10000 ** (np.arange(0, hd, 2) / hd))
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    inits = [
        nh.from_array(np.cos(ang).astype(np.float32), "cos"),
        nh.from_array(np.sin(ang).astype(np.float32), "sin"),
    ]
    node = h.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len", "cos", "sin"],
        ["a", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=kv,
        do_rotary=1,
        name="gqa",
    )
    ins = [
        h.make_tensor_value_info("q", T.FLOAT, ["batch", "seq", d]),
        h.make_tensor_value_info("k", T.FLOAT, ["batch", "seq", kv * hd]),
        h.make_tensor_value_info("v", T.FLOAT, ["batch", "seq", kv * hd]),
        h.make_tensor_value_info("past_k", T.FLOAT, ["batch", kv, "past", hd]),
        h.make_tensor_value_info("past_v", T.FLOAT, ["batch", kv, "past", hd]),
        h.make_tensor_value_info("seqlens_k", T.INT32, ["batch"]),
        h.make_tensor_value_info("total_len", T.INT32, []),
    ]
    outs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("a", "present_k", "present_v")]
    return _model([node], ins, outs, inits, opset=21, ms=True, name="gqa_rotary")


def gqa_inputs(
    batch: int, seq: int, past: int, d: int = 64, kv: int = 2, hd: int = 16, seed: int = 2
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = np.float32
    return {
        "q": rng.standard_normal((batch, seq, d)).astype(f),
        "k": rng.standard_normal((batch, seq, kv * hd)).astype(f),
        "v": rng.standard_normal((batch, seq, kv * hd)).astype(f),
        "past_k": rng.standard_normal((batch, kv, past, hd)).astype(f),
        "past_v": rng.standard_normal((batch, kv, past, hd)).astype(f),
        "seqlens_k": np.full(batch, past + seq - 1, np.int32),
        "total_len": np.array(past + seq, np.int32),
    }
