"""The official ONNX node tests of the LLM ops, run through llmir: scope, classification,
comparison.

Shared by scripts/gen_onnx_conformance.py (the full run: writes docs/onnx-conformance.md and
onnx_node_baseline.json) and tests/conformance/test_onnx_node.py (CI: a sample of the node-test
modules, plus checks that the committed numbers are consistent). The cases come from the
installed onnx package (`onnx.backend.test.case.node`, generated in memory, one module at a time).

Scope. The LLM ops are the documented list LLM_OPS below (every op an LLM graph uses, by
category, whether llmir maps it or not). A node test is *of* op X when onnx's `expect()` recorded
it for a node of type X (its `_expanded` variants, X's function body, belong to X too). Every
node test of an LLM op is in scope, whatever its dtypes, attributes or opset: a test llmir cannot
import or run counts as failed. The only case-level exclusion is a test whose expected output the
spec does not define (EXCLUDED, with the rule).

Each in-scope test runs on two backends:
- reference: import -> the numpy reference interpreter;
- onnxruntime: import -> build (in memory) -> onnxruntime. The built model is also compared with
  onnxruntime running the original model where onnxruntime can (an agreement count only: a test
  onnxruntime cannot run in its original form still counts, since llmir's build must run it).

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
import re
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper

from llmir_core.onnx_backend import LlmirRep
from llmir_core.targets.onnxruntime.session import run_session

BACKENDS = ("reference", "onnxruntime")
# (rtol, atol) floors per output dtype name
TOL_FLOOR = {
    "float16": (2e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-2),
    "float8_e4m3fn": (2.5e-1, 1e-2),
    "float8_e5m2": (2.5e-1, 1e-2),
}


# In-scope tests whose expected output the spec does not define: not run, not counted.
_RANDOM = (
    "training-mode Dropout with ratio > 0: the spec defines the output's distribution (a random "
    "mask), not its values"
)
EXCLUDED = {
    "test_training_dropout": _RANDOM,
    "test_training_dropout_default": _RANDOM,
    "test_training_dropout_default_mask": _RANDOM,
    "test_training_dropout_mask": _RANDOM,
}


# The ONNX ops an LLM graph uses, by category: what exporters (torch.onnx, optimum,
# onnxruntime-genai, onnxruntime's and llm-compressor's quantizers) emit for decoder-only and
# encoder transformer models. Every node test of these op types is measured, whatever its dtypes
# or attributes, whether llmir maps the op or not. Not listed: convolution, pooling and image ops
# (Conv*, *Pool, Resize, GridSample, RoiAlign, ...), recurrent and state-space ops (RNN, GRU, LSTM,
# LinearAttention, CausalConvWithState, Scan), control flow (If, Loop), sequences and optionals,
# strings and the ai.onnx.ml domain, training and losses (ai.onnx.preview.training,
# NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), signal processing (DFT, STFT, windows),
# random generators, bit manipulation (BitShift, Bitwise*, BitCast), the inverse/hyperbolic
# trigonometric ops, vision-style normalizations (BatchNormalization, GroupNormalization,
# InstanceNormalization, LRN, LpNormalization, MeanVarianceNormalization) and preview ops.
LLM_OPS: dict[str, tuple[str, ...]] = {
    "arithmetic": (
        "Abs", "Add", "Ceil", "Clip", "Cos", "Div", "Erf", "Exp", "Floor", "Log", "Max", "Mean",
        "Min", "Mod", "Mul", "Neg", "Pow", "Reciprocal", "Round", "Sign", "Sin", "Sqrt", "Sub",
        "Sum", "Tanh",
    ),
    "comparison and logic": (
        "And", "Equal", "Greater", "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual",
        "Not", "Or", "Where", "Xor",
    ),
    "activations": (
        "Celu", "Elu", "Gelu", "HardSigmoid", "HardSwish", "LeakyRelu", "LogSoftmax", "Mish",
        "PRelu", "Relu", "Selu", "Sigmoid", "Softmax", "Softplus", "Softsign", "SwiGLU", "Swish",
        "ThresholdedRelu",
    ),
    "normalization": ("LayerNormalization", "RMSNormalization"),
    "attention and KV cache": ("Attention", "RotaryEmbedding", "TensorScatter"),
    "matmul": ("Einsum", "Gemm", "MatMul", "MatMulInteger", "QLinearMatMul"),
    "quantization": ("DequantizeLinear", "DynamicQuantizeLinear", "QuantizeLinear"),
    "casts and constants": (
        "Cast", "CastLike", "Constant", "ConstantOfShape", "Dropout", "Identity",
    ),
    "shapes": (
        "Concat", "Expand", "Flatten", "Pad", "Range", "Reshape", "Shape", "Size", "Slice",
        "Split", "Squeeze", "Tile", "Transpose", "Trilu", "Unsqueeze",
    ),
    "gather, scatter and indices": (
        "ArgMax", "ArgMin", "CumSum", "Gather", "GatherElements", "GatherND", "ScatterElements",
        "ScatterND", "TopK",
    ),
    "reductions": (
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    ),
}  # fmt: skip
LLM_OP_SET = frozenset(op for ops in LLM_OPS.values() for op in ops)


@dataclass
class CaseResult:
    name: str
    op: str  # the op type the test is for (see op_under_test)
    scope: str | None = None  # None = in scope; else why not
    status: dict[str, str] = field(default_factory=dict)  # backend -> pass | fail | excluded
    reason: dict[str, str] = field(default_factory=dict)
    ort_original_agrees: bool | None = None
    module: str = ""  # the onnx.backend.test.case.node module that records it


def node_modules() -> list[str]:
    """The modules of onnx.backend.test.case.node that record node tests, sorted."""
    import pkgutil

    import onnx.backend.test.case.node as node

    return sorted(m.name for m in pkgutil.walk_packages(node.__path__, "") if not m.ispkg)


@functools.cache
def cases_of_module(module: str) -> tuple[Any, ...]:
    """The node tests one module records (importing it runs its `expect()` calls). A module some
    earlier code imported already (e.g. through collect_testcases) is looked up in the full set,
    by the names the committed baseline lists for it."""
    import importlib
    import sys

    import onnx.backend.test.case.node as node

    full = f"{node.__name__}.{module}"
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if full not in sys.modules:
            before = len(node._NodeTestCases)
            importlib.import_module(full)
            return tuple(c for c in node._NodeTestCases[before:] if c.kind == "node")
    from tests.conformance.baseline import read_baseline

    names = {n for n, e in read_baseline()["cases"].items() if e["module"] == module}
    return tuple(c for c in node._NodeTestCases if c.kind == "node" and c.name in names)


def node_cases() -> list[tuple[str, Any]]:
    """Every node test, as (module, case)."""
    return [(m, c) for m in node_modules() for c in cases_of_module(m)]


def _op_key(n: onnx.NodeProto) -> tuple[str, str]:
    return ("" if n.domain in ("", "ai.onnx") else n.domain, n.op_type)


_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


def op_under_test(case: Any, by_name: dict[str, Any] | None = None) -> str:
    """The op type a node test is for. onnx's `expect()` makes each test a graph of the one node
    under test; the `_expanded` variant of a test is that node's function body (several nodes),
    so it belongs to the op of the test it expands."""
    nodes = case.model.graph.node
    if by_name is not None and _EXPANDED.search(case.name):
        base = by_name.get(_EXPANDED.sub("", case.name))
        if base is not None and base is not case:
            return op_under_test(base)
    d, o = _op_key(nodes[0]) if len(nodes) == 1 else ("", "?")
    return f"{d}:{o}" if d else o


def scope_of(op: str) -> str | None:
    """None when the test is in scope (its op is an LLM op), else the reason it is not."""
    return None if op in LLM_OP_SET else "not an LLM op"


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


def run_case(case: Any, op: str | None = None) -> CaseResult:
    op = op or op_under_test(case)
    res = CaseResult(case.name, op, scope_of(op))
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
            # onnxruntime on the original model, for the agreement count only: a test it cannot
            # run still counts (llmir's build must run it)
            for ins, _ in sets:
                outs, err = _ort_original(case, ins)
                if err is not None:
                    ort_outs = []
                    break
                assert outs is not None
                ort_outs.append(outs)
        try:
            rep = LlmirRep(case.model, backend)
            agrees = True
            why = None
            for k, (ins, want) in enumerate(sets):
                got = rep.run(ins)
                if len(got) != len(want):
                    why = why or f"{len(got)} outputs, expected {len(want)}"
                undefined = undefined_elements(case, ins, want)
                for j, (g, w) in enumerate(zip(got, want)):
                    why = why or compare(g, w, case.rtol, case.atol, undefined[j])
                    if why and not why.startswith("output #"):
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


def run_all(modules: list[str] | None = None) -> tuple[list[CaseResult], float]:
    """Run every node test of the given modules (default: all), in scope or not."""
    t0 = time.perf_counter()
    out = []
    sink = io.StringIO()
    mods = node_modules() if modules is None else modules
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        os.environ.setdefault("ORT_LOGGING_LEVEL", "4")
        for m in mods:
            cases = cases_of_module(m)
            by_name = {c.name: c for c in cases}
            for case in cases:
                r = run_case(case, op_under_test(case, by_name))
                r.module = m
                out.append(r)
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
        for b in BACKENDS:
            table[r.op][b][r.status.get(b, "fail")] += 1
    return dict(sorted(table.items()))
