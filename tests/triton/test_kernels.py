"""Every Triton kernel under TRITON_INTERPRET=1 on CPU torch tensors, against the reference
semantics of the llmir op it implements (llmir_core.dialects declarations)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import import_or_skip

torch = import_or_skip("torch", "the triton kernels need torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton kernels need triton (pip install 'llmir[gpu]')")

from llmir_core.targets.triton.kernels import (  # noqa: E402
    decode_attention,
    embedding,
    kv_cache,
    matmul,
    norm,
    prefill_attention,
    quant_matmul,
    rotary,
    sampling,
)

from .helpers import TOL, TORCH, assert_elementwise, max_err, np32, rand, ref  # noqa: E402


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_embedding(dt: str) -> None:
    table = rand((37, 24), dt)
    ids = torch.tensor([[3, 36, 0], [5, 5, 17]])
    got = embedding.embedding(table, ids)
    np.testing.assert_array_equal(np32(got), ref("llm.embedding", [np32(table), ids.numpy()]))


@pytest.mark.parametrize(
    "dt,res,offset", [("f32", False, 0.0), ("f32", True, 1.0), ("bf16", True, 0.0)]
)
def test_rms_norm(dt: str, res: bool, offset: float) -> None:
    x, r, w = rand((3, 40), dt, 1), rand((3, 40), dt, 2), rand((40,), dt, 3)
    y, s = norm.rms_norm(x, w, r if res else None, eps=1e-5, offset=offset)
    if res:
        want, want_sum = ref(
            "llm.add_rms_norm", [np32(x), np32(r), np32(w)], eps=1e-5, offset=offset
        )
        assert max_err(np32(s), want_sum) < TOL[dt]  # the interpreter may round bf16 differently
        want = ref("llm.rms_norm", [np32(s), np32(w)], eps=1e-5, offset=offset)
    else:
        want = ref("llm.rms_norm", [np32(x), np32(w)], eps=1e-5, offset=offset)
    assert max_err(np32(y), want) < TOL[dt]


def _rms64(s: np.ndarray, w: np.ndarray, eps: float, offset: float) -> np.ndarray:
    s64 = s.astype(np.float64)
    return s64 / np.sqrt((s64 * s64).mean(-1, keepdims=True) + eps) * (w + offset)


@pytest.mark.parametrize("eps", [1e-2, 1e-6])
@pytest.mark.parametrize("res,offset", [(False, 0.0), (True, 1.0)])
def test_rms_norm_edge_rows(eps: float, res: bool, offset: float) -> None:
    """All-zero, tiny (1e-20), huge (1e16) and eps-sized rows, element by element against
    float64: eps decides the tiny rows and half of the eps-sized ones."""
    x = rand((6, 40), "f32", 31)
    x[0] = 0.0
    x[1] *= 1e-20
    x[2] *= 1e16
    x[3] *= eps**0.5
    x[4] *= eps**0.5 / 10
    r, w = rand((6, 40), "f32", 32) * x.abs().amax(-1, keepdim=True), rand((40,), "f32", 33)
    y, s = norm.rms_norm(x, w, r if res else None, eps=eps, offset=offset)
    want_sum = np32(x) + np32(r) if res else np32(x)
    if res:
        np.testing.assert_array_equal(np32(s), want_sum)
    assert_elementwise(np32(y), _rms64(want_sum, np32(w).astype(np.float64), eps, offset), 2e-6)


@pytest.mark.parametrize(
    "interleaved,rd,pos_batch", [(False, 0, 2), (True, 0, 1), (False, 6, 1), (True, 6, 2)]
)
def test_rotary(interleaved: bool, rd: int, pos_batch: int) -> None:
    x = rand((2, 3, 5, 10), "f32", 4)
    half = (rd or 10) // 2
    cos, sin = rand((20, half), "f32", 5), rand((20, half), "f32", 6)
    pos = torch.tensor([[7, 8, 9, 10, 11], [0, 2, 4, 6, 19]])[:pos_batch]
    got = rotary.rotary(x, cos, sin, pos, interleaved=interleaved, rotary_dim=rd)
    want = ref(
        "llm.rotary_embedding",
        [np32(x), np32(cos), np32(sin), pos.numpy()],
        interleaved=interleaved,
        rotary_dim=rd,
    )
    assert max_err(np32(got), want) < TOL["f32"]
    # in place on a strided view (the heads of a [B, S, H, D] projection)
    y = x.transpose(1, 2).contiguous().transpose(1, 2)
    rotary.rotary(y, cos, sin, pos, interleaved=interleaved, rotary_dim=rd, out=y)
    assert max_err(np32(y), want) < TOL["f32"]


@pytest.mark.parametrize(
    "dt,rows,act,gated,bias",
    [
        ("f32", 1, "none", False, True),
        ("f16", 2, "silu", True, False),
        ("f32", 7, "gelu_tanh", True, False),
        ("bf16", 9, "relu", False, True),
        ("f32", 6, "gelu", False, False),
    ],
)
def test_matmul(dt: str, rows: int, act: str, gated: bool, bias: bool) -> None:
    x, w, wu, b = (
        rand((rows, 40), dt, 7),
        rand((19, 40), dt, 8, 0.2),
        rand((19, 40), dt, 9, 0.2),
        rand((19,), dt, 10),
    )
    got = matmul.matmul(x, w, b if bias else None, w_up=wu if gated else None, activation=act)
    args = [np32(x), np32(w)] + ([np32(b)] if bias else [])
    want = ref("llm.linear", args, activation=act).astype(np.float64)
    if gated:
        want = want * ref("llm.linear", [np32(x), np32(wu)])
    assert max_err(np32(got), want) < 2 * TOL[dt]


def _act64(y: np.ndarray, act: str) -> np.ndarray:
    from math import erf

    if act == "silu":
        return y / (1.0 + np.exp(-y))
    if act == "gelu":
        return 0.5 * y * (1.0 + np.vectorize(erf)(y / np.sqrt(2.0)))
    if act == "gelu_tanh":
        return 0.5 * y * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (y + 0.044715 * y**3)))
    return np.maximum(y, 0.0) if act == "relu" else y


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("rows", [2, 40])  # the GEMV and the tiled kernel
def test_matmul_activations_per_element(act: str, rows: int) -> None:
    """x @ I^T is exact, so each epilogue is seen alone, element by element against float64 over
    [-6, 6] (gated: act(x) * x)."""
    x = torch.linspace(-6.0, 6.0, rows * 32).reshape(rows, 32)
    eye = torch.eye(32)
    for gated in (False, True):
        got = matmul.matmul(x, eye, None, w_up=eye if gated else None, activation=act)
        x64 = np32(x).astype(np.float64)
        want = _act64(x64, act) * (x64 if gated else 1.0)
        # 1 + tanh(z) cancels in f32 for z << 0: an absolute error of about ulp(1) |x| (|x|)
        assert_elementwise(
            np32(got), want, 1e-5, 1e-6 * np.abs(x64) * (np.abs(x64) if gated else 1)
        )


def _gguf_rows(scheme: str, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    gguf = import_or_skip("gguf", "the gguf package writes the blocks")
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    qt = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[scheme]
    raw = gguf.quants.quantize(w, qt)
    from llmir_core.quant.gguf_blocks import dequantize

    return raw, dequantize(raw, scheme, (n, k))


@pytest.mark.parametrize("scheme,rows", [("q8_0", 1), ("q4_0", 2), ("q4_0", 6), ("q8_0", 5)])
def test_gguf_quant_matmul(scheme: str, rows: int) -> None:
    n, k = 24, 96
    raw, wd = _gguf_rows(scheme, n, k, 11)
    codes, scales = quant_matmul.repack_gguf(raw, scheme, n, k)
    bits = 8 if scheme == "q8_0" else 4
    x = rand((rows, k), "f32", 12)
    got = quant_matmul.q_matmul(
        x, torch.from_numpy(codes), torch.from_numpy(scales), bits=bits, qblock=32, gguf_order=True
    )
    want = np32(x).astype(np.float64) @ wd.astype(np.float64).T
    assert max_err(np32(got), want) < TOL["f32"]


def test_nbits_quant_matmul() -> None:
    from llmir_core.quant import nbits

    n, k = 16, 64
    w = np.random.default_rng(13).standard_normal((n, k)).astype(np.float32)
    for bits in (4, 8):
        codes, scales, _ = nbits.quantize(w, bits, 32, True, np.float32)
        wd = nbits.dequantize(codes, scales, None, bits, 32, (n, k))
        c, s = quant_matmul.repack_nbits(codes, scales, bits, n, k)
        x = rand((1, k), "f32", 14)
        got = quant_matmul.q_matmul(
            x,
            torch.from_numpy(c),
            torch.from_numpy(s),
            bits=bits,
            qblock=32,
            gguf_order=False,
            activation="silu",
        )
        want = ref("llm.linear", [np32(x), wd.astype(np.float32)], activation="silu")
        assert max_err(np32(got), want) < TOL["f32"]


@pytest.mark.parametrize("dt", ["f16", "int8"])
def test_kv_append(dt: str) -> None:
    new = rand((2, 3, 4, 10), "f32", 15)
    new[0, 1, 2] = 0.0  # an all-zero row: scale 1
    pos = torch.tensor([[5, 6, 7, 8]])
    cap = 12
    cache = torch.zeros((2, 3, cap, 10), dtype=torch.int8 if dt == "int8" else torch.float16)
    scales = torch.zeros((2, 3, cap)) if dt == "int8" else None
    kv_cache.kv_append(new, pos, cache, scales)
    if dt == "int8":
        x = np32(new).astype(np.float32)
        amax = np.abs(x).max(-1, keepdims=True)
        s = np.where(amax == 0, np.float32(1), amax / np.float32(127)).astype(np.float32)
        np.testing.assert_array_equal(np32(scales)[:, :, 5:9], s[..., 0])
        np.testing.assert_array_equal(cache.numpy()[:, :, 5:9], np.rint(x / s).astype(np.int8))
        assert not cache[:, :, :5].any() and not cache[:, :, 9:].any()
    else:
        np.testing.assert_array_equal(np32(cache[:, :, 5:9]), np32(new.half()))


def test_kv_append_rounds_half_to_even() -> None:
    """amax 127 gives scale 1: the halves in the row round to even, as numpy's rint does."""
    row = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -126.5, 0.0])
    cache = torch.zeros((1, 1, 4, 10), dtype=torch.int8)
    scales = torch.zeros((1, 1, 4))
    kv_cache.kv_append(row.reshape(1, 1, 1, 10), torch.tensor([[2]]), cache, scales)
    assert float(scales[0, 0, 2]) == 1.0
    assert cache[0, 0, 2].tolist() == np.rint(row.numpy()).astype(int).tolist()


