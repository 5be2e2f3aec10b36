"""Rules of the -O3 fusion and lifting passes: residual add + RMSNorm, matmul + bias +
activation, decomposed LayerNorm, the half-split rotary embedding of exported graphs, and
attention (softmax(q k^T * scale + mask) v, its grouped-query repeat, its causal -inf mask).

Each rule's obligation is `lhs == rhs` with the element-level semantics of
`llmir_core.rewrite.smt_ext` (the fused ops' definitions), for symbolic dims; preconditions
that depend on data (the rotary tables repeat their halves) are checked by the pass and
assumed in the proof at the symbolic index. Registered into `library.RULES` on import.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Value
from llmir_core.ir.dims import SymDim
from llmir_core.ir.types import TensorType

from .library import rule
from .proof_obligations import equality
from .rule import Rule
from .terms import BIG, A, C, K, Match, T, V, t


def _type(v: Value) -> TensorType | None:
    return v.type if isinstance(v.type, TensorType) else None


def _last_axis(axes: Any, rank: int) -> bool:
    return isinstance(axes, tuple) and len(axes) == 1 and axes[0] in (-1, rank - 1)


# -- residual add + RMSNorm -------------------------------------------------------------------

_ADD = t("core.add", V("x"), V("r"))
_FUSED = T("llm.add_rms_norm", (V("x"), V("r"), V("w")), {"eps": A("eps"), "offset": A("offset")})
_ARN_SIG = {"x": "... n", "r": "... n", "w": "n"}
_ARN_LHS = t("llm.rms_norm", _ADD, V("w"), eps=A("eps"), offset=A("offset"))
_ARN_SUM_RHS = T("llm.add_rms_norm", _FUSED.args, _FUSED.attrs, 1)
for _name, _lhs, _rhs, _summary in (
    (
        "fuse-add-rms-norm",
        _ARN_LHS,
        _FUSED,
        "rms_norm(x + r, w) is result 0 of llm.add_rms_norm(x, r, w)",
    ),
    (
        "fuse-add-rms-norm-sum",
        _ADD,
        _ARN_SUM_RHS,
        "x + r is result 1 (the sum) of llm.add_rms_norm(x, r, w)",
    ),
):
    rule(
        Rule(
            name=_name,
            summary=_summary,
            lhs=_lhs,
            rhs=_rhs,
            sig=_ARN_SIG,
            batch_ranks=(0, 1),
            obligation=equality(_lhs, _rhs, _ARN_SIG, (0, 1)),
            passes=("fuse-add-rms-norm",),
        )
    )


# -- matmul + bias + activation -> llm.linear ----------------------------------------------------

_ACTS: dict[str, Any] = {
    "silu": lambda y: t("core.silu", y),
    "relu": lambda y: t("core.relu", y),
    "gelu": lambda y: t("core.gelu", y, approximate="none"),
    "gelu_tanh": lambda y: t("core.gelu", y, approximate="tanh"),
}


def _linear_check(m: Match) -> str | None:
    x, w = _type(m.values["x"]), _type(m.values["w"])
    if x is None or w is None or w.rank != 2:
        return "the weight is not a matrix"
    root = _type(m.root.results[0])
    mm = next(o for o in m.ops if o.name == "core.matmul")
    if root is None or root.shape != mm.results[0].type.shape:  # type: ignore[union-attr]
        return "the bias broadcasts the product to a larger shape"
    if "b" in m.values:
        b = _type(m.values["b"])
        if b is None or b.rank != 1 or b.dtype != x.dtype:
            return f"bias %{m.values['b'].name} is not a vector of the output's dtype"
    return None


for _tb in (True, False):
    _mm = t("core.matmul", V("x"), V("w"), transpose_a=False, transpose_b=_tb)
    _sig = {"x": "... m k", "w": "n k" if _tb else "k n", "b": "n"}
    _suffix = "" if _tb else "-kn"
    _forms: list[tuple[str, T, T, str]] = [
        (
            "linear-bias",
            t("core.add", _mm, V("b")),
            t("llm.linear", V("x"), V("w"), V("b"), activation="none", transpose_b=_tb),
            "x @ w + b",
        )
    ]
    for _act, _wrap in _ACTS.items():
        _forms.append(
            (
                f"linear-{_act}",
                _wrap(_mm),
                t("llm.linear", V("x"), V("w"), activation=_act, transpose_b=_tb),
                f"{_act}(x @ w)",
            )
        )
        _forms.append(
            (
                f"linear-bias-{_act}",
                _wrap(t("core.add", _mm, V("b"))),
                t("llm.linear", V("x"), V("w"), V("b"), activation=_act, transpose_b=_tb),
                f"{_act}(x @ w + b)",
            )
        )
    for _name, _lhs, _rhs, _what in _forms:
        _s = {k: v for k, v in _sig.items() if k != "b" or "bias" in _name}
        rule(
            Rule(
                name=_name + _suffix,
                summary=f"{_what} is one llm.linear",
                lhs=_lhs,
                rhs=_rhs,
                sig=_s,
                tag="reassociating",
                check=_linear_check,
                batch_ranks=(0, 1),
                obligation=equality(_lhs, _rhs, _s, (0, 1)),
                passes=("fuse-linear",),
            )
        )


# -- decomposed LayerNorm -> llm.layer_norm ---------------------------------------------------------


def _layer_norm_check(m: Match) -> str | None:
    x = _type(m.values["x"])
    if x is None or x.rank == 0:
        return "x is not a tensor of rank >= 1"
    for key in ("ax1", "ax2"):
        if not _last_axis(tuple(m.attrs[key]), x.rank):
            return f"reduces over axes {list(m.attrs[key])}, not the last axis"
    if not (m.attrs["kd1"] and m.attrs["kd2"]):
        return "a reduce_mean drops the reduced axis (keepdims = false)"
    if m.consts["eps"] <= 0:
        return f"eps = {m.consts['eps']} is not positive"
    for key in ("w", "b"):
        if key in m.values:
            v = _type(m.values[key])
            if v is None or v.rank != 1 or v.shape[0] != x.shape[-1] or v.dtype != x.dtype:
                return f"{'weight' if key == 'w' else 'bias'} %{m.values[key].name} is not a vector over the last axis"
    if m.root.results[0].type != x:
        return f"result type {m.root.results[0].type} differs from x's {x}"
    return None


def _layer_norm_patterns() -> list[tuple[str, T, T]]:
    x = V("x")
    mean = t("core.reduce_mean", x, axes=A("ax1"), keepdims=A("kd1"))
    c = t("core.sub", x, mean)
    out = []
    for sq_name, sq in (("mul", t("core.mul", c, c)), ("pow", t("core.pow", c, K(2.0)))):
        var = t("core.add", t("core.reduce_mean", sq, axes=A("ax2"), keepdims=A("kd2")), C("eps"))
        for n_name, norm in (
            ("rsqrt", t("core.mul", c, t("core.rsqrt", var))),
            ("div-sqrt", t("core.div", c, t("core.sqrt", var))),
        ):
            scaled = {"": t("core.mul", norm, V("w")), "-wl": t("core.mul", V("w"), norm)}
            for w_name, sc in scaled.items():
                base = f"lift-layer-norm-{sq_name}-{n_name}{w_name}"
                out.append(
                    (
                        base,
                        t("core.add", sc, V("b")),
                        t("llm.layer_norm", x, V("w"), V("b"), eps=A("eps")),
                    )
                )
                out.append((base + "-nobias", sc, t("llm.layer_norm", x, V("w"), eps=A("eps"))))
    return out


def layer_norm_attrs(b: int, syms: dict[str, Any]) -> dict[str, Any]:
    return {"ax1": (-1,), "ax2": (-1,), "kd1": True, "kd2": True}


for _name, _lhs, _rhs in _layer_norm_patterns():
    _s = {"x": "... n", "w": "n", "b": "n", "eps": ""}
    if _name.endswith("-nobias"):
        del _s["b"]

    rule(
        Rule(
            name=_name,
            summary="the decomposed LayerNorm (x - mean) / sqrt(var + eps) * w (+ b) is llm.layer_norm",
            lhs=_lhs,
            rhs=_rhs,
            sig=_s,
            check=_layer_norm_check,
            batch_ranks=(0, 1),
            tag="exact" if "rsqrt" in _name and "pow" not in _name else "reassociating",
            obligation=equality(
                _lhs,
                _rhs,
                _s,
                (0, 1),
                assume=lambda s: [s["eps"] > 0],
                proof_attrs=layer_norm_attrs,
            ),
            passes=("lift-layer-norm",),
        )
    )


# -- the half-split rotary embedding of exported graphs -------------------------------------------


def _ints(v: Any) -> tuple[int, ...] | None:
    return tuple(v) if isinstance(v, tuple) and all(isinstance(i, int) for i in v) else None


def _rotary_check(m: Match) -> str | None:
    x = _type(m.values["x"])
    if x is None or x.rank != 4 or not isinstance(x.shape[3], int) or x.shape[3] % 2:
        return "x is not [batch, heads, seq, head_dim] with an even, static head_dim"
    d = x.shape[3]
    half = d // 2
    for key in ("ua1", "ua2"):
        if _ints(m.attrs[key]) not in ((1,), (-3,)):
            return "the cos/sin tables are not broadcast over heads (unsqueeze axis 1)"
    if m.attrs["cat"] not in (-1, 3):
        return "the rotated halves are not concatenated along the last axis"
    lo = (_ints(m.attrs["s1"]), _ints(m.attrs["e1"]), _ints(m.attrs["a1"]), _ints(m.attrs["st1"]))
    hi = (_ints(m.attrs["s2"]), _ints(m.attrs["e2"]), _ints(m.attrs["a2"]), _ints(m.attrs["st2"]))
    last = ((-1,), (3,))
    if lo[0] != (0,) or lo[1] != (half,) or lo[2] not in last or lo[3] not in ((), (1,)):
        return "the first slice is not x[..., :head_dim/2]"
    if (
        hi[0] != (half,)
        or hi[1] is None
        or hi[1][0] < d
        or hi[2] not in last
        or hi[3] not in ((), (1,))
    ):
        return "the second slice is not x[..., head_dim/2:]"
    for key in ("cos", "sin"):
        tab = _type(m.values[key])
        if tab is None or tab.rank != 2 or tab.shape[1] != d:
            return f"the {key} table is not [positions, head_dim]"
    pos = _type(m.values["pos"])
    if pos is None or pos.rank != 2:
        return "positions are not [batch, seq]"
    if m.root.results[0].type != x:
        return "the result type differs from x's (broadcast)"
    m.attrs["half"] = (half,)
    return None


def _rotary_patterns() -> list[tuple[str, T]]:
    x = V("x")
    c4 = t("core.unsqueeze", t("core.gather", V("cos"), V("pos"), axis=0), axes=A("ua1"))
    s4 = t("core.unsqueeze", t("core.gather", V("sin"), V("pos"), axis=0), axes=A("ua2"))
    x1 = t("core.slice", x, starts=A("s1"), ends=A("e1"), axes=A("a1"), steps=A("st1"))
    x2 = t("core.slice", x, starts=A("s2"), ends=A("e2"), axes=A("a2"), steps=A("st2"))
    rot = t("core.concat", t("core.neg", x2), x1, axis=A("cat"))
    out = []
    for a_name, xc in (("", t("core.mul", x, c4)), ("-cx", t("core.mul", c4, x))):
        for b_name, rs in (("", t("core.mul", rot, s4)), ("-sr", t("core.mul", s4, rot))):
            out.append((f"lift-rotary{a_name}{b_name}", t("core.add", xc, rs)))
            out.append((f"lift-rotary{a_name}{b_name}-swap", t("core.add", rs, xc)))
    return out


_HALF_TABLE = {"starts": (0,), "ends": A("half"), "axes": (1,), "steps": (1,)}
_ROT_RHS = t(
    "llm.rotary_embedding",
    V("x"),
    T("core.slice", (V("cos"),), _HALF_TABLE),
    T("core.slice", (V("sin"),), _HALF_TABLE),
    V("pos"),
    interleaved=False,
    rotary_dim=0,
)
_ROT_SIG = {"x": "b h s 2*d", "cos": "p 2*d", "sin": "p 2*d", "pos": "b s"}


def rotary_attrs(b: int, s: dict[str, Any]) -> dict[str, Any]:
    d = s["d"]
    return {
        "ua1": (1,),
        "ua2": (1,),
        "cat": -1,
        "s1": (0,),
        "e1": (d,),
        "a1": (-1,),
        "st1": (1,),
        "s2": (d,),
        "e2": (BIG,),
        "a2": (-1,),
        "st2": (1,),
        "half": (d,),
    }


def rotary_hyps(s: dict[str, Any], idx: tuple[Any, ...]) -> list[Any]:
    """The precondition at the index: each table's second half repeats its first half."""
    import z3

    lv = s["__leaves__"]
    b, i = idx[0], idx[3]
    p = lv["pos"].f((b, idx[2]))
    return [
        z3.Implies(i >= s["d"], lv[k].f((p, i)) == lv[k].f((p, i - s["d"]))) for k in ("cos", "sin")
    ]


