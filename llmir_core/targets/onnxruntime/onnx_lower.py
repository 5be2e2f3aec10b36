"""Lowering llmir to ONNX for the onnxruntime backend: one function per llmir op, as a table.

`Lowering` walks a function and emits ONNX nodes (opset 23 plus com.microsoft ops), initializers
and a `DataPlan` (where each external tensor's bytes come from). Weights are never read here: a
`core.weight` becomes an external-data initializer pointing at bytes the plan copies at build
time. Composite llm ops without an ONNX equivalent are lowered through their decomposition.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from llmir_core.builder import Builder
from llmir_core.dialects.opdef import OpVerifyError
from llmir_core.dialects.registry import get_op
from llmir_core.errors import BuildError
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.dims import DYN, Dim, SymDim, format_dim
from llmir_core.ir.types import DType, QuantType, TensorType, Type, numpy_dtype
from llmir_core.targets.onnxruntime.nodeinfo import tag_node  # node -> .llmir op
from llmir_core.weights import resolve_path

OPSET = 23
MS = "com.microsoft"
DATA_FILE = "model.onnx.data"
EXTERNAL_MIN = 1024  # constants of at least this many bytes go to the data file
# tensors of 1 MB or more start on a 4 KiB boundary (onnxruntime memory-maps external data at
# page-aligned offsets, as its own writer aligns them), others on 64 bytes
_ALIGN_SMALL, _ALIGN_LARGE, _LARGE = 64, 4096, 1 << 20
_BLOCK = 16 << 20

DTYPE_TO_ONNX: dict[DType, int] = {
    DType.f32: TensorProto.FLOAT,
    DType.u8: TensorProto.UINT8,
    DType.i8: TensorProto.INT8,
    DType.i16: TensorProto.INT16,
    DType.i32: TensorProto.INT32,
    DType.i64: TensorProto.INT64,
    DType.bool: TensorProto.BOOL,
    DType.f16: TensorProto.FLOAT16,
    DType.f64: TensorProto.DOUBLE,
    DType.bf16: TensorProto.BFLOAT16,
    DType.f8e4m3: TensorProto.FLOAT8E4M3FN,
    DType.f8e5m2: TensorProto.FLOAT8E5M2,
    DType.u4: TensorProto.UINT4,
    DType.i4: TensorProto.INT4,
    DType.u16: TensorProto.UINT16,
    DType.u32: TensorProto.UINT32,
    DType.u64: TensorProto.UINT64,
    DType.f8e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ,
    DType.f8e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ,
    DType.f8e8m0: TensorProto.FLOAT8E8M0,
    DType.f4e2m1: TensorProto.FLOAT4E2M1,
    DType.u2: TensorProto.UINT2,
    DType.i2: TensorProto.INT2,
}


# -- the data file plan -----------------------------------------------------------------------------


@dataclass
class _Chunk:
    offset: int
    nbytes: int
    src: str | None = None  # a file to copy from (with src_offset), or
    src_offset: int = 0
    data: bytes | None = None  # bytes in memory


@dataclass
class DataPlan:
    """The external data file's layout: where each tensor's bytes come from."""

    chunks: list[_Chunk] = field(default_factory=list)
    size: int = 0
    _dedupe: dict[Any, int] = field(default_factory=dict)

    def _place(self, key: Any, nbytes: int) -> tuple[int, bool]:
        if key in self._dedupe:
            return self._dedupe[key], False
        align = _ALIGN_LARGE if nbytes >= _LARGE else _ALIGN_SMALL
        off = -(-self.size // align) * align
        self._dedupe[key] = off
        self.size = off + nbytes
        return off, True

    def add_file(self, path: str, offset: int, nbytes: int) -> int:
        off, new = self._place(("file", os.path.realpath(path), offset, nbytes), nbytes)
        if new:
            self.chunks.append(_Chunk(off, nbytes, src=path, src_offset=offset))
        return off

    def add_bytes(self, data: bytes) -> int:
        off, new = self._place(("bytes", hashlib.sha256(data).hexdigest(), len(data)), len(data))
        if new:
            self.chunks.append(_Chunk(off, len(data), data=data))
        return off

    def write(self, path: str) -> str:
        """Write the data file and return its sha256.

        The bytes are copied file to file by the kernel (copy_file_range) while a second thread
        reads the same source ranges and hashes them, so the build costs about one copy; memory
        stays at one 16 MB block.
        """
        hasher = hashlib.sha256()
        error: list[BaseException] = []

        def digest() -> None:
            try:
                pos = 0
                for c in self.chunks:
                    if c.offset > pos:
                        hasher.update(bytes(c.offset - pos))
                    if c.data is not None:
                        hasher.update(c.data)
                    else:
                        assert c.src is not None
                        _read_range(c.src, c.src_offset, c.nbytes, hasher.update)
                    pos = c.offset + c.nbytes
            except BaseException as exc:  # reported by the writing thread
                error.append(exc)

        worker = threading.Thread(target=digest, daemon=True)
        worker.start()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(fd, self.size)  # gaps between tensors read back as zeros
            for c in self.chunks:
                if c.data is not None:
                    os.pwrite(fd, c.data, c.offset)
                else:
                    assert c.src is not None
                    _copy_range(c.src, c.src_offset, c.nbytes, fd, c.offset)
            os.fsync(fd)
        finally:
            os.close(fd)
            worker.join()
        if error:
            raise BuildError(f"cannot read weights while hashing: {error[0]}")
        return hasher.hexdigest()


class DataWriter:
    """The external data file written front to back as a graph is built (the decoder serializer
    streams transformed weights through it); the same alignment as `DataPlan`, and file ranges
    copied by the kernel. `append_plan` places a generic `DataPlan` after what is written."""

    def __init__(self, path: str) -> None:
        self.fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.pos = 0

    def start(self, large: bool) -> int:
        """Pad to the alignment of a small or large tensor; its offset."""
        align = _ALIGN_LARGE if large else _ALIGN_SMALL
        pad = (-self.pos) % align
        if pad:
            self.fh.write(b"\0" * pad)
            self.pos += pad
        return self.pos

    def write(self, arr: np.ndarray | bytes) -> None:
        data = arr if isinstance(arr, bytes) else np.ascontiguousarray(arr).tobytes()
        self.fh.write(data)
        self.pos += len(data)

    def copy(self, path: str, offset: int, nbytes: int) -> None:
        self.fh.flush()
        _copy_range(path, offset, nbytes, self.fh.fileno(), self.pos)
        self.pos += nbytes
        self.fh.seek(self.pos)

    def append_plan(self, plan: DataPlan) -> int:
        """Write a DataPlan's chunks at the next large alignment; the base their offsets move by."""
        base = self.start(True)
        pos = 0
        for c in plan.chunks:
            if c.offset > pos:
                self.write(b"\0" * (c.offset - pos))
            if c.data is not None:
                self.write(c.data)
            else:
                assert c.src is not None
                self.copy(c.src, c.src_offset, c.nbytes)
            pos = c.offset + c.nbytes
        return base

    def close(self) -> None:
        if self.fh.closed:
            return
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


