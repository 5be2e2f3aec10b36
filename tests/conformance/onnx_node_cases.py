"""The official ONNX node tests, run through llmir: scope, classification, comparison.

Shared by tests/conformance/test_onnx_node.py (the CI gate) and scripts/gen_onnx_conformance.py
(writes docs/onnx-conformance.md). The cases come from the installed onnx package
(`onnx.backend.test.case.node.collect_testcases()`, generated in memory).

Scope. A node test is *for a supported op* when every node in it is an op the ONNX frontend maps
(`onnx_ops.HANDLERS`) and every tensor type in it has an llmir dtype, whatever its opset (the
importer converts models older than opset 13 with onnx.version_converter, as users get it).
Out-of-scope tests are counted, with the reason, but not run.

Each in-scope test runs on two backends:
- reference: import -> the numpy reference interpreter;
- onnxruntime: import -> build (in memory) -> onnxruntime. A test onnxruntime cannot run in its
  original form (a kernel or a numpy I/O type it lacks) is excluded from this column, with the
  error as the reason; the built model is also compared with onnxruntime on the original.

Outputs are compared with the test's expected outputs at the test's rtol/atol, raised to a floor
per dtype (f16 2e-3, bf16 1.6e-2, f8 2.5e-1: about two units in the last place), NaNs equal.

Elements the ONNX spec leaves undefined are not compared: a Cast/CastLike from a floating type to
a fixed-point type (int4, uint4, int2, uint2, int8, ...) is "undefined if OOR", and the node tests
record whatever numpy's out-of-range cast produced on the machine that generated them (it differs
between CPUs: 8.0 -> int4 gives 0 on one, -8 on another). Such elements (NaN, +-inf, or a value
whose truncation lies outside the target's range) may hold any value of the right dtype; every
other element is compared exactly. Casts the spec defines (fixed -> fixed wraps, float -> float8
saturates or not per the `saturate` table) are compared as recorded: onnx computes those in
software, the same on every machine. So the pass/fail of a case, and the baseline, do not depend
on the machine the tests ran on.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper

from llmir_core.backends.ort_runtime import run_session
from llmir_core.frontends.onnx import ONNX_TO_DTYPE, onnx_dtype_name
from llmir_core.frontends.onnx_ops import HANDLERS
from llmir_core.onnx_backend import LlmirRep

BACKENDS = ("reference", "onnxruntime")
# (rtol, atol) floors per output dtype name
TOL_FLOOR = {
    "float16": (2e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "float8_e4m3fn": (2.5e-1, 1e-2),
    "float8_e5m2": (2.5e-1, 1e-2),
}


# In-scope tests llmir does not run, with the reason (not counted in the pass rate).
EXCLUDED = {
    "test_training_dropout": "Dropout in training mode draws random numbers",
    "test_training_dropout_default": "Dropout in training mode draws random numbers",
    "test_training_dropout_default_mask": "Dropout in training mode draws random numbers",
    "test_training_dropout_mask": "Dropout in training mode draws random numbers",
}


@dataclass
class CaseResult:
    name: str
    ops: tuple[str, ...]
    scope: str | None = None  # None = in scope; else why not
    status: dict[str, str] = field(default_factory=dict)  # backend -> pass | fail | excluded
    reason: dict[str, str] = field(default_factory=dict)
    ort_original_agrees: bool | None = None


@functools.lru_cache(maxsize=1)
def node_cases() -> list[Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return [c for c in collect_testcases() if c.kind == "node"]


def _op_key(n: onnx.NodeProto) -> tuple[str, str]:
    return ("" if n.domain in ("", "ai.onnx") else n.domain, n.op_type)


def _types_in(model: onnx.ModelProto) -> set[int]:
    """Every tensor element type the test's graph mentions (I/O, Cast targets, attribute tensors)."""
    out: set[int] = set()
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        t = vi.type
        if t.HasField("tensor_type"):
            out.add(t.tensor_type.elem_type)
        else:
            out.add(-1)  # sequence / optional / map
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to":
                out.add(a.i)
            if a.type == onnx.AttributeProto.TENSOR:
                out.add(a.t.data_type)
    for t in g.initializer:
        out.add(t.data_type)
    return out


def scope_of(case: Any) -> str | None:
    """None when the case is in scope, else the reason it is not."""
    missing = sorted(
        {
            f"{d + ':' if d else ''}{o}"
            for d, o in map(_op_key, case.model.graph.node)
            if (d, o) not in HANDLERS
        }
    )
    if missing:
        return f"op not in llmir's op set: {', '.join(missing)}"
    bad = sorted(t for t in _types_in(case.model) if t not in ONNX_TO_DTYPE)
    if bad:
        names = ["sequence/optional" if t == -1 else onnx_dtype_name(t) for t in bad]
        return f"type without an llmir dtype: {', '.join(names)}"
    return None


def _arrays(values: list[Any]) -> list[np.ndarray]:
    return [
        np.asarray(onnx.numpy_helper.to_array(v))
        if isinstance(v, onnx.TensorProto)
        else np.asarray(v)
        for v in values
    ]


# Value range of the fixed-point types numpy's iinfo does not know (ml_dtypes' sub-byte ints).
_SUB_BYTE_RANGE = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _int_range(dtype: np.dtype) -> tuple[int, int] | None:
    """(min, max) of a fixed-point dtype, None for a floating or bool one."""
    if dtype.name in _SUB_BYTE_RANGE:
        return _SUB_BYTE_RANGE[dtype.name]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    return None


