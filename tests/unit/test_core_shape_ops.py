"""core_shape ops: the reference semantics against onnxruntime, shape rules on symbolic dims, errors.

Each op runs through the whole pipeline (Builder infers the type, the verifier accepts the module,
the interpreter runs it and checks every result against the inferred type), and its output is
compared with onnxruntime running the equivalent one-node ONNX model.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from llmir_core.builder import Builder
from llmir_core.dialects.registry import all_ops
from llmir_core.interp import run
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Op
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.ir.typeparse import parse_type_text
from llmir_core.ir.types import TensorType, Type, dtype_from_numpy
from llmir_core.verifier import verify

onnx = pytest.importorskip("onnx", reason="onnx is needed to build the comparison models")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the independent oracle")
from onnx import helper  # noqa: E402

OPSET = 21
I64_MAX = 9223372036854775807
RNG = np.random.default_rng(0)

SHAPE_OPS = [
    "transpose",
    "concat",
    "split",
    "slice",
    "slice_dyn",
    "gather",
    "gather_elements",
    "scatter_elements",
    "scatter_nd",
    "expand",
    "expand_dyn",
    "squeeze",
    "unsqueeze",
    "range",
    "shape",
    "size",
    "trilu",
    "cumsum",
    "argmax",
    "argmin",
    "top_k",
    "identity",
    "tile",
    "pad",
    "flatten",
    "reshape_dyn",
    "constant_of_shape",
]


# -- harness -------------------------------------------------------------------------------


def ort_run(
    op_type: str, inputs: list[np.ndarray | None], n_out: int = 1, **attrs: Any
) -> list[np.ndarray]:
    """Run a one-node ONNX model on onnxruntime (None = an omitted optional input)."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(inputs)]
    infos = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in zip(names, inputs)
        if a is not None
    ]
    outs = [f"out{i}" for i in range(n_out)]
    graph = helper.make_graph(
        [helper.make_node(op_type, names, outs, **attrs)],
        "g",
        infos,
        [onnx.ValueInfoProto(name=o) for o in outs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {n: a for n, a in zip(names, inputs) if a is not None})


def static_type(a: np.ndarray) -> TensorType:
    return TensorType(tuple(int(s) for s in a.shape), dtype_from_numpy(a.dtype))


def build(name: str, types: list[Type], attrs: dict[str, Any] | None = None) -> tuple[Module, Op]:
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", t) for i, t in enumerate(types)]
    op = b.create(name, args, attrs)
    b.ret(*op.results)
    return Module("t", [fn], {"llmir.dialects": ("core",)}), op


def run_ir(
    name: str,
    inputs: list[np.ndarray],
    attrs: dict[str, Any] | None = None,
    types: list[Type] | None = None,
) -> list[np.ndarray]:
    """Build, verify and interpret one op (the interpreter checks results against the inferred types)."""
    m, _ = build(name, types or [static_type(a) for a in inputs], attrs)
    assert [d.message for d in verify(m)] == []
    return run(m, inputs)


def check(
    ours: list[np.ndarray], theirs: list[np.ndarray], rtol: float = 0.0, atol: float = 0.0
) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(
            a, b, rtol=rtol, atol=atol
        ) if rtol or atol else np.testing.assert_array_equal(a, b)


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def rand(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-5, 6, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def split_types(sig: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in sig:
        depth += (ch == "<") - (ch == ">")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + ([cur.strip()] if cur.strip() else [])


def example_module(example: str) -> Module:
    """Wrap an op's example line into a module whose arguments are the example's operands."""
    lhs, rhs = example.split("=", 1) if example.lstrip().startswith("%") else ("", example)
    body = rhs.strip().split(None, 1)[1] if " " in rhs.strip() else ""
    operands = re.findall(r"%\w+", re.split(r"[{:]", body, maxsplit=1)[0])
    arrow = example.rindex(") ->")
    depth, i = 0, arrow
    while True:
        depth += (example[i] == ")") - (example[i] == "(")
        if depth == 0:
            break
        i -= 1
    in_types = split_types(example[i + 1 : arrow])
    results = [r.strip() for r in lhs.split(",") if r.strip()]
    out_sig = example[arrow + 4 :].strip()
    out_types = split_types(out_sig[1:-1]) if out_sig.startswith("(") else [out_sig]
    args = ", ".join(f"{v}: {t}" for v, t in zip(operands, in_types))
    text = (
        f'module @ex attributes {{llmir.dialects = ["core"]}} {{\n'
        f"  func.func @main({args}) -> ({', '.join(out_types)}) {{\n    {example}\n"
        f"    return {', '.join(results)} : {', '.join(out_types)}\n  }}\n}}\n"
    )
    return parse_module(text)


# -- every op is declared completely, and its example verifies -----------------------------


@pytest.mark.parametrize("name", SHAPE_OPS)
def test_declared_with_example_that_verifies(name: str) -> None:
    d = all_ops()[f"core.{name}"]
    assert d.summary and d.verifies.endswith(".") and d.reference is not None
    m = example_module(d.example)
    assert [x.message for x in verify(m)] == []
    assert m.main.ops[0].name == f"core.{name}"
    assert parse_module(print_module(m)) == m


# -- reference semantics against onnxruntime -----------------------------------------------


@pytest.mark.parametrize(
    "shape,perm",
    [
        ((2, 3, 4), (2, 0, 1)),
        ((2, 3, 4), ()),
        ((0, 3), (1, 0)),
        ((5,), (0,)),
        ((2, 1, 3, 2), (3, 1, 0, 2)),
    ],
)
def test_transpose(shape: tuple[int, ...], perm: tuple[int, ...]) -> None:
    x = rand(*shape)
    check(
        run_ir("core.transpose", [x], {"perm": perm}),
        ort_run("Transpose", [x], **({"perm": list(perm)} if perm else {})),
    )


@pytest.mark.parametrize(
    "shapes,axis",
    [
        ([(2, 3), (2, 1), (2, 4)], -1),
        ([(0, 3), (2, 3)], 0),
        ([(1, 2, 3)], 1),
        ([(2, 0, 2), (2, 3, 2)], 1),
    ],
)
def test_concat(shapes: list[tuple[int, ...]], axis: int) -> None:
    xs = [rand(*s, dtype=np.int32) for s in shapes]
    check(run_ir("core.concat", xs, {"axis": axis}), ort_run("Concat", xs, axis=axis))


@pytest.mark.parametrize(
    "shape,axis,sizes,num",
    [
        ((4, 6), 1, (1, 2, 3), 0),
        ((4, 6), -2, (4,), 0),
        ((7, 2), 0, (), 3),
        ((6, 2), 0, (), 2),
        ((3, 0), 1, (0, 0), 0),
    ],
)
def test_split(shape: tuple[int, ...], axis: int, sizes: tuple[int, ...], num: int) -> None:
    x = rand(*shape)
    attrs: dict[str, Any] = (
        {"axis": axis, "sizes": sizes} if sizes else {"axis": axis, "num_outputs": num}
    )
    n = len(sizes) or num
    theirs = (
        ort_run("Split", [x, i64(*sizes)], n, axis=axis)
        if sizes
        else ort_run("Split", [x], n, axis=axis, num_outputs=num)
    )
    check(run_ir("core.split", [x], attrs), theirs)


SLICES = [  # starts, ends, axes, steps on a [5, 6, 4] tensor
    ((1,), (3,), (), ()),
    ((-1,), (I64_MAX,), (1,), ()),
    ((0, 2), (-1, 100), (0, -1), ()),
    ((I64_MAX,), (-I64_MAX,), (1,), (-1,)),
    ((4,), (0,), (0,), (-2,)),
    ((-2,), (-5,), (1,), (-1,)),
    ((3,), (1,), (0,), ()),  # empty
    ((0, 0, 0), (5, 6, 4), (), (2, 3, 5)),
    ((10,), (20,), (2,), ()),  # starts past the end: empty
    ((-100,), (2,), (1,), ()),
    ((-1,), (-100,), (2,), (-1,)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(
    starts: tuple[int, ...], ends: tuple[int, ...], axes: tuple[int, ...], steps: tuple[int, ...]
) -> None:
    x = rand(5, 6, 4)
    onnx_in: list[np.ndarray | None] = [
        x,
        i64(*starts),
        i64(*ends),
        i64(*axes) if axes else None,
        i64(*steps) if steps else None,
    ]
    while onnx_in[-1] is None:
        onnx_in.pop()
    if len(onnx_in) == 5 and onnx_in[3] is None:
        onnx_in[3] = i64(*range(len(starts)))
    theirs = ort_run("Slice", onnx_in)
    check(
        run_ir("core.slice", [x], {"starts": starts, "ends": ends, "axes": axes, "steps": steps}),
        theirs,
    )
    dyn_in = [a for a in onnx_in if a is not None]
    check(run_ir("core.slice_dyn", dyn_in), theirs)  # also the run-time form


@pytest.mark.parametrize(
    "idx,axis",
    [
        (i64(0, 2, -1), 0),
        (i64(1), 1),
        (np.array([[0, -3], [2, 1]], np.int32), -1),
        (np.array(1, np.int64), 0),
        (np.zeros((0,), np.int64), 1),
    ],
)
def test_gather(idx: np.ndarray, axis: int) -> None:
    x = rand(3, 4, 3)
    check(run_ir("core.gather", [x, idx], {"axis": axis}), ort_run("Gather", [x, idx], axis=axis))


@pytest.mark.parametrize(
    "idx,axis",
    [
        (np.array([[0, 1], [3, -1], [2, 2]], np.int64), 1),
        (np.array([[1, 0, 2, 0]], np.int64), 0),
        (np.array([[-3], [0]], np.int32), -1),
    ],
)
def test_gather_elements(idx: np.ndarray, axis: int) -> None:
    x = rand(3, 4)
    check(
        run_ir("core.gather_elements", [x, idx], {"axis": axis}),
        ort_run("GatherElements", [x, idx], axis=axis),
    )


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements(reduction: str, axis: int) -> None:
    x = rand(3, 4)
    idx = (
        np.array([[1, 0, 2, -1], [0, 2, 1, 0]], np.int64)
        if axis == 0
        else np.array([[0, 3], [-1, 1], [2, 2]], np.int64)
    )
    if reduction == "none":  # duplicates are undefined without a reduction
        idx = (
            np.array([[1, 0, 2, -1], [0, 2, 1, 0]], np.int64)
            if axis == 0
            else np.array([[0, 3], [-1, 1], [2, 1]], np.int64)
        )
    upd = rand(*idx.shape)
    check(
        run_ir("core.scatter_elements", [x, idx, upd], {"axis": axis, "reduction": reduction}),
        ort_run("ScatterElements", [x, idx, upd], axis=axis, reduction=reduction),
        rtol=1e-6,
    )


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("k", [1, 2])
def test_scatter_nd(reduction: str, k: int) -> None:
    x = rand(4, 3, 2)
    idx = (
        np.array([[1], [3]], np.int64)
        if k == 1
        else np.array([[[0, 1], [3, 2]], [[2, 0], [1, 1]]], np.int64)
    )
    if reduction != "none":
        idx = np.concatenate([idx, idx[..., :1, :] if idx.ndim == 3 else idx[:1]], axis=-2)
    upd = rand(*(idx.shape[:-1] + x.shape[k:]))
    check(
        run_ir("core.scatter_nd", [x, idx, upd], {"reduction": reduction}),
        ort_run("ScatterND", [x, idx, upd], reduction=reduction),
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    "xshape,shape",
    [((3, 1), (2, 1, 4)), ((1,), (3,)), ((2, 3), (1, 1)), ((4, 1), (0, 4, 2)), ((), (2, 2))],
)
def test_expand(xshape: tuple[int, ...], shape: tuple[int, ...]) -> None:
    x = rand(*xshape)
    theirs = ort_run("Expand", [x, i64(*shape)])
    check(run_ir("core.expand", [x], {"shape": shape}), theirs)
    check(run_ir("core.expand_dyn", [x, i64(*shape)]), theirs)


@pytest.mark.parametrize(
    "shape,axes", [((2, 1, 3, 1), (1,)), ((2, 1, 3, 1), ()), ((1, 1), (-1, 0)), ((0, 1), (1,))]
)
def test_squeeze(shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    x = rand(*shape)
    check(
        run_ir("core.squeeze", [x], {"axes": axes}),
        ort_run("Squeeze", [x, i64(*axes)] if axes else [x]),
    )


@pytest.mark.parametrize(
    "shape,axes", [((2, 3), (0,)), ((2, 3), (-1, 1)), ((), (0, 1)), ((0,), (0,))]
)
def test_unsqueeze(shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    x = rand(*shape)
    check(run_ir("core.unsqueeze", [x], {"axes": axes}), ort_run("Unsqueeze", [x, i64(*axes)]))


@pytest.mark.parametrize(
    "start,limit,delta,dt",
    [
        (0, 5, 1, np.int64),
        (10, 1, -3, np.int32),
        (3, 3, 1, np.int64),
        (5, 1, 1, np.int64),
        (0.5, 2.0, 0.25, np.float32),
        (1.0, -1.0, -0.3, np.float64),
    ],
)
def test_range(start: float, limit: float, delta: float, dt: Any) -> None:
    args = [np.array(v, dtype=dt) for v in (start, limit, delta)]
    check(run_ir("core.range", args), ort_run("Range", args), rtol=1e-6)


@pytest.mark.parametrize(
    "start,end", [(0, None), (1, None), (-2, None), (0, -1), (1, 2), (3, 1), (-10, 10)]
)
def test_shape(start: int, end: int | None) -> None:
    x = rand(2, 0, 4)
    check(
        run_ir("core.shape", [x], {"start": start, "end": end}),
        ort_run("Shape", [x], start=start, **({} if end is None else {"end": end})),
    )


@pytest.mark.parametrize("shape", [(2, 3), (0, 4), ()])
def test_size(shape: tuple[int, ...]) -> None:
    x = rand(*shape)
    check(run_ir("core.size", [x]), ort_run("Size", [x]))


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("k", [None, -1, 2])
@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5)])
def test_trilu(upper: bool, k: int | None, shape: tuple[int, ...]) -> None:
    x = rand(*shape)
    ins = [x] if k is None else [x, np.array(k, np.int64)]
    check(run_ir("core.trilu", ins, {"upper": upper}), ort_run("Trilu", ins, upper=int(upper)))


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("axis,dt", [(1, np.float32), (-2, np.int32), (0, np.float64)])
def test_cumsum(exclusive: bool, reverse: bool, axis: int, dt: Any) -> None:
    x = rand(3, 5, dtype=dt)
    check(
        run_ir("core.cumsum", [x], {"axis": axis, "exclusive": exclusive, "reverse": reverse}),
        ort_run(
            "CumSum", [x, np.array(axis, np.int64)], exclusive=int(exclusive), reverse=int(reverse)
        ),
        rtol=1e-6,
        # f32 partial sums that cancel (|sum| << its terms): the two sums' orders may differ by
        # an ulp of the terms (the data depend on the order xdist runs tests in: one RNG)
        atol=1e-6 if dt == np.float32 else 0.0,
    )


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize(
    "axis,keepdims,last", [(0, True, False), (-1, False, False), (1, True, True), (0, False, True)]
)
def test_argmax_argmin(op: str, axis: int, keepdims: bool, last: bool) -> None:
    x = RNG.integers(0, 3, size=(4, 5)).astype(np.float32)  # many ties
    check(
        run_ir(f"core.{op}", [x], {"axis": axis, "keepdims": keepdims, "select_last_index": last}),
        ort_run(
            "ArgMax" if op == "argmax" else "ArgMin",
            [x],
            axis=axis,
            keepdims=int(keepdims),
            select_last_index=int(last),
        ),
    )


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize(
    "k,axis,dt", [(3, -1, np.float32), (2, 0, np.int64), (0, 1, np.float32), (6, -1, np.int32)]
)
def test_top_k(largest: bool, k: int, axis: int, dt: Any) -> None:
    x = RNG.integers(0, 4, size=(4, 6)).astype(dt)  # ties: the lower index comes first
    check(
        run_ir("core.top_k", [x], {"k": k, "axis": axis, "largest": largest}),
        ort_run("TopK", [x, i64(k)], 2, axis=axis, largest=int(largest), sorted=1),
    )


def test_top_k_unsigned_and_ties() -> None:
    x = np.array([[3, 0, 3, 255, 0]], np.uint8)
    v, i = run_ir("core.top_k", [x], {"k": 4})
    assert v.tolist() == [[255, 3, 3, 0]] and i.tolist() == [[3, 0, 2, 1]]
    v, i = run_ir("core.top_k", [x], {"k": 3, "largest": False})
    assert v.tolist() == [[0, 0, 3]] and i.tolist() == [[1, 4, 0]]


@pytest.mark.parametrize("shape", [(2, 3), (0,), ()])
def test_identity(shape: tuple[int, ...]) -> None:
    x = rand(*shape)
    check(run_ir("core.identity", [x]), ort_run("Identity", [x]))


@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 1)), ((2, 3), (0, 3)), ((3,), (4,))])
def test_tile(shape: tuple[int, ...], reps: tuple[int, ...]) -> None:
    x = rand(*shape)
    check(run_ir("core.tile", [x], {"repeats": reps}), ort_run("Tile", [x, i64(*reps)]))


