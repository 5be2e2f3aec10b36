"""Rules of assign-precision (dtype and device assignment) and of the canonicalizations that fold
the conversions it materializes.

assign-precision rewrites each supported op `K(a0, .., an)` to
`restore(K(prep(a0), .., prep(an)))` with `prep(a) = cast(to_device(a, dev, layout), D)` (move,
then convert on the device; packed operands are only moved) and `restore(y) = to_device(cast(y,
orig), "")`: every operand and result of the original op is a value of the original module, so
translation validation rebuilds the replacement from the original's values and checks it
completely. One rule per op kind, arity and result (`precision-<op>[-<n>][-r<i>]`), plus the
weight reorders `precision-core-matmul-reorder-{nk,kn}` (a parameter matrix transposed at load
time to the target's layout, transpose_b flipped). They are `approximate`: the proved lemma is
the rounding bound of narrowing the operands (bf16 or narrower, unit roundoff u <= 2^-8:
|prod of rounded - prod| <= ((1 + u)^2 - 1) |prod| per product term).

canonicalize then folds the round trips between neighbouring ops, exactly:
`to_device(to_device(x, ""), d, l) -> x` when x already is on d with layout l, and
`cast(cast(x, f32), D) -> x` when x has the narrow float dtype D (widening to f32 is exact).
"""

from __future__ import annotations

from typing import Any

from llmir_core.dialects.registry import get_op
from llmir_core.ir.types import DType, TensorType

from .library import rule
from .proof_obligations import Obligation, equality, rounding_bound
from .rule import Rule
from .terms import A, Match, T, Term, V, t

# op kind -> class: "low" computes in the target's low precision, "f32" stays in f32 (norms,
# softmax, reductions, exp/log, rotary, lookups), "follow" takes the low precision when its
# run-time float operands all come from low ops. Move-only operands are not converted.
OP_CLASSES: dict[str, str] = {
    "core.matmul": "low",
    "llm.linear": "low",
    "llm.gated_mlp": "low",
    "llm.scaled_dot_product_attention": "low",
    "llm.quantized_matmul": "low",
    "llm.rms_norm": "f32",
    "llm.add_rms_norm": "f32",
    "llm.layer_norm": "f32",
    "core.softmax": "f32",
    "core.log_softmax": "f32",
    "core.reduce_mean": "f32",
    "core.reduce_sum": "f32",
    "core.exp": "f32",
    "core.log": "f32",
    "core.pow": "f32",
    "core.sqrt": "f32",
    "core.rsqrt": "f32",
    "llm.rotary_embedding": "f32",
    "llm.embedding": "f32",
    "core.add": "follow",
    "core.sub": "follow",
    "core.mul": "follow",
    "core.div": "follow",
    "core.neg": "follow",
    "core.silu": "follow",
    "core.gelu": "follow",
    "core.relu": "follow",
    "core.tanh": "follow",
    "core.sigmoid": "follow",
    "llm.silu_mul": "follow",
    "core.reshape": "follow",
    "core.transpose": "follow",
    "core.concat": "follow",
    "core.slice": "follow",
    "core.unsqueeze": "follow",
    "core.squeeze": "follow",
    "core.reduce_max": "follow",
    "core.tile": "follow",
    "core.gather": "follow",
}
MOVE_ONLY: dict[str, tuple[int, ...]] = {"llm.quantized_matmul": (1, 2, 3)}
CONCAT_ARITIES = (2, 3)


def arities(kind: str) -> tuple[int, ...]:
    od = get_op(kind)
    assert od is not None, kind
    lo, hi = od.operand_range()
    return CONCAT_ARITIES if hi is None else tuple(range(max(lo, 1), hi + 1))


def results_of(kind: str) -> int:
    od = get_op(kind)
    assert od is not None
    return len(od.results)


def prep(i: int, kind: str, reorder: bool = False) -> T:
    a: Any = V(f"a{i}")
    if reorder:
        a = t("core.transpose", a, perm=(1, 0))
    moved = t("llm.to_device", a, device=A("__dev"), layout=A(f"__lay{i}"))
    return moved if i in MOVE_ONLY.get(kind, ()) else t("core.cast", moved, to=A(f"__to{i}"))


def restore(y: Term) -> T:
    return t("llm.to_device", t("core.cast", y, to=A("__back")), device="", layout="")


def rule_name(kind: str, n: int, result: int) -> str:
    base = "precision-" + kind.replace(".", "-").replace("_", "-")
    if len(arities(kind)) > 1:
        base += f"-{n}"
    if results_of(kind) > 1:
        base += f"-r{result}"
    return base


