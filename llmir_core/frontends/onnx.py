"""The ONNX frontend: an `.onnx` file (or ModelProto) to an llmir Module.

Reading goes through `onnx_ir`, which maps external weights lazily, so a model of many GB imports
without reading its weights. Initializers become `core.weight` references to the bytes where they
already are (an external-data file, by offset); tensors stored inside the `.onnx` protobuf are
written once to `NAME.weights.bin` beside the `.llmir` (onnx_ir does not expose their offsets in
the protobuf, and tensors stored as typed fields have no raw byte layout there at all); tensors
under 1 KiB become inline `core.constant`s. Op mapping lives in `onnx_ops.py` (one handler per ONNX
op); this module is the only one that reads ONNX.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.inliner
import onnx_ir as ir
from google.protobuf.message import DecodeError

from llmir_core.builder import Builder
from llmir_core.dialects.opdef import OpVerifyError
from llmir_core.dialects.registry import get_op
from llmir_core.errors import InputError
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.dims import DYN, Dim, SymDim
from llmir_core.ir.typeparse import TypeSyntaxError, parse_dim_expr
from llmir_core.ir.types import DType, TensorType, Type, numpy_dtype
from llmir_core.weights import expected_nbytes

from .onnx_ops import HANDLERS, NeedsConstant, Node, NotMapped
from .validate_onnx import check_model_proto

MIN_OPSET = 13
MAX_OPSET = onnx.defs.onnx_opset_version()
INLINE_LIMIT = 1024  # tensors smaller than this many bytes become inline constants
SIDECAR_ALIGN = 64

# ONNX TensorProto data types (the same numbers as onnx_ir.DataType) -> llmir dtypes
ONNX_TO_DTYPE: dict[int, DType] = {
    1: DType.f32,
    2: DType.u8,
    3: DType.i8,
    5: DType.i16,
    6: DType.i32,
    7: DType.i64,
    9: DType.bool,
    10: DType.f16,
    11: DType.f64,
    16: DType.bf16,
    17: DType.f8e4m3,
    19: DType.f8e5m2,
    21: DType.u4,
    22: DType.i4,
    4: DType.u16,
    12: DType.u32,
    13: DType.u64,
    18: DType.f8e4m3fnuz,
    20: DType.f8e5m2fnuz,
    23: DType.f4e2m1,
    24: DType.f8e8m0,
    25: DType.u2,
    26: DType.i2,
}
DTYPE_TO_ONNX: dict[DType, int] = {v: k for k, v in ONNX_TO_DTYPE.items()}


def onnx_dtype_name(code: int) -> str:
    try:
        return str(onnx.TensorProto.DataType.Name(code)).lower()
    except ValueError:
        return f"type {code}"


class ImportSource:
    """Where an imported model came from and where its outputs go."""

    def __init__(self, label: str, base_dir: str, out_path: str | None) -> None:
        self.label = label
        self.base_dir = base_dir
        self.out_path = os.path.abspath(out_path) if out_path else None

    @property
    def out_dir(self) -> str | None:
        return os.path.dirname(self.out_path) if self.out_path else None

    @property
    def sidecar_name(self) -> str | None:
        if not self.out_path:
            return None
        stem = os.path.basename(self.out_path)
        stem = stem[: -len(".llmir")] if stem.endswith(".llmir") else stem
        return f"{stem}.weights.bin"


@dataclass
class Sidecar:
    """Tensors stored inside the .onnx protobuf, to be written to one file beside the .llmir."""

    name: str
    chunks: list[tuple[int, Any]] = field(default_factory=list)  # (offset, ir tensor)
    size: int = 0
    offsets: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, tensor: Any, nbytes: int) -> int:
        if key in self.offsets:
            return self.offsets[key]
        off = -(-self.size // SIDECAR_ALIGN) * SIDECAR_ALIGN
        self.chunks.append((off, tensor))
        self.offsets[key] = off
        self.size = off + nbytes
        return off

    def write(self, fh: Any) -> None:
        pos = 0
        for off, tensor in self.chunks:
            if off > pos:
                fh.write(b"\0" * (off - pos))
            data = tensor.tobytes()
            fh.write(data)
            pos = off + len(data)


# -- loading and checking ---------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_onnx_ir() -> Iterator[None]:
    """onnx_ir logs warnings for invalid graphs; we report those ourselves, as one line."""
    log = logging.getLogger("onnx_ir")
    old = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(old)


def load_proto(path: str) -> onnx.ModelProto:
    """Read an .onnx file's protobuf without its external data; bad files raise InputError."""
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file", hint="check the path")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a folder, expected an .onnx file")
    try:
        proto = onnx.load(path, load_external_data=False)
    except DecodeError as exc:
        raise InputError(
            f"{path}: not a valid ONNX model (truncated or corrupt protobuf: {exc})",
            hint="re-export or re-download the model",
        ) from None
    except (OSError, ValueError, RuntimeError) as exc:
        raise InputError(
            f"{path}: cannot read the ONNX model: {exc}", hint="re-export or re-download the model"
        ) from None
    if proto.ir_version <= 0 or not proto.HasField("graph"):
        raise InputError(
            f"{path}: not a valid ONNX model (no IR version or no graph: truncated or "
            "not an ONNX file)",
            hint="re-export or re-download the model",
        )
    return proto