def _read_range(src: str, offset: int, nbytes: int, sink: Callable[[bytes], Any]) -> None:
    with open(src, "rb", buffering=0) as fin:
        fin.seek(offset)
        left = nbytes
        while left > 0:
            b = fin.read(min(left, _BLOCK))
            if not b:
                raise BuildError(f"weight file {src} ended early")
            sink(b)
            left -= len(b)


def _copy_range(src: str, offset: int, nbytes: int, fd: int, dst_offset: int) -> None:
    """Copy src[offset:offset+nbytes] to fd at dst_offset, in the kernel where it can."""
    with open(src, "rb", buffering=0) as fin:
        done = 0
        if hasattr(os, "copy_file_range"):
            try:
                while done < nbytes:
                    n = os.copy_file_range(
                        fin.fileno(),
                        fd,
                        min(nbytes - done, 1 << 30),
                        offset + done,
                        dst_offset + done,
                    )
                    if n <= 0:
                        break
                    done += n
            except OSError:
                pass  # another filesystem or no support: copy through user space
        while done < nbytes:
            b = os.pread(fin.fileno(), min(nbytes - done, _BLOCK), offset + done)
            if not b:
                raise BuildError(f"weight file {src} ended early while copying")
            os.pwrite(fd, b, dst_offset + done)
            done += len(b)


# -- lowering ------------------------------------------------------------------------------------------


def onnx_dtype(t: TensorType | DType) -> int:
    dt = t.dtype if isinstance(t, TensorType) else t
    if not isinstance(dt, DType) or dt not in DTYPE_TO_ONNX:
        raise BuildError(f"dtype {dt} has no ONNX tensor type")
    return DTYPE_TO_ONNX[dt]


def _dim_param(d: Dim) -> str:
    return format_dim(d).replace("?", "")


def value_info(name: str, t: Type) -> onnx.ValueInfoProto:
    if not isinstance(t, TensorType):
        raise BuildError(
            f"'{name}' has type {t}, which onnxruntime artifacts cannot take as an input or output",
            hint="KV-cache values must stay inside the function",
        )
    shape: list[Any] = []
    for d in t.shape:
        shape.append(d if isinstance(d, int) else (None if d is DYN else _dim_param(d)))
    return helper.make_tensor_value_info(name, onnx_dtype(t), shape)