@pytest.mark.parametrize(
    "mode,pads",
    [
        ("constant", (1, 0, 2, 3)),
        ("constant", (-1, 2, 0, -2)),
        ("reflect", (2, 1, 1, 2)),
        ("edge", (0, 3, 2, 0)),
        ("wrap", (1, 2, 3, 1)),
        ("edge", (-1, 1, 2, -2)),
    ],
)
def test_pad(mode: str, pads: tuple[int, ...]) -> None:
    x = rand(4, 5)
    value = 1.5 if mode == "constant" else 0.0
    check(
        run_ir("core.pad", [x], {"pads": pads, "mode": mode, "value": value}),
        ort_run("Pad", [x, i64(*pads), np.array(value, np.float32)], mode=mode),
    )


def test_pad_int_value() -> None:
    x = rand(2, 2, dtype=np.int32)
    check(
        run_ir("core.pad", [x], {"pads": (1, 0, 0, 1), "value": 7.0}),
        ort_run("Pad", [x, i64(1, 0, 0, 1), np.array(7, np.int32)]),
    )


@pytest.mark.parametrize(
    "shape,axis",
    [((2, 3, 4), 1), ((2, 3, 4), 0), ((2, 3, 4), 3), ((2, 3, 4), -1), ((2, 0, 4), 2), ((), 0)],
)
def test_flatten(shape: tuple[int, ...], axis: int) -> None:
    x = rand(*shape)
    check(run_ir("core.flatten", [x], {"axis": axis}), ort_run("Flatten", [x], axis=axis))