def undefined_elements(
    case: Any, inputs: list[np.ndarray], want: list[np.ndarray]
) -> list[np.ndarray | None]:
    """Per expected output, a mask of the elements whose value the ONNX spec leaves undefined
    (None: all defined). Only a Cast/CastLike of a graph input from a floating type to a
    fixed-point type has such elements: NaN, +-inf and values out of the target's range."""
    out: list[np.ndarray | None] = [None] * len(want)
    g = case.model.graph
    if len(g.node) != 1 or g.node[0].op_type not in ("Cast", "CastLike") or not inputs:
        return out
    src = np.asarray(inputs[[i.name for i in g.input].index(g.node[0].input[0])])
    if src.dtype.kind in "biu" or _int_range(src.dtype) is not None:
        return out  # fixed -> fixed wraps, bool casts are exact: all defined
    for j, w in enumerate(want):
        rng = _int_range(np.asarray(w).dtype)
        if rng is None or src.shape != np.asarray(w).shape:
            continue
        with np.errstate(invalid="ignore"):
            x = np.trunc(src.astype(np.float64))
            out[j] = ~np.isfinite(x) | (x < rng[0]) | (x > rng[1])
    return out


def compare(
    got: np.ndarray, want: np.ndarray, rtol: float, atol: float, undefined: np.ndarray | None = None
) -> str | None:
    """None when equal within tolerance, else a one-line reason. Elements set in `undefined`
    (see undefined_elements) may hold any value."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if undefined is not None and undefined.any():
        got = np.where(undefined, want, got).astype(want.dtype)
    floor = TOL_FLOOR.get(want.dtype.name)
    if floor:
        rtol, atol = max(rtol, floor[0]), max(atol, floor[1])
    if want.dtype.kind in "biu" or want.dtype.name in ("int4", "uint4"):
        bad = np.asarray(got != want)
        return None if not bad.any() else f"{int(bad.sum())} of {bad.size} elements differ"
    g, w = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return None
    idx = np.argwhere(~close)[0]
    return (
        f"{int((~close).sum())} of {close.size} elements differ (first at {idx.tolist()}: "
        f"{g[tuple(idx)]!r} vs {w[tuple(idx)]!r})"
    )


def _ort_original(
    case: Any, inputs: list[np.ndarray]
) -> tuple[list[np.ndarray] | None, str | None]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(
            case.model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in sess.get_inputs()]
        return run_session(sess, dict(zip(names, inputs))), None
    except Exception as exc:
        return None, str(exc).strip().splitlines()[0][:200]


def run_case(case: Any) -> CaseResult:
    ops = tuple(sorted({o for _, o in map(_op_key, case.model.graph.node)}))
    res = CaseResult(case.name, ops, scope_of(case))
    if res.scope:
        return res
    if case.name in EXCLUDED:
        for b in BACKENDS:
            res.status[b], res.reason[b] = "excluded", EXCLUDED[case.name]
        return res
    sets = [(_arrays(list(i)), _arrays(list(o))) for i, o in case.data_sets]
    for backend in BACKENDS:
        ort_outs: list[list[np.ndarray]] = []
        if backend == "onnxruntime":
            for ins, _ in sets:
                outs, err = _ort_original(case, ins)
                if err is not None:
                    res.status[backend] = "excluded"
                    res.reason[backend] = f"onnxruntime cannot run the original model: {err}"
                    break
                assert outs is not None
                ort_outs.append(outs)
            if backend in res.status:
                continue
        try:
            rep = LlmirRep(case.model, backend)
            agrees = True
            why = None
            for k, (ins, want) in enumerate(sets):
                got = rep.run(ins)
                undefined = undefined_elements(case, ins, want)
                for j, (g, w) in enumerate(zip(got, want)):
                    why = why or compare(g, w, case.rtol, case.atol, undefined[j])
                    if why:
                        why = f"output #{j}: {why}"
                    if ort_outs and compare(g, ort_outs[k][j], case.rtol, case.atol, undefined[j]):
                        agrees = False
            if ort_outs:
                res.ort_original_agrees = agrees
            res.status[backend] = "fail" if why else "pass"
            if why:
                res.reason[backend] = why
        except Exception as exc:
            res.status[backend] = "fail"
            lines = str(exc).strip().splitlines()
            res.reason[backend] = f"{type(exc).__name__}: {lines[0] if lines else ''}"[:240]
    return res


def run_all(names: list[str] | None = None) -> tuple[list[CaseResult], float]:
    t0 = time.perf_counter()
    out = []
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        os.environ.setdefault("ORT_LOGGING_LEVEL", "4")
        for case in node_cases():
            if names is None or case.name in names:
                out.append(run_case(case))
    return out, time.perf_counter() - t0


def summarize(results: list[CaseResult]) -> dict[str, Any]:
    in_scope = [r for r in results if r.scope is None]
    summary: dict[str, Any] = {
        "total": len(results),
        "in_scope": len(in_scope),
        "out_of_scope": len(results) - len(in_scope),
    }
    for b in BACKENDS:
        c = Counter(r.status.get(b) for r in in_scope)
        runnable = len(in_scope) - c["excluded"]
        summary[b] = {
            "pass": c["pass"],
            "fail": c["fail"],
            "excluded": c["excluded"],
            "runnable": runnable,
            "rate": c["pass"] / runnable if runnable else 1.0,
        }
    agree = [r.ort_original_agrees for r in in_scope if r.ort_original_agrees is not None]
    summary["ort_original_agrees"] = sum(1 for a in agree if a)
    summary["ort_original_compared"] = len(agree)
    return summary


def per_op(results: list[CaseResult]) -> dict[str, dict[str, Counter[str]]]:
    table: dict[str, dict[str, Counter[str]]] = defaultdict(
        lambda: {b: Counter() for b in BACKENDS}
    )
    for r in results:
        if r.scope is not None:
            continue
        for op in r.ops:
            for b in BACKENDS:
                table[op][b][r.status.get(b, "fail")] += 1
    return dict(sorted(table.items()))