for _name, _lhs in _rotary_patterns():
    rule(
        Rule(
            name=_name,
            summary="x * cos + rotate_half(x) * sin with tables gathered by position is llm.rotary_embedding",
            lhs=_lhs,
            rhs=_ROT_RHS,
            sig=_ROT_SIG,
            check=_rotary_check,
            batch_ranks=(0,),
            obligation=equality(
                _lhs,
                _ROT_RHS,
                _ROT_SIG,
                (0,),
                proof_attrs=rotary_attrs,
                int_leaves=("pos",),
                hyps_at=rotary_hyps,
            ),
            passes=("lift-rotary",),
        )
    )


def tables_repeat_halves(tab: np.ndarray) -> bool:
    """The data precondition of lift-rotary: table[:, d/2:] == table[:, :d/2]."""
    h = tab.shape[-1] // 2
    return bool(np.array_equal(tab[..., :h], tab[..., h:]))


# -- attention --------------------------------------------------------------------------------

_Q4 = {"q": "b h s d", "k": "b h t d", "v": "b h t e"}


def _attn_check(m: Match) -> str | None:
    for key in ("q", "k", "v"):
        tt = _type(m.values[key])
        if tt is None or tt.rank != 4:
            return f"{key} is not [batch, heads, seq, head_dim]"
    if "axis" in m.attrs and m.attrs["axis"] not in (-1, 3):
        return f"softmax over axis {m.attrs['axis']}, not the key axis"
    if "perm" in m.attrs and tuple(m.attrs["perm"]) != (0, 1, 3, 2):
        return f"k is transposed by {list(m.attrs['perm'])}, not (0, 1, 3, 2)"
    if "c" in m.consts:
        if m.consts["c"] <= 0 or not math.isfinite(m.consts["c"]):
            return f"the scores are divided by {m.consts['c']}, not a positive number"
        m.attrs["scale"] = 1.0 / m.consts["c"]
    if "sc" in m.consts and (m.consts["sc"] <= 0 or not math.isfinite(m.consts["sc"])):
        return f"the scores are scaled by {m.consts['sc']}, not a positive number"
    if "mask" in m.values:
        mt = _type(m.values["mask"])
        q = _type(m.values["q"])
        if mt is None or q is None or mt.dtype != q.dtype:
            return "the mask is not an additive float mask of q's dtype"
    return None


