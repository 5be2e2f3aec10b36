"""The llm dialect: each op's reference against an independent computation (numpy by hand,
onnxruntime's opset-23 ops and MatMulNBits, torch when installed), reference == decomposition
for every composite op, symbolic shape inference, examples, and one verifier error per op."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from llmir_core.builder import Builder
from llmir_core.dialects.llm import KVCacheValue
from llmir_core.dialects.registry import all_ops, get_op
from llmir_core.interp import InterpError, run
from llmir_core.ir.core import Function, Module
from llmir_core.ir.dims import DYN, SymDim, dim_add
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.ir.typeparse import parse_type_text
from llmir_core.ir.types import (
    GGUF_QUANTS,
    DType,
    KVCacheType,
    QuantType,
    TensorType,
    dtype_from_numpy,
)
from llmir_core.quant import quantize
from llmir_core.verifier import verify
from llmir_core.weights import PackedArray

LLM_OPS = sorted(n for n in all_ops() if n.startswith("llm."))
B, S = SymDim.name("batch"), SymDim.name("seq")


# -- harness ---------------------------------------------------------------------------------------


def _type_of(a: Any) -> Any:
    if isinstance(a, PackedArray):
        return TensorType(a.shape, a.qtype)
    return TensorType(tuple(a.shape), dtype_from_numpy(a.dtype))


def _module(name: str, types: list[Any], attrs: dict[str, Any], decompose: bool = False) -> Module:
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", t) for i, t in enumerate(types)]
    if decompose:
        opdef = get_op(name)
        assert opdef is not None and opdef.decompose is not None
        outs = opdef.decompose(b, args, opdef.with_defaults(attrs))
        assert all(not op.name.startswith("llm.") or op.name == "llm.dequantize" for op in fn.ops)
    else:
        outs = b.create(name, args, attrs).results
    b.ret(*outs)
    m = Module("t", [fn], {"llmir.dialects": ("core", "llm")})
    diags = verify(m)
    assert diags == [], [d.header() for d in diags]
    return m


def ref(name: str, arrays: list[Any], types: list[Any] | None = None, **attrs: Any) -> list[Any]:
    return run(_module(name, types or [_type_of(a) for a in arrays], attrs), arrays)


def dec(name: str, arrays: list[Any], types: list[Any] | None = None, **attrs: Any) -> list[Any]:
    m = _module(name, types or [_type_of(a) for a in arrays], attrs, decompose=True)
    assert parse_module(print_module(m)) == m  # the decomposition prints and parses back
    return run(m, arrays)


def rand(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def infer(name: str, types: list[str], **attrs: Any) -> list[str]:
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", parse_type_text(t)) for i, t in enumerate(types)]
    return [str(r.type) for r in b.create(name, args, attrs).results]


# -- examples --------------------------------------------------------------------------------------


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch in "<({[" and 1 or 0
        depth -= ch in ">)}]" and 1 or 0
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def example_module(line: str) -> str:
    """Wrap an example op line in a module whose arguments are the op's operands."""
    depth, cut = 0, -1
    for i, ch in enumerate(line):
        depth += ch in "<({[" and 1 or 0
        depth -= ch in ">)}]" and 1 or 0
        if depth == 0 and line.startswith(" : (", i):
            cut = i
            break
    head, sig = line[:cut], line[cut + 3 :]
    lhs, rhs = head.split(" = ", 1)
    results = [r.strip() for r in lhs.split(",")]
    operands = [o.strip() for o in rhs.split(" ", 1)[1].split("{", 1)[0].split(",") if o.strip()]
    ins_text, outs_text = sig.split(") -> ", 1)
    ins = _split_top(ins_text[1:])
    outs = _split_top(outs_text[1:-1]) if outs_text.startswith("(") else [outs_text]
    args = ", ".join(f"{o}: {t}" for o, t in zip(operands, ins))
    ret = f"({', '.join(outs)})" if len(outs) > 1 else outs[0]
    return (
        f'module @ex attributes {{llmir.dialects = ["core", "llm"], llmir.version = "0.1"}} {{\n'
        f"  func.func @main({args}) -> {ret} {{\n    {line}\n"
        f"    return {', '.join(results)} : {', '.join(outs)}\n  }}\n}}\n"
    )


