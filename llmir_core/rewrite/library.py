"""The rule library: every rewrite a pass may apply, with its proof obligation.

`RULES` maps rule name -> Rule. Each pass names the rule set it uses (`Rule.passes`). `llmir
verify --rules` proves them all; `proofs.json` next to this file is the certificate the passes
read (a rule whose fingerprint is not in it as proved is refused unless `--allow-unproved`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from llmir_core.ir.core import Value
from llmir_core.ir.types import TensorType

from .rule import Rule
from .terms import A, C, K, Match, T, V, t

CANON = ("canonicalize",)


def _type(v: Value) -> TensorType | None:
    return v.type if isinstance(v.type, TensorType) else None


def _same_type_as_root(leaf: str) -> Any:
    """Dropping a broadcast operand is only sound when it does not change the result type."""

    def check(m: Match) -> str | None:
        root_t = m.root.results[0].type
        if m.values[leaf].type != root_t:
            return f"%{m.values[leaf].name} has type {m.values[leaf].type}, the result {root_t} (broadcast)"
        return None

    return check


def _const_is(name: str, value: float, leaf: str) -> Any:
    same = _same_type_as_root(leaf)

    def check(m: Match) -> str | None:
        if m.consts[name] != value:
            return f"constant is {m.consts[name]!r}, not {value!r}"
        return same(m)

    return check


def _eq(name: str, value: float) -> Any:
    return lambda s: [s[name] == value]


def _swap_last2(rank: int) -> tuple[int, ...]:
    p = list(range(rank))
    p[-1], p[-2] = p[-2], p[-1]
    return tuple(p)


def _is_swap_last2(perm: Any) -> bool:
    return isinstance(perm, tuple) and len(perm) >= 2 and tuple(perm) == _swap_last2(len(perm))


RULES: dict[str, Rule] = {}


def rule(r: Rule) -> Rule:
    if r.name in RULES:
        raise ValueError(f"rule {r.name} defined twice")
    RULES[r.name] = r
    return r


# -- canonicalization: identities ---------------------------------------------------------

for _op, _k, _side in (
    ("add", 0.0, "r"),
    ("add", 0.0, "l"),
    ("sub", 0.0, "r"),
    ("mul", 1.0, "r"),
    ("mul", 1.0, "l"),
    ("div", 1.0, "r"),
):
    _args = (V("x"), C("c")) if _side == "r" else (C("c"), V("x"))
    _nm = {"add": "zero", "sub": "zero", "mul": "one", "div": "one"}[_op]
    rule(
        Rule(
            name=f"{_op}-{_nm}" + ("-left" if _side == "l" else ""),
            summary=f"x {_op} {_k:g} is x" if _side == "r" else f"{_k:g} {_op} x is x",
            lhs=t(f"core.{_op}", *_args),
            rhs=V("x"),
            sig={"x": "... n", "c": ""},
            check=_const_is("c", _k, "x"),
            assume=_eq("c", _k),
            passes=CANON,
        )
    )

rule(
    Rule(
        name="neg-neg",
        summary="-(-x) is x",
        lhs=t("core.neg", t("core.neg", V("x"))),
        rhs=V("x"),
        sig={"x": "... n"},
        passes=CANON,
    )
)

rule(
    Rule(
        name="cast-same",
        summary="a cast to the operand's own dtype is the operand",
        lhs=t("core.cast", V("x"), to=A("to")),
        rhs=V("x"),
        sig={"x": "... n"},
        check=lambda m: (
            None
            if _type(m.values["x"]) is not None and _type(m.values["x"]).dtype == m.attrs["to"]  # type: ignore[union-attr]
            else f"casts {m.values['x'].type} to {m.attrs['to']}"
        ),
        proof_attrs=lambda b: {"to": "f32"},
        passes=CANON,
    )
)

rule(
    Rule(
        name="transpose-transpose",
        summary="two transposes that compose to the identity cancel",
        lhs=t("core.transpose", t("core.transpose", V("x"), perm=A("p1")), perm=A("p2")),
        rhs=V("x"),
        sig={"x": "... m n"},
        check=lambda m: (
            None
            if tuple(m.attrs["p1"][i] for i in m.attrs["p2"]) == tuple(range(len(m.attrs["p1"])))
            else f"perms {list(m.attrs['p1'])} then {list(m.attrs['p2'])} do not cancel"
        ),
        proof_attrs=lambda b: {"p1": _swap_last2(b + 2), "p2": _swap_last2(b + 2)},
        batch_ranks=(0, 1, 2),
        passes=CANON,
    )
)

rule(
    Rule(
        name="identity",
        summary="core.identity(x) is x",
        lhs=t("core.identity", V("x")),
        rhs=V("x"),
        sig={"x": "... n"},
        passes=CANON,
    )
)

# -- matmul + transpose -------------------------------------------------------------------

rule(
    Rule(
        name="matmul-transpose-b",
        summary="matmul(a, transpose(b)) folds the transpose into transpose_b",
        lhs=t(
            "core.matmul",
            V("a"),
            t("core.transpose", V("b"), perm=A("perm")),
            transpose_a=False,
            transpose_b=False,
        ),
        rhs=t("core.matmul", V("a"), V("b"), transpose_b=True),
        sig={"a": "... m k", "b": "n k"},
        check=lambda m: (
            None
            if _is_swap_last2(m.attrs["perm"])
            else f"perm {list(m.attrs['perm'])} does not swap the last two axes"
        ),
        proof_attrs=lambda b: {"perm": (1, 0)},
        batch_ranks=(0, 1),
        passes=("fuse-matmul-transpose",),
    )
)

rule(
    Rule(
        name="matmul-transpose-a",
        summary="matmul(transpose(a), b) folds the transpose into transpose_a",
        lhs=t(
            "core.matmul",
            t("core.transpose", V("a"), perm=A("perm")),
            V("b"),
            transpose_a=False,
            transpose_b=False,
        ),
        rhs=t("core.matmul", V("a"), V("b"), transpose_a=True),
        sig={"a": "k m", "b": "k n"},
        check=lambda m: (
            None
            if _is_swap_last2(m.attrs["perm"])
            else f"perm {list(m.attrs['perm'])} does not swap the last two axes"
        ),
        proof_attrs=lambda b: {"perm": (1, 0)},
        batch_ranks=(0,),
        passes=("fuse-matmul-transpose",),
    )
)

# -- activations --------------------------------------------------------------------------

rule(
    Rule(
        name="lift-silu",
        summary="x * sigmoid(x) is silu(x)",
        lhs=t("core.mul", V("x"), t("core.sigmoid", V("x"))),
        rhs=t("core.silu", V("x")),
        sig={"x": "... n"},
        passes=("lift-activations",),
    )
)
rule(
    Rule(
        name="lift-silu-left",
        summary="sigmoid(x) * x is silu(x)",
        lhs=t("core.mul", t("core.sigmoid", V("x")), V("x")),
        rhs=t("core.silu", V("x")),
        sig={"x": "... n"},
        passes=("lift-activations",),
    )
)

# -- norms --------------------------------------------------------------------------------


def _rms_check(m: Match) -> str | None:
    x = _type(m.values["x"])
    w = _type(m.values["w"])
    if x is None or w is None:
        return "operands are not tensors"
    axes = tuple(m.attrs.get("axes", ()))
    if len(axes) != 1 or axes[0] not in (-1, x.rank - 1):
        return f"reduces over axes {list(axes)}, not the last axis"
    if not m.attrs.get("keepdims", True):
        return "reduce_mean drops the reduced axis (keepdims = false)"
    if w.rank != 1 or w.shape[0] != x.shape[-1]:
        return f"weight {w} is not a vector over the last axis of {x}"
    if m.consts["eps"] <= 0:
        return f"eps = {m.consts['eps']} is not positive"
    root_t = m.root.results[0].type
    if root_t != x:
        return f"result type {root_t} differs from x's {x}"
    return None


def _rms_patterns() -> list[tuple[str, T]]:
    out = []
    squares = {"mul": t("core.mul", V("x"), V("x")), "pow": t("core.pow", V("x"), K(2.0))}
    for sq_name, sq in squares.items():
        ms = t(
            "core.add", t("core.reduce_mean", sq, axes=A("axes"), keepdims=A("keepdims")), C("eps")
        )
        norms = {
            "rsqrt": t("core.mul", V("x"), t("core.rsqrt", ms)),
            "div-sqrt": t("core.div", V("x"), t("core.sqrt", ms)),
            "recip-sqrt": t("core.mul", V("x"), t("core.reciprocal", t("core.sqrt", ms))),
        }
        for n_name, norm in norms.items():
            out.append((f"lift-rms-norm-{sq_name}-{n_name}", t("core.mul", norm, V("w"))))
            out.append((f"lift-rms-norm-{sq_name}-{n_name}-wl", t("core.mul", V("w"), norm)))
    return out


for _name, _lhs in _rms_patterns():
    rule(
        Rule(
            name=_name,
            summary="the decomposed RMSNorm x / sqrt(mean(x^2, -1) + eps) * w is llm.rms_norm",
            lhs=_lhs,
            rhs=t("llm.rms_norm", V("x"), V("w"), eps=A("eps")),
            sig={"x": "... n", "w": "n", "eps": ""},
            check=_rms_check,
            assume=lambda s: [s["eps"] > 0],
            proof_attrs=lambda b: {"axes": (-1,), "keepdims": True},
            batch_ranks=(0, 1),
            passes=("lift-rms-norm",),
            tag="exact" if "rsqrt" in _name and "pow" not in _name else "reassociating",
        )
    )

# -- gated MLP ------------------------------------------------------------------------------

rule(
    Rule(
        name="fuse-silu-mul",
        summary="silu(gate) * up is llm.silu_mul(gate, up)",
        lhs=t("core.mul", t("core.silu", V("g")), V("u")),
        rhs=t("llm.silu_mul", V("g"), V("u")),
        sig={"g": "... n", "u": "... n"},
        check=lambda m: (
            None
            if m.values["g"].type == m.values["u"].type
            else "gate and up differ in type (broadcast)"
        ),
        passes=("fuse-silu-mul",),
    )
)
rule(
    Rule(
        name="fuse-silu-mul-left",
        summary="up * silu(gate) is llm.silu_mul(gate, up)",
        lhs=t("core.mul", V("u"), t("core.silu", V("g"))),
        rhs=t("llm.silu_mul", V("g"), V("u")),
        sig={"g": "... n", "u": "... n"},
        check=lambda m: (
            None
            if m.values["g"].type == m.values["u"].type
            else "gate and up differ in type (broadcast)"
        ),
        passes=("fuse-silu-mul",),
    )
)


def _mlp_check(m: Match) -> str | None:
    ws = [_type(m.values[k]) for k in ("wg", "wu", "wd")]
    if any(w is None or w.rank != 2 for w in ws):
        return "weights are not matrices"
    return None


rule(
    Rule(
        name="fuse-gated-mlp",
        summary="down(silu_mul(x @ Wg^T, x @ Wu^T)) is llm.gated_mlp(x, Wg, Wu, Wd)",
        lhs=t(
            "core.matmul",
            t(
                "llm.silu_mul",
                t("core.matmul", V("x"), V("wg"), transpose_a=False, transpose_b=True),
                t("core.matmul", V("x"), V("wu"), transpose_a=False, transpose_b=True),
            ),
            V("wd"),
            transpose_a=False,
            transpose_b=True,
        ),
        rhs=t("llm.gated_mlp", V("x"), V("wg"), V("wu"), V("wd"), activation="silu"),
        sig={"x": "... s h", "wg": "f h", "wu": "f h", "wd": "h f"},
        check=_mlp_check,
        batch_ranks=(0, 1),
        passes=("fuse-gated-mlp",),
    )
)

# -- Q/K/V projection merge (one rule per output of the merged matmul) ----------------------

for _i, _w in enumerate(("wq", "wk", "wv")):
    rule(
        Rule(
            name=f"merge-qkv-{_w[1]}",
            summary=f"x @ {_w}^T is slice {_i} of x @ concat(wq, wk, wv)^T",
            lhs=t("core.matmul", V("x"), V(_w), transpose_a=False, transpose_b=True),
            rhs=T(
                "core.split",
                (
                    t(
                        "core.matmul",
                        V("x"),
                        t("core.concat", V("wq"), V("wk"), V("wv"), axis=0),
                        transpose_b=True,
                    ),
                ),
                {"axis": -1, "sizes": A("sizes")},
                _i,
            ),
            sig={"x": "... s h", "wq": "q h", "wk": "k h", "wv": "v h"},
            proof_attrs=lambda b: {"sizes": ("q", "k", "v")},
            batch_ranks=(0, 1),
            passes=("merge-qkv",),
        )
    )


# -- rules of the -O3 fusion and lifting passes, quantization and precision assignment ---------

from . import fusion_rules, nbits_rules, precision_rules, quant_rules  # noqa: E402,F401  (register into RULES)

# -- the certificate -------------------------------------------------------------------------

CERT_PATH = os.path.join(os.path.dirname(__file__), "proofs.json")


def load_certificate() -> dict[str, dict[str, Any]]:
    try:
        with open(CERT_PATH, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data.get("rules", {}) if isinstance(data, dict) else {}


_CERT: dict[str, dict[str, Any]] | None = None


def is_proved(r: Rule) -> bool:
    global _CERT
    if _CERT is None:
        _CERT = load_certificate()
    entry = _CERT.get(r.name)
    return bool(
        entry and entry.get("fingerprint") == r.fingerprint and entry.get("verdict") == "proved"
    )


def rules_for(pass_name: str) -> list[Rule]:
    return [r for r in RULES.values() if pass_name in r.passes]