@pytest.mark.parametrize(
    "shape,target,allowzero",
    [
        ((2, 3, 4), (0, -1), False),
        ((2, 3, 4), (4, 0, 2), False),
        ((2, 3, 4), (-1,), False),
        ((0, 3), (3, 0), True),
        ((2, 6), (2, 3, 2), True),
    ],
)
def test_reshape_dyn(shape: tuple[int, ...], target: tuple[int, ...], allowzero: bool) -> None:
    x = rand(*shape)
    check(
        run_ir("core.reshape_dyn", [x, i64(*target)], {"allowzero": allowzero}),
        ort_run("Reshape", [x, i64(*target)], allowzero=int(allowzero)),
    )


@pytest.mark.parametrize(
    "value", [None, np.array([3], np.int64), np.array([2.5], np.float16), np.array([True])]
)
@pytest.mark.parametrize("shape", [(2, 3), (0,), ()])
def test_constant_of_shape(value: np.ndarray | None, shape: tuple[int, ...]) -> None:
    s = np.array(shape, np.int64)
    attrs = {} if value is None else {"value": DenseAttr(value)}
    extra = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    check(run_ir("core.constant_of_shape", [s], attrs), ort_run("ConstantOfShape", [s], **extra))


# -- shape rules on symbolic dims, checked by running concrete inputs -----------------------