def test_catalog_is_complete() -> None:
    assert LLM_OPS == sorted(
        f"llm.{n}"
        for n in (
            "embedding",
            "rms_norm",
            "layer_norm",
            "rotary_embedding",
            "scaled_dot_product_attention",
            "silu_mul",
            "gated_mlp",
            "kv_cache_update",
            "kv_cache_read",
            "quantize",
            "dequantize",
            "quantized_matmul",
            "add_rms_norm",
            "linear",
            "to_device",
            "moe",
        )
    )


@pytest.mark.parametrize("name", LLM_OPS)
def test_example_parses_verifies_and_is_canonical(name: str) -> None:
    opdef = all_ops()[name]
    assert opdef.summary and opdef.verifies.endswith(".") and opdef.example
    text = example_module(opdef.example)
    m = parse_module(text)
    assert verify(m) == []
    assert print_module(m) == text


# -- references against independent computations ----------------------------------------------------


def _ort(
    op_type: str,
    inputs: dict[str, np.ndarray],
    n_out: int = 1,
    domain: str = "",
    opset: int = 23,
    **attrs: Any,
) -> list[np.ndarray]:
    pytest.importorskip("onnx", reason="onnx builds the oracle models")
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the oracle")
    from onnx import TensorProto, helper

    def vi(name: str, a: np.ndarray | None) -> Any:
        if a is None:
            return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape
        )

    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, list(inputs), outs, domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [vi(k, v) for k, v in inputs.items()], [vi(o, None) for o in outs]
    )
    imports = [helper.make_opsetid("", opset)] + (
        [helper.make_opsetid(domain, 1)] if domain else []
    )
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, inputs))


def test_embedding_reference() -> None:
    table = rand(10, 4)
    ids = np.array([[3, 0, 9], [1, 1, 2]], np.int64)
    (y,) = ref("llm.embedding", [table, ids])
    assert np.array_equal(y, np.stack([[table[i] for i in row] for row in ids]))
    with pytest.raises(InterpError, match="token id out of range"):
        ref("llm.embedding", [table, np.array([10], np.int64)])


def test_rms_norm_matches_onnxruntime() -> None:
    x, w = rand(2, 3, 16), rand(16, seed=1)
    (y,) = ref("llm.rms_norm", [x, w], eps=1e-5)
    (want,) = _ort("RMSNormalization", {"X": x, "W": w}, epsilon=1e-5, axis=-1)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_rms_norm_offset_by_hand() -> None:
    x, w = rand(3, 8, dtype=np.float64), rand(8, seed=1, dtype=np.float64)
    (y,) = ref("llm.rms_norm", [x, w], eps=1e-6, offset=1.0)
    want = np.array(
        [
            [
                v / math.sqrt(sum(t * t for t in row) / 8 + 1e-6) * (1.0 + w[j])
                for j, v in enumerate(row)
            ]
            for row in x
        ]
    )
    np.testing.assert_allclose(y, want, rtol=1e-12)


@pytest.mark.parametrize("with_bias", [False, True])
def test_layer_norm_matches_onnxruntime(with_bias: bool) -> None:
    x, w, bias = rand(2, 5, 12), rand(12, seed=1), rand(12, seed=2)
    args = [x, w, bias] if with_bias else [x, w]
    (y,) = ref("llm.layer_norm", args, eps=1e-5)
    feeds = dict(zip(["X", "Scale", "B"], args))
    (want,) = _ort("LayerNormalization", feeds, epsilon=1e-5, axis=-1)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _rope_inputs(
    batch: int = 2, heads: int = 3, seq: int = 5, head: int = 8, rd: int = 0
) -> list[np.ndarray]:
    half = (rd or head) // 2
    ang = np.arange(32)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    pos = np.random.default_rng(3).integers(0, 32, (batch, seq)).astype(np.int64)
    return [
        rand(batch, heads, seq, head),
        np.cos(ang).astype(np.float32),
        np.sin(ang).astype(np.float32),
        pos,
    ]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rd", [0, 4])
def test_rotary_matches_onnxruntime(interleaved: bool, rd: int) -> None:
    args = _rope_inputs(rd=rd)
    (y,) = ref("llm.rotary_embedding", args, interleaved=interleaved, rotary_dim=rd)
    feeds = dict(zip(["X", "cos_cache", "sin_cache", "position_ids"], args))
    (want,) = _ort("RotaryEmbedding", feeds, interleaved=int(interleaved), rotary_embedding_dim=rd)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_rotary_by_hand_llama_convention() -> None:
    """Position p rotates pair (i, i + D/2) by p * theta_i (llama's rotate_half)."""
    x, cos, sin, _ = _rope_inputs(batch=1, heads=1, seq=2, head=4)
    pos = np.array([[0, 7]], np.int64)
    (y,) = ref("llm.rotary_embedding", [x, cos, sin, pos])
    assert np.allclose(y[0, 0, 0], x[0, 0, 0])  # position 0 is the identity
    t = 7 * 10000.0 ** (-np.arange(2) / 2)
    a, b2 = x[0, 0, 1, :2], x[0, 0, 1, 2:]
    want = np.concatenate([a * np.cos(t) - b2 * np.sin(t), a * np.sin(t) + b2 * np.cos(t)])
    np.testing.assert_allclose(y[0, 0, 1], want, rtol=1e-5)