def _cache(b: int, hkv: int, cap: int, d: int, dt: str, seed: int) -> tuple:
    """(cache, scales, dequantized f32 numpy) for a random cache in dtype dt (int8: quantized)."""
    x = rand((b, hkv, cap, d), "f32", seed)
    if dt != "int8":
        c = x.to(TORCH[dt])
        return c, None, np32(c)
    xf = np32(x)  # the kv-cache-int8 rule (test_kv_append checks the kernel writes exactly this)
    s = np.abs(xf).max(-1) / np.float32(127)
    c = np.rint(xf / s[..., None]).astype(np.int8)
    return torch.from_numpy(c), torch.from_numpy(s), c.astype(np.float32) * s[..., None]


@pytest.mark.parametrize(
    "dt,hq,hkv,p,window,softcap,split_k,scale",
    [
        ("f32", 4, 4, 36, 0, 0.0, 3, 0.0),
        ("f16", 6, 2, 20, 0, 0.0, 2, 0.0),
        ("f32", 8, 2, 41, 7, 0.0, 4, 0.0),
        ("f32", 3, 1, 9, 0, 5.0, 1, 0.0),
        ("int8", 4, 2, 30, 0, 0.0, 2, 0.0),
        ("f32", 6, 2, 40, 5, 3.0, 3, 0.6),  # every attribute at once
    ],
)
def test_decode_attention(
    dt: str, hq: int, hkv: int, p: int, window: int, softcap: float, split_k: int, scale: float
) -> None:
    b, d, cap = 2, 16, 48
    qdt = "f32" if dt == "int8" else dt
    q = rand((b, hq, 1, d), qdt, 16)
    k, ks, kf = _cache(b, hkv, cap, d, dt, 17)
    v, vs, vf = _cache(b, hkv, cap, d, dt, 18)
    pos = torch.tensor([[p], [p - 3]])
    got = decode_attention.decode_attention(
        q,
        k,
        v,
        pos,
        k_scales=ks,
        v_scales=vs,
        scale=scale,
        softcap=softcap,
        window=window,
        split_k=split_k,
        block_n=16,
    )
    for i in range(b):
        n = int(pos[i, 0]) + 1
        want = ref(
            "llm.scaled_dot_product_attention",
            [np32(q[i : i + 1]), kf[i : i + 1, :, :n], vf[i : i + 1, :, :n]],
            causal=True,
            sliding_window=window,
            softcap=softcap,
            scale=scale,
        )
        assert max_err(np32(got[i : i + 1]), want) < (TOL[qdt] if dt != "int8" else 2e-5)