SYMBOLIC = [  # op, operand types, attrs, expected result types, concrete inputs
    (
        "transpose",
        ["tensor<?b x ?s x 4 x f32>"],
        {"perm": (0, 2, 1)},
        ["tensor<?b x 4 x ?s x f32>"],
        [rand(2, 3, 4)],
    ),
    (
        "concat",
        ["tensor<?b x ?p x 8 x f32>", "tensor<?b x ?s x 8 x f32>"],
        {"axis": -2},
        ["tensor<?b x ?p+?s x 8 x f32>"],
        [rand(2, 0, 8), rand(2, 3, 8)],
    ),
    (
        "concat",
        ["tensor<?x4xf32>", "tensor<3x?xf32>"],
        {"axis": 0},
        ["tensor<?x4xf32>"],
        [rand(2, 4), rand(3, 4)],
    ),
    (
        "split",
        ["tensor<?b x 12 x f32>"],
        {"axis": 1, "sizes": (4, 8)},
        ["tensor<?b x 4 x f32>", "tensor<?b x 8 x f32>"],
        [rand(3, 12)],
    ),
    (
        "split",
        ["tensor<2*?h x 4 x f32>"],
        {"num_outputs": 2},
        ["tensor<?h x 4 x f32>"] * 2,
        [rand(6, 4)],
    ),
    ("split", ["tensor<?n x f32>"], {"num_outputs": 3}, ["tensor<?xf32>"] * 3, [rand(7)]),
    (
        "split",
        ["tensor<?a+?b x f32>"],
        {"sizes": ("?a", "?b")},
        ["tensor<?a x f32>", "tensor<?b x f32>"],
        None,
    ),
    (
        "slice",
        ["tensor<?b x ?s x 8 x f32>"],
        {"starts": (0, -1), "ends": (I64_MAX, I64_MAX), "axes": (0, 1)},
        ["tensor<?b x ? x 8 x f32>"],
        [rand(2, 5, 8)],
    ),
    (
        "slice",
        ["tensor<?s x 8 x f32>"],
        {"starts": (I64_MAX,), "ends": (-I64_MAX,), "axes": (0,), "steps": (-1,)},
        ["tensor<?s x 8 x f32>"],
        [rand(4, 8)],
    ),
    (
        "slice",
        ["tensor<?s x 8 x f32>"],
        {"starts": (5, 2), "ends": (3, 6), "steps": (1, 2)},
        ["tensor<0x2xf32>"],
        [rand(7, 8)],
    ),
    (
        "slice_dyn",
        ["tensor<?s x 8 x 3 x f32>", "tensor<2xi64>", "tensor<2xi64>"],
        {},
        ["tensor<?x?x3xf32>"],
        [rand(4, 8, 3), i64(1, 2), i64(3, -1)],
    ),
    (
        "slice_dyn",
        ["tensor<?s x 8 x f32>", "tensor<1xi64>", "tensor<1xi64>", "tensor<1xi64>"],
        {},
        ["tensor<?x?xf32>"],
        [rand(4, 8), i64(1), i64(3), i64(-1)],
    ),
    (
        "gather",
        ["tensor<100 x 8 x f32>", "tensor<?b x ?s x i64>"],
        {},
        ["tensor<?b x ?s x 8 x f32>"],
        [rand(100, 8), RNG.integers(0, 100, (2, 3))],
    ),
    (
        "gather_elements",
        ["tensor<?b x 8 x f32>", "tensor<?b x 2 x i64>"],
        {"axis": 1},
        ["tensor<?b x 2 x f32>"],
        [rand(3, 8), RNG.integers(0, 8, (3, 2))],
    ),
    (
        "scatter_elements",
        ["tensor<?b x 8 x f32>", "tensor<?b x 2 x i64>", "tensor<?b x 2 x f32>"],
        {"axis": 1},
        ["tensor<?b x 8 x f32>"],
        [rand(3, 8), np.array([[0, 1], [2, 3], [4, 5]]), rand(3, 2)],
    ),
    (
        "scatter_nd",
        ["tensor<?n x 4 x f32>", "tensor<?k x 1 x i64>", "tensor<?k x 4 x f32>"],
        {},
        ["tensor<?n x 4 x f32>"],
        [rand(5, 4), i64(4, 0).reshape(2, 1), rand(2, 4)],
    ),
    (
        "expand",
        ["tensor<1 x 1 x ?s x ?s x bool>"],
        {"shape": ("?b", 1, 1, 1)},
        ["tensor<?b x 1 x ?s x ?s x bool>"],
        None,
    ),
    (
        "expand_dyn",
        ["tensor<?s x 1 x 5 x f32>", "tensor<4xi64>"],
        {},
        ["tensor<?x?x?x5xf32>"],
        [rand(3, 1, 5), i64(2, 3, 4, 1)],
    ),
    (
        "squeeze",
        ["tensor<?b x ?one x 8 x f32>"],
        {"axes": (1,)},
        ["tensor<?b x 8 x f32>"],
        [rand(2, 1, 8)],
    ),
    (
        "unsqueeze",
        ["tensor<?b x ?s x f32>"],
        {"axes": (1, -1)},
        ["tensor<?b x 1 x ?s x 1 x f32>"],
        [rand(2, 3)],
    ),
    (
        "range",
        ["tensor<i64>", "tensor<i64>", "tensor<i64>"],
        {},
        ["tensor<?xi64>"],
        [np.array(2), np.array(9), np.array(3)],
    ),
    ("shape", ["tensor<?b x ?s x 64 x f32>"], {"start": -2}, ["tensor<2xi64>"], [rand(2, 3, 64)]),
    ("size", ["tensor<?b x ?s x f32>"], {}, ["tensor<i64>"], [rand(2, 3)]),
    (
        "trilu",
        ["tensor<?s x ?t x f32>", "tensor<i64>"],
        {},
        ["tensor<?s x ?t x f32>"],
        [rand(3, 4), np.array(1)],
    ),
    (
        "cumsum",
        ["tensor<?b x ?s x i64>"],
        {"axis": 1, "exclusive": True},
        ["tensor<?b x ?s x i64>"],
        [RNG.integers(0, 3, (2, 5))],
    ),
    (
        "argmax",
        ["tensor<?b x ?s x 16 x f32>"],
        {"axis": -1, "keepdims": False},
        ["tensor<?b x ?s x i64>"],
        [rand(2, 3, 16)],
    ),
    (
        "argmin",
        ["tensor<?b x ?s x 16 x f32>"],
        {"axis": 1},
        ["tensor<?b x 1 x 16 x i64>"],
        [rand(2, 3, 16)],
    ),
    (
        "top_k",
        ["tensor<?b x 100 x f32>"],
        {"k": 5},
        ["tensor<?b x 5 x f32>", "tensor<?b x 5 x i64>"],
        [rand(2, 100)],
    ),
    ("identity", ["tensor<?b x 3 x bf16>"], {}, ["tensor<?b x 3 x bf16>"], None),
    (
        "tile",
        ["tensor<?b x ?s x f32>"],
        {"repeats": (2, 1)},
        ["tensor<2*?b x ?s x f32>"],
        [rand(2, 3)],
    ),
    (
        "pad",
        ["tensor<?b x ?s x f32>"],
        {"pads": (0, 2, 0, -1)},
        ["tensor<?b x ?s+1 x f32>"],
        [rand(2, 3)],
    ),
    (
        "flatten",
        ["tensor<?b x ?s x 4 x f32>"],
        {"axis": 2},
        ["tensor<?b*?s x 4 x f32>"],
        [rand(2, 3, 4)],
    ),
    (
        "reshape_dyn",
        ["tensor<?b x ?s x 576 x f32>", "tensor<4xi64>"],
        {},
        ["tensor<?x?x?x?xf32>"],
        [rand(1, 2, 576), i64(0, 0, 9, 64)],
    ),
    ("constant_of_shape", ["tensor<3xi64>"], {}, ["tensor<?x?x?xf32>"], [i64(1, 0, 2)]),
]