def _attn_by_hand(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    causal: bool = False,
    window: int = 0,
    softcap: float = 0.0,
    scale: float = 0.0,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """Loops over every (batch, head, query): an independent, obviously-correct attention."""
    bsz, hq, sq, d = q.shape
    hk, skv = k.shape[1], k.shape[2]
    out = np.zeros((bsz, hq, sq, v.shape[3]))
    for b in range(bsz):
        for h in range(hq):
            kh = h // (hq // hk)
            for i in range(sq):
                p = i + skv - sq
                scores = []
                for j in range(skv):
                    s = float(q[b, h, i] @ k[b, kh, j]) * (scale or 1 / math.sqrt(d))
                    if softcap:
                        s = softcap * math.tanh(s / softcap)
                    visible = (not (causal or window) or j <= p) and (not window or j > p - window)
                    if mask is not None:
                        m = np.broadcast_to(mask, (bsz, hq, sq, skv))[b, h, i, j]
                        visible = visible and bool(m) if mask.dtype == bool else visible
                        s += 0.0 if mask.dtype == bool else float(m)
                    scores.append(s if visible else -math.inf)
                mx = max(scores)
                e = [math.exp(s - mx) for s in scores]
                out[b, h, i] = sum(w * v[b, kh, j] for j, w in enumerate(e)) / sum(e)
    return out


ATTN_CASES = {
    "plain": {},
    "causal_prefill": {"causal": True},
    "causal_decode_with_past": {"causal": True, "sq": 2, "skv": 7},
    "sliding_window": {"causal": True, "sliding_window": 3, "sq": 4, "skv": 9},
    "window_without_causal": {"sliding_window": 2},
    "softcap_scale": {"softcap": 2.0, "scale": 0.9},
    "bool_mask": {"mask": "bool"},
    "float_mask_causal": {"mask": "float", "causal": True},
}


def _attn_inputs(
    case: dict[str, Any], hq: int = 4, hk: int = 2
) -> tuple[list[np.ndarray], dict[str, Any]]:
    sq, skv = case.get("sq", 5), case.get("skv", case.get("sq", 5))
    args = [rand(2, hq, sq, 8, seed=1), rand(2, hk, skv, 8, seed=2), rand(2, hk, skv, 6, seed=3)]
    rng = np.random.default_rng(4)
    if case.get("mask") == "bool":
        m = rng.random((2, 1, sq, skv)) < 0.7
        m[..., 0] = True  # every query keeps a key
        args.append(m)
    elif case.get("mask") == "float":
        args.append(rng.standard_normal((sq, skv)).astype(np.float32))
    attrs = {k: v for k, v in case.items() if k not in ("sq", "skv", "mask")}
    return args, attrs


@pytest.mark.parametrize("case", list(ATTN_CASES))
def test_attention_reference_by_hand(case: str) -> None:
    args, attrs = _attn_inputs(ATTN_CASES[case])
    (y,) = ref("llm.scaled_dot_product_attention", args, **attrs)
    want = _attn_by_hand(
        *args[:3],
        causal=attrs.get("causal", False),
        window=attrs.get("sliding_window", 0),
        softcap=attrs.get("softcap", 0.0),
        scale=attrs.get("scale", 0.0),
        mask=args[3] if len(args) > 3 else None,
    )
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "case", ["plain", "causal_prefill", "softcap_scale", "bool_mask", "float_mask_causal"]
)
def test_attention_matches_onnxruntime(case: str) -> None:
    args, attrs = _attn_inputs(ATTN_CASES[case])
    (y,) = ref("llm.scaled_dot_product_attention", args, **attrs)
    onnx_attrs: dict[str, Any] = {"is_causal": int(attrs.get("causal", False))}
    for key in ("scale", "softcap"):
        if key in attrs:
            onnx_attrs[key] = attrs[key]
    feeds = dict(zip(["Q", "K", "V", "attn_mask"], args))
    want = _ort("Attention", feeds, **onnx_attrs)[0]
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_attention_matches_torch() -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional oracle (pip install torch)")
    f = torch.nn.functional
    q, k, v = rand(2, 6, 3, 8, seed=1), rand(2, 2, 7, 8, seed=2), rand(2, 2, 7, 8, seed=3)
    (y,) = ref("llm.scaled_dot_product_attention", [q, k, v], causal=True)
    keep = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=7 - 3)  # bottom-right aligned
    want = f.scaled_dot_product_attention(
        torch.from_numpy(q),
        torch.from_numpy(k),
        torch.from_numpy(v),
        attn_mask=keep,
        enable_gqa=True,
    )
    np.testing.assert_allclose(y, want.numpy(), rtol=1e-5, atol=1e-6)
    q2 = rand(1, 2, 4, 8, seed=5)
    (y2,) = ref("llm.scaled_dot_product_attention", [q2, q2, q2], causal=True)
    t = torch.from_numpy(q2)
    want2 = f.scaled_dot_product_attention(t, t, t, is_causal=True)  # square: both alignments agree
    np.testing.assert_allclose(y2, want2.numpy(), rtol=1e-5, atol=1e-6)