@pytest.mark.parametrize(
    "dt,hq,hkv,sq,past,window,softcap,causal,scale",
    [
        ("f32", 4, 2, 13, 5, 0, 0.0, True, 0.0),
        ("f16", 2, 2, 17, 0, 0, 0.0, True, 0.0),
        ("f32", 3, 1, 9, 4, 4, 20.0, True, 0.0),
        ("f32", 2, 1, 5, 3, 0, 0.0, False, 0.0),
        ("int8", 2, 1, 7, 2, 0, 0.0, True, 0.0),
        ("f32", 6, 2, 20, 3, 6, 3.0, True, 0.6),  # every attribute at once, 2 query tiles
    ],
)
def test_prefill_attention(
    dt: str,
    hq: int,
    hkv: int,
    sq: int,
    past: int,
    window: int,
    softcap: float,
    causal: bool,
    scale: float,
) -> None:
    b, d, cap = 1, 16, 40
    qdt = "f32" if dt == "int8" else dt
    q = rand((b, hq, sq, d), qdt, 19)
    k, ks, kf = _cache(b, hkv, cap, d, dt, 20)
    v, vs, vf = _cache(b, hkv, cap, d, dt, 21)
    n = past + sq
    got = prefill_attention.prefill_attention(
        q,
        k,
        v,
        n,
        k_scales=ks,
        v_scales=vs,
        causal=causal,
        scale=scale,
        window=window,
        softcap=softcap,
        block_m=16,
        block_n=16,
    )
    want = ref(
        "llm.scaled_dot_product_attention",
        [np32(q), kf[:, :, :n], vf[:, :, :n]],
        causal=causal,
        sliding_window=window,
        softcap=softcap,
        scale=scale,
    )
    assert max_err(np32(got), want) < (2 * TOL[qdt] if dt != "int8" else 2e-5)


