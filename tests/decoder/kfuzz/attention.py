"""Hostile cases of llmir's GroupQueryAttention (attention.c, f32 and int8 caches) and its
numpy reference, written against the node's onnxruntime interface."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import F32, F64, Call, Case, Feeds, Scenario, _f, _graph

# -- attention -----------------------------------------------------------------------------------

GQA_IN = [
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale",
    "qkv_bias",
]  # fmt: skip


def _gqa_types(kv8: bool) -> dict[str, int]:
    from onnx import TensorProto as T

    t = {n: T.FLOAT for n in GQA_IN}
    t["seqlens_k"] = t["total_sequence_length"] = T.INT32
    t["position_ids"] = T.INT64
    if kv8:
        t["past_key"] = t["past_value"] = T.INT8
    return t


def _rotate(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pos: int, interleaved: bool
) -> np.ndarray:
    half = cos.shape[1]
    c, s = _f(cos[pos]), _f(sin[pos])
    y = x.copy()
    if interleaved:
        x1, x2 = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
        y[..., 0 : 2 * half : 2], y[..., 1 : 2 * half : 2] = x1 * c - x2 * s, x2 * c + x1 * s
    else:
        x1, x2 = x[..., :half], x[..., half : 2 * half]
        y[..., :half], y[..., half : 2 * half] = x1 * c - x2 * s, x2 * c + x1 * s
    return y


def _gqa_ref(at: dict[str, Any]) -> Callable[[Feeds], list[np.ndarray]]:
    """com.microsoft GroupQueryAttention as llmir's kernel documents it (attention.c's header),
    in float64: the past rows up to each row's past length (the rest of present zero), the new
    rows (rotated, int8-rounded) after them, causal attention over each row's keys."""
    from llmir_core.targets.onnxruntime.dialect import kv_int8_codes

    H, Hkv = at["num_heads"], at["kv_num_heads"]
    scale_at, cap = at.get("scale", 0.0), at.get("softcap", 0.0)
    rotary, inter = at.get("do_rotary", 0), at.get("rotary_interleaved", 0)
    window = at.get("local_window_size", -1)

    def ref(f: Feeds) -> list[np.ndarray]:
        qkv = _f(f["query"])
        B, S, W = qkv.shape
        packed = "key" not in f
        D = W // (H + 2 * Hkv) if packed else W // H
        if "qkv_bias" in f:
            qkv = qkv + _f(f["qkv_bias"])
        if packed:
            q, k, v = qkv[..., : H * D], qkv[..., H * D : (H + Hkv) * D], qkv[..., (H + Hkv) * D :]
        else:
            q, k, v = qkv, _f(f["key"]), _f(f["value"])
        q, k, v = q.reshape(B, S, H, D), k.reshape(B, S, Hkv, D), v.reshape(B, S, Hkv, D)
        pk_in, pv_in = f.get("past_key"), f.get("past_value")
        Lp = 0 if pk_in is None else pk_in.shape[2]
        seq = f["seqlens_k"].astype(np.int64)
        total = int(f["total_sequence_length"].reshape(-1)[0])
        first = S > 1 and S == total
        P = max(Lp, total)
        kv8 = "k_scale" in f
        dt = np.int8 if kv8 else F32
        pk, pv = np.zeros((B, Hkv, P, D), dt), np.zeros((B, Hkv, P, D), dt)
        out = np.zeros((B, S, H, D))
        ks = _kv_scale(f["k_scale"], Hkv, D) if kv8 else None  # [Hkv or 1, D or 1]
        vs = _kv_scale(f["v_scale"], Hkv, D) if kv8 else None
        scale = scale_at if scale_at > 0 else 1.0 / np.sqrt(D)
        for b in range(B):
            past = 0 if first else int(seq[b]) + 1 - S
            tot = int(seq[b]) + 1
            keep = min(past, Lp)
            if pk_in is not None:
                pk[b, :, :keep], pv[b, :, :keep] = pk_in[b, :, :keep], pv_in[b, :, :keep]  # type: ignore[index]
            qr = np.zeros((S, H, D))
            for s in range(S):
                pos = int(f["position_ids"][b, s]) if "position_ids" in f else past + s
                kr, qs = k[b, s], q[b, s]
                if rotary:
                    kr = _rotate(kr, f["cos_cache"], f["sin_cache"], pos, bool(inter))
                    qs = _rotate(qs, f["cos_cache"], f["sin_cache"], pos, bool(inter))
                qr[s] = qs
                if kv8:
                    pk[b, :, past + s] = kv_int8_codes(kr.astype(F32), ks.astype(F32))  # type: ignore[union-attr]
                    pv[b, :, past + s] = kv_int8_codes(v[b, s].astype(F32), vs.astype(F32))  # type: ignore[union-attr]
                else:
                    pk[b, :, past + s], pv[b, :, past + s] = kr, v[b, s]
            ka = _f(pk[b]) * (ks[:, None, :] if ks is not None else 1.0)
            va = _f(pv[b]) * (vs[:, None, :] if vs is not None else 1.0)
            for s in range(S):
                n = min(past + s + 1, tot)
                k0 = n - window if window > 0 and n > window else 0
                for h in range(H):
                    kh = h // (H // Hkv)
                    sc = ka[kh, k0:n] @ (qr[s, h] * scale)
                    if cap > 0:
                        sc = cap * np.tanh(sc / cap)
                    p = np.exp(sc - sc.max())
                    out[b, s, h] = (p / p.sum()) @ va[kh, k0:n]
        return [out.reshape(B, S, H * D).astype(F32), pk, pv]

    return ref