def _attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    from llmir_core.ir.typeparse import parse_dim_expr

    return {
        k: tuple(parse_dim_expr(d) if isinstance(d, str) else d for d in v)
        if isinstance(v, tuple)
        else v
        for k, v in attrs.items()
    }


@pytest.mark.parametrize(
    "op,types,attrs,expected,inputs", SYMBOLIC, ids=[f"{c[0]}-{i}" for i, c in enumerate(SYMBOLIC)]
)
def test_symbolic_shape_rule(
    op: str,
    types: list[str],
    attrs: dict[str, Any],
    expected: list[str],
    inputs: list[np.ndarray] | None,
) -> None:
    m, o = build(f"core.{op}", [parse_type_text(t) for t in types], _attrs(attrs))
    assert [r.type for r in o.results] == [parse_type_text(t) for t in expected]
    assert [d.message for d in verify(m)] == []
    if inputs is not None:  # the interpreter checks every result against the inferred type
        inputs = [
            a.astype(np.float32) if a.dtype == np.float64 and "f32" in t else a
            for a, t in zip(inputs, types)
        ]
        inputs = [
            a.astype(np.int64) if a.dtype.kind == "i" and "i64" in t else a
            for a, t in zip(inputs, types)
        ]
        outs = run(m, inputs)
        assert len(outs) == len(expected)


