"""`verify(module)`: SSA, op signatures, attributes, inferred vs annotated types, weights.

Returns a list of Diagnostics (empty when the module verifies). Never raises on bad IR.
"""

from __future__ import annotations

import os
from typing import Any

from llmir_core.dialects.opdef import ATTR_KIND_CHECKS, REQUIRED, InferCtx, OpDef, OpVerifyError
from llmir_core.dialects.registry import CORE_DIALECTS, DIALECTS, get_op, suggest
from llmir_core.errors import Diagnostic, SourcePos
from llmir_core.ir.core import Function, Module, Op, Value, gc_paused
from llmir_core.ir.dims import DYN, SymDim, dims_compatible, format_dim
from llmir_core.ir.types import DType, KVCacheType, Type

_KIND_CHECK = ATTR_KIND_CHECKS


def types_compatible(inferred: Type, annotated: Type) -> bool:
    """Same kind, rank and dtype; each dim equal, or `?` on either side."""
    if inferred is annotated or inferred == annotated:
        return True
    if isinstance(inferred, KVCacheType) or isinstance(annotated, KVCacheType):
        if not (isinstance(inferred, KVCacheType) and isinstance(annotated, KVCacheType)):
            return False
        return (inferred.layers, inferred.kv_heads, inferred.head_dim, inferred.dtype) == (
            annotated.layers,
            annotated.kv_heads,
            annotated.head_dim,
            annotated.dtype,
        ) and dims_compatible(inferred.max_len, annotated.max_len)
    if inferred.dtype != annotated.dtype or inferred.rank != annotated.rank:
        return False
    return all(dims_compatible(a, b) for a, b in zip(inferred.shape, annotated.shape))