class Lowering:
    """Turns one llmir function into ONNX nodes, initializers and a data plan."""

    def __init__(self, module: Module, base_dir: str, inline_weights: bool) -> None:
        self.module = module
        self.base_dir = base_dir
        self.inline = inline_weights
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.plan = DataPlan()
        self.names: dict[int, str] = {}
        self.used_names: set[str] = set()
        self.weights: dict[int, Op] = {}  # id(value) -> core.weight op, materialized on use
        # the decomposition functions built while lowering: kept alive so that the id() keys of
        # their values in `names` / `weights` are never reused by later values
        self._decomposed: list[Function] = []
        self.const_cache: dict[Any, str] = {}
        self.dim_sources: dict[str, tuple[str, int]] = {}
        self.dim_cache: dict[str, str] = {}
        self.opsets: dict[str, int] = {"": OPSET}
        self.origin: str | None = None
        self.src_op: Op | None = None  # the op whose nodes are being emitted (nodeinfo.tag_node)
        self._counter = 0

    # -- names ---------------------------------------------------------------
    def fresh(self, base: str) -> str:
        name = base
        while name in self.used_names:
            self._counter += 1
            name = f"{base}__{self._counter}"
        self.used_names.add(name)
        return name

    def name_of(self, v: Value) -> str:
        if id(v) in self.names:
            return self.names[id(v)]
        if id(v) in self.weights:
            return self._materialize_weight(v)
        raise BuildError(f"value %{v.name} is used before it is defined")

    # -- emitting ------------------------------------------------------------
    def node(
        self,
        op_type: str,
        inputs: list[str],
        n_out: int = 1,
        domain: str = "",
        out_names: list[str] | None = None,
        **attrs: Any,
    ) -> list[str]:
        outs = out_names or [self.fresh(f"{op_type.lower()}") for _ in range(n_out)]
        name = self.fresh(f"n{len(self.nodes)}_{op_type}")
        attrs = {k: v for k, v in attrs.items() if v is not None}
        nd = helper.make_node(op_type, inputs, outs, name=name, domain=domain or None, **attrs)
        if self.origin:
            nd.doc_string = self.origin
        tag_node(nd, self.src_op)  # node -> .llmir op
        self.nodes.append(nd)
        if domain and domain not in self.opsets:
            self.opsets[domain] = 1
        return outs

    def one(self, op_type: str, *inputs: str, domain: str = "", **attrs: Any) -> str:
        return self.node(op_type, list(inputs), 1, domain, **attrs)[0]

    def const(self, arr: np.ndarray, base: str = "const") -> str:
        arr = np.asarray(arr)
        key = (str(arr.dtype), arr.shape, arr.tobytes())
        if key in self.const_cache:
            return self.const_cache[key]
        name = self.fresh(base)
        self._add_tensor(name, arr)
        self.const_cache[key] = name
        return name

    def ints(self, values: list[int] | tuple[int, ...], base: str = "ints") -> str:
        return self.const(np.array(list(values), dtype=np.int64), base)

    def _add_tensor(self, name: str, arr: np.ndarray) -> None:
        dt = DTYPE_TO_ONNX.get(_dtype_of_array(arr))
        if dt is None:
            raise BuildError(f"constant of numpy dtype {arr.dtype} has no ONNX type")
        if arr.nbytes >= EXTERNAL_MIN and not self.inline:
            data = _raw_bytes(arr)
            t = _external_tensor(name, dt, list(arr.shape), self.plan.add_bytes(data), len(data))
        else:
            t = _tensor_proto(name, arr, dt)
        self.inits.append(t)

    def _materialize_weight(
        self,
        v: Value,
        as_type: TensorType | None = None,
        onnx_shape: list[int] | None = None,
        onnx_dt: int | None = None,
    ) -> str:
        op = self.weights[id(v)]
        key = ("w", id(v), tuple(onnx_shape or ()), onnx_dt)
        if key in self.const_cache:
            return self.const_cache[key]
        t = as_type or v.type
        assert isinstance(t, TensorType)
        shape = onnx_shape if onnx_shape is not None else list(t.static_shape() or ())
        dt = onnx_dt if onnx_dt is not None else onnx_dtype(t)
        nbytes = int(op.attrs["nbytes"])
        path = resolve_path(op.attrs["file"], self.base_dir)
        if not os.path.isfile(path):
            raise BuildError(f"weight '{op.attrs.get('name', v.name)}': file {path} not found")
        if os.path.getsize(path) < int(op.attrs.get("offset", 0)) + nbytes:
            raise BuildError(f"weight '{op.attrs.get('name', v.name)}': file {path} is too short")
        name = self.fresh(op.attrs.get("name") or v.name)
        if self.inline:
            with open(path, "rb") as fh:
                fh.seek(int(op.attrs.get("offset", 0)))
                data = fh.read(nbytes)
            t_proto = helper.make_tensor(name, dt, shape, vals=data, raw=True)
        else:
            off = self.plan.add_file(path, int(op.attrs.get("offset", 0)), nbytes)
            t_proto = _external_tensor(name, dt, shape, off, nbytes)
        self.inits.append(t_proto)
        self.const_cache[key] = name
        return name

    # -- symbolic dims at run time ---------------------------------------------
    def bind_dims(self, fn: Function, input_names: list[str]) -> None:
        for a, n in zip(fn.args, input_names):
            t = a.type
            if not isinstance(t, TensorType):
                continue
            for i, d in enumerate(t.shape):
                if (
                    isinstance(d, SymDim)
                    and len(d.terms) == 1
                    and d.const == 0
                    and d.terms[0][1] == 1
                    and len(d.terms[0][0]) == 1
                ):
                    self.dim_sources.setdefault(d.terms[0][0][0], (n, i))

    def dim_tensor(self, d: Dim) -> str:
        """A 1-D int64 [1] tensor holding d's value at run time."""
        if isinstance(d, int):
            return self.ints([d])
        if not isinstance(d, SymDim):
            raise BuildError("an anonymous '?' dim in an attribute cannot be computed at run time")
        key = format_dim(d)
        if key in self.dim_cache:
            return self.dim_cache[key]
        total: str | None = None
        for mono, coef in d.terms:
            term: str | None = None
            for nm in mono:
                if nm not in self.dim_sources:
                    raise BuildError(
                        f"symbolic dim ?{nm} is not the size of any input, so the "
                        "artifact cannot compute it"
                    )
                src, axis = self.dim_sources[nm]
                ck = f"?{nm}"
                if ck not in self.dim_cache:
                    self.dim_cache[ck] = self.one("Shape", src, start=axis, end=axis + 1)
                s = self.dim_cache[ck]
                term = s if term is None else self.one("Mul", term, s)
            assert term is not None
            if coef != 1:
                term = self.one("Mul", term, self.ints([coef]))
            total = term if total is None else self.one("Add", total, term)
        if d.const:
            assert total is not None
            total = self.one("Add", total, self.ints([d.const]))
        assert total is not None
        self.dim_cache[key] = total
        return total

    def dims_tensor(self, dims: tuple[Dim, ...] | list[Dim]) -> tuple[str, bool]:
        """A 1-D int64 shape tensor for dims; also whether any piece is computed at run time."""
        if all(isinstance(d, int) for d in dims):
            return self.ints([int(d) for d in dims]), False  # type: ignore[arg-type]
        pieces: list[str] = []
        run: list[int] = []
        for d in dims:
            if isinstance(d, int):
                run.append(d)
                continue
            if run:
                pieces.append(self.ints(run))
                run = []
            pieces.append(self.dim_tensor(d))
        if run:
            pieces.append(self.ints(run))
        return (pieces[0] if len(pieces) == 1 else self.one("Concat", *pieces, axis=0)), True

    # -- the function --------------------------------------------------------
    def lower_function(self, fn: Function) -> tuple[list[str], list[str]]:
        input_names = list(fn.attrs.get("input_names") or [a.name for a in fn.args])
        for a, n in zip(fn.args, input_names):
            self.names[id(a)] = n
            self.used_names.add(n)
        self.bind_dims(fn, input_names)
        for op in fn.ops:
            self.lower_op(op)
        wanted = list(fn.attrs.get("output_names") or [v.name for v in fn.outputs])
        out_names: list[str] = []
        taken = set(input_names)
        for v, want in zip(fn.outputs, wanted):
            src = self.name_of(v)
            if want in taken or src in taken or src != want and want in self.used_names:
                want = want if want not in taken else self.fresh(want)
                self.used_names.add(want)
                self.origin = None
                self.node("Identity", [src], out_names=[want])
            elif src != want:
                self._rename(src, want)
            taken.add(want)
            out_names.append(want)
        return input_names, out_names

    def _rename(self, old: str, new: str) -> None:
        self.used_names.add(new)
        for nd in self.nodes:
            for i, o in enumerate(nd.output):
                if o == old:
                    nd.output[i] = new
            for i, x in enumerate(nd.input):
                if x == old:
                    nd.input[i] = new
        for k, v in list(self.names.items()):
            if v == old:
                self.names[k] = new

    def lower_op(self, op: Op) -> None:
        if op.name == "core.weight":
            self.weights[id(op.result)] = op
            return
        prev = (
            self.origin,
            self.src_op,
        )  # restored, as lower_op also runs nested (static producers)
        self.origin = op.origin
        self.src_op = (
            op if op.pos is not None or self.src_op is None else self.src_op
        )  # made ops: the parent's
        fn = LOWER.get(op.name)
        try:
            outs = fn(self, op) if fn is not None else self._lower_decomposed(op)
        finally:
            self.origin, self.src_op = prev
        for r, o in zip(op.results, outs):
            self.names[id(r)] = o

    def _lower_decomposed(self, op: Op) -> list[str]:
        opdef = get_op(op.name)
        if opdef is None or opdef.decompose is None:
            raise BuildError(
                f"{op.name} has no onnxruntime lowering" + (f" [{op.origin}]" if op.origin else ""),
                hint="this op cannot be built for onnxruntime yet",
            )
        sub = Function(f"{op.name}.decomposed", [])
        self._decomposed.append(sub)
        params = [Value(f"d{i}", v.type) for i, v in enumerate(op.operands)]
        sub.args = params
        b = Builder(sub, prefix="dec")
        try:
            outs = opdef.decompose(b, params, opdef.with_defaults(op.attrs))
        except OpVerifyError as exc:
            raise BuildError(
                f"{op.name} cannot be decomposed for onnxruntime: {exc}"
                + (f" [{op.origin}]" if op.origin else "")
            ) from None
        for p, v in zip(params, op.operands):
            if id(v) in self.weights:
                self.weights[id(p)] = self.weights[id(v)]
            else:
                self.names[id(p)] = self.name_of(v)
        origin = op.origin
        for sop in sub.ops:
            sop.origin = origin
            self.lower_op(sop)
        return [self.name_of(v) for v in outs]