def test_symbolic_sizes_are_evaluated_at_run_time() -> None:
    # ?a and ?b are bound by other arguments, as position ids bind ?seq in a real graph
    m, _ = build(
        "core.split", [parse_type_text("tensor<?a+?b x f32>")], _attrs({"sizes": ("?a", "?b")})
    )
    b = Builder(m.main)
    b.arg("pa", parse_type_text("tensor<?a x i64>"))
    b.arg("pb", parse_type_text("tensor<?b x i64>"))
    assert [d.message for d in verify(m)] == []
    out = run(m, [np.arange(5, dtype=np.float32), np.zeros(2, np.int64), np.zeros(3, np.int64)])
    assert [o.tolist() for o in out] == [[0, 1], [2, 3, 4]]
    m, _ = build(
        "core.expand", [parse_type_text("tensor<1 x ?s x f32>")], _attrs({"shape": ("?b", 1)})
    )
    Builder(m.main).arg("pb", parse_type_text("tensor<?b x i64>"))
    out = run(m, [np.ones((1, 2), np.float32), np.zeros(3, np.int64)])
    assert out[0].shape == (3, 2)


def test_slice_on_a_symbolic_dim_is_dynamic_unless_exact() -> None:
    # x[:, :-1] would be ?s-1 only for ?s >= 1: with ?s = 0 it is 0, so the rule gives ?
    _, o = build(
        "core.slice", [parse_type_text("tensor<?s x f32>")], {"starts": (0,), "ends": (-1,)}
    )
    assert str(o.results[0].type) == "tensor<?xf32>"
    m, o = build(
        "core.slice", [parse_type_text("tensor<?s x f32>")], {"starts": (0,), "ends": (I64_MAX,)}
    )
    assert str(o.results[0].type) == "tensor<?s x f32>"
    assert run(m, [np.zeros(0, np.float32)])[0].shape == (0,)


