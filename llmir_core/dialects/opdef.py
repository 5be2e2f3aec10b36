"""Ops are declared as data: one `OpDef` per op.

An OpDef holds the op's name, its operand/result/attribute signature, a one-sentence statement of
what its verifier checks, a shape/dtype rule over symbolic dims (`infer`), the numpy reference
semantics (`reference`), and for composite ops a decomposition into simpler ops (`decompose`).
The rest of the op's meaning lives on the declaration too (docs/optimize.md, "An op's meaning"):
- `smt`: its element-level encoding for the SMT prover (a function over the shared helpers of
  `llmir_core.smt.semantics.Encoder`), usually `encoding("core_smt", "matmul")`, a `Lazy`
  reference into `dialects/*_smt.py`, so z3 loads only when an encoding is evaluated; or else
  `no_smt`, the reason there is none (rules over it cannot be proved; translation validation
  keeps it an uninterpreted function, expands it through its decomposition if it has one, and
  falls back to differential testing);
- `interval`: the range of its first result from its operands' ranges (helpers in `ranges`);
  fallback [0, 1] for bool results, unbounded otherwise;
- `cost`: FLOPs and bytes read per evaluation (helpers in `ranges`); fallback one FLOP per result
  element, every operand read once.
`llmir_core.smt.meaning.meaning_of` says which an op has.
Every docstring-style `example` is parsed and verified by the test-suite, and `docs/spec.md`'s op
reference is generated from these entries.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.dims import SymDim, _Dyn
from llmir_core.ir.types import DType, KVCacheType, QuantType, TensorType, Type

if TYPE_CHECKING:
    from llmir_core.builder import Builder
    from llmir_core.ir.core import Value


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

# Attribute kinds and what they accept.
ATTR_KIND_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, (float, int)) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str) and not isinstance(v, DType),
    "ints": lambda v: (
        isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    ),
    "floats": lambda v: (
        isinstance(v, tuple)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    ),
    "strs": lambda v: isinstance(v, tuple) and all(isinstance(x, str) for x in v),
    "dtype": lambda v: isinstance(v, DType),
    "dims": lambda v: (
        isinstance(v, tuple)
        and all(
            (isinstance(x, int) and not isinstance(x, bool)) or isinstance(x, (SymDim, _Dyn))
            for x in v
        )
    ),
    "dense": lambda v: isinstance(v, DenseAttr),
    "type": lambda v: isinstance(v, (TensorType, KVCacheType)),
    "quant": lambda v: isinstance(v, QuantType),
    "dict": lambda v: isinstance(v, dict),
    "any": lambda v: True,
}
ATTR_KINDS = tuple(ATTR_KIND_CHECKS)


class OpVerifyError(Exception):
    """Raised by shape rules: the op is ill-typed; the message says why (one line)."""


@dataclass(frozen=True)
class Operand:
    name: str
    variadic: bool = False  # zero or more (only the last operand)
    optional: bool = False  # may be absent (only trailing operands)
    doc: str = ""
    # declared constraints, checked before the shape rule runs (so `infer` need not code them):
    kind: str = ""  # "tensor", "float" (a float tensor); "" = unchecked
    rank: int | None = None  # exact rank
    dtype_of: str = ""  # has the dtype of the operand of this name


OPERAND_KINDS = ("", "tensor", "float")


@dataclass(frozen=True)
class Attr:
    name: str
    kind: str
    default: Any = REQUIRED
    doc: str = ""
    choices: tuple[Any, ...] | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


InferFn = Callable[["InferCtx"], list[Type]]
# (encoder, operand STensors, attributes with defaults) -> result STensor(s); see smt/semantics.py
SmtFn = Callable[[Any, Sequence[Any], dict[str, Any]], Any]
# (op, operand ranges (lo, hi), dim bindings, default dim) -> the first result's range
IntervalFn = Callable[[Any, list[tuple[float, float]], dict[str, int], int], tuple[float, float]]
# (op, dim bindings) -> (FLOPs, bytes read)
CostFn = Callable[[Any, dict[str, int]], tuple[int, int]]
RefFn = Callable[[list[np.ndarray], dict[str, Any]], "np.ndarray | list[np.ndarray]"]
DecomposeFn = Callable[["Builder", list["Value"], dict[str, Any]], list["Value"]]


@dataclass(frozen=True)
class Lazy:
    """A meaning function defined in another module, imported when first called: `smt` encodings
    live in `dialects/*_smt.py`, which import z3 at the top, so a declaration can name its
    encoding without loading z3."""

    ref: str  # "package.module:function"

    def resolve(self) -> Callable[..., Any]:
        mod, _, fn = self.ref.partition(":")
        return getattr(importlib.import_module(mod), fn)  # type: ignore[no-any-return]

    def __call__(self, *args: Any) -> Any:
        return self.resolve()(*args)


def lazy(ref: str) -> Lazy:
    """`lazy("llmir_core.dialects.core_smt:matmul")`: see `Lazy`."""
    return Lazy(ref)


_PY_NAMES = frozenset({"abs", "and", "max", "min", "not", "or", "pow", "round", "slice"})


def encoding(module: str, name: str) -> Lazy:
    """The encoding `name` of `llmir_core.dialects.<module>` (an op's short name; Python's own
    names such as `abs` or `and` get a trailing `_`), loaded when first evaluated. A dotted
    `module` is a full module path (a target's or a plugin's encodings)."""
    path = module if "." in module else f"llmir_core.dialects.{module}"
    return Lazy(f"{path}:{name}{'_' if name in _PY_NAMES else ''}")


@dataclass(frozen=True)
class OpDef:
    name: str
    summary: str
    operands: tuple[Operand, ...]
    attrs: tuple[Attr, ...]
    infer: InferFn
    reference: RefFn | None
    verifies: str  # one sentence: what the verifier checks for this op
    results: tuple[str, ...] = ("result",)
    variadic_results: bool = False
    decompose: DecomposeFn | None = None
    example: str = ""
    effects: bool = False  # has an effect beyond its results (never dead-code eliminated)
    traits: frozenset[str] = field(default_factory=frozenset)
    smt: SmtFn | None = None  # element-level SMT encoding (usually `lazy(...)`)
    no_smt: str = ""  # why the op has no `smt` (a test requires one of the two)
    interval: IntervalFn | None = None  # first result's range (None: [0, 1] for bool, else any)
    cost: CostFn | None = None  # FLOPs and bytes read (None: one FLOP per result element)

    @property
    def dialect(self) -> str:
        return self.name.split(".", 1)[0]

    def attr(self, name: str) -> Attr | None:
        for a in self.attrs:
            if a.name == name:
                return a
        return None

    def with_defaults(self, attrs: dict[str, Any]) -> dict[str, Any]:
        out = {a.name: a.default for a in self.attrs if not a.required}
        out.update(attrs)
        return out

    def declaration_errors(self) -> list[str]:
        """What is wrong with the declaration itself (checked when the op is registered)."""
        errs = []
        if "." not in self.name:
            errs.append(f"op name {self.name!r} has no dialect prefix")
        if self.smt is not None and self.no_smt:
            errs.append("an op with an smt encoding needs no no_smt reason")
        if self.smt is not None and not callable(self.smt):
            errs.append("smt must be callable (an encoding or lazy('module:function'))")
        seen: set[str] = set()
        for a in self.attrs:
            check = ATTR_KIND_CHECKS.get(a.kind)
            if a.name in seen:
                errs.append(f"attribute {a.name!r} declared twice")
            seen.add(a.name)
            if check is None:
                errs.append(
                    f"attribute {a.name!r} has unknown kind {a.kind!r} (kinds: {', '.join(ATTR_KINDS)})"
                )
                continue
            if not a.required and a.default is not None and not check(a.default):
                errs.append(f"attribute {a.name!r}: default {a.default!r} is not a {a.kind}")
            if a.choices is not None:
                bad = [c for c in a.choices if not check(c)]
                if bad:
                    errs.append(f"attribute {a.name!r}: choice {bad[0]!r} is not a {a.kind}")
                elif not a.required and a.default is not None and a.default not in a.choices:
                    errs.append(
                        f"attribute {a.name!r}: default {a.default!r} is not one of its choices"
                    )
        names = [o.name for o in self.operands]
        for i, o in enumerate(self.operands):
            last = i == len(self.operands) - 1
            if o.kind not in OPERAND_KINDS:
                errs.append(
                    f"operand {o.name!r} has unknown kind {o.kind!r} (kinds: tensor, float)"
                )
            if o.dtype_of and o.dtype_of not in names[:i]:
                errs.append(
                    f"operand {o.name!r}: dtype_of names no earlier operand ({o.dtype_of!r})"
                )
            if o.variadic and not last:
                errs.append(f"operand {o.name!r} is variadic but not the last operand")
            if o.optional and any(
                not p.optional and not p.variadic for p in self.operands[i + 1 :]
            ):
                errs.append(f"operand {o.name!r} is optional but a required operand follows it")
        return errs

    def check_operands(self, types: Sequence[Type]) -> None:
        """Raise OpVerifyError for the first operand that breaks its declared constraints."""
        by_name: dict[str, Type] = {}
        for i, (o, t) in enumerate(zip(self.operands, types)):
            by_name[o.name] = t
            what = f"operand #{i} ({o.name})"
            if not (o.kind or o.rank is not None or o.dtype_of):
                continue
            if not isinstance(t, TensorType):
                raise OpVerifyError(f"{what} must be a tensor, got {t}")
            if o.kind == "float" and not (isinstance(t.dtype, DType) and t.dtype.is_float):
                raise OpVerifyError(f"{what} must have a float dtype, got {t.dtype}")
            if o.rank is not None and t.rank != o.rank:
                raise OpVerifyError(f"{o.name} must have rank {o.rank}, got {t}")
            ref = by_name.get(o.dtype_of)
            if isinstance(ref, TensorType) and t.dtype != ref.dtype:
                raise OpVerifyError(
                    f"{o.name} has dtype {t.dtype}, expected {ref.dtype} (insert core.cast)"
                )

    def run_infer(self, ctx: InferCtx) -> list[Type]:
        """The declared operand constraints, then the shape rule."""
        self.check_operands(ctx.types)
        return self.infer(ctx)

    def operand_range(self) -> tuple[int, int | None]:
        """(min, max) operand count; max None when variadic."""
        lo = sum(1 for o in self.operands if not o.optional and not o.variadic)
        if any(o.variadic for o in self.operands):
            return lo, None
        return lo, len(self.operands)


class InferCtx:
    """What a shape rule sees: the operand types and the attributes (defaults filled)."""

    __slots__ = ("op", "types", "attrs", "num_results", "declared")

    def __init__(
        self,
        op: OpDef,
        types: Sequence[Type],
        attrs: dict[str, Any],
        num_results: int | None = None,
        declared: Sequence[Type] | None = None,
    ) -> None:
        self.op = op
        self.types = list(types)
        self.attrs = attrs
        self.num_results = num_results
        # the result types written in the text (None when building): only ops whose result
        # cannot be computed from operands and attributes (core.weight) may read them
        self.declared = list(declared) if declared is not None else None

    def fail(self, message: str) -> OpVerifyError:
        return OpVerifyError(message)

    def __getitem__(self, key: str) -> Any:
        return self.attrs[key]