def test_attention_softmax_eps_and_empty_rows() -> None:
    q, k, v = rand(1, 1, 2, 4), rand(1, 1, 2, 4, seed=1), np.ones((1, 1, 2, 1), np.float32)
    (y,) = ref("llm.scaled_dot_product_attention", [q, k, v], softmax_eps=1.0)
    s = (q[0, 0] @ k[0, 0].T) / 2.0
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(y[0, 0, :, 0], e.sum(-1) / (e.sum(-1) + 1.0), rtol=1e-6)
    (z,) = ref("llm.scaled_dot_product_attention", [rand(1, 1, 3, 4), k, v], causal=True)
    assert np.isnan(z[0, 0, 0]).all() and np.isfinite(z[0, 0, 1:]).all()  # query 0 sees no key


def test_silu_mul_and_gated_mlp_by_hand() -> None:
    g, u = rand(3, 8), rand(3, 8, seed=1)
    (y,) = ref("llm.silu_mul", [g, u])
    np.testing.assert_allclose(y, g / (1 + np.exp(-g)) * u, rtol=1e-6)
    x, wg, wu, wd = rand(2, 3, 8), rand(16, 8, seed=1), rand(16, 8, seed=2), rand(5, 16, seed=3)
    for act, fn in (
        ("silu", lambda t: t / (1 + np.exp(-t))),
        ("gelu", lambda t: 0.5 * t * (1 + np.vectorize(math.erf)(t / math.sqrt(2)))),
        (
            "gelu_tanh",
            lambda t: 0.5 * t * (1 + np.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t**3))),
        ),
    ):
        (y,) = ref("llm.gated_mlp", [x, wg, wu, wd], activation=act)
        xd = x.astype(np.float64)
        want = (fn(xd @ wg.T) * (xd @ wu.T)) @ wd.T
        assert y.shape == (2, 3, 5)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def _kv_type(max_len: int = 8) -> KVCacheType:
    return KVCacheType(2, 2, max_len, 4, DType.f32)


def test_kv_cache_update_and_read_by_hand() -> None:
    t = _kv_type()
    cache = KVCacheValue.empty(t, batch=1)
    k, v = rand(1, 2, 3, 4), rand(1, 2, 3, 4, seed=1)
    i64 = TensorType((), DType.i64)
    kt = TensorType((1, 2, 3, 4), DType.f32)
    (c1,) = ref(
        "llm.kv_cache_update", [cache, k, v, np.array(2, np.int64)], [t, kt, kt, i64], layer=1
    )
    assert isinstance(c1, KVCacheValue)
    assert not cache.keys.any(), "update must not modify its input cache"
    want = np.zeros((2, 1, 2, 8, 4), np.float32)
    want[1, :, :, 2:5] = k
    assert np.array_equal(c1.keys, want)
    keys, values = ref("llm.kv_cache_read", [c1, np.array(5, np.int64)], [t, i64], layer=1)
    assert keys.shape == (1, 2, 5, 4)
    assert np.array_equal(keys[:, :, 2:], k) and np.array_equal(values[:, :, 2:], v)
    assert not keys[:, :, :2].any()
    with pytest.raises(InterpError, match="overflows a cache of max_len 8"):
        ref("llm.kv_cache_update", [cache, k, v, np.array(6, np.int64)], [t, kt, kt, i64], layer=0)
    with pytest.raises(InterpError, match="reading 9 positions"):
        ref("llm.kv_cache_read", [c1, np.array(9, np.int64)], [t, i64], layer=0)
    assert get_op("llm.kv_cache_update").effects  # type: ignore[union-attr]