def _attrs(kind: str) -> dict[str, Any]:
    od = get_op(kind)
    assert od is not None
    return {a.name: A(a.name) for a in od.attrs}


_LEMMA: Obligation = rounding_bound(7, 2)


def _sig(n: int) -> dict[str, str]:
    return {f"a{i}": "... n" for i in range(n)}


for _kind in OP_CLASSES:
    for _n in arities(_kind):
        _at = _attrs(_kind)
        _inner = T(_kind, tuple(prep(i, _kind) for i in range(_n)), _at)  # shared by the results
        for _r in range(results_of(_kind)):
            _core = T(_kind, _inner.args, _at, _r) if _r else _inner
            rule(
                Rule(
                    name=rule_name(_kind, _n, _r),
                    summary=f"{_kind} computed on the target device in the assigned precision",
                    lhs=T(_kind, tuple(V(f"a{i}") for i in range(_n)), _at, _r),
                    rhs=restore(_core),
                    sig=_sig(_n),
                    tag="approximate",
                    obligation=_LEMMA,
                    passes=("assign-precision",),
                )
            )

for _layout, _tb in (("nk", True), ("kn", False)):
    rule(
        Rule(
            name=f"precision-core-matmul-reorder-{_layout}",
            summary=f"a matmul whose parameter matrix is transposed at load time to the target's "
            f"{_layout} layout (transpose_b = {str(_tb).lower()})",
            lhs=t(
                "core.matmul", V("a0"), V("a1"), transpose_a=A("transpose_a"), transpose_b=not _tb
            ),
            rhs=restore(
                t(
                    "core.matmul",
                    prep(0, "core.matmul"),
                    prep(1, "core.matmul", reorder=True),
                    transpose_a=A("transpose_a"),
                    transpose_b=_tb,
                )
            ),
            sig={"a0": "... m k", "a1": "k n" if _tb else "n k"},
            tag="approximate",
            obligation=_LEMMA,
            passes=("assign-precision",),
        )
    )


def reorder_rule(target_layout: str) -> str:
    return f"precision-core-matmul-reorder-{target_layout}"


# -- canonicalizations that fold the materialized conversions ------------------------------------


def _narrow_roundtrip(dt: DType) -> Any:
    def check(m: Match) -> str | None:
        x = m.values["x"].type
        if not isinstance(x, TensorType) or x.dtype != dt:
            return f"{x} is not a {dt} value widened to f32"
        return None

    return check


def _same_place(m: Match) -> str | None:
    x = m.values["x"].type
    want = (m.attrs["device"] or None, m.attrs["layout"] or None)
    if not isinstance(x, TensorType) or (x.device, x.layout) != want:
        return f"%{m.values['x'].name} is not on device {want[0]!r} with layout {want[1]!r}"
    return None


def _narrow_lemma() -> Obligation:
    """cast(cast(x, f32), D) = x for x in D: widening to f32 is exact and rounding to D is the
    identity on D's values (r is any rounding: r(r(y)) = r(y))."""

    def obligation() -> tuple[list[Any], Any, list[Any]]:
        import z3

        y = z3.Real("y")
        r = z3.Function("round_D", z3.RealSort(), z3.RealSort())
        widen = z3.Function("to_f32", z3.RealSort(), z3.RealSort())
        x = r(y)
        hyps = [r(r(y)) == r(y), widen(x) == x]
        return hyps, r(widen(x)) == x, [y]

    return obligation


for _dt in (DType.f16, DType.bf16):
    _lhs = t("core.cast", t("core.cast", V("x"), to=DType.f32), to=_dt)
    rule(
        Rule(
            name=f"cast-roundtrip-{_dt}",
            summary=f"a {_dt} value widened to f32 and narrowed back is itself",
            lhs=_lhs,
            rhs=V("x"),
            sig={"x": "... n"},
            check=_narrow_roundtrip(_dt),
            obligation=_narrow_lemma(),
            passes=("canonicalize",),
            dtypes={"x": str(_dt)},
        )
    )

_TD_LHS = t(
    "llm.to_device",
    t("llm.to_device", V("x"), device="", layout=""),
    device=A("device"),
    layout=A("layout"),
)
rule(
    Rule(
        name="to-device-roundtrip",
        summary="a value moved to the host and back to where it was is itself",
        lhs=_TD_LHS,
        rhs=V("x"),
        sig={"x": "... n"},
        check=_same_place,
        obligation=equality(_TD_LHS, V("x"), {"x": "... n"}, (0, 1)),
        passes=("canonicalize",),
    )
)