def _attention_patterns() -> list[tuple[str, T, T, dict[str, str], Any]]:
    q, k, v = V("q"), V("k"), V("v")
    out = []
    qks = {
        "": t("core.matmul", q, k, transpose_a=False, transpose_b=True),
        "-kt": t(
            "core.matmul",
            q,
            t("core.transpose", k, perm=A("perm")),
            transpose_a=False,
            transpose_b=False,
        ),
    }
    for qk_name, qk in qks.items():
        scaled = {
            "mul": (t("core.mul", qk, C("sc")), A("sc")),
            "div": (t("core.div", qk, C("c")), A("scale")),
        }
        for sc_name, (s, scale) in scaled.items():
            masks = {
                "": s,
                "-mask": t("core.add", s, V("mask")),
                "-mask-left": t("core.add", V("mask"), s),
            }
            for m_name, sm in masks.items():
                lhs = t(
                    "core.matmul",
                    t("core.softmax", sm, axis=A("axis")),
                    v,
                    transpose_a=False,
                    transpose_b=False,
                )
                args = (q, k, v, V("mask")) if m_name else (q, k, v)
                rhs = T("llm.scaled_dot_product_attention", args, {"scale": scale, "causal": False})
                sig = dict(
                    _Q4,
                    **({"mask": "s t"} if m_name else {}),
                    **{("sc" if sc_name == "mul" else "c"): ""},
                )

                def pa(b: int, syms: dict[str, Any], sc_name: str = sc_name) -> dict[str, Any]:
                    at: dict[str, Any] = {"axis": -1, "perm": (0, 1, 3, 2)}
                    if sc_name == "div":
                        at["scale"] = 1 / syms["c"]
                    return at

                out.append((f"lift-attention-{sc_name}{qk_name}{m_name}", lhs, rhs, sig, pa))
    return out


