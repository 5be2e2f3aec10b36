"""Rules of assign-precision (dtype and device assignment) and of the canonicalizations that fold
the conversions it materializes.

assign-precision rewrites each supported op `K(a0, .., an)` to
`restore(K(prep(a0), .., prep(an)))` with `prep(a) = cast(to_device(a, dev, layout), D)` (move,
then convert on the device; packed operands are only moved) and `restore(y) = to_device(cast(y,
orig), "")`: every operand and result of the original op is a value of the original module, so
translation validation rebuilds the replacement from the original's values and checks it
completely. One rule per op kind, arity and result (`precision-<op>[-<n>][-r<i>]`), plus the
weight reorders `precision-core-matmul-reorder-{nk,kn}` (a parameter matrix transposed at load
time to the target's layout, transpose_b flipped). They are `approximate`: each states
`|rhs - lhs| <= abs + rel * magnitude` (`_magnitude`) and `llmir verify --rules` proves it about
the rule's own terms in the rounding model of `llmir_core.smt.prove_approx` (every target float: u <=
2^-8), for D in {f32, f16, bf16} (the f32-class ops: D = f32; `_check` refuses other dtypes).

canonicalize then folds the round trips between neighbouring ops, exactly:
`to_device(to_device(x, ""), d, l) -> x` when x already is on d with layout l, and
`cast(cast(x, f32), D) -> x` when x has the narrow float dtype D (widening to f32 is exact).
"""

from __future__ import annotations

from typing import Any

from llmir_core.dialects.registry import get_op
from llmir_core.ir.types import DType, TensorType

from .bounds import ROUND_H, ROUND_TINY, ROUND_U, ErrorBound, gamma, no_bound
from .library import rule
from .proof_obligations import equality
from .rule import Rule
from .terms import A, K, Match, T, Term, V, t

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


# -- what each precision rule proves (`llmir_core.smt.prove_approx`: the rounding model) ---------------

INT_OPERANDS: dict[str, tuple[int, ...]] = {
    "core.gather": (1,),
    "llm.embedding": (1,),
    "llm.rotary_embedding": (3,),
}
T_ = K(ROUND_TINY)
# low-precision ops whose rounding error is not bounded here (reported unproved): a quotient by a
# value near zero, attention (softmax of rounded scores), the gated MLP's nested reductions
# a quotient's error grows without bound as the divisor nears zero: the div rule's premise is a
# divisor of magnitude at least DIV_MIN (far above f16's subnormals, 2^-14)
DIV_MIN = 2.0**-10
NO_BOUND = {
    "llm.scaled_dot_product_attention": "softmax of rounded scores: not bounded here",
    "llm.gated_mlp": "nested reductions through the activation: not bounded here",
    "llm.silu_mul": "the product of a rounded silu and a rounded value: z3 does not decide it "
    "within a minute",
}


def _abs(x: Term) -> T:
    return t("core.abs", x)


def _pad(x: Term) -> T:
    """|x| + tiny: a rounding's error is at most u * (|x| + tiny) (tiny covers subnormals)."""
    return t("core.add", _abs(x), T_)