def test_kv_cache_empty_needs_a_length_when_symbolic() -> None:
    t = KVCacheType(1, 2, SymDim.name("max"), 4, DType.f16)
    with pytest.raises(ValueError, match="symbolic max_len"):
        KVCacheValue.empty(t, batch=1)
    c = KVCacheValue.empty(t, batch=3, max_len=5)
    assert c.keys.shape == (1, 3, 2, 5, 4) and c.keys.dtype == np.float16


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero", ["none", "int"])
def test_quantized_matmul_matches_onnxruntime_matmulnbits(bits: int, zero: str) -> None:
    n, k, block = 6, 64, 32
    x, w = rand(3, k), rand(n, k, seed=1)
    qt = QuantType("nbits", bits, block, DType.f32, zero)
    packed, scales, zp = quantize(w, qt)
    args = [x, packed, scales] + ([zp] if zp is not None else [])
    (y,) = ref("llm.quantized_matmul", args)
    feeds = {
        "A": x,
        "B": packed.data.reshape(n, k // block, block * bits // 8),
        "scales": scales.reshape(-1),
    }
    if zp is not None:
        feeds["zero_points"] = zp.reshape(-1)
    (want,) = _ort(
        "MatMulNBits", feeds, domain="com.microsoft", K=k, N=n, bits=bits, block_size=block
    )
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)


def test_quantized_matmul_gguf_equals_dequantize_then_matmul() -> None:
    x, w = rand(2, 64), rand(5, 64, seed=1)
    packed, _, _ = quantize(w, GGUF_QUANTS["q8_0"])
    (y,) = ref("llm.quantized_matmul", [x, packed])
    (wd,) = ref("llm.dequantize", [packed])
    np.testing.assert_allclose(y, x.astype(np.float64) @ wd.T.astype(np.float64), rtol=1e-5)
    np.testing.assert_allclose(wd, w, atol=np.abs(w).max() / 127)
    (y2,) = ref("llm.quantized_matmul", [rand(2, 5), packed], transpose_b=False)
    assert y2.shape == (2, 64)


# -- reference == decomposition -------------------------------------------------------------------


def _same_numbers(
    name: str,
    arrays: list[Any],
    types: list[Any] | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    **attrs: Any,
) -> None:
    r = ref(name, arrays, types, **attrs)
    d = dec(name, arrays, types, **attrs)
    assert len(r) == len(d)
    for a, b in zip(r, d):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(
            a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True
        )


def test_decompose_embedding() -> None:
    _same_numbers("llm.embedding", [rand(10, 4), np.array([[3, 0, 9]], np.int64)])


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_decompose_rms_norm(dtype: Any) -> None:
    tol = 1e-5 if dtype == np.float32 else 2e-3
    _same_numbers(
        "llm.rms_norm",
        [rand(2, 3, 16, dtype=dtype), rand(16, seed=1, dtype=dtype)],
        rtol=tol,
        atol=tol,
        eps=1e-5,
    )
    _same_numbers(
        "llm.rms_norm",
        [rand(4, 8, dtype=dtype), rand(8, seed=1, dtype=dtype)],
        rtol=tol,
        atol=tol,
        offset=1.0,
    )


@pytest.mark.parametrize("with_bias", [False, True])
def test_decompose_layer_norm(with_bias: bool) -> None:
    args = [rand(2, 5, 12), rand(12, seed=1)] + ([rand(12, seed=2)] if with_bias else [])
    _same_numbers("llm.layer_norm", args)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rd", [0, 4])
def test_decompose_rotary(interleaved: bool, rd: int) -> None:
    args = _rope_inputs(rd=rd)
    types = [
        TensorType((B, 3, S, 8), DType.f32),
        _type_of(args[1]),
        _type_of(args[2]),
        TensorType((B, S), DType.i64),
    ]
    _same_numbers("llm.rotary_embedding", args, types, interleaved=interleaved, rotary_dim=rd)


