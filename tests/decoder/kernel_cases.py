"""Hostile one-node cases for every ai.llmir kernel (llmir_core/backends/ort_ext), each run in a
subprocess of its own so that a crash is a failed case, not a dead runner.

A case builds a one-node onnxruntime graph and a sequence of calls on one session (shapes may
grow or shrink between them); each call says what it wants: "ref" (the result must match the
numpy reference), "error" (onnxruntime must refuse it with a status: an exception raised by
onnxruntime, never a signal), "either" (one of the two: zero-size or absurd inputs where
refusing is as good as computing). A case passes when every call gets what it wants and the
process ends normally with no AddressSanitizer / UBSan report on stderr.

    python -m tests.decoder.kernel_cases OP NAME      # run one case here (prints one JSON line)
    python -m tests.decoder.kernel_cases --serve      # fork a child per case named on stdin

scripts/fuzz_kernels.py runs every case (also against the sanitized library, `--asan`);
tests/decoder/test_kernel_fuzz.py a bounded subset. LLMIR_FUZZ_LIB names the library to load
(default: llmir's cached build).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
LIB_ENV = "LLMIR_FUZZ_LIB"
F32, F64 = np.float32, np.float64
BIG = 2**40  # with a zero dim beside it: a tensor of no elements whose dims overflow int64
ASAN_MARKS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")

Feeds = dict[str, np.ndarray]


@dataclass
class Call:
    feeds: Feeds
    want: str = "ref"  # "ref" | "error" | "either"
    alias: dict[str, str] = field(default_factory=dict)  # output -> input it is bound onto


@dataclass
class Scenario:
    graph: Any  # onnx GraphProto
    calls: list[Call]
    ref: Callable[[Feeds], list[np.ndarray]] | None = None
    tol: float = 1e-5  # |got - want| <= tol * sqrt(K) * max|want| (K: ref_k)
    ref_k: int = 1


@dataclass(frozen=True)
class Case:
    op: str
    name: str
    make: Callable[[np.random.Generator], Scenario]


# -- graphs ------------------------------------------------------------------------------------


def _graph(
    op: str,
    inputs: list[tuple[str, int]],
    outputs: list[str],
    attrs: dict[str, Any] | None = None,
    inits: list[Any] | None = None,
    pre: list[Any] | None = None,
    out_types: dict[str, int] | None = None,
) -> Any:
    """One ai.llmir node (inputs named "" are absent), its named inputs as graph inputs of
    unknown shape; `pre`: default-domain nodes before it (their outputs feed it)."""
    from onnx import TensorProto, helper

    from llmir_core.backends.ort_ext import DOMAIN

    node = helper.make_node(op, [n for n, _ in inputs], outputs, domain=DOMAIN, **(attrs or {}))
    init_names = {t.name for t in inits or []}
    made = {o for n in pre or [] for o in n.output}
    gin = [
        helper.make_tensor_value_info(n, t, None)
        for n, t in inputs
        if n and n not in init_names and n not in made
    ]
    types = out_types or {}
    outs = [
        helper.make_tensor_value_info(o, types.get(o, TensorProto.FLOAT), None)
        for o in outputs
        if o
    ]
    return helper.make_graph([*(pre or []), node], "fuzz", gin, outs, initializer=inits or [])


def _session(graph: Any) -> Any:
    import onnxruntime as ort
    from onnx import helper

    from llmir_core.backends.ort_ext import DOMAIN, register

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.enable_cpu_mem_arena = False  # one allocation per tensor: ASan sees each one's bounds
    lib = os.environ.get(LIB_ENV)
    if lib:
        so.register_custom_ops_library(lib)
    else:
        register(so, ["llmir_ops"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# -- comparing -----------------------------------------------------------------------------------


def compare(got: np.ndarray, want: np.ndarray, tol: float, k: int) -> str | None:
    """None when got matches want: the same shape, non-finite where want is, elsewhere within
    tol * sqrt(k) * max|want|."""
    if got.shape != want.shape:
        return f"shape {got.shape}, reference {want.shape}"
    if got.size == 0:
        return None
    g, w = np.asarray(got, F64), np.asarray(want, F64)
    bad = ~np.isfinite(w)
    if bad.any() and np.isfinite(g[bad]).any():
        return f"{int(np.isfinite(g[bad]).sum())} finite values where the reference is not"
    ok = ~bad
    if not ok.any():
        return None
    if not np.isfinite(g[ok]).all():
        return f"{int((~np.isfinite(g[ok])).sum())} non-finite values where the reference is finite"
    scale = max(float(np.abs(w[ok]).max()), 1e-30)
    err = float(np.abs(g[ok] - w[ok]).max())
    if err > tol * np.sqrt(max(k, 1)) * scale + 1e-30:
        return f"max error {err:.3g} (reference max {scale:.3g})"
    return None


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


def _f(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, F64)


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
        m = int(np.prod(x.shape[:-1]))
        xe = _int8_rows(x) if (m <= 4 or bits == 4) and x.shape[-1] else _f(x)
        return xe @ _f(deq).T

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
    at = {**mo.attrs(panel_n or 0), **(attrs or {})} if panel_n is not None else dict(attrs or {})
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


def _overflow_x(s: Scenario, skip: bool = False) -> Scenario:
    """X made in the graph by ConstantOfShape([2^40, 2^40, 0]) (numpy cannot hold such an
    array): no elements, but the product of its leading dims overflows int64."""
    from onnx import TensorProto, helper

    pre = [helper.make_node("ConstantOfShape", ["x_shape"], ["x"])]
    node = s.graph.node[0]
    if skip:
        pre.append(helper.make_node("ConstantOfShape", ["x_shape"], ["k"]))
    ins = [helper.make_tensor_value_info("x_shape", TensorProto.INT64, [3])]
    ins += [i for i in s.graph.input if i.name not in ("x", "k" if skip else "x")]
    s.graph = helper.make_graph([*pre, node], "fuzz", ins, list(s.graph.output))
    for c in s.calls:
        c.feeds = {k: v for k, v in c.feeds.items() if k not in ("x", "k")}
        c.feeds["x_shape"] = np.asarray([BIG, BIG, 0], np.int64)
    s.ref = None
    return s


def _put(value: float, where: tuple[int, ...] = (0,)) -> Callable[[np.ndarray], None]:
    def fill(a: np.ndarray) -> None:
        a.reshape(-1)[list(where)] = value

    return fill


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


# -- norms ---------------------------------------------------------------------------------------


def _norm_cases(skip: bool) -> list[Case]:
    from onnx import TensorProto as T

    op = "SkipSimplifiedLayerNormalization" if skip else "SimplifiedLayerNormalization"
    H = 40

    def ref_for(eps: float) -> Callable[[Feeds], list[np.ndarray]]:
        def ref(f: Feeds) -> list[np.ndarray]:
            x, g = f["x"], f["g"]
            if x.dtype != F32 or g.dtype != F32 or x.ndim < 1 or g.shape != x.shape[-1:]:
                raise ValueError("bad shapes")
            if skip and f["k"].shape != x.shape:
                raise ValueError("bad skip")
            with np.errstate(all="ignore"):
                s = (x + f["k"]).astype(F32) if skip else x
                sf = _f(s)
                y = sf / np.sqrt(np.mean(sf * sf, axis=-1, keepdims=True) + eps) * _f(g)
            return [y.astype(F32), s] if skip else [y.astype(F32)]

        return ref

    def sc(
        shapes: list[tuple[tuple[int, ...], int, str]],
        eps: float = 1e-5,
        xf: Callable[[np.ndarray], None] | None = None,
        outs: list[str] | None = None,
        feed: Callable[[Feeds], Feeds] | None = None,
        alias: dict[str, str] | None = None,
    ) -> Callable[[np.random.Generator], Scenario]:
        def make(rng: np.random.Generator) -> Scenario:
            ins = (
                [("x", T.FLOAT), ("k", T.FLOAT), ("g", T.FLOAT)]
                if skip
                else [("x", T.FLOAT), ("g", T.FLOAT)]
            )
            o = outs or (["y", "", "", "sum"] if skip else ["y"])
            g = _graph(op, ins, o, {"epsilon": eps})
            calls = []
            for xs, h, want in shapes:
                x = rng.standard_normal(xs).astype(F32)
                if xf:
                    xf(x)
                f = {"x": x, "g": rng.standard_normal((h,)).astype(F32)}
                if skip:
                    f["k"] = rng.standard_normal(xs).astype(F32)
                if feed:
                    f = feed(f)
                calls.append(Call(f, want, dict(alias or {})))
            ref = ref_for(eps)
            if outs and skip:
                keep = [i for i, n in enumerate(["y", "sum"]) if n in outs]
                base = ref
                ref = lambda f: [base(f)[i] for i in keep]  # noqa: E731
            return Scenario(g, calls, ref, 1e-6, 1)

        return make

    cases = [
        ("valid-decode", sc([((1, 1, H), H, "ref")])),
        ("valid-prefill", sc([((2, 9, H), H, "ref")])),
        ("valid-h-not-multiple-of-8", sc([((3, 37), 37, "ref")])),
        ("valid-h-large", sc([((2, 4096), 4096, "ref")])),
        ("rows-grow-and-shrink", sc([((1, H), H, "ref"), ((64, H), H, "ref"), ((1, H), H, "ref")])),
        (
            "h-changes-between-calls",
            sc([((2, 64), 64, "ref"), ((2, 8), 8, "ref"), ((2, 1000), 1000, "ref")]),
        ),
        ("scale-too-short", sc([((2, H), H - 1, "error")])),
        ("scale-too-long", sc([((2, H), H + 8, "error")])),
        (
            "scale-rank2",
            sc([((2, H), H, "error")], feed=lambda f: {**f, "g": f["g"].reshape(1, -1)}),
        ),
        ("scale-empty", sc([((2, H), 0, "error")])),
        (
            "x-rank0",
            sc(
                [((), 1, "error")],
                feed=lambda f: {
                    **f,
                    "x": np.asarray(1.0, F32),
                    **({"k": np.asarray(1.0, F32)} if skip else {}),
                },
            ),
        ),
        ("x-rank1", sc([((H,), H, "ref")])),
        ("x-rank9", sc([((1,) * 8 + (H,), H, "error")])),
        ("rows-zero", sc([((0, H), H, "either")])),
        ("h-zero", sc([((3, 0), 0, "either")])),
        ("rows-overflow-int64", lambda rng: _overflow_x(sc([((1, 0), 0, "either")])(rng), skip)),
        ("nan-in-x", sc([((3, H), H, "ref")], xf=_put(np.nan, (5,)))),
        ("inf-in-x", sc([((3, H), H, "ref")], xf=_put(np.inf, (H + 2,)))),
        ("huge-x", sc([((3, H), H, "ref")], xf=lambda a: a.__imul__(F32(1e30)))),
        ("zero-x", sc([((3, H), H, "ref")], xf=lambda a: a.fill(0))),
        ("eps-zero-zero-x", sc([((2, H), H, "ref")], eps=0.0, xf=lambda a: a.fill(0))),
        ("eps-negative", sc([((2, H), H, "either")], eps=-1.0, xf=lambda a: a.__imul__(F32(3)))),
        ("eps-nan", sc([((2, H), H, "either")], eps=float("nan"))),
        ("x-float64", sc([((2, H), H, "error")], feed=lambda f: {**f, "x": f["x"].astype(F64)})),
        (
            "scale-float16",
            sc([((2, H), H, "error")], feed=lambda f: {**f, "g": f["g"].astype(np.float16)}),
        ),
        ("output-aliases-x", sc([((4, H), H, "either")], alias={"y": "x"})),
    ]
    if skip:
        cases += [
            (
                "skip-shape-differs",
                sc([((2, H), H, "error")], feed=lambda f: {**f, "k": f["k"][:1]}),
            ),
            (
                "skip-broadcast-row",
                sc([((3, H), H, "error")], feed=lambda f: {**f, "k": f["k"][:1].copy()}),
            ),
            (
                "skip-rank-differs",
                sc([((2, H), H, "error")], feed=lambda f: {**f, "k": f["k"].reshape(1, 2, H)}),
            ),
            ("no-sum-output", sc([((2, H), H, "ref")], outs=["y"])),
            ("mean-output-asked", sc([((2, H), H, "either")], outs=["y", "mean", "", "sum"])),
        ]
    else:
        cases += [("extra-output-asked", lambda rng: _sln_extra(rng))]
    return [Case(op, n, m) for n, m in cases]


def _sln_extra(rng: np.random.Generator) -> Scenario:
    from onnx import TensorProto as T

    g = _graph("SimplifiedLayerNormalization", [("x", T.FLOAT), ("g", T.FLOAT)], ["y", "inv"])
    f = {"x": rng.standard_normal((2, 16)).astype(F32), "g": rng.standard_normal(16).astype(F32)}
    return Scenario(g, [Call(f, "error")], None)


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
    from llmir_core.dialects.ort import kv_int8_codes

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


# -- the table -----------------------------------------------------------------------------------


def all_cases() -> list[Case]:
    out: list[Case] = []
    for mo in _mat_ops():
        out += _mat_cases(mo)
    out += _nbits_repros()
    out += _norm_cases(False) + _norm_cases(True)
    out += _gqa_cases() + _gqa8_cases()
    return out


def find(op: str, name: str) -> Case:
    for c in all_cases():
        if c.op == op and c.name == name:
            return c
    raise KeyError(f"no case {op}/{name}")


# -- one case, in this process -------------------------------------------------------------------


def _is_ort_error(exc: BaseException) -> bool:
    return type(exc).__module__.startswith("onnxruntime") and bool(str(exc).strip())


def _run_call(sess: Any, call: Call) -> list[np.ndarray]:
    import onnxruntime as ort

    from llmir_core.backends.ort_runtime import _from_ort_value, _ort_value

    def value(a: np.ndarray) -> Any:  # _ort_value makes a 0-d array 1-d (ascontiguousarray)
        return ort.OrtValue.ortvalue_from_numpy(a) if a.ndim == 0 else _ort_value(a)

    vals = {k: value(np.asarray(v)) for k, v in call.feeds.items()}
    if not call.alias:
        return [_from_ort_value(o) for o in sess.run_with_ort_values(None, vals)]
    bind = sess.io_binding()
    for k, v in vals.items():
        bind.bind_ortvalue_input(k, v)
    names = [o.name for o in sess.get_outputs()]
    for o in names:
        if o in call.alias:
            bind.bind_ortvalue_output(o, vals[call.alias[o]])
        else:
            bind.bind_output(o, "cpu")
    sess.run_with_iobinding(bind)
    return [_from_ort_value(v) for v in bind.get_outputs()]


def run_here(case: Case) -> dict[str, Any]:
    """Run one case in this process: {"calls": [outcome per call], "verdict": ...}."""
    scen = case.make(np.random.default_rng(zlib.crc32(f"{case.op}/{case.name}".encode())))
    outcomes: list[str] = []
    try:
        sess = _session(scen.graph)
    except Exception as exc:  # refused at load: every call refused
        if not _is_ort_error(exc):
            return {"calls": [], "verdict": "harness", "detail": f"{type(exc).__name__}: {exc}"}
        sess = None
        load_error = str(exc).strip().splitlines()[0]
    for call in scen.calls:
        if sess is None:
            outcomes.append(f"error: {load_error}")
            continue
        before = {k: np.array(v, copy=True) for k, v in call.feeds.items()}
        try:
            got = _run_call(sess, call)
        except Exception as exc:
            if not _is_ort_error(exc):
                return {
                    "calls": outcomes,
                    "verdict": "harness",
                    "detail": f"{type(exc).__name__}: {exc}",
                }
            outcomes.append("error: " + str(exc).strip().splitlines()[0])
            continue
        outcomes.append(_check(scen, call, before, got))
    verdict = "pass"
    for call, out in zip(scen.calls, outcomes):
        kind = out.split(":")[0]
        if call.want == "ref" and kind != "ok":
            verdict = "fail"
        elif call.want == "error" and kind != "error":
            verdict = "fail"
        elif call.want == "either" and kind not in ("ok", "error"):
            verdict = "fail"
    return {"calls": outcomes, "verdict": verdict, "wants": [c.want for c in scen.calls]}


def _check(scen: Scenario, call: Call, feeds: Feeds, got: list[np.ndarray]) -> str:
    """got against the reference on the inputs as they were before the call; outputs bound
    onto an input are not compared (only their memory safety is checked)."""
    if scen.ref is None:
        return "ok (no reference)"
    try:
        want = scen.ref(feeds)
    except Exception as exc:  # the reference refuses these inputs: the kernel had to as well
        return f"accepted: the reference refuses ({type(exc).__name__}: {exc})"
    if len(got) != len(want):
        return f"mismatch: {len(got)} outputs, the reference has {len(want)}"
    names = list(call.alias) if call.alias else []
    skip = {i for i, n in enumerate(scen.graph.output) if n.name in names}
    for i, (g, w) in enumerate(zip(got, want)):
        if i in skip:
            continue
        if w.dtype == np.int8 or g.dtype == np.int8:
            if g.shape != w.shape or not np.array_equal(g, w):
                diff = int((g != w).sum()) if g.shape == w.shape else -1
                return (
                    f"mismatch: output {i}: {diff} int8 codes differ (shape {g.shape} vs {w.shape})"
                )
            continue
        why = compare(g, w, scen.tol, scen.ref_k)
        if why:
            return f"mismatch: output {i}: {why}"
    return "ok"


# -- one case, in a subprocess -------------------------------------------------------------------


@dataclass
class Result:
    case: Case
    status: str  # pass | fail | signal | sanitizer | timeout | crash | harness
    detail: str
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def asan_env(lib: str) -> dict[str, str]:
    """The environment that loads the sanitized library into a python that is not built with
    it: libasan (and libubsan) preloaded, leaks not reported (python's own), reports to stderr."""
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True)
        path = out.stdout.strip()
        if out.returncode or not os.path.isabs(path):
            raise RuntimeError(f"gcc does not know where {name} is")
        libs.append(os.path.realpath(path))
    return {
        LIB_ENV: lib,
        "LD_PRELOAD": " ".join(libs),
        "ASAN_OPTIONS": "detect_leaks=0:allocator_may_return_null=1:halt_on_error=1:"
        "handle_segv=1:print_summary=1",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }


class Server:
    """A python that has imported numpy, onnx, onnxruntime and the cases once and forks a child
    per case (`python -m tests.decoder.kernel_cases --serve`): each case still runs in a
    process of its own (a crash ends only that child), without paying the imports each time.
    env: the server's extra environment (the library to load, the sanitizer's preloads)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        e = {**os.environ, **(env or {})}
        e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        e["OMP_NUM_THREADS"] = e["OPENBLAS_NUM_THREADS"] = "1"  # no BLAS pool across fork
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.decoder.kernel_cases", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=e,
        )

    def run(self, case: Case, timeout: float = 120) -> Result:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        t0 = time.perf_counter()
        self.proc.stdin.write(f"{case.op}\t{case.name}\t{timeout}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the case server exited ({self.proc.poll()})")
        return _classify(case, json.loads(line), time.perf_counter() - t0)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


_SERVERS: dict[tuple[tuple[str, str], ...], Server] = {}


def run_isolated(case: Case, env: dict[str, str] | None = None, timeout: float = 120) -> Result:
    """Run one case in a child process of a server for env (started on first use)."""
    key = tuple(sorted((env or {}).items()))
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = Server(env)
    return server.run(case, timeout)


def _classify(case: Case, rep: dict[str, Any], dt: float) -> Result:
    """A child's report -> its Result: a sanitizer report, a signal, a timeout, an exit other
    than 0 or a failed check is a failure."""
    err = rep["stderr"]
    marks = [ln for ln in err.splitlines() if any(m in ln for m in ASAN_MARKS)]
    if marks:
        return Result(case, "sanitizer", marks[0].strip()[:300], dt)
    if rep["timeout"]:
        return Result(case, "timeout", f"no result within {rep['timeout']:.0f} s", dt)
    if rep["signal"]:
        return Result(case, "signal", signal.Signals(rep["signal"]).name, dt)
    if rep["rc"] != 0:
        tail = (err.strip().splitlines() or ["(no output)"])[-1]
        return Result(case, "crash", f"exit {rep['rc']}: {tail[:300]}", dt)
    try:
        data = json.loads(rep["result"])
    except json.JSONDecodeError:
        return Result(case, "harness", f"no result: {rep['result'][-200:]!r}", dt)
    detail = "; ".join(f"{w}->{c}" for w, c in zip(data.get("wants", []), data["calls"]))
    return Result(case, data["verdict"], detail or data.get("detail", ""), dt)


def _serve() -> int:
    """The server's loop: one line "op<TAB>name<TAB>timeout" in, one JSON report out."""
    import tempfile

    import onnx.helper  # noqa: F401  (imported once, here, for every child)
    import onnxruntime  # noqa: F401

    import llmir_core.backends.ort_runtime  # noqa: F401
    import llmir_core.dialects.ort  # noqa: F401
    import llmir_core.quant.nbits  # noqa: F401
    import llmir_core.quant.s8  # noqa: F401

    table = {(c.op, c.name): c for c in all_cases()}
    _bf16()
    tmp = tempfile.mkdtemp(prefix="llmir-kcases-")
    res_path, err_path = os.path.join(tmp, "result"), os.path.join(tmp, "stderr")
    for line in sys.stdin:
        op, name, limit = line.rstrip("\n").split("\t")
        for path in (res_path, err_path):
            open(path, "w").close()
        pid = os.fork()
        if pid == 0:  # the child: its stdout and stderr into the file, the result into another
            fd = os.open(err_path, os.O_WRONLY | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = 0
            try:
                out = run_here(table[(op, name)])
                with open(res_path, "w") as fh:
                    fh.write(json.dumps(out))
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 70
            sys.stderr.flush()
            os._exit(code)
        rep = _reap(pid, float(limit))
        rep["result"] = Path(res_path).read_text()
        rep["stderr"] = Path(err_path).read_text(errors="replace")[-20000:]
        sys.stdout.write(json.dumps(rep) + "\n")
        sys.stdout.flush()
    return 0


def _reap(pid: int, limit: float) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"rc": None, "signal": 0, "timeout": limit}
        time.sleep(0.005)
    if os.WIFSIGNALED(status):
        return {"rc": None, "signal": os.WTERMSIG(status), "timeout": 0}
    return {"rc": os.WEXITSTATUS(status), "signal": 0, "timeout": 0}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--serve"]:
        return _serve()
    if len(args) != 2:
        print("usage: python -m tests.decoder.kernel_cases (OP NAME | --serve)", file=sys.stderr)
        return 2
    out = run_here(find(args[0], args[1]))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