def test_argmax_first_of_ties() -> None:
    x = rand((3, 50), "f32", 22)
    x[1, 7] = x[1, 33] = 100.0
    got = sampling.argmax(x, block_v=16)
    assert got.tolist() == [int(np.argmax(np32(x[0]))), 7, int(np.argmax(np32(x[2])))]


def _inverse_cdf(logits: np.ndarray, u: float, temperature: float, top_k: int, top_p: float) -> int:
    """llmir's Sampler kept set (runtime/sampling.py), drawn by inverse CDF in index order."""
    x = logits.astype(np.float64) / temperature
    if 0 < top_k < x.size:
        kth = np.partition(x, -top_k)[-top_k]
        x[x < kth] = -np.inf
    p = np.exp(x - x.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < top_p
        mask = np.zeros_like(p, dtype=bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0.0)
    c = np.cumsum(p) / p.sum()
    return int(np.searchsorted(c, u, side="right"))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 5, 1.0), (0.9, 8, 0.6)])
def test_sample(temperature: float, top_k: int, top_p: float) -> None:
    x = rand((1, 41), "f32", 23)
    x[0, 30] = x[0, 3] = x[0].max()  # a tie at the top
    us = [0.05, 0.5, 0.97]
    got = sampling.sample(
        x.expand(len(us), -1),
        torch.tensor(us),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        block_v=64,
    )
    assert got.tolist() == [_inverse_cdf(np32(x[0]), u, temperature, top_k, top_p) for u in us]