@pytest.mark.parametrize("case", list(ATTN_CASES) + ["softmax_eps", "mha"])
def test_decompose_attention(case: str) -> None:
    spec = {"softmax_eps": {"softmax_eps": 0.5, "causal": True}, "mha": {"causal": True}}.get(
        case, ATTN_CASES.get(case)
    )
    args, attrs = _attn_inputs(spec, hk=4 if case == "mha" else 2)
    past = SymDim.name("past")
    sq, skv = args[0].shape[2], args[1].shape[2]
    q_seq = S
    kv_seq = dim_add(past, S) if skv != sq else S  # named dims, as a decoder writes them
    types = [
        TensorType((B, args[0].shape[1], q_seq, 8), DType.f32),
        TensorType((B, args[1].shape[1], kv_seq, 8), DType.f32),
        TensorType((B, args[1].shape[1], kv_seq, 6), DType.f32),
    ]
    if len(args) > 3:
        types.append(
            _type_of(args[3]) if args[3].ndim == 4 else TensorType((q_seq, kv_seq), DType.f32)
        )
        if args[3].ndim == 4:
            types[3] = TensorType((B, 1, q_seq, kv_seq), DType.bool)
    _same_numbers("llm.scaled_dot_product_attention", args, types, **attrs)


def test_decompose_attention_f16() -> None:
    args = [
        rand(1, 2, 3, 8, dtype=np.float16),
        rand(1, 1, 3, 8, seed=1, dtype=np.float16),
        rand(1, 1, 3, 8, seed=2, dtype=np.float16),
    ]
    _same_numbers("llm.scaled_dot_product_attention", args, rtol=2e-3, atol=2e-3, causal=True)


def test_decompose_silu_mul() -> None:
    _same_numbers("llm.silu_mul", [rand(3, 8), rand(8, seed=1)])


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_decompose_gated_mlp(act: str) -> None:
    args = [rand(2, 3, 8), rand(16, 8, seed=1), rand(16, 8, seed=2), rand(8, 16, seed=3)]
    types = [TensorType((B, S, 8), DType.f32)] + [_type_of(a) for a in args[1:]]
    _same_numbers("llm.gated_mlp", args, types, rtol=1e-4, activation=act)


@pytest.mark.parametrize("fmt", ["q4_0", "q4_k", "nbits"])
def test_decompose_quantized_matmul(fmt: str) -> None:
    qt = QuantType("nbits", 4, 32, DType.f32, "int") if fmt == "nbits" else GGUF_QUANTS[fmt]
    w = rand(4, 256, seed=1)
    if fmt == "q4_k":
        from tests.unit.test_gguf_blocks import _random_k_blocks

        packed = PackedArray(
            _random_k_blocks(np.random.default_rng(0), "q4_k", 4).reshape(-1), qt, (4, 256)
        )
        extra: list[Any] = []
    else:
        packed, scales, zp = quantize(w, qt)
        extra = [a for a in (scales, zp) if a is not None]
    _same_numbers("llm.quantized_matmul", [rand(2, 256), packed, *extra], rtol=1e-4, atol=1e-4)


def test_every_composite_op_has_a_decomposition() -> None:
    composite = {
        "llm.embedding",
        "llm.rms_norm",
        "llm.layer_norm",
        "llm.rotary_embedding",
        "llm.scaled_dot_product_attention",
        "llm.silu_mul",
        "llm.gated_mlp",
        "llm.quantized_matmul",
        "llm.add_rms_norm",
        "llm.linear",
        "llm.moe",
    }
    assert {n for n in LLM_OPS if all_ops()[n].decompose is not None} == composite


# -- symbolic shape inference -------------------------------------------------------------------------


