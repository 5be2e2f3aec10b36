"""An ONNX model's protobuf, checked before it is converted: what protobuf itself accepts but no
ONNX model may hold.

- every node attribute has the type its operator's schema declares (`perm` is INTS, not an
  INT or FLOATS), for operators whose schema the installed onnx knows;
- every initializer and Constant tensor has non-negative dims, a known element type, and exactly
  the bytes its dims need (raw_data, or the typed field that holds the values);
- graph inputs and outputs have no negative dims.

Each failure is one `InputError` naming the model file, the node or tensor, and what is wrong.
Subgraphs (If, Loop, Scan bodies) are checked the same way.
"""

from __future__ import annotations

from typing import Any

from llmir_core.errors import InputError

_HINT = "the model is damaged or was written by a broken exporter: check it with onnx.checker.check_model"
MAX_ELEMENTS = 1 << 62


def check_model_proto(proto: Any, label: str, opsets: dict[str, int]) -> None:
    """Raise InputError (naming `label`) at the first malformed attribute or tensor."""
    _check_graph(proto.graph, label, opsets)


def _check_graph(graph: Any, label: str, opsets: dict[str, int]) -> None:
    import onnx

    for t in graph.initializer:
        if not isinstance(t.name, str):
            raise InputError(
                f"{label}: an initializer's name is not UTF-8 text ({bytes(t.name)[:40]!r})",
                hint=_HINT,
            )
        check_tensor_proto(t, label, f"initializer '{t.name}'")
    for vi in list(graph.input) + list(graph.output):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value < 0:
                raise InputError(
                    f"{label}: graph input/output '{vi.name}' has dim {i} = {d.dim_value}, "
                    "which is negative",
                    hint=_HINT,
                )
    for i, node in enumerate(graph.node):
        for what, value in (
            ("op_type", node.op_type),
            ("domain", node.domain),
            ("name", node.name),
            *(("attribute name", a.name) for a in node.attribute),
        ):
            if not isinstance(value, str):  # protobuf hands back bytes that are not UTF-8
                raise InputError(
                    f"{label}: node #{i} of graph '{_shown(graph.name)}' whose {what} is not "
                    f"UTF-8 text ({bytes(value)[:40]!r})",
                    hint=_HINT,
                )
        where = f"node '{node.name or node.op_type}' ({node.op_type})"
        schema = _schema(onnx, node, opsets)
        for a in node.attribute:
            if a.ref_attr_name:
                continue  # a function's attribute reference: typed where it is bound
            if schema is not None and a.name in schema.attributes and a.type != 0:
                want = schema.attributes[a.name].type
                if int(want) != int(a.type):
                    raise InputError(
                        f"{label}: {where}: attribute '{a.name}' must be "
                        f"{_type_name(onnx, int(want))}, got {_type_name(onnx, int(a.type))}",
                        hint=_HINT,
                    )
            if a.HasField("t"):
                check_tensor_proto(a.t, label, f"{where} attribute '{a.name}'")
            for t in a.tensors:
                check_tensor_proto(t, label, f"{where} attribute '{a.name}'")
            if a.HasField("g"):
                _check_graph(a.g, label, opsets)
            for g in a.graphs:
                _check_graph(g, label, opsets)


def _shown(name: Any) -> str:
    return name if isinstance(name, str) else repr(bytes(name)[:40])


def _schema(onnx: Any, node: Any, opsets: dict[str, int]) -> Any:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    version = opsets.get(domain)
    if version is None:
        return None
    for args in ((node.op_type, version, domain), (node.op_type, domain)):
        try:  # the op at the model's opset, else its latest version (attribute types rarely change)
            return onnx.defs.get_schema(*args)
        except onnx.defs.SchemaError:
            continue
    return None


def _type_name(onnx: Any, t: int) -> str:
    try:
        return str(onnx.AttributeProto.AttributeType.Name(t))
    except ValueError:
        return f"type {t}"


def check_tensor_proto(t: Any, label: str, what: str) -> None:
    """A TensorProto's dims, element type and data size agree (external data is checked where
    its file is opened)."""
    import onnx
    from onnx import TensorProto

    dims = [int(d) for d in t.dims]
    if any(d < 0 for d in dims):
        raise InputError(f"{label}: {what} has dims {dims}: a dim cannot be negative", hint=_HINT)
    numel = 1
    for d in dims:
        numel *= d
    if numel > MAX_ELEMENTS:
        raise InputError(
            f"{label}: {what} has dims {dims}: {numel} elements, more than any file holds",
            hint=_HINT,
        )
    if t.data_type == TensorProto.UNDEFINED or t.data_type not in TensorProto.DataType.values():
        raise InputError(f"{label}: {what} has unknown element type {t.data_type}", hint=_HINT)
    if t.data_type == TensorProto.STRING or t.data_location == TensorProto.EXTERNAL:
        return
    bits = _bits(onnx, t.data_type)
    if bits is None:
        return
    dtype_name = TensorProto.DataType.Name(t.data_type)
    if t.HasField("raw_data"):  # set, even empty: readers take the values from it
        want = (numel * bits + 7) // 8
        if len(t.raw_data) != want:
            raise InputError(
                f"{label}: {what} ({dtype_name}{dims}) has {len(t.raw_data)} bytes of "
                f"raw_data, its dims need {want}",
                hint=_HINT,
            )
        return
    field, per = _typed_field(t.data_type, bits)
    if field is None:
        return
    have = len(getattr(t, field))
    want_n = (numel + 1) // 2 if per == 0.5 else numel * int(per)
    if have != want_n:
        raise InputError(
            f"{label}: {what} ({dtype_name}{dims}) has {have} value(s) in {field}, "
            f"its dims need {want_n}",
            hint=_HINT,
        )


def _bits(onnx: Any, data_type: int) -> int | None:
    from onnx import TensorProto

    four = {
        getattr(TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(TensorProto, n)
    }
    if data_type in four:
        return 4
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize) * 8
    except (KeyError, TypeError, ValueError):
        return None


def _typed_field(data_type: int, bits: int) -> tuple[str | None, float]:
    """The TensorProto field that holds values of this type, and how many entries per element."""
    from onnx import TensorProto as T

    if data_type == T.FLOAT:
        return "float_data", 1
    if data_type == T.COMPLEX64:
        return "float_data", 2
    if data_type == T.DOUBLE:
        return "double_data", 1
    if data_type == T.COMPLEX128:
        return "double_data", 2
    if data_type == T.INT64:
        return "int64_data", 1
    if data_type in (T.UINT32, T.UINT64):
        return "uint64_data", 1
    if bits == 4:
        return "int32_data", 0.5  # two 4-bit values per entry
    if bits <= 32:
        return "int32_data", 1
    return None, 1
