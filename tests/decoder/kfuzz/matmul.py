"""Hostile cases of llmir's matmul kernels (MatMulF16/Bf16/F32, the panel layout, MatMulS8,
MatMulNBitsQ4/Q8, MatMulGGUF) and the MatMulNBits reproductions of issue 24."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import F32, F64, Call, Case, Feeds, Scenario, _f, _graph, _overflow_x, _put

# -- the matmul family ----------------------------------------------------------------------


@dataclass(frozen=True)
class MatOp:
    """A matmul op: its weight inputs for a logical [N, K] weight, and its reference."""

    op: str
    inputs: list[tuple[str, int]]
    weights: Callable[[np.random.Generator, int, int], Feeds]
    ref: Callable[[np.ndarray, Feeds], np.ndarray]  # x [..., K] -> y [..., N] (no epilogue)
    tol: float
    attrs: Callable[[int], dict[str, Any]] = lambda n: {}


def _dense(dtype: Any) -> Callable[[np.random.Generator, int, int], Feeds]:
    def make(rng: np.random.Generator, n: int, k: int) -> Feeds:
        return {"w": rng.standard_normal((n, k)).astype(F32).astype(dtype)}

    return make


def _dense_ref(x: np.ndarray, f: Feeds) -> np.ndarray:
    return _f(x) @ _f(f["w"].astype(F32)).T


def _panel_weights(rng: np.random.Generator, n: int, k: int) -> Feeds:
    w = rng.standard_normal((n, k)).astype(F32)
    return {"w": _to_panels(w)}


def _to_panels(w: np.ndarray) -> np.ndarray:
    n, k = w.shape
    p = -(-n // 16)
    full = np.zeros((p * 16, k), F32)
    full[:n] = w
    return np.ascontiguousarray(full.reshape(p, 16, k).transpose(0, 2, 1))


def _panel_ref(n: int) -> Callable[[np.ndarray, Feeds], np.ndarray]:
    def ref(x: np.ndarray, f: Feeds) -> np.ndarray:
        w = f["w"]
        logical = w.transpose(0, 2, 1).reshape(w.shape[0] * 16, w.shape[1])[:n]
        return _f(x) @ _f(logical).T

    return ref


def _int8_rows(x: np.ndarray) -> np.ndarray:
    """x as int8 activation kernels see it: codes per 32-block, rint(x * 127 / amax) in f32."""
    lead, k = x.shape[:-1], x.shape[-1]
    xb = np.asarray(x, F32).reshape(-1, k // 32, 32)
    with np.errstate(all="ignore"):
        amax = np.abs(xb).max(-1, keepdims=True)
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
        inv[~np.isfinite(inv)] = 0  # max |x| under 127 / FLT_MAX: the block counts as zeros
        q = np.rint(xb * inv)
        return (_f(q) * _f(amax / F32(127))).reshape(*lead, k)


def _nbits_weights(
    bits: int, zp: bool, f16: bool
) -> Callable[[np.random.Generator, int, int], Feeds]:
    def make(rng: np.random.Generator, n: int, k: int) -> Feeds:
        from llmir_core.quant import nbits

        if k == 0 or n == 0:  # no blocks (quantize wants at least one)
            out = {
                "b": np.zeros((n, k // 32, 4 * bits), np.uint8),
                "s": np.zeros(0, np.float16 if f16 else F32),
            }
            return {**out, "z": np.zeros(0, np.uint8)} if zp else out
        w = rng.standard_normal((n, k)).astype(F32)
        codes, sc, z = nbits.quantize(w, bits, 32, not zp, np.dtype(np.float16 if f16 else F32))
        out = {"b": codes.reshape(n, k // 32, 4 * bits), "s": sc.reshape(-1)}
        if zp:
            assert z is not None
            out["z"] = z.reshape(-1)
        return out

    return make


def _nbits_ref(bits: int) -> Callable[[np.ndarray, Feeds], np.ndarray]:
    def ref(x: np.ndarray, f: Feeds) -> np.ndarray:
        from llmir_core.quant import nbits

        b = f["b"]
        n, nb = b.shape[0], b.shape[1]
        if n == 0 or nb == 0:
            if f["s"].size or x.shape[-1] != nb * 32:
                raise ValueError("scales or X do not match B")
            return np.zeros((*x.shape[:-1], n))
        z = f.get("z")
        zr = None if z is None else z.reshape(n, -1)
        deq = nbits.dequantize(b, f["s"].reshape(n, nb), zr, bits, 32, (n, nb * 32))
        m = int(np.prod(x.shape[:-1]))  # int8 X at decode (M <= 16, matmul_nbits.c's GEMV)
        xe = _int8_rows(x) if (m <= 16 or bits == 4) and x.shape[-1] else _f(x)
        return xe @ _f(deq).T

    return ref


def _gguf_weights(scheme: str) -> Callable[[np.random.Generator, int, int], Feeds]:
    def make(rng: np.random.Generator, n: int, k: int) -> Feeds:
        from tests.quant.blocks import random_rows

        return {"w": random_rows(rng, scheme, n, k)}

    return make


def _gguf_ref(scheme: str) -> Callable[[np.ndarray, Feeds], np.ndarray]:
    def ref(x: np.ndarray, f: Feeds) -> np.ndarray:
        from llmir_core.quant import gguf_blocks

        w, (elems, nbytes) = f["w"], gguf_blocks.BLOCKS[scheme]
        if w.ndim != 2 or w.shape[1] % nbytes or x.shape[-1] != w.shape[1] // nbytes * elems:
            raise ValueError("W is not [N, row_bytes] of whole blocks for X's K")
        k = x.shape[-1]
        deq = gguf_blocks.dequantize(w, scheme, (w.shape[0], k))
        return (_int8_rows(x) if k else _f(x)) @ _f(deq).T  # int8 rows at decode and prefill

    return ref


def _s8_weights(rng: np.random.Generator, n: int, k: int) -> Feeds:
    from llmir_core.quant import s8

    codes, scales = s8.quantize_rows(rng.standard_normal((n, k)).astype(F32))
    return {"w": s8.interleave(codes), "s": scales.astype(F32)}


def _s8_ref(x: np.ndarray, f: Feeds) -> np.ndarray:
    from llmir_core.quant import s8

    n, k = f["s"].shape[0], x.shape[-1]
    if f["w"].shape != (-(-n // 4), -(-k // 32), 4, 32):
        raise ValueError("W does not match S and X")
    if x.size == 0 or n == 0 or k == 0:
        return np.zeros((*x.shape[:-1], n))
    with np.errstate(all="ignore"):
        y = s8.matmul(x, s8.deinterleave(f["w"], n, k), f["s"])
    # NaN in, NaN out: s8.matmul's prefill rounding counts a NaN block as zeros
    y[np.isnan(x).any(-1)] = np.nan
    return y


def _bf16() -> Any:
    import ml_dtypes

    return ml_dtypes.bfloat16


def _mat_ops() -> list[MatOp]:
    from onnx import TensorProto as T

    ops = [
        MatOp(
            "MatMulF16", [("x", T.FLOAT), ("w", T.FLOAT16)], _dense(np.float16), _dense_ref, 2e-5
        ),
        MatOp("MatMulBf16", [("x", T.FLOAT), ("w", T.BFLOAT16)], _dense(_bf16()), _dense_ref, 2e-5),
        MatOp("MatMulF32", [("x", T.FLOAT), ("w", T.FLOAT)], _dense(F32), _dense_ref, 2e-5),
        MatOp(
            "MatMulF32[panel16]",
            [("x", T.FLOAT), ("w", T.FLOAT)],
            _panel_weights,
            _panel_ref(48),
            2e-5,
            attrs=lambda n: {"N": n},
        ),
        MatOp(
            "MatMulS8", [("x", T.FLOAT), ("w", T.INT8), ("s", T.FLOAT)], _s8_weights, _s8_ref, 2e-5
        ),
    ]
    for bits in (4, 8):
        ops.append(
            MatOp(
                f"MatMulNBitsQ{bits}",
                [("x", T.FLOAT), ("b", T.UINT8), ("s", T.FLOAT), ("z", T.UINT8)],
                _nbits_weights(bits, True, False),
                _nbits_ref(bits),
                2e-5,
            )
        )
    # GGUF blocks as stored: the shared cases in q5_1 (32-element blocks with mins, so K = 64
    # works), the format-specific ones in _gguf_cases
    ops.append(
        MatOp(
            "MatMulGGUF[q5_1]",
            [("x", T.FLOAT), ("w", T.UINT8)],
            _gguf_weights("q5_1"),
            _gguf_ref("q5_1"),
            2e-5,
            attrs=lambda n: {"format": "q5_1"},
        )
    )
    return ops


def _swiglu(y: np.ndarray) -> np.ndarray:
    h = y.shape[-1] // 2
    g = y[..., :h]
    with np.errstate(all="ignore"):
        return g / (1.0 + np.exp(-g)) * y[..., h:]


def _mat_scenario(
    mo: MatOp,
    rng: np.random.Generator,
    shapes: list[tuple[tuple[int, ...], int, str]],  # (x shape, N, want) per call
    x_fill: Callable[[np.ndarray], None] | None = None,
    w_fill: Callable[[Feeds], None] | None = None,
    attrs: dict[str, Any] | None = None,
    mutate: Callable[[Feeds], Feeds] | None = None,
    x_dtype: Any = F32,
    alias: dict[str, str] | None = None,
) -> Scenario:
    """Calls on one session: X of each shape times a fresh weight of N rows (K: X's last dim)."""
    panel_n = shapes[0][1] if mo.op.endswith("[panel16]") else None
    at = {**mo.attrs(panel_n or 0), **(attrs or {})}
    op = mo.op.split("[")[0]
    names = mo.inputs
    ref_fn = _panel_ref(panel_n) if panel_n is not None else mo.ref
    swiglu = at.get("epilogue") == "swiglu"
    calls = []
    kmax = 1
    for xs, n, want in shapes:
        k = xs[-1] if xs else 0
        kmax = max(kmax, k)
        x = rng.standard_normal(xs).astype(x_dtype) if xs else np.asarray(1.0, x_dtype)
        if x_fill:
            x_fill(x)
        w = mo.weights(rng, n, k)
        if w_fill:
            w_fill(w)
        if mutate:
            w = mutate(w)
        calls.append(Call({"x": x, **w}, want, dict(alias or {})))

    def ref(f: Feeds) -> list[np.ndarray]:
        x = f["x"]
        if x.dtype != F32 or x.ndim < 1:
            raise ValueError("X must be f32 [..., K]")
        with np.errstate(all="ignore"):
            y = ref_fn(x, f)
        if swiglu:
            if y.shape[-1] % 2:
                raise ValueError("odd N")
            y = _swiglu(y)
        return [y.astype(F32)]

    graph = _graph(op, names, ["y"], at)
    return Scenario(graph, calls, ref, mo.tol, kmax)


def _mat_cases(mo: MatOp) -> list[Case]:
    """The hostile cases every matmul op gets (>= 25), plus its own (_own_cases)."""
    panel = mo.op.endswith("[panel16]")
    K, N = 64, 48  # K a multiple of 32 (the block formats), N of 16 (panels)
    nb = mo.op.startswith("MatMulNBits") or mo.op == "MatMulS8"

    def sc(
        shapes: list[tuple[tuple[int, ...], int, str]], **kw: Any
    ) -> Callable[[np.random.Generator], Scenario]:
        return lambda rng: _mat_scenario(mo, rng, shapes, **kw)

    def wnan(v: float) -> Callable[[Feeds], None]:
        def fill(w: Feeds) -> None:
            key = "s" if "s" in w else "w"
            a = w[key]
            if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
                a.reshape(-1)[0] = v

        return fill

    cases = [
        ("valid-decode", sc([((1, K), N, "ref")])),
        ("valid-prefill", sc([((7, K), N, "ref")])),
        ("valid-batched-4d", sc([((2, 3, 1, K), N, "ref")])),
        (
            "valid-decode-then-prefill",
            sc([((1, K), N, "ref"), ((9, K), N, "ref"), ((2, K), N, "ref")]),
        ),
        (
            "k-mismatch-larger",
            sc([((2, K), N, "ref"), ((2, K + 32), N, "error")], mutate=_shrink_k(mo, K)),
        ),
        ("x-rank0", sc([((), N, "error")])),
        ("x-rank1", sc([((K,), N, "either")])),
        ("m-zero", sc([((0, K), N, "either")])),
        ("m-zero-3d", sc([((3, 0, K), N, "either")])),
        ("n-zero", sc([((2, K), 0, "either")])),
        ("k-zero", sc([((2, 0), N, "either")])),
        (
            "rows-overflow-int64",
            lambda rng: _overflow_x(_mat_scenario(mo, rng, [((1, 0), N, "either")])),
        ),
        (
            "rows-overflow-int64-n0",
            lambda rng: _overflow_x(_mat_scenario(mo, rng, [((1, 0), 0, "either")])),
        ),
        (
            "weight-shrinks-between-calls",
            sc(
                [
                    ((1, K), 16 if panel else 4096, "ref"),
                    ((1, K), 16 if panel else 1, "ref"),
                    ((5, K), 16, "ref"),
                ]
            ),
        ),
        (
            "weight-grows-between-calls",
            sc([((1, K), 16, "ref"), ((6, K), 16 if panel else 1024, "ref")]),
        ),
        (
            "k-grows-between-calls",
            sc([((1, 32), 16, "ref"), ((1, 32 * 40), 16, "ref"), ((3, 32), 16, "ref")]),
        ),
        ("nan-in-x", sc([((1, K), N, "ref"), ((6, K), N, "ref")], x_fill=_put(np.nan, (0, 40)))),
        ("inf-in-x", sc([((1, K), N, "ref"), ((6, K), N, "ref")], x_fill=_put(np.inf, (3,)))),
        ("neg-inf-in-x", sc([((2, K), N, "ref")], x_fill=_put(-np.inf, (K + 1,)))),
        (
            "huge-x",
            sc([((1, K), N, "ref"), ((6, K), N, "ref")], x_fill=lambda a: a.__imul__(F32(1e30))),
        ),
        (
            "denormal-x",
            sc([((1, K), N, "ref"), ((6, K), N, "ref")], x_fill=lambda a: a.__imul__(F32(1e-42))),
        ),
        ("zero-x", sc([((1, K), N, "ref"), ((6, K), N, "ref")], x_fill=lambda a: a.fill(0))),
        ("nan-in-weight", sc([((1, K), N, "ref"), ((6, K), N, "ref")], w_fill=wnan(np.nan))),
        ("inf-in-weight", sc([((1, K), N, "ref"), ((6, K), N, "ref")], w_fill=wnan(np.inf))),
        ("x-float64", sc([((2, K), N, "error")], x_dtype=F64)),
        ("x-int32", sc([((2, K), N, "error")], x_dtype=np.int32)),
        ("weight-wrong-dtype", sc([((2, K), N, "error")], mutate=_retype_weight)),
        (
            "weight-rank1",
            sc(
                [((2, K), N, "error")],
                mutate=lambda w: _reshape(w, "w" if "w" in w else "b", (-1,)),
            ),
        ),
        (
            "weight-rank5",
            sc(
                [((2, K), N, "error")],
                mutate=lambda w: _reshape(w, "w" if "w" in w else "b", (1, 1, 1, 1, -1)),
            ),
        ),
        (
            "epilogue-swiglu",
            sc([((1, K), 32, "ref"), ((7, K), 32, "ref")], attrs={"epilogue": "swiglu"}),
        ),
        (
            "epilogue-swiglu-odd-n",
            sc([((1, K), 16 if panel else 17, "error")], attrs={"epilogue": "swiglu"}),
        ),
        ("epilogue-unknown", sc([((1, K), N, "error")], attrs={"epilogue": "gelu"})),
        ("epilogue-long-string", sc([((1, K), N, "error")], attrs={"epilogue": "swiglu" * 400})),
        ("output-aliases-x", sc([((4, K), K, "either")], alias={"y": "x"})),
        ("noncontiguous-x", lambda rng: _noncontig(mo, rng, K, N)),
    ]
    out = [Case(mo.op, n, m) for n, m in cases]
    if panel:
        out += _panel_cases(mo)
    if nb:
        out += _quant_cases(mo)
    if mo.op.startswith("MatMulGGUF"):
        out += _gguf_cases(mo)
    return out


def _shrink_k(mo: MatOp, k: int) -> Callable[[Feeds], Feeds]:
    """The weight made for X's K (the second call's larger K) replaced by one for K = k: X and
    the weight disagree."""
    rng = np.random.default_rng(7)

    def mutate(w: Feeds) -> Feeds:
        first = next(iter(w.values()))
        n = first.shape[0] * (16 if mo.op.endswith("[panel16]") else 1)
        if mo.op.startswith("MatMulNBits") or mo.op == "MatMulS8":
            n = w["s"].shape[0] if mo.op == "MatMulS8" else w["b"].shape[0]
        return mo.weights(rng, n, k)

    return mutate


def _reshape(w: Feeds, key: str, shape: tuple[int, ...]) -> Feeds:
    return {**w, key: w[key].reshape(shape)}


def _retype_weight(w: Feeds) -> Feeds:
    key = "w" if "w" in w else "b"
    a = w[key]
    other = np.int16 if a.dtype.itemsize == 1 else np.float64
    return {**w, key: a.astype(F32).astype(other)}


def _noncontig(mo: MatOp, rng: np.random.Generator, k: int, n: int) -> Scenario:
    s = _mat_scenario(mo, rng, [((6, 2 * k), n, "ref")])
    for c in s.calls:  # every other column of a wider X (onnxruntime gets a strided view)
        x = c.feeds["x"][:, ::2]
        c.feeds = {**c.feeds, "x": x, **mo.weights(rng, n, k)}
    s.ref_k = k
    return s


def _panel_cases(mo: MatOp) -> list[Case]:
    K = 64

    def with_n(n_attr: int, p: int, want: str) -> Callable[[np.random.Generator], Scenario]:
        def make(rng: np.random.Generator) -> Scenario:
            s = _mat_scenario(mo, rng, [((2, K), 32, want)])
            s.graph = _graph("MatMulF32", [("x", 1), ("w", 1)], ["y"], {"N": n_attr})
            s.calls[0].feeds["w"] = _to_panels(rng.standard_normal((p * 16, K)).astype(F32))
            return s

        return make

    return [
        Case(mo.op, "panel-n-int64-max", with_n(2**63 - 1, 2, "error")),
        Case(mo.op, "panel-n-negative", with_n(-5, 2, "error")),
        Case(mo.op, "panel-n-too-large", with_n(33, 2, "error")),
        Case(mo.op, "panel-n-too-small", with_n(16, 2, "error")),
        Case(mo.op, "panel-n-zero", with_n(0, 0, "either")),
        Case(mo.op, "panel-last-dim-not-16", lambda rng: _panel_last(mo, rng)),
    ]


def _panel_last(mo: MatOp, rng: np.random.Generator) -> Scenario:
    s = _mat_scenario(mo, rng, [((2, 64), 32, "error")])
    s.calls[0].feeds["w"] = rng.standard_normal((2, 64, 8)).astype(F32)
    return s


def _quant_cases(mo: MatOp) -> list[Case]:
    """Scales and zero points that disagree with the weight, between calls too."""
    K, N = 64, 48

    def sc(
        shapes: list[tuple[tuple[int, ...], int, str]], mutate: Callable[[Feeds], Feeds]
    ) -> Callable[[np.random.Generator], Scenario]:
        return lambda rng: _mat_scenario(mo, rng, shapes, mutate=mutate)

    def drop(key: str, n: int) -> Callable[[Feeds], Feeds]:
        return lambda w: {**w, key: w[key].reshape(-1)[: w[key].size - n]} if key in w else w

    def grow(key: str) -> Callable[[Feeds], Feeds]:
        return lambda w: (
            {**w, key: np.concatenate([w[key].reshape(-1), w[key].reshape(-1)])} if key in w else w
        )

    cases = [
        ("scales-short", sc([((1, K), N, "error")], drop("s", 5))),
        ("scales-long", sc([((1, K), N, "error")], grow("s"))),
        ("scales-float64", sc([((1, K), N, "error")], lambda w: {**w, "s": w["s"].astype(F64)})),
        ("scales-int32", sc([((1, K), N, "error")], lambda w: {**w, "s": w["s"].astype(np.int32)})),
        ("scales-empty", sc([((1, K), N, "error")], lambda w: {**w, "s": w["s"][:0]})),
    ]
    if mo.op.startswith("MatMulNBits"):
        cases += [
            ("zero-points-short", sc([((1, K), N, "error")], drop("z", 1))),
            ("zero-points-long", sc([((1, K), N, "error")], grow("z"))),
            (
                "b-last-dim-wrong",
                sc([((1, K), N, "error")], lambda w: {**w, "b": w["b"][..., :-1].copy()}),
            ),
            (
                "b-blocks-overflow-int64",
                sc(
                    [((1, K), N, "error")],
                    lambda w: {
                        **w,
                        "b": np.zeros(
                            (0, 2**58 if mo.op.endswith("4") else 2**57, w["b"].shape[2]), np.uint8
                        ),
                    },
                ),
            ),
            ("scales-f16", lambda rng: _nbits_f16(mo, rng)),
            ("no-zero-points", lambda rng: _nbits_nozp(mo, rng)),
        ]
    else:
        cases += [
            (
                "w-groups-wrong",
                sc([((1, K), N, "error")], lambda w: {**w, "w": w["w"][:-1].copy()}),
            ),
            (
                "k-not-multiple-of-32",
                lambda rng: _mat_scenario(mo, rng, [((3, 50), 20, "ref"), ((1, 50), 20, "ref")]),
            ),
        ]
    return [Case(mo.op, n, m) for n, m in cases]


def _nbits_f16(mo: MatOp, rng: np.random.Generator) -> Scenario:
    bits = int(mo.op[-1])
    mo16 = MatOp(mo.op, mo.inputs, _nbits_weights(bits, False, True), mo.ref, mo.tol)
    s = _mat_scenario(mo16, rng, [((1, 64), 48, "ref"), ((6, 64), 48, "ref")])
    from onnx import TensorProto as T

    s.graph = _graph(mo.op, [("x", T.FLOAT), ("b", T.UINT8), ("s", T.FLOAT16)], ["y"])
    return s


def _nbits_nozp(mo: MatOp, rng: np.random.Generator) -> Scenario:
    bits = int(mo.op[-1])
    mo0 = MatOp(mo.op, mo.inputs, _nbits_weights(bits, False, False), mo.ref, mo.tol)
    s = _mat_scenario(mo0, rng, [((1, 64), 48, "ref"), ((6, 64), 20, "ref")])
    from onnx import TensorProto as T

    s.graph = _graph(mo.op, [("x", T.FLOAT), ("b", T.UINT8), ("s", T.FLOAT)], ["y"])
    return s


def _gguf_cases(mo: MatOp) -> list[Case]:
    """Every other format (K-quants at K = 512), and W / format attributes that do not fit."""
    from onnx import TensorProto as T

    def fmt(scheme: str, shapes: list[tuple[tuple[int, ...], int, str]], **kw: Any) -> Any:
        other = MatOp(
            f"MatMulGGUF[{scheme}]",
            [("x", T.FLOAT), ("w", T.UINT8)],
            _gguf_weights(scheme),
            _gguf_ref(scheme),
            2e-5,
            attrs=lambda n: {"format": scheme},
        )
        return lambda rng: _mat_scenario(other, rng, shapes, **kw)

    def nan_scale(w: Feeds) -> None:
        w["w"][0, 0:2] = np.array([np.nan], np.float16).view(np.uint8)  # q4_k's d of row 0

    def bad_format(name: str) -> Any:
        return lambda rng: _mat_scenario(mo, rng, [((1, 64), 16, "error")], attrs={"format": name})

    cases = [
        (
            f"valid-{s}",
            fmt(s, [((1, 512), 40, "ref"), ((3, 512), 40, "ref"), ((9, 512), 40, "ref")]),
        )
        for s in (
            "q4_0",
            "q5_0",
            "q8_0",
            "q2_k",
            "q3_k",
            "q4_k",
            "q5_k",
            "q6_k",
            "iq4_nl",
            "iq4_xs",
        )
    ]
    cases += [
        (
            "nan-scale-in-weight",
            fmt("q4_k", [((1, 256), 20, "ref"), ((6, 256), 20, "ref")], w_fill=nan_scale),
        ),
        (
            "k-not-whole-super-blocks",
            fmt("q6_k", [((1, 288), 20, "error")], mutate=lambda w: {"w": w["w"][:, :-1].copy()}),
        ),
        (
            "row-bytes-not-whole-blocks",
            lambda rng: _mat_scenario(
                mo, rng, [((1, 64), 16, "error")], mutate=lambda w: {"w": w["w"][:, :-3].copy()}
            ),
        ),
        ("format-unknown", bad_format("q7_k")),
        ("format-upper-case", bad_format("Q5_1")),
        ("format-long-string", bad_format("q5_1" * 300)),
        ("format-empty", bad_format("")),
    ]
    return [Case(mo.op, n, m) for n, m in cases]


# -- the MatMulNBits reproductions (issue 24) ------------------------------------------------


def _nbits_repros() -> list[Case]:
    """B checked once and trusted afterwards: a 1-row B after a 65536-row one (scales kept:
    refused; scales matching: computed); small sizes (the missing rows were heap garbage); B
    sliced by the prompt length in the graph (what `llmir run` fed it)."""
    mo = next(m for m in _mat_ops() if m.op == "MatMulNBitsQ4")
    q4 = _nbits_weights(4, False, False)

    def big_then_one(rng: np.random.Generator) -> Scenario:
        from onnx import TensorProto as T

        big, one = q4(rng, 65536, 64), q4(rng, 1, 64)
        x = rng.standard_normal((1, 64)).astype(F32)
        calls = [
            Call({"x": x, **big}, "ref"),
            Call({"x": x, "b": one["b"], "s": big["s"]}, "error"),
            Call({"x": x, **one}, "ref"),
        ]
        g = _graph("MatMulNBitsQ4", [("x", T.FLOAT), ("b", T.UINT8), ("s", T.FLOAT)], ["y"])
        return Scenario(g, calls, lambda f: [mo.ref(f["x"], f).astype(F32)], 2e-5, 64)

    def small(rng: np.random.Generator) -> Scenario:
        from onnx import TensorProto as T

        a, b = q4(rng, 40, 64), q4(rng, 3, 64)
        x = rng.standard_normal((1, 64)).astype(F32)
        calls = [Call({"x": x, **a}), Call({"x": x, **b}), Call({"x": x, **a})]
        g = _graph("MatMulNBitsQ4", [("x", T.FLOAT), ("b", T.UINT8), ("s", T.FLOAT)], ["y"])
        return Scenario(g, calls, lambda f: [mo.ref(f["x"], f).astype(F32)], 2e-5, 64)

    def sliced(rng: np.random.Generator) -> Scenario:
        from onnx import TensorProto as T
        from onnx import helper, numpy_helper

        full = q4(rng, 64, 64)
        inits = [
            numpy_helper.from_array(full["b"], "B"),
            numpy_helper.from_array(full["s"].reshape(64, 2), "S"),
        ]
        inits += [
            numpy_helper.from_array(np.array([0], np.int64), name) for name in ("zero", "axis")
        ]
        inits += [numpy_helper.from_array(np.array([1], np.int64), "one")]
        inits += [numpy_helper.from_array(np.array([-1], np.int64), "flat")]
        pre = [  # B[:S], scales[:S] for the prompt length S (X's dim 1)
            helper.make_node("Shape", ["x"], ["xs"]),
            helper.make_node("Gather", ["xs", "one"], ["len"], axis=0),
            helper.make_node("Slice", ["B", "zero", "len", "axis"], ["b"]),
            helper.make_node("Slice", ["S", "zero", "len", "axis"], ["s2"]),
            helper.make_node("Reshape", ["s2", "flat"], ["s"]),
        ]
        g = _graph(
            "MatMulNBitsQ4",
            [("x", T.FLOAT), ("b", T.UINT8), ("s", T.FLOAT)],
            ["y"],
            inits=inits,
            pre=pre,
        )
        calls = [Call({"x": rng.standard_normal((1, s, 64)).astype(F32)}) for s in (6, 1, 7, 1)]

        def ref(f: Feeds) -> list[np.ndarray]:
            s = f["x"].shape[1]
            w = {"b": full["b"][:s], "s": full["s"].reshape(64, 2)[:s].reshape(-1)}
            return [mo.ref(f["x"], w).astype(F32)]

        return Scenario(g, calls, ref, 2e-5, 64)

    return [
        Case("MatMulNBitsQ4", "repro-65536-rows-then-1", big_then_one),
        Case("MatMulNBitsQ4", "repro-small-rows-shrink", small),
        Case("MatMulNBitsQ4", "repro-b-sliced-by-prompt", sliced),
    ]