def _dtype_of_array(arr: np.ndarray) -> DType:
    from llmir_core.ir.types import dtype_from_numpy

    return dtype_from_numpy(arr.dtype)


def _raw_bytes(arr: np.ndarray) -> bytes:
    dt = _dtype_of_array(arr)
    if dt.bits < 8:
        from llmir_core.ir.types import pack_sub_byte

        return pack_sub_byte(arr, dt.bits)
    return np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def _tensor_proto(name: str, arr: np.ndarray, dt: int) -> onnx.TensorProto:
    return helper.make_tensor(name, dt, list(arr.shape), vals=_raw_bytes(arr), raw=True)


def _external_tensor(
    name: str, dt: int, shape: list[int], offset: int, nbytes: int
) -> onnx.TensorProto:
    t = onnx.TensorProto(name=name, data_type=dt, dims=shape)
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", DATA_FILE), ("offset", str(offset)), ("length", str(nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


# -- per-op lowering -----------------------------------------------------------------------------------

LowerFn = Callable[[Lowering, Op], list[str]]
LOWER: dict[str, LowerFn] = {}


def lowers(*names: str) -> Callable[[LowerFn], LowerFn]:
    def deco(fn: LowerFn) -> LowerFn:
        for n in names:
            LOWER[n] = fn
        return fn

    return deco


def _ins(L: Lowering, op: Op) -> list[str]:
    return [L.name_of(v) for v in op.operands]


def _t(v: Value) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise BuildError(f"%{v.name} is not a tensor")
    return t


_SIMPLE = {
    "core.abs": "Abs",
    "core.neg": "Neg",
    "core.relu": "Relu",
    "core.sign": "Sign",
    "core.exp": "Exp",
    "core.log": "Log",
    "core.sqrt": "Sqrt",
    "core.tanh": "Tanh",
    "core.erf": "Erf",
    "core.sigmoid": "Sigmoid",
    "core.sin": "Sin",
    "core.cos": "Cos",
    "core.reciprocal": "Reciprocal",
    "core.floor": "Floor",
    "core.ceil": "Ceil",
    "core.round": "Round",
    "core.not": "Not",
    "core.add": "Add",
    "core.sub": "Sub",
    "core.mul": "Mul",
    "core.div": "Div",
    "core.pow": "Pow",
    "core.max": "Max",
    "core.min": "Min",
    "core.equal": "Equal",
    "core.less": "Less",
    "core.less_equal": "LessOrEqual",
    "core.greater": "Greater",
    "core.greater_equal": "GreaterOrEqual",
    "core.and": "And",
    "core.or": "Or",
    "core.xor": "Xor",
    "core.where": "Where",
    "core.identity": "Identity",
    "core.size": "Size",
    "core.gather_elements": "GatherElements",
    "core.expand_dyn": "Expand",
    "llm.embedding": "Gather",
}