# -- one verifier error per op ----------------------------------------------------------------

ERRORS = [  # op, operand types, attrs, message fragment
    ("transpose", ["tensor<2x3xf32>"], {"perm": (0, 0)}, "is not a permutation of the 2 axes"),
    (
        "concat",
        ["tensor<2x3xf32>", "tensor<2x4xf32>"],
        {"axis": 0},
        "input #1 dim 1 differs from the other inputs: 3 != 4",
    ),
    (
        "concat",
        ["tensor<2x3xf32>", "tensor<2xf32>"],
        {"axis": 0},
        "input #1 has rank 1, input #0 has rank 2",
    ),
    (
        "split",
        ["tensor<2x6xf32>"],
        {"axis": 1, "sizes": (2, 3)},
        "sizes sum to 5, but the split axis has 6",
    ),
    (
        "slice",
        ["tensor<2x6xf32>"],
        {"starts": (0,), "ends": (1,), "axes": (2,)},
        "axis 2 is out of range for rank 2",
    ),
    (
        "slice_dyn",
        ["tensor<2x6xf32>", "tensor<2xi64>", "tensor<1xi64>"],
        {},
        "ends has 1 entries but starts has 2",
    ),
    ("gather", ["tensor<4x3xf32>", "tensor<2xf32>"], {}, "indices must be i64 or i32, got f32"),
    (
        "gather_elements",
        ["tensor<4x3xf32>", "tensor<2xi64>"],
        {},
        "indices has rank 1, x has rank 2",
    ),
    (
        "scatter_elements",
        ["tensor<4x3xf32>", "tensor<2x2xi64>", "tensor<2x2xf16>"],
        {},
        "operand dtypes differ",
    ),
    (
        "scatter_nd",
        ["tensor<4x3xf32>", "tensor<2x1xi64>", "tensor<2x4xf32>"],
        {},
        "updates dim 1 should be 3: 3 != 4",
    ),
    ("expand", ["tensor<3x2xf32>"], {"shape": (4, 1)}, "do not broadcast"),
    ("expand_dyn", ["tensor<3x2xf32>", "tensor<?xi64>"], {}, "shape must have a static length"),
    ("squeeze", ["tensor<3x2xf32>"], {"axes": (1,)}, "cannot squeeze axis 1 of size 2"),
    ("unsqueeze", ["tensor<3x2xf32>"], {"axes": (0, -4)}, "repeat an axis"),
    ("range", ["tensor<i64>", "tensor<i64>", "tensor<1xi64>"], {}, "delta must be a scalar"),
    (
        "shape",
        ["!llm.kv_cache<layers=1, kv_heads=1, max_len=8, head_dim=4, dtype=f16>"],
        {},
        "must be a tensor",
    ),
    ("shape", ["tensor<3xf32>"], {"end": 1.5}, "end must be an int or none, got 1.5"),
    (
        "size",
        ["!llm.kv_cache<layers=1, kv_heads=1, max_len=8, head_dim=4, dtype=f16>"],
        {},
        "must be a tensor",
    ),
    ("trilu", ["tensor<3xf32>"], {}, "x must have rank >= 2"),
    ("cumsum", ["tensor<3x4xbool>"], {"axis": 0}, "x must be numeric, got bool"),
    ("argmax", ["tensor<3x0xf32>"], {"axis": 1}, "cannot take argmax over axis 1 of size 0"),
    ("argmin", ["tensor<3x4xf32>"], {"axis": -3}, "axis -3 is out of range for rank 2"),
    ("top_k", ["tensor<3x4xf32>"], {"k": 5}, "k = 5 must be in 0..4"),
    ("identity", [], {}, None),
    ("tile", ["tensor<3x4xf32>"], {"repeats": (2,)}, "repeats has 1 entries, x has rank 2"),
    ("pad", ["tensor<3x4xf32>"], {"pads": (0, -5, 0, 0)}, "leave -1 elements"),
    ("flatten", ["tensor<3x4xf32>"], {"axis": 3}, "axis 3 is out of range for flatten of rank 2"),
    ("reshape_dyn", ["tensor<3x4xf32>", "tensor<2x2xi64>"], {}, "shape must be 1-D, got rank 2"),
    ("constant_of_shape", ["tensor<2xi32>"], {}, "shape must be i64, got i32"),
]