def upgrade_opset(proto: onnx.ModelProto, label: str) -> tuple[onnx.ModelProto, int | None]:
    """A model whose default opset is older than MIN_OPSET, converted to MIN_OPSET with
    `onnx.version_converter` (with the opset it had); any other model unchanged (with None)."""
    default = next(
        (int(o.version) for o in proto.opset_import if o.domain in ("", "ai.onnx")), None
    )
    if default is None or default >= MIN_OPSET:
        return proto, None
    import onnx.version_converter

    try:
        converted = onnx.version_converter.convert_version(proto, MIN_OPSET)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(
            f"{label}: opset {default} is older than {MIN_OPSET}, the oldest llmir reads, and "
            f"onnx.version_converter cannot convert it: {first[:300]}",
            hint=f"re-export the model with opset {MIN_OPSET} or newer",
        ) from None
    return converted, default


def _check_opsets(proto: onnx.ModelProto, label: str) -> dict[str, int]:
    opsets = {
        ("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in proto.opset_import
    }
    default = opsets.get("")
    if default is None:
        raise InputError(f"{label}: the model imports no default (ai.onnx) opset")
    if default > MAX_OPSET:
        raise InputError(
            f"{label}: opset {default} is newer than {MAX_OPSET}, the newest the "
            f"installed onnx ({onnx.__version__}) knows",
            hint="upgrade onnx",
        )
    return opsets


def _inside(base: str, path: str) -> bool:
    base_r, path_r = os.path.realpath(base), os.path.realpath(path)
    return os.path.commonpath([base_r, path_r]) == base_r


def check_external(t: ir.ExternalTensor, label: str) -> tuple[str, int, int]:
    """Validate one external-data reference; return (absolute path, offset, nbytes)."""
    loc = str(t.location)
    base = str(t.base_dir) or "."
    if os.path.isabs(loc) or not _inside(base, os.path.join(base, loc)):
        raise InputError(
            f"{label}: tensor '{t.name}' has external data location '{loc}' outside "
            "the model's folder; refusing it (path traversal)",
            hint="external data must live in the model's folder or below it",
        )
    path = os.path.normpath(os.path.join(base, loc))
    offset = int(t.offset or 0)
    want = _tensor_nbytes(t)
    nbytes = int(t.length) if t.length is not None else want
    if want is not None and nbytes != want:
        raise InputError(
            f"{label}: tensor '{t.name}' declares {nbytes} bytes of external data but "
            f"its type needs {want}"
        )
    if not os.path.isfile(path):
        raise InputError(
            f"{label}: external data file '{loc}' for tensor '{t.name}' not found "
            f"(looked in {path})",
            hint="copy the model's data file(s) next to the .onnx file",
        )
    size = os.path.getsize(path)
    if offset + (nbytes or 0) > size:
        raise InputError(
            f"{label}: external data file '{loc}' has {size} bytes but tensor "
            f"'{t.name}' needs bytes {offset}..{offset + (nbytes or 0)} (file too short)",
            hint="the data file is truncated: copy it again",
        )
    return path, offset, nbytes or 0


def _tensor_nbytes(t: Any) -> int | None:
    dt = ONNX_TO_DTYPE.get(int(t.dtype))
    if dt is None:
        return None
    shape = tuple(int(d) for d in t.shape)
    return expected_nbytes(TensorType(shape, dt))


def _toposort(graph: ir.Graph, label: str) -> list[ir.Node]:
    """Nodes in dependency order; dangling inputs and cycles raise InputError."""
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    nodes = list(graph)
    node_ids = {id(n) for n in nodes}
    for n in nodes:
        for v in n.inputs:
            if v is None or id(v) in defined:
                continue
            p = v.producer()
            if p is None or id(p) not in node_ids:
                if v.const_value is not None:
                    continue
                raise InputError(
                    f"{label}: node '{n.name or n.op_type}' ({n.op_type}) reads "
                    f"'{v.name}', which no node, initializer or graph input defines "
                    "(dangling input)"
                )
    indeg: dict[int, int] = {}
    users: dict[int, list[ir.Node]] = {}
    for n in nodes:
        deps = {
            id(v.producer())
            for v in n.inputs
            if v is not None and id(v) not in defined and v.producer() is not None
        }
        indeg[id(n)] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(n)
    ready = [n for n in nodes if indeg[id(n)] == 0]
    order: list[ir.Node] = []
    while ready:
        n = ready.pop(0)
        order.append(n)
        for u in users.get(id(n), []):
            indeg[id(u)] -= 1
            if indeg[id(u)] == 0:
                ready.append(u)
    if len(order) != len(nodes):
        stuck = [n.name or n.op_type for n in nodes if indeg[id(n)] > 0][:5]
        raise InputError(
            f"{label}: the graph has a cycle through node(s) {', '.join(stuck)}",
            hint="an ONNX graph must be acyclic; re-export the model",
        )
    for out in graph.outputs:
        if out.producer() is None and id(out) not in defined:
            raise InputError(
                f"{label}: graph output '{out.name}' is not produced by any node (dangling output)"
            )
    return order


# -- types --------------------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _dim_name(text: str) -> str:
    name = re.sub(r"\W", "_", text)
    if not name or name[0].isdigit() or name[0] == "x":
        name = "_" + name
    return name


def dim_from_param(text: str, names: dict[str, str]) -> Dim:
    """An ONNX dim_param as a named symbolic dim; `a + 1` style expressions become polynomials."""
    if text in names:
        return SymDim.name(names[text])
    if _IDENT.fullmatch(text):
        names[text] = _dim_name(text)
        return SymDim.name(names[text])
    if re.fullmatch(r"[\w\s+*()-]+", text):
        expr = _IDENT.sub(lambda m: "?" + names.setdefault(m.group(0), _dim_name(m.group(0))), text)
        try:
            return parse_dim_expr(expr)
        except TypeSyntaxError:
            pass
    names[text] = _dim_name(text)
    return SymDim.name(names[text])


def tensor_type_of(
    v: ir.Value, names: dict[str, str], strict_names: bool = False
) -> TensorType | None:
    """The llmir type of an ONNX value; None when its type, rank or dtype is unknown."""
    t = v.type
    if t is None or not isinstance(t, ir.TensorType) or v.shape is None:
        return None
    dt = ONNX_TO_DTYPE.get(int(t.dtype))
    if dt is None:
        return None
    dims: list[Dim] = []
    for d in v.shape:
        if isinstance(d, int):
            dims.append(d)
        elif d.value is None or (strict_names and d.value not in names):
            dims.append(DYN)
        else:
            dims.append(dim_from_param(str(d.value), names))
    return TensorType(tuple(dims), dt)


def _merge(inferred: TensorType, hint: TensorType | None) -> TensorType:
    """Fill llmir's unknown dims from ONNX's shape information."""
    if hint is None or hint.rank != inferred.rank or hint.dtype != inferred.dtype:
        return inferred
    if all(d is not DYN for d in inferred.shape):
        return inferred
    dims = [h if d is DYN and h is not DYN else d for d, h in zip(inferred.shape, hint.shape)]
    return inferred.with_shape(tuple(dims))


# -- attributes ---------------------------------------------------------------------------------------


def _attr_value(a: ir.Attr) -> Any:
    ty = a.type
    v = a.value
    if ty == ir.AttributeType.TENSOR:
        return v.numpy()
    if ty == ir.AttributeType.GRAPH:
        return (
            "onnx.graph:"
            + base64.b64encode(ir.serde.serialize_graph(v).SerializeToString()).decode()
        )
    if ty == ir.AttributeType.TENSORS:
        return [t.numpy() for t in v]
    if ty == ir.AttributeType.FLOAT:
        return _f32(v)
    if ty == ir.AttributeType.FLOATS:
        return [_f32(x) for x in v]
    if ty in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
        return list(v)
    if ty in (
        ir.AttributeType.GRAPHS,
        ir.AttributeType.SPARSE_TENSOR,
        ir.AttributeType.SPARSE_TENSORS,
        ir.AttributeType.TYPE_PROTO,
        ir.AttributeType.TYPE_PROTOS,
    ):
        raise NotMapped(f"attribute '{a.name}' of kind {ty.name} is not supported")
    return v


def _f32(x: float) -> float:
    """An ONNX float attribute (float32) as the shortest Python float that rounds to it."""
    return float(str(np.float32(x)))


def _opaque_attr(v: Any) -> Any:
    """A node attribute as an llmir attribute value (for onnx.opaque)."""
    if isinstance(v, np.ndarray):
        return DenseAttr(v)
    if isinstance(v, list):
        return tuple(_opaque_attr(x) for x in v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


# -- shape inference ------------------------------------------------------------------------------------


def infer_onnx_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """ONNX shape inference on a weightless copy of the graph: name -> inferred TypeProto."""
    g = proto.graph
    skel = onnx.GraphProto(name=g.name)
    skel.node.extend(g.node)
    skel.input.extend(g.input)
    skel.output.extend(g.output)
    skel.value_info.extend(g.value_info)
    have = {i.name for i in g.input}
    for init in g.initializer:
        small = (
            init.data_location != onnx.TensorProto.EXTERNAL and init.ByteSize() <= INLINE_LIMIT + 64
        )
        if small:
            skel.initializer.append(init)
        elif init.name not in have:
            skel.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    model = onnx.helper.make_model(
        skel, opset_imports=list(proto.opset_import), ir_version=proto.ir_version
    )
    try:
        # no data_prop: it materializes values per element (GBs for a large input); llmir
        # tracks shape arithmetic itself (onnx_fold.py)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:  # shape inference is a hint; llmir infers types itself
        return {}
    out: dict[str, onnx.TypeProto] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        out[vi.name] = vi.type
    return out


# -- the importer ----------------------------------------------------------------------------------------


class _Importer:
    def __init__(
        self,
        model: ir.Model,
        src: ImportSource,
        opsets: dict[str, int],
        hints: dict[str, onnx.TypeProto],
        keep_unknown: bool,
    ) -> None:
        self.model = model
        self.src = src
        self.opsets = opsets
        self.hint_protos = hints
        self.keep_unknown = keep_unknown
        self.dim_names: dict[str, str] = {}
        self.known: dict[int, np.ndarray] = {}
        self.values: dict[int, Value] = {}  # id(ir.Value) -> llmir Value
        self.weight_values: dict[str, Value] = {}
        self.const_cache: dict[tuple[str, tuple[int, ...], bytes], Value] = {}
        self.sidecar = Sidecar(src.sidecar_name) if src.sidecar_name else None
        self.used_opaque = False
        self.node_value_name: str | None = None
        self.fn = Function("main", [])
        self.b = Builder(self.fn)
        self.module = Module(_module_name(model, src.label), [self.fn])
        self._interp: Any = None

    # -- types ---------------------------------------------------------------
    def dtype_of_onnx(self, code: int | None) -> DType:
        if code is None or int(code) not in ONNX_TO_DTYPE:
            raise NotMapped(f"ONNX data type {onnx_dtype_name(int(code or 0))} has no llmir dtype")
        return ONNX_TO_DTYPE[int(code)]

    def _hint(self, name: str) -> TensorType | None:
        tp = self.hint_protos.get(name)
        if tp is None or not tp.HasField("tensor_type"):
            return None
        tt = tp.tensor_type
        dt = ONNX_TO_DTYPE.get(tt.elem_type)
        if dt is None or not tt.HasField("shape"):
            return None
        dims: list[Dim] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param in self.dim_names:
                dims.append(dim_from_param(d.dim_param, self.dim_names))
            else:
                dims.append(DYN)
        return TensorType(tuple(dims), dt)

    # -- building ------------------------------------------------------------
    def emit(
        self,
        name: str,
        operands: list[Value],
        attrs: dict[str, Any],
        hints: list[TensorType | None] | None = None,
        n: int | None = None,
    ) -> list[Value]:
        inferred = self.b.infer(name, operands, attrs, num_results=n)
        types: list[Type] = []
        for i, t in enumerate(inferred):
            h = hints[i] if hints and i < len(hints) else None
            types.append(_merge(t, h) if isinstance(t, TensorType) else t)
        op = self.b.create(name, operands, attrs, result_types=types)
        self._propagate(op)
        return op.results

    def constant(self, arr: np.ndarray, name: str | None = None) -> Value:
        arr = np.asarray(arr)
        key = (str(arr.dtype), arr.shape, arr.tobytes())
        if arr.nbytes <= 64 and key in self.const_cache and name is None:
            return self.const_cache[key]
        op = self.b.create(
            "core.constant", [], {"value": DenseAttr(arr)}, names=[name] if name else None
        )
        self.known[id(op.result)] = arr
        if arr.nbytes <= 64 and name is None:
            self.const_cache[key] = op.result
        return op.result

    def _interp_eval(self, op: Op, args: list[np.ndarray]) -> list[Any] | None:
        from llmir_core.interp import Interpreter

        if self._interp is None:
            self._interp = Interpreter(self.module, check_types=False)
        try:
            return list(self._interp.eval_op(op, args, {}))
        except Exception:
            return None

    def _propagate(self, op: Op) -> None:
        """Record what is known at import time of the op's results (constants, symbolic shapes)."""
        from .onnx_fold import propagate

        propagate(self, op)

    # -- weights -------------------------------------------------------------
    def initializer_value(self, v: ir.Value) -> Value:
        key = _name(v)
        if key in self.weight_values:
            return self.weight_values[key]
        t = v.const_value
        assert t is not None
        dt = ONNX_TO_DTYPE.get(int(t.dtype))
        if dt is None:
            raise InputError(
                f"{self.src.label}: initializer '{v.name}' has data type "
                f"{onnx_dtype_name(int(t.dtype))}, which llmir has no dtype for"
            )
        ty = TensorType(_static_shape(t.shape), dt)
        val = self._tensor_value(_name(v), t, ty, allow_inline=True)
        self.weight_values[key] = val
        return val

    def requantized_weight(self, input_name: str, ty: TensorType) -> Value:
        """A quantized view (e.g. MatMulNBits' packed B) of an initializer's bytes."""
        init = self.model.graph.initializers.get(input_name)
        if init is None or init.const_value is None:
            raise NotMapped(f"'{input_name}' must be an initializer")
        key = f"{input_name}#{ty}"
        if key not in self.weight_values:
            self.weight_values[key] = self._tensor_value(
                input_name, init.const_value, ty, allow_inline=False
            )
        return self.weight_values[key]

    def reshaped_initializer(self, name: str, ty: TensorType) -> Value | None:
        """An initializer's bytes under another static shape (None if `name` is no initializer)."""
        init = self.model.graph.initializers.get(name)
        if init is None or init.const_value is None:
            return None
        key = f"{name}#{ty}"
        if key not in self.weight_values:
            self.weight_values[key] = self._tensor_value(
                name, init.const_value, ty, allow_inline=True
            )
        return self.weight_values[key]

    def _tensor_value(self, name: str, t: Any, ty: TensorType, allow_inline: bool) -> Value:
        origin, self.b.origin = self.b.origin, None  # a weight is no node's: no location
        try:
            return self._tensor_value_at(name, t, ty, allow_inline)
        finally:
            self.b.origin = origin

    def _tensor_value_at(self, name: str, t: Any, ty: TensorType, allow_inline: bool) -> Value:
        want = expected_nbytes(ty) or 0
        hint = _value_hint(name)
        if isinstance(t, ir.ExternalTensor):
            path, offset, nbytes = check_external(t, self.src.label)
            if nbytes != want:
                raise InputError(
                    f"{self.src.label}: tensor '{name}' has {nbytes} bytes, {ty} needs {want}"
                )
            file = os.path.relpath(path, self.src.out_dir) if self.src.out_dir else path
            op = self.b.create(
                "core.weight",
                [],
                {"file": file, "name": name, "offset": offset, "nbytes": nbytes},
                result_types=[ty],
                names=[hint],
            )
            return op.result
        nbytes = int(t.nbytes)
        if nbytes != want and ty.dtype not in (DType.i4, DType.u4):
            raise InputError(
                f"{self.src.label}: tensor '{name}' has {nbytes} bytes, {ty} needs {want}"
            )
        if allow_inline and (nbytes < INLINE_LIMIT or self.sidecar is None):
            if not isinstance(ty.dtype, DType) or ty.dtype in (DType.i4, DType.u4):
                raise NotMapped(f"inline {ty.dtype} constants are not supported ('{name}')")
            arr = np.asarray(t.numpy()).reshape(ty.static_shape() or ())
            return self.constant(arr.astype(numpy_dtype(ty.dtype), copy=False), name=hint)
        if self.sidecar is None:
            raise InputError(
                f"{self.src.label}: tensor '{name}' is stored inside the .onnx file; "
                "importing it needs an output path for its weights file"
            )
        offset = self.sidecar.add(name, t, nbytes)
        op = self.b.create(
            "core.weight",
            [],
            {"file": self.sidecar.name, "name": name, "offset": offset, "nbytes": want},
            result_types=[ty],
            names=[hint],
        )
        return op.result

    # -- the graph -----------------------------------------------------------
    def value_of(self, v: ir.Value) -> Value:
        if id(v) in self.values:
            return self.values[id(v)]
        if v.const_value is not None:
            val = self.initializer_value(v)
            self.values[id(v)] = val
            return val
        raise InputError(f"{self.src.label}: value '{v.name}' is used before it is defined")

    def run(self, order: list[ir.Node]) -> Module:
        g = self.model.graph
        init_names = set(g.initializers)
        input_names: list[str] = []
        for v in g.inputs:
            if v.name in init_names:
                continue
            t = tensor_type_of(v, self.dim_names)
            if t is None:
                raise InputError(
                    f"{self.src.label}: graph input '{v.name}' has no tensor type with a "
                    "known rank and an llmir dtype"
                    + (f" (it is {v.type})" if v.type is not None else "")
                )
            arg = self.b.arg(_value_hint(_name(v)), t)
            self.values[id(v)] = arg
            input_names.append(_name(v))
        for i, node in enumerate(order):
            self._node(node, i)
        outs: list[Value] = []
        out_names: list[str] = []
        for v in g.outputs:
            outs.append(self.value_of(v))
            out_names.append(_name(v))
        self.fn.outputs = outs
        self._fold_constants()
        _dce(self.fn)
        if [a.name for a in self.fn.args] != input_names:
            self.fn.attrs["input_names"] = tuple(input_names)
        if [v.name for v in outs] != out_names:
            self.fn.attrs["output_names"] = tuple(out_names)
        dialects = ["core", "llm"] + (["onnx"] if self.used_opaque else [])
        self.module.attrs["llmir.dialects"] = tuple(dialects)
        self.module.attrs["onnx.opset"] = self.opsets.get("", 0)
        if self.model.producer_name:
            self.module.attrs["onnx.producer"] = (
                self.model.producer_name + " " + (self.model.producer_version or "")
            ).strip()
        return self.module

    def _fold_constants(self) -> None:
        """Ops whose small numeric results are known at import time become core.constant."""
        for op in self.fn.ops:
            if (
                op.name in ("core.constant", "core.weight")
                or len(op.results) != 1
                or not op.operands
            ):
                continue
            opdef = get_op(op.name)
            if opdef is None or opdef.effects or op.name == "onnx.opaque":
                continue
            arr = self.known.get(id(op.result))
            t = op.result.type
            if arr is None or arr.dtype == object or arr.size > 64 or not isinstance(t, TensorType):
                continue
            if (
                t.static_shape() != arr.shape
                or not isinstance(t.dtype, DType)
                or numpy_dtype(t.dtype) != arr.dtype
            ):
                continue
            op.name, op.operands, op.attrs = (
                "core.constant",
                [],
                {"value": DenseAttr(np.array(arr))},
            )

    def _node(self, node: ir.Node, index: int) -> None:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        opset = self.opsets.get(domain, 1)
        label = node.name or f"{node.op_type}_{index}"
        self.b.origin = f"onnx:{label}"
        inputs = [None if v is None else self.value_of(v) for v in node.inputs]
        input_names = ["" if v is None else _name(v) for v in node.inputs]
        used = [bool(o.name) and (len(o.uses()) > 0 or o.is_graph_output()) for o in node.outputs]
        hints = [self._hint(_name(o)) for o in node.outputs]
        where = f"node '{label}' ({domain + ':' if domain else ''}{node.op_type}, opset {opset})"
        start = len(self.fn.ops)
        self.node_value_name = _value_hint(_name(node.outputs[0])) if node.outputs else None
        try:
            try:
                attrs = {a.name: _attr_value(a) for a in node.attributes.values()}
                n = Node(
                    self,
                    node.op_type,
                    domain,
                    opset,
                    label,
                    inputs,
                    input_names,
                    attrs,
                    len(node.outputs),
                    used,
                    hints,
                )
                handler = HANDLERS.get((domain, node.op_type))
                if handler is None:
                    raise NotMapped("llmir has no mapping for this op")
                outs = handler(n)
            except NotMapped:
                if not self.keep_unknown:
                    raise
                del self.fn.ops[start:]
                outs = self._opaque(node, domain, opset, inputs, hints, label)
        except NeedsConstant as exc:
            raise NeedsConstantError(f"{self.src.label}: {where}: {exc}", exc.input_name) from None
        except NotMapped as exc:
            known = (domain, node.op_type) in HANDLERS
            what = "is not supported here" if known else "is not known to llmir"
            raise InputError(
                f"{self.src.label}: {where}: ONNX op {node.op_type} {what}: {exc}",
                hint="pass --keep-unknown to keep it as an opaque onnx.opaque op "
                "(only the onnxruntime backend can build it)",
            ) from None
        except OpVerifyError as exc:
            raise InputError(
                f"{self.src.label}: {where}: {exc}",
                hint="the model may be invalid; check it with onnx.checker",
            ) from None
        finally:
            self.node_value_name = None
        new_ops = {id(op) for op in self.fn.ops[start:]}
        for i, o in enumerate(node.outputs):
            if not o.name:
                continue
            val = outs[i] if i < len(outs) else None
            if val is None:
                if used[i]:
                    raise InputError(
                        f"{self.src.label}: {where}: output #{i} ('{o.name}') is not supported",
                        hint="the model uses an output llmir cannot produce",
                    )
                continue
            if val.owner is not None and id(val.owner) in new_ops and not _is_named(val, node):
                val.name = self.b.fresh(_value_hint(o.name))
            self.values[id(o)] = val

    def _opaque(
        self,
        node: ir.Node,
        domain: str,
        opset: int,
        inputs: list[Value | None],
        hints: list[TensorType | None],
        label: str,
    ) -> list[Value | None]:
        types: list[Type] = []
        for o, h in zip(node.outputs, hints):
            if not o.name:
                continue
            t = h or tensor_type_of(o, self.dim_names, strict_names=True)
            if t is None:
                raise InputError(
                    f"{self.src.label}: cannot keep {node.op_type} (node '{label}') "
                    f"as an opaque op: ONNX shape inference gives no type for output "
                    f"'{o.name}'"
                )
            types.append(t)
        attrs: dict[str, Any] = {}
        for a in node.attributes.values():
            try:
                attrs[a.name] = _opaque_attr(_attr_value(a))
            except NotMapped as exc:
                raise InputError(
                    f"{self.src.label}: cannot keep {node.op_type} (node '{label}'): {exc}"
                ) from None
        missing_in = tuple(i for i, v in enumerate(inputs) if v is None)
        missing_out = tuple(i for i, o in enumerate(node.outputs) if not o.name)
        if missing_in:
            attrs["__missing_inputs"] = missing_in
        if missing_out:
            attrs["__missing_outputs"] = missing_out
        op_attrs = {"op_type": node.op_type, "domain": domain, "opset": opset, "attributes": attrs}
        operands = [v for v in inputs if v is not None]
        names = [_value_hint(o.name) for o in node.outputs if o.name]
        op = self.b.create("onnx.opaque", operands, op_attrs, result_types=types, names=names)
        self.used_opaque = True
        res = iter(op.results)
        return [next(res) if o.name else None for o in node.outputs]


class NeedsConstantError(InputError):
    """An input llmir takes as an attribute is not constant (names the ONNX input)."""

    def __init__(self, message: str, input_name: str) -> None:
        super().__init__(
            message,
            hint="fold it into a constant first (e.g. onnxsim, or onnx_ir's constant folding pass)",
        )
        self.input_name = input_name


def _name(v: ir.Value) -> str:
    return v.name or ""


def _static_shape(shape: Any) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else 0 for d in shape)


def _is_named(val: Value, node: ir.Node) -> bool:
    return any(val.name == _value_hint(o.name) for o in node.outputs if o.name)


def _value_hint(name: str) -> str:
    return re.sub(r"[^\w.]", "_", name).strip("_.") or "v"


def _module_name(model: ir.Model, label: str) -> str:
    name = model.graph.name or os.path.splitext(os.path.basename(label))[0]
    return re.sub(r"[^\w.]", "_", name) or "model"


def _dce(fn: Function) -> None:
    """Drop ops none of whose results are used (every llmir op the importer emits is pure)."""
    used = {id(v) for v in fn.outputs}
    keep: list[Op] = []
    for op in reversed(fn.ops):
        opdef = get_op(op.name)
        effectful = opdef is not None and opdef.effects
        if effectful or any(id(r) in used for r in op.results):
            keep.append(op)
            used.update(id(v) for v in op.operands)
    fn.ops[:] = list(reversed(keep))


# -- entry point --------------------------------------------------------------------------------------------


def import_onnx(
    src: str | os.PathLike[str] | onnx.ModelProto,
    *,
    out_path: str | None = None,
    keep_unknown: bool = False,
    base_dir: str | None = None,
) -> tuple[Module, Sidecar | None]:
    """Import an ONNX model; return the module and the weights file to write beside it (if any).

    `out_path` is the `.llmir` the module will be written to: weight paths are made relative to
    its folder, and tensors stored inside the protobuf go to `<stem>.weights.bin` there. Without
    it, weight paths are absolute and in-protobuf tensors become inline constants.
    """
    if isinstance(src, onnx.ModelProto):
        proto = src
        label = proto.graph.name or "<model>"
        base = base_dir or os.getcwd()
    else:
        label = os.fspath(src)
        proto = load_proto(label)
        base = base_dir or os.path.dirname(os.path.abspath(label))
    proto, converted_from = upgrade_opset(proto, label)
    opsets = _check_opsets(proto, label)
    check_model_proto(proto, label, opsets)
    if len(proto.functions):
        try:
            proto = onnx.inliner.inline_local_functions(proto)
        except Exception as exc:
            raise InputError(f"{label}: cannot inline the model's local functions: {exc}") from None
    hints = infer_onnx_types(proto)
    with _quiet_onnx_ir():
        try:
            model = ir.serde.deserialize_model(proto)
        except Exception as exc:
            raise InputError(
                f"{label}: not a valid ONNX model: {exc}",
                hint="check it with onnx.checker.check_model",
            ) from None
    ir.external_data.set_base_dir(model.graph, base)
    source = ImportSource(label, base, out_path)
    for init in model.graph.initializers.values():
        if isinstance(init.const_value, ir.ExternalTensor):
            check_external(init.const_value, label)
    order = _toposort(model.graph, label)
    imp = _Importer(model, source, opsets, hints, keep_unknown)
    module = imp.run(order)
    if converted_from is not None:
        module.attrs["onnx.converted_from_opset"] = converted_from
    if source.out_path:
        module.source = source.out_path
    sidecar = imp.sidecar if imp.sidecar is not None and imp.sidecar.chunks else None
    return module, sidecar


__all__ = [
    "import_onnx",
    "Sidecar",
    "NeedsConstantError",
    "ONNX_TO_DTYPE",
    "DTYPE_TO_ONNX",
    "load_proto",
    "load_tensor_pb",
    "dim_from_param",
    "MIN_OPSET",
    "MAX_OPSET",
    "upgrade_opset",
]


def load_tensor_pb(path: str) -> np.ndarray:
    """An ONNX TensorProto .pb file as a numpy array."""
    t = onnx.TensorProto()
    try:
        with open(path, "rb") as fh:
            t.ParseFromString(fh.read())
    except (DecodeError, OSError) as exc:
        raise InputError(f"{path}: not a readable ONNX TensorProto (.pb): {exc}") from None
    if t.data_type not in ONNX_TO_DTYPE:
        raise InputError(
            f"{path}: tensor of ONNX type {onnx_dtype_name(t.data_type)}, which llmir has "
            "no dtype for"
        )
    try:
        # external data lives beside the .pb (onnx refuses a location outside that folder)
        arr = onnx.numpy_helper.to_array(t, base_dir=os.path.dirname(os.path.abspath(path)))
    except Exception as exc:
        raise InputError(f"{path}: cannot decode the tensor: {exc}") from None
    return np.asarray(arr).astype(numpy_dtype(ONNX_TO_DTYPE[t.data_type]), copy=False)