# dtypes onnxruntime's CPU Max/Min have no kernel for: computed exactly in int32
_WIDEN_MAX_MIN = {DType.i16, DType.u16}


@lowers(*_SIMPLE)
def _l_simple(L: Lowering, op: Op) -> list[str]:
    attrs: dict[str, Any] = {}
    if op.name == "core.gather_elements":
        attrs["axis"] = op.attrs.get("axis", 0)
    dt = _t(op.results[0]).dtype
    if op.name in ("core.max", "core.min") and dt in _WIDEN_MAX_MIN:
        wide = [L.one("Cast", x, to=TensorProto.INT32) for x in _ins(L, op)]
        return [L.one("Cast", L.one(_SIMPLE[op.name], *wide), to=onnx_dtype(dt))]
    return L.node(_SIMPLE[op.name], _ins(L, op), **attrs)


@lowers("core.rsqrt")
def _l_rsqrt(L: Lowering, op: Op) -> list[str]:
    return [L.one("Reciprocal", L.one("Sqrt", L.name_of(op.operands[0])))]


@lowers("core.silu")
def _l_silu(L: Lowering, op: Op) -> list[str]:
    x = L.name_of(op.operands[0])
    return [L.one("Mul", x, L.one("Sigmoid", x))]


@lowers("llm.silu_mul")
def _l_silu_mul(L: Lowering, op: Op) -> list[str]:
    g, u = _ins(L, op)
    return [L.one("Mul", L.one("Mul", g, L.one("Sigmoid", g)), u)]


@lowers("core.gelu")
def _l_gelu(L: Lowering, op: Op) -> list[str]:
    return L.node("Gelu", _ins(L, op), approximate=op.attrs.get("approximate", "none"))


@lowers("core.not_equal")
def _l_ne(L: Lowering, op: Op) -> list[str]:
    return [L.one("Not", L.one("Equal", *_ins(L, op)))]


@lowers("core.mod")
def _l_mod(L: Lowering, op: Op) -> list[str]:
    fmod = 1 if _t(op.operands[0]).dtype in (DType.f16, DType.f32, DType.f64, DType.bf16) else 0
    return L.node("Mod", _ins(L, op), fmod=fmod)


_OPSET25_TYPES = {DType.i2, DType.u2, DType.f8e8m0, DType.f4e2m1}


@lowers("ort.cast")
def _l_ort_cast(L: Lowering, op: Op) -> list[str]:
    return L.node("Cast", _ins(L, op), to=onnx_dtype(op.attrs["to"]))


@lowers("core.cast")
def _l_cast(L: Lowering, op: Op) -> list[str]:
    to = op.attrs["to"]
    # llmir's cast does not saturate float8 (out of range -> NaN / inf); ONNX's does by default
    sat = 0 if to in (DType.f8e4m3, DType.f8e5m2, DType.f8e4m3fnuz, DType.f8e5m2fnuz) else None
    if {to, _t(op.operands[0]).dtype} & _OPSET25_TYPES:
        L.opsets[""] = max(L.opsets[""], 25)  # Cast takes int2/uint2/float8e8m0 from opset 25
    return L.node("Cast", _ins(L, op), to=onnx_dtype(to), saturate=sat)


@lowers("llm.to_device")
def _l_to_device(L: Lowering, op: Op) -> list[str]:
    """Host/CPU placement is what onnxruntime's CPU provider does anyway: the same values."""
    device = op.attrs.get("device", "")
    if device not in ("", "cpu"):
        raise BuildError(
            f"llm.to_device to '{device}': the onnxruntime backend runs on the CPU only"
            + (f" [{op.origin}]" if op.origin else "")
        )
    return L.node("Identity", _ins(L, op))


@lowers("core.range")
def _l_range(L: Lowering, op: Op) -> list[str]:
    dt = _t(op.operands[0]).dtype
    ins = _ins(L, op)
    if dt in (DType.f16, DType.bf16):  # onnxruntime has Range for f32/f64/ints only
        wide = [L.one("Cast", x, to=TensorProto.FLOAT) for x in ins]
        return [L.one("Cast", L.one("Range", *wide), to=onnx_dtype(dt))]
    return L.node("Range", ins)


@lowers("core.matmul")
def _l_matmul(L: Lowering, op: Op) -> list[str]:
    a, b = _ins(L, op)
    ta, tb = bool(op.attrs.get("transpose_a")), bool(op.attrs.get("transpose_b"))
    at, bt = _t(op.operands[0]), _t(op.operands[1])
    if (ta or tb) and at.dtype == DType.f32 and at.rank >= 2 and bt.rank >= 2:
        return L.node("FusedMatMul", [a, b], domain=MS, transA=int(ta), transB=int(tb))
    if ta:
        a = L.one("Transpose", a, perm=list(range(at.rank - 2)) + [at.rank - 1, at.rank - 2])
    if tb:
        b = L.one("Transpose", b, perm=list(range(bt.rank - 2)) + [bt.rank - 1, bt.rank - 2])
    return L.node("MatMul", [a, b])


@lowers("core.constant")
def _l_constant(L: Lowering, op: Op) -> list[str]:
    arr = op.attrs["value"].array
    return [L.const(arr, op.result.name)]


@lowers("core.reshape")
def _l_reshape(L: Lowering, op: Op) -> list[str]:
    dims = tuple(op.attrs["shape"])
    shape, computed = L.dims_tensor(dims)
    allowzero = bool(op.attrs.get("allowzero"))
    if computed and 0 not in dims:
        allowzero = True  # computed sizes may be 0 at run time and must not mean 'copy'
    if allowzero and -1 in dims and 0 in dims:
        allowzero = False
    return L.node("Reshape", [L.name_of(op.operands[0]), shape], allowzero=int(allowzero) or None)