def test_infer_symbolic_dims() -> None:
    f32 = "f32"
    assert infer(
        "llm.scaled_dot_product_attention",
        [
            f"tensor<?batch x 9 x ?seq x 64 x {f32}>",
            "tensor<?batch x 3 x ?past+?seq x 64 x f32>",
            "tensor<?batch x 3 x ?past+?seq x 32 x f32>",
            "tensor<?batch x 1 x ?seq x ?past+?seq x bool>",
        ],
        causal=True,
    ) == ["tensor<?batch x 9 x ?seq x 32 x f32>"]
    assert infer(
        "llm.rotary_embedding",
        [
            "tensor<?batch x 9 x ?seq x 64 x f16>",
            "tensor<2048x32xf16>",
            "tensor<2048x32xf16>",
            "tensor<?batch x ?seq x i64>",
        ],
    ) == ["tensor<?batch x 9 x ?seq x 64 x f16>"]
    assert infer("llm.embedding", ["tensor<49152x576xbf16>", "tensor<?batch x ?seq x i64>"]) == [
        "tensor<?batch x ?seq x 576 x bf16>"
    ]
    assert infer(
        "llm.gated_mlp",
        [
            "tensor<?batch x ?seq x 64 x f32>",
            "tensor<256x64xf32>",
            "tensor<256x64xf32>",
            "tensor<64x256xf32>",
        ],
    ) == ["tensor<?batch x ?seq x 64 x f32>"]
    assert infer("llm.rms_norm", ["tensor<?batch x ?seq x 64 x f32>", "tensor<64xf32>"]) == [
        "tensor<?batch x ?seq x 64 x f32>"
    ]
    assert infer("llm.silu_mul", ["tensor<?batch x ?seq x 8 x f32>", "tensor<8xf32>"]) == [
        "tensor<?batch x ?seq x 8 x f32>"
    ]
    kv = "!llm.kv_cache<layers=2, kv_heads=3, max_len=?, head_dim=64, dtype=f16>"
    assert infer("llm.kv_cache_read", [kv, "tensor<i64>"], layer=1) == ["tensor<?x3x?x64xf16>"] * 2
    assert infer(
        "llm.kv_cache_update",
        [
            kv,
            "tensor<?batch x 3 x ?seq x 64 x f16>",
            "tensor<?batch x 3 x ?seq x 64 x f16>",
            "tensor<i64>",
        ],
        layer=0,
    ) == [kv]
    assert infer(
        "llm.quantize",
        ["tensor<?rows x 128 x f32>"],
        format=QuantType("nbits", 4, 32, DType.f16, "int"),
    ) == [
        "tensor<?rows x 128 x !quant<nbits, bits=4, block=32, scale=f16, zero=int>>",
        "tensor<?rows x 4 x f16>",
        "tensor<?rows x 2 x u8>",
    ]
    assert infer(
        "llm.quantize", ["tensor<4 x ?k x f32>"], format=QuantType("nbits", 8, 32, DType.f32, "int")
    ) == [
        "tensor<4 x ?k x !quant<nbits, bits=8, block=32, scale=f32, zero=int>>",
        "tensor<4x?xf32>",
        "tensor<4x?xu8>",
    ]
    assert infer("llm.dequantize", ["tensor<?n x 256 x !quant.q6_k>"], dtype=DType.bf16) == [
        "tensor<?n x 256 x bf16>"
    ]
    assert infer(
        "llm.quantized_matmul", ["tensor<?batch x ?seq x 64 x f32>", "tensor<128x64x!quant.q8_0>"]
    ) == ["tensor<?batch x ?seq x 128 x f32>"]
    assert DYN is not None


# -- one verifier error per op ----------------------------------------------------------------------

BAD = {
    "llm.embedding": (
        ("tensor<?batch x ?seq x i64>", "tensor<?batch x ?seq x f32>"),
        "ids must be integers",
    ),
    "llm.rms_norm": (
        ("tensor<64xf32>) ->", "tensor<32xf32>) ->"),
        "weight has 32 elements but x's last dim is 64",
    ),
    "llm.layer_norm": (
        ("tensor<64xf32>) ->", "tensor<64xf16>) ->"),
        "bias has dtype f16, expected f32",
    ),
    "llm.rotary_embedding": (("%pos :", "%pos {rotary_dim = 3} :"), "rotary_dim must be even"),
    "llm.scaled_dot_product_attention": (
        ("tensor<?batch x 9 x ?seq", "tensor<?batch x 8 x ?seq"),
        "q heads (8) must be a multiple of kv heads (3)",
    ),
    "llm.silu_mul": (
        ("-> tensor<?batch x ?seq x 256 x f32>", "-> tensor<?batch x ?seq x 256 x f32>"),
        "up has dtype f16, expected f32",
    ),
    "llm.gated_mlp": (
        ("tensor<64x256xf32>)", "tensor<64x128xf32>)"),
        "w_down takes 128 inputs but the gate gives 256",
    ),
    "llm.moe": (("{top_k = 2}", "{top_k = 9}"), "top_k must be in 1..8, got 9"),
    "llm.kv_cache_update": (
        ("{layer = 0}", "{layer = 2}"),
        "layer 2 is out of range for a cache of 2 layers",
    ),
    "llm.kv_cache_read": (("tensor<i64>)", "tensor<f32>)"), "length must be an integer scalar"),
    "llm.quantize": (("!quant.q4_0}", "!quant.q4_k}"), "quantizing to q4_k is not supported"),
    "llm.dequantize": (
        ("128x64x!quant.q4_0", "128x48x!quant.q4_0"),
        "not a multiple of the q4_0 block (32)",
    ),
    "llm.quantized_matmul": (
        ("x 64 x f32>, tensor<128x64x", "x 32 x f32>, tensor<128x64x"),
        "contraction dims differ: x has 32, the weight 64",
    ),
    "llm.add_rms_norm": (
        ("tensor<64xf32>) ->", "tensor<32xf32>) ->"),
        "weight has 32 elements but x's last dim is 64",
    ),
    "llm.linear": (
        ("tensor<256xf32>) ->", "tensor<128xf32>) ->"),
        "bias has 128 elements but the output has 256",
    ),
    "llm.to_device": (('{device = "cuda"}', "{device = 3}"), "device"),
}