def _positive(name: str) -> Callable[[dict[str, Any]], list[Any]]:
    """The proof assumption that the symbol `name` is positive."""
    return lambda s: [s[name] > 0]


for _name, _lhs, _rhs, _sig, _pa in _attention_patterns():
    _pos = "c" if "-div" in _name else "sc"
    rule(
        Rule(
            name=_name,
            summary="softmax(q @ k^T * scale (+ mask)) @ v is llm.scaled_dot_product_attention",
            lhs=_lhs,
            rhs=_rhs,
            sig=_sig,
            check=_attn_check,
            batch_ranks=(0,),
            tag="reassociating",
            obligation=equality(_lhs, _rhs, _sig, (0,), proof_attrs=_pa, assume=_positive(_pos)),
            passes=("lift-attention",),
        )
    )


# grouped-query: k and v repeated per q head group by unsqueeze + tile + reshape (repeat_interleave)


def _rep(name: str, tag: str) -> T:
    return t(
        "core.reshape",
        t("core.tile", t("core.unsqueeze", V(name), axes=A(f"ua{tag}")), repeats=A(f"reps{tag}")),
        shape=A(f"shape{tag}"),
        allowzero=A(f"az{tag}"),
    )


def _gqa_check(m: Match) -> str | None:
    k = _type(m.values["k"])
    q = _type(m.values["q"])
    if k is None or q is None or k.rank != 4 or q.rank != 4:
        return "q and k are not rank-4"
    for tag in ("k", "v"):
        if _ints(m.attrs[f"ua{tag}"]) != (2,):
            return f"{tag} is not repeated along a new axis 2"
        reps = _ints(m.attrs[f"reps{tag}"])
        if (
            reps is None
            or len(reps) != 5
            or reps[:2] != (1, 1)
            or reps[3:] != (1, 1)
            or reps[2] < 1
        ):
            return f"{tag} is tiled by {m.attrs[f'reps{tag}']}, not [1, 1, g, 1, 1]"
    g = _ints(m.attrs["repsk"])[2]  # type: ignore[index]
    if _ints(m.attrs["repsv"])[2] != g:  # type: ignore[index]
        return "k and v are repeated a different number of times"
    if not isinstance(k.shape[1], int) or q.shape[1] != k.shape[1] * g:
        return f"q has {q.shape[1]} heads, not {k.shape[1]} kv heads x {g}"
    for key in ("softcap", "sliding_window", "softmax_eps"):
        if m.attrs[key]:
            return f"attention with {key} is not lifted"
    return None