@lowers("core.reshape_dyn")
def _l_reshape_dyn(L: Lowering, op: Op) -> list[str]:
    return L.node("Reshape", _ins(L, op), allowzero=int(bool(op.attrs.get("allowzero"))) or None)


@lowers("core.transpose")
def _l_transpose(L: Lowering, op: Op) -> list[str]:
    perm = list(op.attrs.get("perm") or ())
    return L.node("Transpose", _ins(L, op), perm=perm or None)


@lowers("core.concat")
def _l_concat(L: Lowering, op: Op) -> list[str]:
    return L.node("Concat", _ins(L, op), axis=op.attrs["axis"])


@lowers("core.split")
def _l_split(L: Lowering, op: Op) -> list[str]:
    x = L.name_of(op.operands[0])
    sizes = tuple(op.attrs.get("sizes") or ())
    axis = op.attrs.get("axis", 0)
    if sizes:
        split, _ = L.dims_tensor(sizes)
        return L.node("Split", [x, split], len(op.results), axis=axis)
    return L.node("Split", [x], len(op.results), axis=axis, num_outputs=len(op.results))


@lowers("core.slice")
def _l_slice(L: Lowering, op: Op) -> list[str]:
    starts = list(op.attrs["starts"])
    inputs = [L.name_of(op.operands[0]), L.ints(starts), L.ints(list(op.attrs["ends"]))]
    axes, steps = list(op.attrs.get("axes") or ()), list(op.attrs.get("steps") or ())
    if axes or steps:
        inputs.append(L.ints(axes or list(range(len(starts)))))
    if steps:
        inputs.append(L.ints(steps))
    return L.node("Slice", inputs)


@lowers("core.slice_dyn")
def _l_slice_dyn(L: Lowering, op: Op) -> list[str]:
    return L.node("Slice", _ins(L, op))


@lowers("core.gather")
def _l_gather(L: Lowering, op: Op) -> list[str]:
    return L.node("Gather", _ins(L, op), axis=op.attrs.get("axis", 0))


@lowers("core.scatter_elements")
def _l_scatter_el(L: Lowering, op: Op) -> list[str]:
    return L.node(
        "ScatterElements",
        _ins(L, op),
        axis=op.attrs.get("axis", 0),
        reduction=op.attrs.get("reduction", "none"),
    )


@lowers("core.scatter_nd")
def _l_scatter_nd(L: Lowering, op: Op) -> list[str]:
    return L.node("ScatterND", _ins(L, op), reduction=op.attrs.get("reduction", "none"))


@lowers("core.expand")
def _l_expand(L: Lowering, op: Op) -> list[str]:
    shape, _ = L.dims_tensor(tuple(op.attrs["shape"]))
    return L.node("Expand", [L.name_of(op.operands[0]), shape])


@lowers("core.squeeze")
def _l_squeeze(L: Lowering, op: Op) -> list[str]:
    axes = list(op.attrs.get("axes") or ())
    x = L.name_of(op.operands[0])
    if not axes:
        t = _t(op.operands[0])
        axes = [i for i, d in enumerate(t.shape) if d == 1]
        if any(not isinstance(d, int) for d in t.shape):
            return L.node("Squeeze", [x])
    return L.node("Squeeze", [x, L.ints(axes)])


@lowers("core.unsqueeze")
def _l_unsqueeze(L: Lowering, op: Op) -> list[str]:
    return L.node("Unsqueeze", [L.name_of(op.operands[0]), L.ints(list(op.attrs["axes"]))])


@lowers("core.shape")
def _l_shape(L: Lowering, op: Op) -> list[str]:
    start, end = op.attrs.get("start", 0), op.attrs.get("end")
    return L.node("Shape", _ins(L, op), start=start or None, end=end)


@lowers("core.trilu")
def _l_trilu(L: Lowering, op: Op) -> list[str]:
    return L.node("Trilu", _ins(L, op), upper=int(op.attrs.get("upper", True)))


@lowers("core.cumsum")
def _l_cumsum(L: Lowering, op: Op) -> list[str]:
    return L.node(
        "CumSum",
        [L.name_of(op.operands[0]), L.const(np.array(op.attrs["axis"], np.int64))],
        exclusive=int(op.attrs.get("exclusive", False)),
        reverse=int(op.attrs.get("reverse", False)),
    )


@lowers("core.argmax", "core.argmin")
def _l_arg(L: Lowering, op: Op) -> list[str]:
    return L.node(
        "ArgMax" if op.name == "core.argmax" else "ArgMin",
        _ins(L, op),
        axis=op.attrs.get("axis", 0),
        keepdims=int(op.attrs.get("keepdims", True)),
        select_last_index=int(op.attrs.get("select_last_index", False)),
    )


@lowers("core.top_k")
def _l_topk(L: Lowering, op: Op) -> list[str]:
    x = L.name_of(op.operands[0])
    dt = _t(op.operands[0]).dtype
    key = x
    if dt in (DType.u16, DType.u32):  # no TopK kernel: int64 keys keep the order exactly
        key = L.one("Cast", x, to=TensorProto.INT64)
    elif dt == DType.u64:  # x - 2**63 (wrapping), read as int64, keeps the order
        shifted = L.one("Sub", x, L.const(np.array(2**63, np.uint64)))
        key = L.one("Cast", shifted, to=TensorProto.INT64)
    axis = op.attrs.get("axis", -1)
    out = L.node(
        "TopK",
        [key, L.ints([op.attrs["k"]])],
        2,
        axis=axis,
        largest=int(op.attrs.get("largest", True)),
        sorted=int(op.attrs.get("sorted", True)),
    )
    if key is x:
        return out
    return [L.one("GatherElements", x, out[1], axis=axis), out[1]]


