"""The pieces every kernel's cases share: a case (calls on one one-node session, each wanting
the reference's result, an onnxruntime error, or either), the graph and session, the
comparison with the reference."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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

    from llmir_core.targets.onnxruntime.native import DOMAIN

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

    from llmir_core.targets.onnxruntime.native import DOMAIN, register

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


def _f(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, F64)


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