def _kv_scale(a: np.ndarray, hkv: int, d: int) -> np.ndarray:
    return _f(a).reshape(hkv, d) if a.size > 1 else _f(a).reshape(1, 1)


@dataclass
class GqaSpec:
    B: int = 1
    S: int = 4
    H: int = 4
    Hkv: int = 2
    D: int = 16
    Lp: int = 0  # past rows (0: no past inputs)
    seqlens: list[int] | None = None  # default: Lp + S - 1 (decode) / S - 1 (prompt)
    total: int | None = None
    packed: bool = False
    bias: bool = False
    rotary: int = 0  # rotary_dim (0: off)
    interleaved: bool = False
    pos_ids: bool = False
    kv8: str = ""  # "" | "tensor" | "channel"
    attrs: dict[str, Any] = field(default_factory=dict)


def _gqa_feeds(sp: GqaSpec, rng: np.random.Generator) -> Feeds:
    B, S, H, Hkv, D = sp.B, sp.S, sp.H, sp.Hkv, sp.D
    f: Feeds = {}
    if sp.packed:
        f["query"] = rng.standard_normal((B, S, (H + 2 * Hkv) * D)).astype(F32)
    else:
        f["query"] = rng.standard_normal((B, S, H * D)).astype(F32)
        f["key"] = rng.standard_normal((B, S, Hkv * D)).astype(F32)
        f["value"] = rng.standard_normal((B, S, Hkv * D)).astype(F32)
    if sp.bias:
        f["qkv_bias"] = rng.standard_normal(((H + 2 * Hkv) * D,)).astype(F32)
    if sp.Lp:
        if sp.kv8:
            f["past_key"] = rng.integers(-127, 128, (B, Hkv, sp.Lp, D)).astype(np.int8)
            f["past_value"] = rng.integers(-127, 128, (B, Hkv, sp.Lp, D)).astype(np.int8)
        else:
            f["past_key"] = rng.standard_normal((B, Hkv, sp.Lp, D)).astype(F32)
            f["past_value"] = rng.standard_normal((B, Hkv, sp.Lp, D)).astype(F32)
    seq = sp.seqlens if sp.seqlens is not None else [sp.Lp + S - 1 if sp.Lp else S - 1] * B
    f["seqlens_k"] = np.asarray(seq, np.int32)
    total = sp.total if sp.total is not None else (max(seq) + 1 if seq else S)
    f["total_sequence_length"] = np.asarray(total, np.int32)
    if sp.rotary:
        f["cos_cache"] = rng.standard_normal((64, sp.rotary // 2)).astype(F32)
        f["sin_cache"] = rng.standard_normal((64, sp.rotary // 2)).astype(F32)
        if sp.pos_ids:
            f["position_ids"] = rng.integers(0, 64, (B, S)).astype(np.int64)
    if sp.kv8 == "tensor":
        f["k_scale"], f["v_scale"] = np.asarray([0.02], F32), np.asarray([0.03], F32)
    elif sp.kv8 == "channel":
        f["k_scale"] = rng.uniform(0.01, 0.05, (1, Hkv, 1, D)).astype(F32)
        f["v_scale"] = rng.uniform(0.01, 0.05, (1, Hkv, 1, D)).astype(F32)
    return f


def _gqa_scenario(
    rng: np.random.Generator,
    specs: list[tuple[GqaSpec, str]],
    edit: Callable[[Feeds], Feeds] | None = None,
    alias: dict[str, str] | None = None,
) -> Scenario:
    sp0 = specs[0][0]
    at = {"num_heads": sp0.H, "kv_num_heads": sp0.Hkv, **sp0.attrs}
    if sp0.rotary:
        at["do_rotary"] = 1
        at["rotary_interleaved"] = int(sp0.interleaved)
    calls = []
    present: set[str] = set()
    for sp, want in specs:
        f = _gqa_feeds(sp, rng)
        if edit:
            f = edit(f)
        present |= set(f)
        calls.append(Call(f, want, dict(alias or {})))
    for c in calls:  # a graph input every call feeds: a past of no rows where a call has none
        for key in ("past_key", "past_value"):
            if key in present and key not in c.feeds:
                q = c.feeds["query"]
                hkv, d = sp0.Hkv, specs[0][0].D
                c.feeds[key] = np.zeros((q.shape[0], hkv, 0, d), np.int8 if sp0.kv8 else F32)
    types = _gqa_types(bool(sp0.kv8))
    ins = [(n, types[n]) if n in present else ("", 0) for n in GQA_IN]
    while ins and not ins[-1][0]:
        ins.pop()
    kv = {"present_key": types["past_key"], "present_value": types["past_value"]}
    graph = _graph(
        "GroupQueryAttention", ins, ["out", "present_key", "present_value"], at, out_types=kv
    )
    return Scenario(graph, calls, _gqa_ref(at), 2e-5, 1)


def _gqa_cases() -> list[Case]:
    def sc(
        *specs: tuple[GqaSpec, str],
        edit: Callable[[Feeds], Feeds] | None = None,
        alias: dict[str, str] | None = None,
    ) -> Callable[[np.random.Generator], Scenario]:
        return lambda rng: _gqa_scenario(rng, list(specs), edit, alias)

    def put(key: str, value: Any) -> Callable[[Feeds], Feeds]:
        return lambda f: {**f, key: np.asarray(value, f[key].dtype if key in f else F32)}

    def drop(key: str) -> Callable[[Feeds], Feeds]:
        return lambda f: {k: v for k, v in f.items() if k != key}

    def nan(key: str, v: float) -> Callable[[Feeds], Feeds]:
        def e(f: Feeds) -> Feeds:
            a = f[key].copy()
            a.reshape(-1)[3] = v
            return {**f, key: a}

        return e

    G = GqaSpec
    dec = G(S=1, Lp=7)
    cases: list[tuple[str, Callable[[np.random.Generator], Scenario]]] = [
        ("valid-prompt", sc((G(), "ref"))),
        ("valid-decode", sc((dec, "ref"))),
        ("valid-packed", sc((G(packed=True, S=1, Lp=5), "ref"))),
        ("valid-packed-bias", sc((G(packed=True, bias=True), "ref"))),
        ("valid-rotary", sc((G(rotary=16, S=1, Lp=3), "ref"))),
        ("valid-rotary-interleaved", sc((G(rotary=8, interleaved=True), "ref"))),
        ("valid-position-ids", sc((G(rotary=16, pos_ids=True), "ref"))),
        (
            "valid-window-softcap",
            sc((G(S=1, Lp=100, attrs={"local_window_size": 5, "softcap": 2.0}), "ref")),
        ),
        ("valid-batch-ragged", sc((G(B=3, S=1, Lp=9, seqlens=[2, 9, 5]), "ref"))),
        (
            "past-grows-and-shrinks",
            sc(
                (G(S=1, Lp=3), "ref"),
                (G(S=1, Lp=300), "ref"),
                (G(S=1, Lp=1), "ref"),
                (G(S=5), "ref"),
            ),
        ),
        ("batch-changes", sc((G(B=1), "ref"), (G(B=4), "ref"), (G(B=2, S=1, Lp=2), "ref"))),
        (
            "total-int32-max",
            sc((G(S=1, Lp=4), "error"), edit=put("total_sequence_length", 2**31 - 1)),
        ),
        ("total-negative", sc((G(S=1, Lp=4), "error"), edit=put("total_sequence_length", -5))),
        ("total-shape-2", sc((G(S=1, Lp=4), "error"), edit=put("total_sequence_length", [5, 5]))),
        ("seqlens-int32-max", sc((G(S=1, Lp=4, seqlens=[2**31 - 1], total=0), "error"))),
        ("seqlens-negative", sc((G(S=1, Lp=4, seqlens=[-3], total=0), "error"))),
        ("seqlens-past-beyond-cache", sc((G(S=1, Lp=4, seqlens=[40]), "error"))),
        ("seqlens-past-without-cache", sc((G(S=1, Lp=0, seqlens=[9]), "error"))),
        ("seqlens-wrong-batch", sc((G(B=2, S=1, Lp=4, seqlens=[4]), "error"))),
        (
            "past-value-shape-differs",
            sc(
                (dec, "error"), edit=lambda f: {**f, "past_value": f["past_value"][:, :, :3].copy()}
            ),
        ),
        (
            "past-head-size-differs",
            sc(
                (dec, "error"),
                edit=lambda f: {
                    **f,
                    "past_key": np.zeros((1, 2, 7, 8), F32),
                    "past_value": np.zeros((1, 2, 7, 8), F32),
                },
            ),
        ),
        ("key-without-value", sc((G(), "error"), edit=drop("value"))),
        ("past-key-without-past-value", sc((dec, "error"), edit=drop("past_value"))),
        (
            "key-shape-differs",
            sc((G(), "error"), edit=lambda f: {**f, "key": f["key"][:, :2].copy()}),
        ),
        ("query-rank2", sc((G(), "error"), edit=lambda f: {**f, "query": f["query"][0]})),
        (
            "hidden-not-heads-times-d",
            sc((G(), "error"), edit=lambda f: {**f, "query": f["query"][..., :-3].copy()}),
        ),
        ("head-size-not-multiple-of-8", sc((G(D=12), "error"))),
        ("head-size-over-256", sc((G(D=264, S=1, Lp=1), "error"))),
        ("head-size-zero", sc((G(D=0), "error"))),
        ("query-batch-zero", sc((G(B=0, seqlens=[]), "either"))),
        ("query-seq-zero", sc((G(S=0, Lp=3, seqlens=[2]), "either"))),
        (
            "position-out-of-cache",
            sc(
                (G(rotary=16, pos_ids=True), "error"),
                edit=lambda f: {**f, "position_ids": np.full_like(f["position_ids"], 64)},
            ),
        ),
        (
            "position-negative",
            sc(
                (G(rotary=16, pos_ids=True), "error"),
                edit=lambda f: {**f, "position_ids": np.full_like(f["position_ids"], -1)},
            ),
        ),
        (
            "position-ids-wrong-shape",
            sc(
                (G(rotary=16, pos_ids=True), "error"),
                edit=lambda f: {**f, "position_ids": f["position_ids"][:, :1].copy()},
            ),
        ),
        ("past-beyond-cos-cache", sc((G(rotary=16, S=1, Lp=80), "error"))),
        (
            "sin-differs-from-cos",
            sc(
                (G(rotary=16), "error"),
                edit=lambda f: {**f, "sin_cache": f["sin_cache"][:10].copy()},
            ),
        ),
        ("rotary-wider-than-head", sc((G(rotary=16, D=8), "error"))),
        (
            "rotary-without-caches",
            sc(
                (G(rotary=16), "error"),
                edit=lambda f: {k: v for k, v in f.items() if "cache" not in k},
            ),
        ),
        (
            "qkv-bias-wrong-length",
            sc(
                (G(packed=True, bias=True), "error"),
                edit=lambda f: {**f, "qkv_bias": f["qkv_bias"][:-1].copy()},
            ),
        ),
        (
            "qkv-bias-unpacked",
            sc((G(), "error"), edit=lambda f: {**f, "qkv_bias": np.zeros(12, F32)}),
        ),
        (
            "attention-bias-given",
            sc((G(), "error"), edit=put("attention_bias", np.zeros((1, 1, 4, 4)))),
        ),
        ("nan-in-query", sc((G(), "ref"), edit=nan("query", np.nan))),
        ("inf-in-key", sc((dec, "ref"), edit=nan("key", np.inf))),
        ("nan-in-past", sc((dec, "ref"), edit=nan("past_key", np.nan))),
        (
            "query-float64",
            sc((G(), "error"), edit=lambda f: {**f, "query": f["query"].astype(F64)}),
        ),
        (
            "seqlens-int64",
            sc((G(), "error"), edit=lambda f: {**f, "seqlens_k": f["seqlens_k"].astype(np.int64)}),
        ),
        (
            "present-bound-onto-past",
            sc(
                (G(S=1, Lp=8, seqlens=[5]), "ref"),
                alias={"present_key": "past_key", "present_value": "past_value"},
            ),
        ),
        ("present-aliases-query", sc((G(S=1, Lp=3), "either"), alias={"out": "query"})),
    ]
    attr_cases = [
        ("heads-zero", {"num_heads": 0}),
        ("heads-int64-max", {"num_heads": 2**63 - 1, "kv_num_heads": 2**63 - 1}),
        ("heads-2^62", {"num_heads": 2**62, "kv_num_heads": 2**61}),
        ("heads-not-multiple", {"num_heads": 3}),
        ("kv-heads-negative", {"kv_num_heads": -2}),
        ("scale-negative", {"scale": -1.0}),
        ("softcap-negative", {"softcap": -1.0}),
        ("smooth-softmax", {"smooth_softmax": 1}),
        ("qk-output", {"qk_output": 1}),
    ]
    for name, at in attr_cases:
        cases.append((f"attr-{name}", _gqa_attr_case(at)))
    return [Case("GroupQueryAttention", n, m) for n, m in cases]


def _gqa_attr_case(at: dict[str, Any]) -> Callable[[np.random.Generator], Scenario]:
    def make(rng: np.random.Generator) -> Scenario:
        s = _gqa_scenario(rng, [(GqaSpec(), "error")])
        node = s.graph.node[0]
        from onnx import helper

        keep = [a for a in node.attribute if a.name not in at]
        del node.attribute[:]
        node.attribute.extend(keep + [helper.make_attribute(k, v) for k, v in at.items()])
        return s

    return make


def _gqa8_cases() -> list[Case]:
    G = GqaSpec

    def sc(
        *specs: tuple[GqaSpec, str], edit: Callable[[Feeds], Feeds] | None = None
    ) -> Callable[[np.random.Generator], Scenario]:
        return lambda rng: _gqa_scenario(rng, list(specs), edit)

    cases = [
        ("int8-valid-tensor-scale", sc((G(S=1, Lp=6, kv8="tensor"), "ref"))),
        ("int8-valid-channel-scale", sc((G(S=3, Lp=6, seqlens=[8], kv8="channel"), "ref"))),
        (
            "int8-past-grows",
            sc((G(S=1, Lp=2, kv8="tensor"), "ref"), (G(S=1, Lp=200, kv8="tensor"), "ref")),
        ),
        (
            "int8-scales-missing",
            sc(
                (G(S=1, Lp=6, kv8="tensor"), "error"),
                edit=lambda f: {k: v for k, v in f.items() if "scale" not in k},
            ),
        ),
        (
            "int8-scale-shapes-differ",
            sc(
                (G(S=1, Lp=6, kv8="tensor"), "error"),
                edit=lambda f: {**f, "v_scale": np.full((1, 2, 1, 16), 0.1, F32)},
            ),
        ),
        (
            "int8-scale-wrong-rank",
            sc(
                (G(S=1, Lp=6, kv8="tensor"), "error"),
                edit=lambda f: {
                    **f,
                    "k_scale": np.full((2,), 0.1, F32),
                    "v_scale": np.full((2,), 0.1, F32),
                },
            ),
        ),
        (
            "int8-scale-zero",
            sc(
                (G(S=1, Lp=6, kv8="tensor"), "either"),
                edit=lambda f: {**f, "k_scale": np.zeros(1, F32)},
            ),
        ),
        (
            "int8-scale-nan",
            sc(
                (G(S=1, Lp=6, kv8="tensor"), "either"),
                edit=lambda f: {**f, "v_scale": np.full(1, np.nan, F32)},
            ),
        ),
    ]
    return [Case("GroupQueryAttention", n, m) for n, m in cases]