_GQA_SIG = {"q": "b hk*g s d", "k": "b hk t d", "v": "b hk t e"}


def _gqa_attrs(b: int, s: dict[str, Any]) -> dict[str, Any]:
    g, hk = s["g"], s["hk"]
    at: dict[str, Any] = {
        "softcap": 0.0,
        "sliding_window": 0,
        "softmax_eps": 0.0,
        "causal": False,
        "scale": s.setdefault("scale_sym", _real("scale")),
        "__core.reshape__": {"__merge__": 1},
    }
    for tag in ("k", "v"):
        at.update(
            {
                f"ua{tag}": (2,),
                f"reps{tag}": (1, 1, g, 1, 1),
                f"shape{tag}": (0, hk * g, 0, 0),
                f"az{tag}": False,
            }
        )
    return at


for _with_mask in (False, True):
    _args = (V("q"), _rep("k", "k"), _rep("v", "v")) + ((V("mask"),) if _with_mask else ())
    _at = {k: A(k) for k in ("scale", "causal", "softcap", "sliding_window", "softmax_eps")}
    _lhs = T("llm.scaled_dot_product_attention", _args, _at)
    _rhs = T("llm.scaled_dot_product_attention", (V("q"), V("k"), V("v")) + _args[3:], _at)
    _sig = dict(_GQA_SIG, **({"mask": "s t"} if _with_mask else {}))
    rule(
        Rule(
            name="attention-gqa" + ("-mask" if _with_mask else ""),
            summary="attention over k, v repeated g times per head (repeat_interleave) is grouped-query attention",
            lhs=_lhs,
            rhs=_rhs,
            sig=_sig,
            check=_gqa_check,
            batch_ranks=(0,),
            obligation=equality(_lhs, _rhs, _sig, (0,), proof_attrs=_gqa_attrs),
            passes=("lift-attention",),
        )
    )