@lowers("core.tile")
def _l_tile(L: Lowering, op: Op) -> list[str]:
    return L.node("Tile", [L.name_of(op.operands[0]), L.ints(list(op.attrs["repeats"]))])


@lowers("core.pad")
def _l_pad(L: Lowering, op: Op) -> list[str]:
    t = _t(op.operands[0])
    assert isinstance(t.dtype, DType)
    inputs = [L.name_of(op.operands[0]), L.ints(list(op.attrs["pads"]))]
    mode = op.attrs.get("mode", "constant")
    if mode == "constant":
        value = float(op.attrs.get("value", 0.0))
        nd = numpy_dtype(t.dtype)
        inputs.append(
            L.const(np.array(value if nd.kind == "f" or not math.isinf(value) else 0, dtype=nd))
        )
    return L.node("Pad", inputs, mode=mode)


@lowers("core.flatten")
def _l_flatten(L: Lowering, op: Op) -> list[str]:
    return L.node("Flatten", _ins(L, op), axis=op.attrs.get("axis", 1))


@lowers("core.constant_of_shape")
def _l_cos(L: Lowering, op: Op) -> list[str]:
    v = op.attrs.get("value")
    attrs: dict[str, Any] = {}
    if v is not None:
        arr = np.asarray(v.array).reshape(1)
        attrs["value"] = _tensor_proto("value", arr, DTYPE_TO_ONNX[_dtype_of_array(arr)])
    return L.node("ConstantOfShape", _ins(L, op), **attrs)


_REDUCE = {
    "core.reduce_sum": "ReduceSum",
    "core.reduce_mean": "ReduceMean",
    "core.reduce_max": "ReduceMax",
    "core.reduce_min": "ReduceMin",
    "core.reduce_prod": "ReduceProd",
}


@lowers(*_REDUCE)
def _l_reduce(L: Lowering, op: Op) -> list[str]:
    inputs = [L.name_of(op.operands[0])]
    boolean = _t(op.operands[0]).dtype == DType.bool
    if boolean:  # onnxruntime refuses bool ReduceMax/Min of an empty set; uint8 gives 0 / 255
        inputs = [L.one("Cast", inputs[0], to=TensorProto.UINT8)]
    axes = list(op.attrs.get("axes") or ())
    if axes:
        inputs.append(L.ints(axes))
    out = L.node(_REDUCE[op.name], inputs, keepdims=int(op.attrs.get("keepdims", True)))
    return [L.one("Cast", out[0], to=TensorProto.BOOL)] if boolean else out


@lowers(*(k + "_dyn" for k in _REDUCE))
def _l_reduce_dyn(L: Lowering, op: Op) -> list[str]:
    inputs = _ins(L, op)
    boolean = _t(op.operands[0]).dtype == DType.bool
    if boolean:  # as in _l_reduce
        inputs[0] = L.one("Cast", inputs[0], to=TensorProto.UINT8)
    out = L.node(
        _REDUCE[op.name.removesuffix("_dyn")],
        inputs,
        keepdims=int(op.attrs.get("keepdims", True)),
    )
    return [L.one("Cast", out[0], to=TensorProto.BOOL)] if boolean else out


@lowers("core.softmax", "core.log_softmax")
def _l_softmax(L: Lowering, op: Op) -> list[str]:
    return L.node(
        "Softmax" if op.name == "core.softmax" else "LogSoftmax",
        _ins(L, op),
        axis=op.attrs.get("axis", -1),
    )


@lowers("llm.rms_norm")
def _l_rms(L: Lowering, op: Op) -> list[str]:
    x, w = _ins(L, op)
    off = float(op.attrs.get("offset", 0.0))
    if off:
        wt = _t(op.operands[1])
        assert isinstance(wt.dtype, DType)
        w = L.one("Add", w, L.const(np.array(off, numpy_dtype(wt.dtype))))
    return L.node("RMSNormalization", [x, w], axis=-1, epsilon=float(op.attrs.get("eps", 1e-6)))


@lowers("llm.layer_norm")
def _l_ln(L: Lowering, op: Op) -> list[str]:
    return L.node(
        "LayerNormalization", _ins(L, op), axis=-1, epsilon=float(op.attrs.get("eps", 1e-5))
    )


@lowers("llm.rotary_embedding")
def _l_rope(L: Lowering, op: Op) -> list[str]:
    x, cos, sin, pos = _ins(L, op)
    xt, pt = _t(op.operands[0]), _t(op.operands[3])
    if pt.shape[0] != xt.shape[0] or pt.shape[0] is DYN:
        # llmir broadcasts positions over the batch; onnxruntime wants [batch, seq] exactly
        shape = L.one(
            "Concat", L.one("Shape", x, start=0, end=1), L.one("Shape", pos, start=1, end=2), axis=0
        )
        pos = L.one("Expand", pos, shape)
    return L.node(
        "RotaryEmbedding",
        [x, cos, sin, pos],
        interleaved=int(bool(op.attrs.get("interleaved", False))),
        rotary_embedding_dim=int(op.attrs.get("rotary_dim", 0)) or None,
    )


def _end_aligned_causal(L: Lowering, q: str, k: str) -> str:
    """bool [Sq, Skv]: query i sees key j iff j <= i + Skv - Sq (llmir's causal alignment)."""
    i64 = np.int64
    sq = L.one("Squeeze", L.one("Shape", q, start=2, end=3), L.ints([0]))
    skv = L.one("Squeeze", L.one("Shape", k, start=2, end=3), L.ints([0]))
    zero, one = L.const(np.array(0, i64)), L.const(np.array(1, i64))
    i = L.one("Add", L.one("Range", zero, sq, one), L.one("Sub", skv, sq))
    j = L.one("Range", zero, skv, one)
    return L.one(
        "LessOrEqual", L.one("Unsqueeze", j, L.ints([0])), L.one("Unsqueeze", i, L.ints([1]))
    )