class _Checker:
    def __init__(self, module: Module, check_files: bool) -> None:
        self.m = module
        self.diags: list[Diagnostic] = []
        self.check_files = check_files
        self._lines: list[str] | None = None
        self.base_dir = (
            os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
        )

    def _source_line(self, pos: SourcePos | None) -> str | None:
        if pos is None or not self.m.source or not os.path.isfile(self.m.source):
            return None
        if self._lines is None:
            try:
                with open(self.m.source, encoding="utf-8") as fh:
                    # "\n" only: positions count lines that way (splitlines also splits on \x0c...)
                    self._lines = [line.rstrip("\r") for line in fh.read().split("\n")]
            except (OSError, UnicodeDecodeError):
                self._lines = []
        return self._lines[pos.line - 1] if 0 < pos.line <= len(self._lines) else None

    def error(
        self,
        message: str,
        pos: SourcePos | None,
        origin: str | None = None,
        notes: list[str] | None = None,
        severity: str = "error",
    ) -> None:
        self.diags.append(
            Diagnostic(severity, message, pos, origin, notes or [], self._source_line(pos))
        )

    def run(self) -> list[Diagnostic]:
        declared = self.m.attrs.get("llmir.dialects", ())
        if not isinstance(declared, tuple) or not all(isinstance(d, str) for d in declared):
            self.error("module attribute llmir.dialects must be an array of strings", None)
            declared = ()
        self.declared = set(declared) | set(CORE_DIALECTS)
        # op signatures (name, operand/result types, attributes) already seen to verify: an op
        # with the same signature needs no second shape inference (most of a model's ops repeat)
        self._verified: set[tuple[Any, ...]] = set()
        self._weights: dict[tuple[str, str], tuple[Op, Any, Any]] = {}
        names: set[str] = set()
        for f in self.m.functions:
            if f.name in names:
                self.error(f"function @{f.name} is defined twice", f.pos)
            names.add(f.name)
            self.check_function(f)
        return self.diags

    def check_function(self, f: Function) -> None:
        defined: set[int] = set()
        seen_names: dict[str, Value] = {}
        for a in f.args:
            if a.name in seen_names:
                self.error(f"argument %{a.name} is defined twice", a.pos or f.pos)
            seen_names[a.name] = a
            defined.add(id(a))
        for op in f.ops:
            for i, v in enumerate(op.operands):
                if id(v) not in defined:
                    self.error(
                        f"operand #{i} of {op.name} (%{v.name}) is used before it is defined "
                        "or comes from another function",
                        op.pos,
                        op.origin,
                    )
            for r in op.results:
                if r.name in seen_names:
                    self.error(f"value %{r.name} is defined twice", r.pos or op.pos, op.origin)
                seen_names[r.name] = r
                defined.add(id(r))
            self.check_op(op)
        for v in f.outputs:
            if id(v) not in defined:
                self.error(
                    f"@{f.name} returns %{v.name}, which is not defined in it",
                    f.return_pos or f.pos,
                )

    def check_op(self, op: Op) -> None:
        key = _signature(op)
        if key is not None and key in self._verified:
            return
        before = len(self.diags)
        self._check_op(op)
        if key is not None and len(self.diags) == before:
            self._verified.add(key)

    def _check_op(self, op: Op) -> None:
        opdef = get_op(op.name)
        if opdef is None:
            close = suggest(op.name)
            notes = [f"did you mean {', '.join(close)}?"] if close else []
            dialect = op.dialect
            if dialect not in DIALECTS and dialect not in CORE_DIALECTS:
                notes.append(
                    f"dialect '{dialect}' is not known to this llmir; an extension op must be "
                    "registered with a decomposition into core ops"
                )
            self.error(f"unknown op '{op.name}'", op.pos, op.origin, notes)
            return
        if opdef.dialect not in self.declared:
            self.error(
                f"op '{op.name}' is from dialect '{opdef.dialect}', which the module header "
                "does not list in llmir.dialects",
                op.pos,
                op.origin,
            )
        lo, hi = opdef.operand_range()
        n = len(op.operands)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
            sig = ", ".join(
                o.name + ("..." if o.variadic else "?" if o.optional else "")
                for o in opdef.operands
            )
            self.error(f"{op.name} takes {want} operands ({sig}), got {n}", op.pos, op.origin)
            return
        if not self.check_attrs(op, opdef):
            return
        attrs = opdef.with_defaults(op.attrs)
        try:
            inferred = opdef.run_infer(
                InferCtx(
                    opdef,
                    [v.type for v in op.operands],
                    attrs,
                    len(op.results),
                    [r.type for r in op.results],
                )
            )
        except OpVerifyError as exc:
            self.error(f"{op.name}: {exc}", op.pos, op.origin)
            return
        except Exception as exc:  # a shape rule that crashes on odd input must not crash verify
            self.error(
                f"{op.name}: internal error in its shape rule: {type(exc).__name__}: {exc}",
                op.pos,
                op.origin,
                ["this is a bug in the op's declaration; please report it"],
            )
            return
        if len(inferred) != len(op.results):
            self.error(
                f"{op.name} produces {len(inferred)} results, but {len(op.results)} are declared",
                op.pos,
                op.origin,
            )
            return
        for i, (it, r) in enumerate(zip(inferred, op.results)):
            if not types_compatible(it, r.type):
                self.error(
                    f"{op.name}: result #{i} (%{r.name}) is declared {r.type} but the op "
                    f"produces {it}",
                    op.pos,
                    op.origin,
                )
        if op.name == "core.weight":
            self.check_weight(op)
        elif op.name == "ort.matmul_gguf":
            self.check_gguf_weight(op, str(attrs["format"]))

    def check_gguf_weight(self, op: Op, fmt: str) -> None:
        """ort.matmul_gguf's weight, where the function computes it, is the llm.dequantize of a
        tensor stored in the op's format (the serializer writes those bytes as they are)."""
        from llmir_core.targets import get_target

        got = get_target("onnxruntime").gguf_weight_problem(op.operands[1], fmt)
        if got is not None:
            self.error(
                f'ort.matmul_gguf {{format = "{fmt}"}}: weight %{op.operands[1].name} must be '
                f"the llm.dequantize of a !quant.{fmt} tensor, got {got}",
                op.pos,
                op.origin,
            )

    def check_attrs(self, op: Op, opdef: OpDef) -> bool:
        ok = True
        known = {a.name: a for a in opdef.attrs}
        for k, v in op.attrs.items():
            spec = known.get(k)
            if spec is None:
                valid = ", ".join(known) or "none"
                self.error(f"{op.name} has no attribute '{k}' (valid: {valid})", op.pos, op.origin)
                ok = False
                continue
            check = _KIND_CHECK.get(spec.kind)
            if check is None:
                self.error(
                    f"{op.name}: attribute '{k}' has unknown kind '{spec.kind}' in the op "
                    "declaration",
                    op.pos,
                    op.origin,
                )
                ok = False
            elif not check(v):
                self.error(
                    f"{op.name}: attribute '{k}' must be {spec.kind}, got {_describe(v)}",
                    op.pos,
                    op.origin,
                )
                ok = False
            elif spec.choices is not None and v not in spec.choices:
                self.error(
                    f"{op.name}: attribute '{k}' must be one of "
                    f"{', '.join(map(str, spec.choices))}, got {v!r}",
                    op.pos,
                    op.origin,
                )
                ok = False
        for spec in opdef.attrs:
            if spec.default is REQUIRED and spec.name not in op.attrs:
                self.error(
                    f"{op.name} requires attribute '{spec.name}' ({spec.kind})", op.pos, op.origin
                )
                ok = False
        return ok

    def check_weight(self, op: Op) -> None:
        from llmir_core.weights import WeightRefError, check_weight_ref

        try:
            check_weight_ref(op.attrs, op.results[0].type, self.base_dir, self.check_files)
        except WeightRefError as exc:
            self.error(f"core.weight: {exc}", op.pos, op.origin)
            return
        name = op.attrs.get("name", "")
        if not name:
            return
        where = (op.attrs.get("offset", 0), op.attrs.get("nbytes"))
        first = self._weights.setdefault((op.attrs["file"], name), (op, where, op.results[0].type))
        if first[0] is not op and first[1] != where:
            at = f" (at {first[0].pos.line}:{first[0].pos.col})" if first[0].pos else ""
            self.error(
                f"core.weight: tensor '{name}' of {op.attrs['file']} is referenced at offset "
                f"{where[0]} ({where[1]} bytes) here but at offset {first[1][0]} "
                f"({first[1][1]} bytes) before{at}",
                op.pos,
                op.origin,
            )