@pytest.mark.parametrize("name", LLM_OPS)
def test_verifier_error(name: str) -> None:
    (old, new), message = BAD[name]
    line = all_ops()[name].example
    if name == "llm.silu_mul":  # make `up` f16 in the signature only
        line = line.replace("x 256 x f32>) ->", "x 256 x f16>) ->")
    else:
        assert old in line, (old, line)
        line = line.replace(old, new, 1)
    if name == "llm.dequantize":
        line = line.replace("tensor<128x64xf32>", "tensor<128x48xf32>")
    diags = verify(parse_module(example_module(line)))
    assert diags, f"{name}: no error for {line}"
    assert diags[0].message.startswith(f"{name}: ")
    assert message in diags[0].message, diags[0].message
    assert diags[0].pos is not None and diags[0].pos.line == 3


def test_attention_mask_must_broadcast() -> None:
    with pytest.raises(Exception, match="does not broadcast to the scores"):
        infer(
            "llm.scaled_dot_product_attention",
            [
                "tensor<1x4x5x8xf32>",
                "tensor<1x2x7x8xf32>",
                "tensor<1x2x7x8xf32>",
                "tensor<5x6xbool>",
            ],
        )


def test_nbits_operands_are_checked() -> None:
    w = "tensor<128x64x!quant<nbits, bits=4, block=32, scale=f32, zero=int>>"
    with pytest.raises(Exception, match="needs its zero_points operand"):
        infer("llm.dequantize", [w, "tensor<128x2xf32>"])
    with pytest.raises(Exception, match="scales has shape"):
        infer("llm.dequantize", [w, "tensor<128x4xf32>", "tensor<128x1xu8>"])
    with pytest.raises(Exception, match="carry their own scales"):
        infer("llm.dequantize", ["tensor<128x64x!quant.q8_0>", "tensor<128x2xf32>"])


# -- the example decoder ----------------------------------------------------------------------------


def test_example_decoder_verifies_runs_and_is_causal() -> None:
    from pathlib import Path

    from llmir_core.ir.parser import parse_file

    path = Path(__file__).resolve().parents[2] / "examples" / "decoder.llmir"
    m = parse_file(str(path))
    assert verify(m) == []
    assert print_module(m) == path.read_text(encoding="utf-8")
    assert len(path.read_text(encoding="utf-8").splitlines()) < 150
    ids = np.random.default_rng(0).integers(0, 128, (2, 6)).astype(np.int64)
    (logits,) = run(m, {"ids": ids})
    assert logits.shape == (2, 6, 128) and logits.dtype == np.float32 and np.isfinite(logits).all()
    assert not np.allclose(logits[0], logits[1])  # different tokens, different logits
    (prefix,) = run(m, {"ids": ids[:, :4]})  # causal: a prefix's logits ignore later tokens
    np.testing.assert_allclose(prefix, logits[:, :4], rtol=1e-5, atol=1e-5)


def test_example_decoder_is_generated_by_its_script() -> None:
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "make_example_decoder", root / "scripts" / "make_example_decoder.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.build() == (root / "examples" / "decoder.llmir").read_text(encoding="utf-8")


def test_quantized_matmul_accuracy_level_range() -> None:
    """accuracy_level (kept from an imported MatMulNBits) is -1..4; anything else is an error."""
    line = all_ops()["llm.quantized_matmul"].example
    ok = line.replace("%s : (", "%s {accuracy_level = 4} : (", 1)
    assert ok != line and verify(parse_module(example_module(ok))) == []
    bad = line.replace("%s : (", "%s {accuracy_level = 7} : (", 1)
    diags = verify(parse_module(example_module(bad)))
    assert diags and "accuracy_level must be -1..4, got 7" in diags[0].message