@lowers("llm.scaled_dot_product_attention")
def _l_sdpa(L: Lowering, op: Op) -> list[str]:
    at = op.attrs
    q, k = _t(op.operands[0]), _t(op.operands[1])
    causal = bool(at.get("causal", False))
    aligned = q.shape[2] == k.shape[2] and q.shape[2] is not DYN
    if at.get("sliding_window", 0) or at.get("softmax_eps", 0.0):
        return L._lower_decomposed(op)
    ins = _ins(L, op)
    attrs: dict[str, Any] = {}
    if causal and aligned:
        attrs["is_causal"] = 1
    elif causal:
        # ONNX Attention's is_causal is top-left aligned without a cache input: pass the
        # end-aligned causal mask explicitly instead
        keep = _end_aligned_causal(L, ins[0], ins[1])
        if len(ins) == 3:
            ins.append(keep)
        elif _t(op.operands[3]).dtype == DType.bool:
            ins[3] = L.one("And", ins[3], keep)
        else:
            assert isinstance(q.dtype, DType)
            ninf = L.const(np.array(-np.inf, numpy_dtype(q.dtype)))
            ins[3] = L.one("Where", keep, ins[3], ninf)
    if at.get("scale"):
        attrs["scale"] = float(at["scale"])
    if at.get("softcap"):
        attrs["softcap"] = float(at["softcap"])
    return L.node("Attention", ins, **attrs)


@lowers("llm.quantized_matmul")
def _l_qmm(L: Lowering, op: Op) -> list[str]:
    w = op.operands[1]
    wt = _t(w)
    q = wt.dtype
    if not (
        isinstance(q, QuantType)
        and q.scheme == "nbits"
        and id(w) in L.weights
        and op.attrs.get("transpose_b", True)
        and wt.rank == 2
    ):
        return L._lower_decomposed(op)
    shape = wt.static_shape()
    assert shape is not None
    n, k = shape
    nb = k // q.block
    blob = q.block * q.bits // 8
    b = L._materialize_weight(w, onnx_shape=[n, nb, blob], onnx_dt=TensorProto.UINT8)
    scales = L.one("Reshape", L.name_of(op.operands[2]), L.ints([-1]))
    inputs = [L.name_of(op.operands[0]), b, scales]
    if len(op.operands) > 3:
        inputs.append(L.one("Reshape", L.name_of(op.operands[3]), L.ints([-1])))
    return L.node("MatMulNBits", inputs, domain=MS, K=k, N=n, bits=q.bits, block_size=q.block)


@lowers("onnx.opaque")
def _l_opaque(L: Lowering, op: Op) -> list[str]:
    at = op.attrs
    attrs = dict(at.get("attributes") or {})
    missing_in = set(attrs.pop("__missing_inputs", ()))
    missing_out = set(attrs.pop("__missing_outputs", ()))
    ins = iter(_ins(L, op))
    total_in = len(op.operands) + len(missing_in)
    inputs = ["" if i in missing_in else next(ins) for i in range(total_in)]
    domain = at.get("domain", "")
    schema_types = _schema_attr_types(at["op_type"], domain, int(at["opset"]))
    onnx_attrs = [_onnx_attr(k, v, schema_types.get(k)) for k, v in sorted(attrs.items())]
    total_out = len(op.results) + len(missing_out)
    outs_iter = iter([L.fresh(r.name) for r in op.results])
    outs = ["" if i in missing_out else next(outs_iter) for i in range(total_out)]
    nd = helper.make_node(
        at["op_type"],
        inputs,
        outs,
        name=L.fresh(f"n{len(L.nodes)}_{at['op_type']}"),
        domain=domain or None,
    )
    nd.attribute.extend(onnx_attrs)
    if L.origin:
        nd.doc_string = L.origin
    tag_node(nd, L.src_op)  # node -> .llmir op
    L.nodes.append(nd)
    L.opsets[domain] = max(L.opsets.get(domain, 1), int(at["opset"]))
    return [o for o in outs if o]


def _schema_attr_types(op_type: str, domain: str, opset: int) -> dict[str, int]:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return {}
    return {name: int(a.type.value) for name, a in schema.attributes.items()}  # type: ignore[attr-defined]


def _onnx_attr(name: str, v: Any, kind: int | None) -> onnx.AttributeProto:
    A = onnx.AttributeProto
    if isinstance(v, str) and v.startswith("onnx.graph:"):
        import base64

        g = onnx.GraphProto()
        g.ParseFromString(base64.b64decode(v[len("onnx.graph:") :]))
        return helper.make_attribute(name, g)
    if isinstance(v, DenseAttr):
        arr = v.array
        return helper.make_attribute(
            name, _tensor_proto(name, arr, DTYPE_TO_ONNX[_dtype_of_array(arr)])
        )
    if isinstance(v, tuple):
        if kind == A.FLOATS:
            return helper.make_attribute(name, [float(x) for x in v], attr_type=A.FLOATS)
        if kind == A.STRINGS:
            return helper.make_attribute(name, [str(x) for x in v], attr_type=A.STRINGS)
        if kind == A.INTS or not v:
            return helper.make_attribute(name, [int(x) for x in v], attr_type=A.INTS)
        return helper.make_attribute(name, list(v))
    if kind == A.FLOAT and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if isinstance(v, bool):
        v = int(v)
    return helper.make_attribute(name, v)