def _magnitude(kind: str, n: int, lhs: T) -> tuple[Term | None, float, float]:
    """(magnitude, rel, abs) of `|rhs - lhs| <= abs + rel * magnitude` for op kind `kind`."""
    a = [V(f"a{i}") for i in range(n)]
    cls = OP_CLASSES[kind]
    if cls == "f32":  # computed in f32: only the cast back to the original dtype rounds
        return None, ROUND_U, ROUND_H
    if kind in NO_BOUND:
        return None, float("inf"), 0.0
    if kind in ("core.add", "core.sub"):
        return t("core.add", _abs(a[0]), _abs(a[1])), gamma(4), 5 * ROUND_H
    if kind == "core.mul":
        return t("core.mul", _pad(a[0]), _pad(a[1])), gamma(4), 3 * ROUND_H
    if kind == "core.div":
        return t("core.div", _pad(a[0]), _abs(a[1])), gamma(5), 3 * ROUND_H
    if kind in ("core.silu", "core.gelu", "core.tanh", "core.sigmoid", "core.relu"):
        return t("core.add", _abs(a[0]), _abs(lhs)), gamma(3), 5 * ROUND_H
    if kind == "llm.silu_mul":
        gate = t("core.add", t("core.add", _abs(a[0]), _abs(t("core.silu", a[0]))), T_)
        return t("core.mul", gate, _pad(a[1])), 6 * ROUND_U, 3 * ROUND_H
    if kind == "core.reduce_max":
        return t("core.reduce_max", _abs(a[0]), **lhs.attrs), gamma(2), 4 * ROUND_H
    if kind == "core.matmul":
        return t("core.matmul", _pad(a[0]), _pad(a[1]), **lhs.attrs), gamma(4), 3 * ROUND_H
    if kind == "llm.linear":
        mm = t("core.matmul", _pad(a[0]), _pad(a[1]), transpose_b=A("transpose_b"))
        return (t("core.add", mm, _pad(a[2])) if n == 3 else mm), gamma(6), 4 * ROUND_H
    if kind == "llm.quantized_matmul" and n >= 3:
        deq = T("llm.dequantize", tuple(a[1:]), {})
        mm = t("core.matmul", _pad(a[0]), _abs(deq), transpose_b=A("transpose_b"))
        return mm, gamma(4), 3 * ROUND_H
    # data movement and neg: each result element is one rounded operand element
    return None, gamma(2), 3 * ROUND_H


def _cases(kind: str, n: int) -> tuple[dict[str, Any], ...]:
    """The attribute bindings proved: D (narrow) for float operands of low/follow ops, f32 for
    the f32-class ops, the integer operands' own dtype; O (original) for the cast back."""
    cls = OP_CLASSES[kind]
    base: dict[str, Any] = {"__back": "O", "__dev": "cuda"}
    for i in range(n):
        base[f"__lay{i}"] = ""
        if i in INT_OPERANDS.get(kind, ()):
            base[f"__to{i}"] = "i64"
        elif i not in MOVE_ONLY.get(kind, ()):
            base[f"__to{i}"] = "f32" if cls == "f32" else "D"
    if kind == "core.matmul":
        return tuple(
            {
                **base,
                "transpose_a": ta,
                "transpose_b": tb,
                "__sig__": {"a0": "... k m" if ta else "... m k", "a1": "n k" if tb else "k n"},
            }
            for ta in (False, True)
            for tb in (False, True)
        )
    if kind == "llm.linear":
        return tuple(
            {
                **base,
                "activation": act,
                "transpose_b": tb,
                "__sig__": {"a0": "... m k", "a1": "n k" if tb else "k n", "a2": "n"},
            }
            for act in ("none", "relu", "silu", "gelu", "gelu_tanh")
            for tb in (True, False)
        )
    if kind == "core.gelu":
        return tuple({**base, "approximate": a} for a in ("none", "tanh"))
    if kind == "llm.quantized_matmul":
        sig = {"a0": "... m k", "a1": "n k", "a2": "n g", "a3": "n g"}
        return ({**base, "transpose_b": True, "accuracy_level": -1, "__sig__": sig},)
    return (base,)


def _check(kind: str) -> Any:
    """The proof covers target dtypes f32, f16 and bf16 (f32 only for the f32-class ops), and
    quantized matmuls over [N, K] weights."""
    allowed = ("f32",) if OP_CLASSES[kind] == "f32" else ("f32", "f16", "bf16")

    def check(m: Match) -> str | None:
        for key, v in m.attrs.items():
            if key.startswith("__to") and isinstance(v, DType) and v.is_float:
                if str(v) not in allowed:
                    return f"{kind} in {v}: the proved bound covers {', '.join(allowed)}"
        if kind == "llm.quantized_matmul" and not m.attrs.get("transpose_b", True):
            return "the proved bound covers quantized weights in [N, K] layout (transpose_b)"
        return None

    return check