@pytest.mark.parametrize(
    "op,types,attrs,message", ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)]
)
def test_verifier_error(
    op: str, types: list[str], attrs: dict[str, Any], message: str | None
) -> None:
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", parse_type_text(t)) for i, t in enumerate(types)]
    op_ = b.create(f"core.{op}", args, attrs, result_types=[parse_type_text("tensor<f32>")])
    b.ret(*op_.results)
    diags = verify(Module("t", [fn], {"llmir.dialects": ("core",)}))
    if message is None:  # identity's error is the operand count
        assert any("takes 1 operands (x), got 0" in d.message for d in diags), diags
        return
    assert any(d.message.startswith(f"core.{op}: ") and message in d.message for d in diags), [
        d.message for d in diags
    ]


def test_run_time_errors_name_the_op() -> None:
    from llmir_core.interp import InterpError

    m, _ = build(
        "core.gather", [parse_type_text("tensor<4xf32>"), parse_type_text("tensor<1xi64>")]
    )
    with pytest.raises(
        InterpError, match="core.gather failed at run time: index 4 is out of bounds"
    ):
        run(m, [rand(4), i64(4)])
    m, _ = build("core.range", [parse_type_text("tensor<i64>")] * 3)
    with pytest.raises(InterpError, match="range delta is 0"):
        run(m, [np.array(0), np.array(3), np.array(0)])
    m, _ = build(
        "core.pad", [parse_type_text("tensor<?n x f32>")], {"pads": (2, 0), "mode": "reflect"}
    )
    with pytest.raises(InterpError, match="reflect pads"):
        run(m, [rand(2)])