def _real(name: str) -> Any:
    import z3

    return z3.Real(name)


# the causal mask: an additive trilu(-inf, k=1) mask over [seq, seq] is causal attention


def _causal_check(m: Match) -> str | None:
    fill = m.attrs["fill"]
    if (
        not isinstance(fill, DenseAttr)
        or fill.array.size != 1
        or not np.isneginf(fill.array.reshape(-1)[0])
    ):
        return "the mask is not filled with -inf"
    if m.attrs["upper"] is not True:
        return "the mask keeps the upper triangle"
    q, k, mt = _type(m.values["q"]), _type(m.values["k"]), _type(m.root.operands[3])
    if q is None or k is None or mt is None or mt.rank != 2:
        return "q, k or the mask has an unexpected type"
    sq, skv = q.shape[2], k.shape[2]
    if not (sq == skv == mt.shape[0] == mt.shape[1]) or not isinstance(sq, (int, SymDim)):
        return (
            f"the mask is [{mt.shape[0]}, {mt.shape[1]}] but q has {sq} and k {skv} positions: "
            "causal alignment needs one length for all"
        )
    for key in ("softcap", "sliding_window", "softmax_eps"):
        if m.attrs[key]:
            return f"attention with {key} is not lifted"
    if m.attrs["causal"]:
        return "already causal"
    return None


_CAUSAL_MASK = t(
    "core.trilu", t("core.constant_of_shape", V("shape"), value=A("fill")), K(1.0), upper=A("upper")
)
_CAT = {k: A(k) for k in ("scale", "causal", "softcap", "sliding_window", "softmax_eps")}
_CAUSAL_LHS = T("llm.scaled_dot_product_attention", (V("q"), V("k"), V("v"), _CAUSAL_MASK), _CAT)
_CAUSAL_RHS = T(
    "llm.scaled_dot_product_attention", (V("q"), V("k"), V("v")), dict(_CAT, causal=True)
)
_CAUSAL_SIG = {"q": "b h s d", "k": "b h s d", "v": "b h s e", "shape": "2"}


def _causal_attrs(b: int, s: dict[str, Any]) -> dict[str, Any]:
    return {
        "softcap": 0.0,
        "sliding_window": 0,
        "softmax_eps": 0.0,
        "causal": False,
        "upper": True,
        "scale": s.setdefault("scale_sym", _real("scale")),
        "__core.constant_of_shape__": {"__shape__": (s["s"], s["s"]), "__neg_inf__": True},
    }


rule(
    Rule(
        name="attention-causal-mask",
        summary="attention with the additive mask trilu(-inf, k=1) over [seq, seq] is causal attention",
        lhs=_CAUSAL_LHS,
        rhs=_CAUSAL_RHS,
        sig=_CAUSAL_SIG,
        check=_causal_check,
        batch_ranks=(0,),
        obligation=equality(
            _CAUSAL_LHS,
            _CAUSAL_RHS,
            _CAUSAL_SIG,
            (0,),
            proof_attrs=_causal_attrs,
            int_leaves=("shape",),
        ),
        passes=("lift-attention",),
    )
)