def _describe(v: Any) -> str:
    if isinstance(v, bool):
        return f"bool {str(v).lower()}"
    if isinstance(v, DType):
        return f"dtype {v}"
    if isinstance(v, (SymDim,)) or v is DYN:
        return f"dim {format_dim(v)}"
    return f"{type(v).__name__} {v!r}"[:80]


def _freeze(v: Any) -> Any:
    """A hashable, type-exact stand-in for an attribute value (True, 1 and 1.0 stay apart)."""
    if type(v) is tuple:
        return tuple([_freeze(x) for x in v])
    if isinstance(v, (dict, list)):
        raise TypeError("unhashable attribute")
    return (type(v), v)


def _signature(op: Op) -> tuple[Any, ...] | None:
    """What an op's verification depends on, or None when it cannot be a dictionary key."""
    if op.name == "core.weight":
        return None  # checked against files and other weights, not only against its signature
    try:
        attrs = tuple([(k, _freeze(v)) for k, v in sorted(op.attrs.items())]) if op.attrs else ()
        key = (
            op.name,
            tuple([v.type for v in op.operands]),
            tuple([r.type for r in op.results]),
            attrs,
        )
        hash(key)
    except TypeError:
        return None
    return key


def verify(module: Module, check_files: bool = True) -> list[Diagnostic]:
    """Check a module; return its diagnostics (empty when it verifies)."""
    with gc_paused():
        return _Checker(module, check_files).run()


def require_verified(module: Module, label: str) -> None:
    """Raise CheckFailed (exit 1) with the located diagnostics when `module` does not verify:
    what `build` and `run` check before they read a single weight."""
    from llmir_core.errors import CheckFailed

    errors = [d for d in verify(module) if d.severity == "error"]
    if errors:
        raise CheckFailed(
            f"{label}: does not verify ({len(errors)} error(s))",
            diagnostics=errors,
            hint=f"run `llmir verify {label}` for details",
        )