def _div_check(arrays: dict[str, Any]) -> str | None:
    import numpy as np

    b = np.abs(np.asarray(arrays["a1"], np.float64))
    if b.size and float(b.min()) < DIV_MIN:
        return f"a divisor of magnitude {float(b.min()):.3g} is below {DIV_MIN:.3g}"
    return None


def _div_premise(kind: str) -> dict[str, Any]:
    """core.div's bound holds for divisors of magnitude >= DIV_MIN: assumed in the proof (at the
    divisor leaf's every element the proof reads), checked on concrete values by numeric_check."""
    if kind != "core.div":
        return {}

    def premise(enc: Any, ts: dict[str, Any], dims: dict[str, Any]) -> dict[str, Any]:
        import z3

        from llmir_core.smt.semantics import STensor

        b = ts["a1"]
        g = z3.Function("divisor_a1", z3.RealSort(), z3.RealSort())
        least = z3.RealVal(f"1/{int(1 / DIV_MIN)}")
        enc.app_lemma["divisor_a1"] = lambda app: [
            app == app.arg(0),
            z3.Or(app >= least, app <= -least),
        ]
        return {"a1": STensor(b.shape, lambda i: g(b.f(i)))}

    return {
        "premise": premise,
        "premise_text": f"|a1| >= {DIV_MIN:g}",
        "numeric_check": _div_check,
    }


def _sig(n: int) -> dict[str, str]:
    return {f"a{i}": "... n" for i in range(n)}


def _dtypes(kind: str, n: int) -> dict[str, str]:
    return {f"a{i}": "i64" for i in INT_OPERANDS.get(kind, ()) if i < n}


for _kind in OP_CLASSES:
    for _n in arities(_kind):
        _at = _attrs(_kind)
        _inner = T(_kind, tuple(prep(i, _kind) for i in range(_n)), _at)  # shared by the results
        for _r in range(results_of(_kind)):
            _core = T(_kind, _inner.args, _at, _r) if _r else _inner
            _lhs = T(_kind, tuple(V(f"a{i}") for i in range(_n)), _at, _r)
            _mag, _rel, _abs_err = _magnitude(_kind, _n, _lhs)
            rule(
                Rule(
                    name=rule_name(_kind, _n, _r),
                    summary=f"{_kind} computed on the target device in the assigned precision",
                    lhs=_lhs,
                    rhs=restore(_core),
                    sig=_sig(_n),
                    tag="approximate",
                    check=_check(_kind),
                    bound=(
                        no_bound(NO_BOUND[_kind])
                        if _kind in NO_BOUND
                        else ErrorBound(rel=_rel, abs=_abs_err, magnitude=_mag)
                    ),
                    proof_cases=_cases(_kind, _n),
                    batch_ranks=(0,),
                    dtypes=_dtypes(_kind, _n),
                    **_div_premise(_kind),
                    passes=("assign-precision",),
                )
            )

for _layout, _tb in (("nk", True), ("kn", False)):
    _lhs = t("core.matmul", V("a0"), V("a1"), transpose_a=A("transpose_a"), transpose_b=not _tb)
    rule(
        Rule(
            name=f"precision-core-matmul-reorder-{_layout}",
            summary=f"a matmul whose parameter matrix is transposed at load time to the target's "
            f"{_layout} layout (transpose_b = {str(_tb).lower()})",
            lhs=_lhs,
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
            check=_check("core.matmul"),
            bound=ErrorBound(
                rel=gamma(4),
                abs=3 * ROUND_H,
                magnitude=t("core.matmul", _pad(V("a0")), _pad(V("a1")), **_lhs.attrs),
            ),
            proof_cases=tuple(
                {
                    **_cases("core.matmul", 2)[0],
                    "transpose_a": ta,
                    "transpose_b": not _tb,
                    "__sig__": {
                        "a0": "... k m" if ta else "... m k",
                        "a1": "k n" if _tb else "n k",
                    },
                }
                for ta in (False, True)
            ),
            batch_ranks=(0,),
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
            bound=ErrorBound(
                text="|rhs - lhs| <= 0 (rounding is the identity on the dtype's values)"
            ),
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
