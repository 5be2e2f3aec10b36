"""Pads in llmir's attention kernel (ai.llmir GroupQueryAttention, native/attention.c): a row's
leading negative position_ids are pads (serve's mixed prefill + decode steps, left-padded).

Against a float64 numpy attention: rows of different real lengths n_b after different cached
prefixes in one call, rows of pads only, on the prompt (S > 1) and decode (S = 1) code paths,
f32 and int8 caches, rotary or not, sliding window and softcap; the pads' output rows are
zeros, and the KV buffer is written only at each row's real tokens (every other byte as it
was). Skipped where the library cannot be built."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from llmir_core.targets.onnxruntime.native import DOMAIN, register, unavailable_reason
from tests.conftest import requires

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
F32 = np.float32
HEADS, KV, D, CAP = 4, 2, 32, 160


def _session(rotary: bool, kv8: bool, **at: Any) -> Any:
    """One ai.llmir GroupQueryAttention node (packed q|k|v, position_ids always given)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    vi, f = helper.make_tensor_value_info, TensorProto.FLOAT
    cache = TensorProto.INT8 if kv8 else f
    inputs = [
        vi("qkv", f, ["B", "S", (HEADS + 2 * KV) * D]),
        vi("pk", cache, ["B", KV, "L", D]),
        vi("pv", cache, ["B", KV, "L", D]),
        vi("seqlens", TensorProto.INT32, ["B"]),
        vi("total", TensorProto.INT32, []),
        vi("cos", f, [None, None]),
        vi("sin", f, [None, None]),
        vi("pos", TensorProto.INT64, ["B", "S"]),
    ]
    ins = ["qkv", "", "", "pk", "pv", "seqlens", "total"]
    ins += ["cos", "sin", "pos"] if rotary else ["", "", "pos"]
    if rotary:
        at["do_rotary"] = 1
    else:
        inputs = [i for i in inputs if i.name not in ("cos", "sin")]
    if kv8:
        ins += ["", "", "ks", "vs"]
        inputs += [vi("ks", f, None), vi("vs", f, None)]
    node = helper.make_node(
        "GroupQueryAttention", ins, ["out", "pk_out", "pv_out"], domain=DOMAIN,
        num_heads=HEADS, kv_num_heads=KV, **at,
    )  # fmt: skip
    outs = [vi("out", f, None), vi("pk_out", cache, None), vi("pv_out", cache, None)]
    model = helper.make_model(
        helper.make_graph([node], "gqa", inputs, outs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _rotate(x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = cos.shape[1]
    c, s = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
    y = x.astype(np.float64).copy()
    y[..., :half] = x[..., :half] * c - x[..., half : 2 * half] * s
    y[..., half : 2 * half] = x[..., half : 2 * half] * c + x[..., :half] * s
    return y


def _step(  # noqa: ANN202
    rows: list[tuple[int, int]], rotary: bool, kv8: bool, shared: bool = True, **at: Any
):
    """Run one call over rows (cached prefix, real new tokens; for a row of pads only, the
    prefix is its seqlens_k + 1, 0 as llmir's graph computes it) with S = the longest; check it
    against numpy; return (output, keys, values) for more checks."""
    import onnxruntime as ort

    rng = np.random.default_rng(len(rows) * 7 + sum(p + 3 * n for p, n in rows))
    B, S = len(rows), max(max(n for _, n in rows), 1)
    qkv = rng.standard_normal((B, S, (HEADS + 2 * KV) * D)).astype(F32)
    ang = rng.standard_normal((CAP, D // 2)).astype(F32)
    cos, sin = np.cos(ang), np.sin(ang)
    scale = rng.uniform(0.01, 0.04, (1, KV, 1, D)).astype(F32)
    if kv8:  # garbage everywhere: a byte written where it should not be shows
        bufs = [rng.integers(-128, 128, (B, KV, CAP, D)).astype(np.int8) for _ in range(2)]
    else:
        bufs = [rng.standard_normal((B, KV, CAP, D)).astype(F32) for _ in range(2)]
    before = [b.copy() for b in bufs]
    pos = np.full((B, S), -1, np.int64)
    for b, (past, n) in enumerate(rows):
        pos[b, S - n :] = np.arange(past, past + n)
    seqlens = np.array([p + n - 1 for p, n in rows], np.int32)
    feeds: dict[str, np.ndarray] = {
        "qkv": qkv, "seqlens": seqlens, "total": np.array(seqlens.max() + 1, np.int32), "pos": pos,
    }  # fmt: skip
    if rotary:
        feeds["cos"], feeds["sin"] = cos, sin
    if kv8:
        feeds["ks"], feeds["vs"] = scale, scale
    sess = _session(rotary, kv8, **at)
    io = sess.io_binding()
    io.bind_output("out")
    for k, v in feeds.items():
        io.bind_cpu_input(k, np.ascontiguousarray(v))
    for name, buf in zip(("pk", "pv"), bufs):
        if shared:  # llmir's runtime: past and present are one buffer, written in place
            val = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(name, val)
            io.bind_ortvalue_output(name + "_out", val)
        else:
            io.bind_cpu_input(name, buf)
            io.bind_output(name + "_out")
    sess.run_with_iobinding(io)
    got = io.copy_outputs_to_cpu()
    out = got[0]
    keys, vals = bufs if shared else got[1:3]
    assert keys.shape == before[0].shape
    if not shared:  # present: the past rows copied, zeros after (a pads-only row: all copied)
        for old in before:
            for b, (past, n) in enumerate(rows):
                old[b, :, past if n else CAP :] = 0
    _check(rows, S, qkv, out, keys, vals, before, cos, sin, scale, rotary, kv8, **at)
    return out, keys, vals


def _check(  # long: one numpy reference of the whole call, row by row
    rows: list[tuple[int, int]],
    S: int,
    qkv: np.ndarray,
    out: np.ndarray,
    keys: np.ndarray,
    vals: np.ndarray,
    before: list[np.ndarray],
    cos: np.ndarray,
    sin: np.ndarray,
    scale: np.ndarray,
    rotary: bool,
    kv8: bool,
    softcap: float = 0.0,
    local_window_size: int = 0,
) -> None:
    G = HEADS // KV
    for b, (past, n) in enumerate(rows):
        x = qkv[b].reshape(S, HEADS + 2 * KV, D).astype(np.float64)
        k_ref = before[0][b].astype(np.float64).copy()
        v_ref = before[1][b].astype(np.float64).copy()
        for i in range(n):
            s = S - n + i
            k = x[s, HEADS : HEADS + KV]
            k = _rotate(k, past + i, cos, sin) if rotary else k
            v = x[s, HEADS + KV :]
            if kv8:  # stored as codes x * (1/s) rounded half to even, saturated
                sc = scale[0, :, 0]
                k_ref[:, past + i] = np.clip(np.rint(k.astype(F32) * (F32(1) / sc)), -128, 127)
                v_ref[:, past + i] = np.clip(np.rint(v.astype(F32) * (F32(1) / sc)), -128, 127)
            else:
                k_ref[:, past + i], v_ref[:, past + i] = k, v
        written = np.zeros(CAP, bool)
        written[past : past + n] = True  # nothing for a row of pads
        for got, ref, old in ((keys[b], k_ref, before[0][b]), (vals[b], v_ref, before[1][b])):
            assert np.array_equal(got[:, ~written], old[:, ~written]), f"row {b}: a stray write"
            tol = 1.0 if kv8 else 1e-5  # int8: a code one off where rotation rounds differently
            diff = np.abs(got[:, written].astype(np.float64) - ref[:, written])
            assert diff.max(initial=0) <= tol
        # attention over what the kernel stored (int8: f32(code) * s)
        kf = keys[b].astype(np.float64) * (scale[0, :, 0, None] if kv8 else 1)
        vf = vals[b].astype(np.float64) * (scale[0, :, 0, None] if kv8 else 1)
        want = np.zeros((S, HEADS, D))
        for i in range(n):
            s, p = S - n + i, past + i
            lo = max(0, p + 1 - local_window_size) if local_window_size > 0 else 0
            q = x[s, :HEADS]
            q = _rotate(q, p, cos, sin) if rotary else q
            for h in range(HEADS):
                sc = kf[h // G, lo : p + 1] @ q[h] / np.sqrt(D)
                if softcap:
                    sc = softcap * np.tanh(sc / softcap)
                w = np.exp(sc - sc.max())
                want[s, h] = (w / w.sum()) @ vf[h // G, lo : p + 1]
        assert np.abs(out[b] - want.reshape(S, HEADS * D)).max() <= 2e-5, f"row {b}"


CASES = [  # (cached prefix, real tokens) per row: S = the longest
    [(10, 6), (3, 2), (0, 0), (70, 1), (0, 4), (90, 5)],  # prompt path, a row of pads only
    [(0, 4), (1, 3), (2, 1), (0, 0)],  # S == total_sequence_length: not a first prompt
    [(5, 1), (0, 0), (130, 1), (64, 1), (9, 0)],  # decode path (S = 1), key chunks; pads
    [(0, 0), (0, 0)],  # nothing to do at all
]
IDS = ["prompt", "prompt-from-0", "decode", "all-pads"]


@needs_kernel
@pytest.mark.parametrize("rows", CASES, ids=IDS)
@pytest.mark.parametrize("kv8", [False, True], ids=["f32", "int8"])
@pytest.mark.parametrize("rotary", [True, False], ids=["rotary", "plain"])
def test_pads_match_numpy(rows: list[tuple[int, int]], kv8: bool, rotary: bool) -> None:
    out, _, _ = _step(rows, rotary, kv8)
    S = out.shape[1]
    for b, (_, n) in enumerate(rows):
        assert not out[b, : S - n].any(), f"row {b}: a pad's output is not zero"


@needs_kernel
@pytest.mark.parametrize("rows", CASES[:3], ids=IDS[:3])
def test_pads_with_window_and_softcap(rows: list[tuple[int, int]]) -> None:
    _step(rows, True, False, softcap=20.0, local_window_size=7)
    _step(rows, True, True, local_window_size=70)


@needs_kernel
def test_pads_with_separate_present_buffers() -> None:
    """Past and present separate: the real rows' pasts are copied, a pads-only row's whole."""
    _step([(10, 3), (20, 0), (4, 1)], True, False, shared=False)


@needs_kernel
def test_a_pad_after_a_real_token_is_refused() -> None:
    sess = _session(False, False)
    feeds = {
        "qkv": np.zeros((1, 3, (HEADS + 2 * KV) * D), F32),
        "pk": np.zeros((1, KV, 8, D), F32),
        "pv": np.zeros((1, KV, 8, D), F32),
        "seqlens": np.array([1], np.int32),
        "total": np.array(2, np.int32),
        "pos": np.array([[0, -1, 1]], np.int64),
    }
    with pytest.raises(Exception, match="a pad .negative position_id. after a real token"):
        sess.run(None, feeds)
