"""Differential testing against the float64 reference interpreter: the fallback when SMT cannot
decide, and the check that a bound B is not below the measured error. Agreement on a few inputs
is evidence, not a proof: `compare` then says `inconclusive` (with `agree: True`), never
`equivalent`; a difference is `not-equivalent` with the input that shows it.

Inputs are seeded and cover edge cases: every symbolic dim 1 (seq=1), every dim 3, and large
magnitudes (x100). Both modules run in float64 where their dtypes are float (the original's
float args are cast up in both), and are compared with a dtype- and depth-aware tolerance. On
a mismatch the first differing op (by SSA name, in the optimized module's order) is reported
with its location in both files and its origin, plus the input that shows it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.interp import Interpreter
from llmir_core.ir.core import Module, Op
from llmir_core.ir.dims import SymDim, eval_dim
from llmir_core.ir.types import DType, KVCacheType, TensorType, numpy_dtype

from .verdicts import INCONCLUSIVE

BASE_TOL = {DType.f64: 1e-9, DType.f32: 1e-4, DType.f16: 2e-2, DType.bf16: 8e-2}


def _dims_env(module: Module, value: int) -> dict[str, int]:
    env: dict[str, int] = {}
    for a in module.main.args:
        t = a.type
        for d in t.shape if isinstance(t, TensorType) else ():
            if isinstance(d, SymDim):
                for n in d.names():
                    env[n] = value
    return env


def make_inputs(module: Module, env: dict[str, int], seed: int, scale: float) -> dict[str, Any]:
    from llmir_core.dialects.llm import KVCacheValue

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for a in module.main.args:
        t = a.type
        if isinstance(t, KVCacheType):
            batch = 1
            out[a.name] = KVCacheValue.empty(t, batch, max_len=env.get("max_len", 8))
            continue
        assert isinstance(t, TensorType)
        shape = tuple(eval_dim(d, env) or 1 if isinstance(d, (int, SymDim)) else 1 for d in t.shape)
        dt = t.dtype
        if isinstance(dt, DType) and dt.is_float:
            arr = (
                rng.standard_normal(shape)
                * scale
                / max(1.0, np.sqrt(shape[-1]) if shape and t.rank >= 2 else 1.0)
            )
            out[a.name] = arr.astype(numpy_dtype(dt))
        elif isinstance(dt, DType) and dt == DType.bool:
            out[a.name] = rng.random(shape) < 0.7
        elif isinstance(dt, DType):
            out[a.name] = rng.integers(0, 2, size=shape).astype(numpy_dtype(dt))
        else:
            raise ValueError(f"cannot generate input for {t}")
    return out


def _tol(module: Module) -> float:
    dts = [a.type.dtype for a in module.main.args if isinstance(a.type, TensorType)]
    base = max(
        (BASE_TOL.get(d, 1e-4) for d in dts if isinstance(d, DType) and d.is_float), default=1e-6
    )
    return base * (1.0 + module.op_count() / 200.0)


def _close(x: Any, y: Any, tol: float) -> bool:
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        if hasattr(x, "keys") and hasattr(y, "keys"):
            return _close(x.keys, y.keys, tol) and _close(x.values, y.values, tol)
        return True
    if x.shape != y.shape:
        return False
    if x.dtype.kind not in "fc":
        return bool(np.array_equal(x, y))
    a, b = x.astype(np.float64), y.astype(np.float64)
    scale = max(float(np.nanmax(np.abs(b))) if b.size else 0.0, 1e-30)
    return bool(np.allclose(a, b, rtol=tol, atol=tol * scale, equal_nan=True))


def _max_abs(x: Any, y: Any) -> float:
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray) or x.shape != y.shape:
        return float("inf")
    if x.dtype.kind not in "fc" or not x.size:
        return 0.0 if np.array_equal(x, y) else float("inf")
    return float(np.nanmax(np.abs(y.astype(np.float64) - x.astype(np.float64))))


def _where(op: Op | None) -> str:
    if op is None:
        return "a function argument"
    parts = [op.name]
    if op.pos is not None:
        parts.append(f"at {op.pos}")
    if op.origin:
        parts.append(f'(model: loc("{op.origin}"))')
    return " ".join(parts)


def _counterparts(op_b: Op, op_a: Op) -> bool:
    """Whether two ops whose results share a name compute the same thing in the two modules:
    passes keep a value's name when they rewrite what computes it, but a fresh name in the
    optimized module can repeat an unrelated one of the original. Ops that both record where in
    the model they come from (`loc`) must come from the same place."""
    return not (op_b.origin and op_a.origin) or op_b.origin == op_a.origin


def _trace(module: Module, inputs: dict[str, Any]) -> tuple[list[Any], dict[str, tuple[Op, Any]]]:
    it = Interpreter(module)
    it.trace = []
    outs = it.run(inputs)
    named = {}
    for op, vals in it.trace:
        for r, v in zip(op.results, vals):
            named[r.name] = (op, v)
    return outs, named


def compare(
    before: Module, after: Module, seeds: int = 2, tol: float | None = None, why: str = ""
) -> dict[str, Any]:
    """tol: the relative tolerance to use instead of the dtype- and depth-aware default (a pass
    that rounds values on purpose declares its own; `why` says so in the verdict's method)."""
    tol = _tol(before) if tol is None else tol
    trials = [
        ("every symbolic dim = 1 (seq=1)", 1, 1.0),
        ("every symbolic dim = 3", 3, 1.0),
        ("large magnitudes (x100)", 2, 100.0),
    ][: max(1, seeds + 1)]
    ran = 0
    for seed, (label, dimv, scale) in enumerate(trials):
        env = _dims_env(before, dimv)
        inputs = make_inputs(before, env, seed, scale)
        b_in = {a.name: inputs[x.name] for a, x in zip(before.main.args, before.main.args)}
        a_in = {a.name: inputs[x.name] for a, x in zip(after.main.args, before.main.args)}
        try:
            ob, tb = _trace(before, b_in)
            oa, ta = _trace(after, a_in)
        except Exception as exc:  # noqa: BLE001 - cannot run: inconclusive
            return {
                "verdict": "inconclusive",
                "method": "differential",
                "details": [f"the reference interpreter cannot run these modules: {exc}"],
            }
        ran += 1
        bad = [i for i, (x, y) in enumerate(zip(ob, oa)) if not _close(y, x, tol)]
        if not bad:
            continue
        x, y = ob[bad[0]], oa[bad[0]]
        err = _max_abs(x, y)
        details = [
            f"output #{bad[0]} differs on input: {label}, seed {seed}, dims {env}: measured max "
            f"|error| {err:.3g} (tolerance: rtol {tol:.2g} of the largest |output|)"
        ]
        first = None
        for op in after.main.ops:
            for r in op.results:
                if r.name in tb and r.name in ta and _counterparts(tb[r.name][0], op):
                    if not _close(ta[r.name][1], tb[r.name][1], tol):
                        first = (r.name, tb[r.name][0], op)
                        break
            if first:
                break
        if first:
            name, op_b, op_a = first
            details.append(f"first differing value: %{name}")
            details.append(f"  original:  {_where(op_b)}")
            details.append(f"  optimized: {_where(op_a)}")
        inp = {
            k: (
                v.tolist()
                if isinstance(v, np.ndarray) and v.size <= 16
                else f"numpy.random.default_rng({seed}) standard normal x{scale}, shape {getattr(v, 'shape', '?')}"
            )
            for k, v in inputs.items()
        }
        return {
            "verdict": "not-equivalent",
            "method": "differential",
            "measured": err,
            "details": details,
            "first_difference": first[0] if first else None,
            "input": inp,
            "input_desc": {"seed": seed, "dims": env, "scale": scale},
        }
    return {
        "verdict": INCONCLUSIVE,
        "agree": True,
        "method": f"differential ({ran} seeded inputs agree within rtol {tol:.2g}"
        f"{'; ' + why if why else ''}; no proof)",
    }


def max_error(
    before: Module, after: Module, input_range: tuple[float, float], trials: int = 3
) -> dict[str, Any]:
    """The largest |after - before| over the float outputs, on seeded inputs whose float
    elements are uniform in `input_range` (the ranges a bound B is stated for): the measurement
    that a claimed bound must not be below. Returns max_error, output, input, input_desc."""
    worst: dict[str, Any] = {"max_error": 0.0, "output": None, "input": None, "input_desc": None}
    lo, hi = input_range
    for seed in range(trials):
        dimv = (1, 3, 2)[seed % 3]
        env = _dims_env(before, dimv)
        inputs = make_inputs(before, env, seed, 1.0)
        rng = np.random.default_rng(1000 + seed)
        for k, v in list(inputs.items()):
            if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                inputs[k] = np.asarray(rng.uniform(lo, hi, v.shape)).astype(v.dtype)
        a_in = {a.name: inputs[x.name] for a, x in zip(after.main.args, before.main.args)}
        ob = Interpreter(before).run(inputs)
        oa = Interpreter(after).run(a_in)
        for i, (x, y) in enumerate(zip(ob, oa)):
            if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or x.shape != np.shape(y):
                continue
            d = np.abs(np.asarray(y, np.float64) - x.astype(np.float64))
            e = float(np.nanmax(d)) if d.size else 0.0
            if np.isnan(d).any():
                e = float("inf")
            if e > worst["max_error"] or worst["input_desc"] is None:
                worst = {
                    "max_error": e,
                    "output": i,
                    "input": _describe(inputs, seed),
                    "input_desc": {"seed": seed, "dims": env, "uniform": [lo, hi]},
                }
    return worst


def _describe(inputs: dict[str, Any], seed: int) -> dict[str, Any]:
    return {
        k: (
            v.tolist()
            if isinstance(v, np.ndarray) and v.size <= 16
            else f"seeded ({seed}), shape {getattr(v, 'shape', '?')}"
        )
        for k, v in inputs.items()
    }
