"""Differential validation across the int8 KV-cache interface (kv-cache-int8{scales=calibrated}).

The rewritten decoder takes and returns int8 codes where the original takes and returns f32
cache entries, with one static scale s per entry (a constant of the module), so translation
validation cannot pair their terms and plain differential testing cannot feed both. This check
adapts the interface: seeded caches within the calibrated range (uniform in +-63.5 s) are
quantized to codes with s (what the int8 decoder would hold), the original gets exactly
f32(codes) * s, the token ids are drawn from the calibration sample the pass recorded
(`llm.kv_cache_int8.sample_ids`; static scales are only meant for inputs like those they were
calibrated on), both modules run in the reference interpreter, and then
- every present entry, dequantized, is within the quantizer's error of the original's: s/2,
  plus the excess beyond the calibrated range where a value saturates (exactly that for the
  first layer's entries, which nothing quantized precedes), plus for later layers a slack of
  `PROPAGATION` of the entry's magnitude for the error the quantized earlier layers carry
  forward;
- the logits agree within `LOGITS_RTOL` of their largest magnitude.
It is a differential check over a few inputs, not a proof: agreement is `inconclusive` with the
measured errors (never `equivalent`: the step is lossy and no bound is composed across the int8
interface); a violation is `not-equivalent` with the input.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.interp import Interpreter
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Module, Value
from llmir_core.ir.types import DType, TensorType

from .verdicts import INCONCLUSIVE, NOT_EQUIVALENT

LOGITS_RTOL = 0.1
PROPAGATION = 0.1  # of the entry's magnitude, for layers after the first
ROUNDING = 1e-5  # f32 arithmetic of the first layer's entries


def _const(v: Value) -> np.ndarray | None:
    op = v.owner
    if op is None or op.name != "core.constant" or not isinstance(op.attrs.get("value"), DenseAttr):
        return None
    return np.asarray(op.attrs["value"].array, np.float32)


def _scale_of(module: Module, arg: Value) -> np.ndarray | None:
    """The static scale an int8 cache argument is read with: the `s` of
    core.mul(core.cast(core.concat(arg, codes)), s), or the k/v_scale of the
    ort.group_query_attention that takes it as its past."""
    fn = module.main
    for op in fn.ops:
        if not any(o is arg for o in op.operands):
            continue
        if op.name == "ort.group_query_attention" and op.attrs.get("kv_quant", "none") != "none":
            n = len(op.operands)
            base = 1 if op.attrs.get("packed") else 3
            if op.operands[base] is arg:
                return _const(op.operands[n - 2])
            if op.operands[base + 1] is arg:
                return _const(op.operands[n - 1])
        if op.name == "core.concat" and op.operands[0] is arg:
            for cast in fn.ops:
                if cast.name == "core.cast" and cast.operands[0] is op.results[0]:
                    for mul in fn.ops:
                        if mul.name == "core.mul" and mul.operands[0] is cast.results[0]:
                            return _const(mul.operands[1])
    return None


def int8_interface(before: Module, after: Module) -> dict[str, np.ndarray] | None:
    """When `after` differs from `before` only by int8 cache entries with static scales (same
    names and shapes, f32 -> i8 arguments and presents): cache argument name -> scale."""
    fb, fa = before.main, after.main
    if len(fb.args) != len(fa.args) or len(fb.outputs) != len(fa.outputs) or len(fa.args) < 3:
        return None
    if len(fa.outputs) != len(fa.args) - 1:  # the decoder convention: logits + one per past
        return None
    scales: dict[str, np.ndarray] = {}
    for i, (x, y) in enumerate(zip(fb.args, fa.args)):
        if x.type == y.type:
            continue
        tx, ty = x.type, y.type
        if (
            i < 2
            or x.name != y.name
            or not isinstance(tx, TensorType)
            or not isinstance(ty, TensorType)
            or tx.dtype != DType.f32
            or ty.dtype != DType.i8
            or tx.shape != ty.shape
        ):
            return None
        s = _scale_of(after, y)
        if s is None:
            return None
        scales[y.name] = s
    for i, (xt, yt) in enumerate(zip(fb.output_types, fa.output_types)):
        if xt == yt:
            continue
        if i == 0 or fa.args[i + 1].name not in scales:
            return None
    return scales or None


def _trial_inputs(
    before: Module, scales: dict[str, np.ndarray], seed: int, dimv: int, sample: list[int]
) -> tuple[dict[str, int], dict[str, Any], dict[str, Any]]:
    """One seeded input at every symbolic dim = `dimv` (token ids drawn from `sample` when
    given): the dims, the original's inputs (f32 caches) and the int8 one's (the same caches as
    codes, so both see the same values)."""
    from llmir_core.targets import get_target

    from .differential import _dims_env, make_inputs

    env = _dims_env(before, dimv)
    inputs = make_inputs(before, env, seed, 1.0)
    rng = np.random.default_rng(seed)
    if sample:
        shape = inputs["input_ids"].shape
        inputs["input_ids"] = rng.choice(np.asarray(sample, np.int64), size=shape)
    b_in, a_in = dict(inputs), dict(inputs)
    for name, s in scales.items():
        x = rng.uniform(-0.5, 0.5, inputs[name].shape) * 127.0 * s
        codes = get_target("onnxruntime").kv_int8_codes(x.astype(np.float32), s)
        a_in[name] = codes
        b_in[name] = codes.astype(np.float32) * s
    return env, b_in, a_in


def compare(before: Module, after: Module, scales: dict[str, np.ndarray]) -> dict[str, Any]:
    fa = after.main
    info = after.attrs.get("llm.kv_cache_int8")
    sample = list(info.get("sample_ids") or []) if isinstance(info, dict) else []
    saturated = checked = 0
    worst_logits = worst_entry = worst_ratio = 0.0
    trials = [("every symbolic dim = 1 (seq=1)", 1), ("every symbolic dim = 3", 3)]
    for seed, (label, dimv) in enumerate(trials):
        env, b_in, a_in = _trial_inputs(before, scales, seed, dimv, sample)
        try:
            ob = Interpreter(before).run(b_in)
            oa = Interpreter(after).run(a_in)
        except Exception as exc:  # noqa: BLE001 - cannot run: inconclusive
            return {
                "verdict": "inconclusive",
                "method": "differential over the int8 KV interface",
                "details": [f"the reference interpreter cannot run these modules: {exc}"],
            }
        where = f"input: {label}, seed {seed}, dims {env}"
        lb, la = np.asarray(ob[0], np.float64), np.asarray(oa[0], np.float64)
        top = max(float(np.abs(lb).max()) if lb.size else 0.0, 1e-30)
        if lb.shape == la.shape:
            worst_logits = max(worst_logits, float(np.abs(la - lb).max(initial=0.0)))
        if lb.shape != la.shape or float(np.abs(la - lb).max()) > LOGITS_RTOL * top:
            return _fail(
                f"the logits differ by more than {LOGITS_RTOL:g} of their largest magnitude ({where})"
            )
        for i in range(1, len(oa)):
            name = fa.args[i + 1].name
            x = np.asarray(ob[i], np.float64)
            if name not in scales:
                if not np.allclose(np.asarray(oa[i], np.float64), x, rtol=1e-4, atol=1e-6):
                    return _fail(f"output #{i} differs ({where})")
                continue
            s = scales[name].astype(np.float64)
            deq = np.asarray(oa[i]).astype(np.float64) * s
            if deq.shape != x.shape:
                return _fail(f"output #{i} has shape {deq.shape}, expected {x.shape} ({where})")
            excess = np.maximum(np.abs(x) - 127.0 * s, 0.0)
            slack = ROUNDING if i <= 2 else PROPAGATION
            bound = s / 2 + excess + slack * max(float(np.abs(x).max()), 1e-30)
            bad = np.abs(deq - x) > bound
            if x.size:
                worst_entry = max(worst_entry, float(np.abs(deq - x).max()))
                worst_ratio = max(worst_ratio, float((np.abs(deq - x) / bound).max()))
            if bad.any():
                j = tuple(int(k) for k in np.argwhere(bad)[0])
                return _fail(
                    f"present #{i} ({name}) at {list(j)}: {deq[j]:.6g} is not within the int8 "
                    f"quantization error of {x[j]:.6g} ({where})"
                )
            saturated += int((excess > 0).sum())
            checked += x.size
    return {
        "verdict": INCONCLUSIVE,
        "agree": True,
        "method": f"differential over the int8 KV interface ({len(trials)} seeded inputs: "
        f"cache entries within the int8 quantization error, {saturated} of {checked} "
        f"saturated; logits within {LOGITS_RTOL:g} of their largest magnitude; no proof)",
        "measured": worst_logits,
        "details": [
            "a lossy step validated by measurement only (no bound is composed across the int8 "
            f"KV interface): measured max |logits error| {worst_logits:.3g}, max |cache entry "
            f"error| {worst_entry:.3g} (at most {worst_ratio:.3g} of its bound)"
        ],
    }


def _fail(msg: str) -> dict[str, Any]:
    return {
        "verdict": NOT_EQUIVALENT,
        "method": "differential over the int8 KV interface",
        "details": [msg],
    }


__all__ = ["int8_interface", "compare", "LOGITS_RTOL"]
