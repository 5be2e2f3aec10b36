"""The bound B of the verdict `within bound B`: how far an approximate compile's outputs can be from
the original's, for every input in the declared ranges.

Translation validation has shown (congruence closure over exact rule instances) that the optimized
module computes the original with each approximate instance's root replaced by the rule's rhs.
Each instance contributes a local error: elementwise |rhs - lhs| <= abs + rel * magnitude (the
rule's own proved `bound`, or the conservative fallback below), evaluated with concrete weights and
the interval ranges of activations. B composes them forward through the original module, one
scalar per value, `err(v)` >= max |v_optimized - v_original| over all elements and inputs:

- every op whose operands carry no error computes the same values in both modules: err 0;
- else the op's first-order / Lipschitz rule over its operands' ranges (`_RULES`: add, mul,
  matmul with concrete weights as a row-sum norm, norms through eps, softmax, attention, silu,
  rotary, ...), never more than the diameter of its result's range over inputs widened by their
  errors (both results lie in it), plus one rounding of each result (2u |result|);
- an op with neither rule nor a bounded range gives err inf: B = inf, no `within bound` verdict.

Fallback local bounds of rules that do not (yet) state one, each marked `fallback` in the output:
- quantization (`quantize-weights-*`): the quantizer lemma |w - q*s| <= s/2 per weight (its
  precondition checked on the concrete codes), propagated through the rule's lhs: for a matmul
  max|x| * max_n sum_k s[n, k // block] / 2;
- precision (`precision-*`): every operand rounded to the target type (|fl(a) - a| <= u|a|)
  propagated through the op, plus (K + 1) u times the sum of |terms| of its result (K the
  reduction length of a matmul), u the unit roundoff of the target type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmir_core.dialects import ranges as rg
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, QuantType, TensorType
from llmir_core.rewrite.bounds import UNIT_ROUNDOFF

from .intervals import interval_rule

INF = math.inf
Iv = tuple[float, float]
MAX_DIM = 4096  # a symbolic dim counts as this long in range rules (as `verify --ranges`)
MAX_CONCRETE = 1 << 24  # elements: a larger parameter-only value is left to the range rules
SILU_LIP = 1.1  # max |d silu / dx| = 1.0998; gelu's is 1.129: GELU_LIP
GELU_LIP = 1.13


def _u(t: Any) -> float:
    dt = getattr(t, "dtype", None)
    return UNIT_ROUNDOFF.get(str(dt), 2.0**-53 if dt == DType.f64 else 0.0)


def _absmax(iv: Iv) -> float:
    return rg.absmax(iv)


def _widen(iv: Iv, e: float) -> Iv:
    return (iv[0] - e, iv[1] + e)


@dataclass
class Ranges:
    """Concrete values of the parameter-only values of a module and interval ranges of all."""

    module: Module
    input_range: Iv = (-1.0, 1.0)
    iv: dict[int, Iv] = field(default_factory=dict)  # id(Value) -> range
    arr: dict[int, Any] = field(default_factory=dict)  # id(Value) -> ndarray / PackedArray
    _depth: int = 0  # decompositions being followed (ranges of fused and target ops)

    def __post_init__(self) -> None:
        fn = self.module.main
        it = Interpreter(self.module)
        for a in fn.args:
            t = a.type
            r = self.input_range
            if isinstance(t, TensorType) and isinstance(t.dtype, DType) and not t.dtype.is_float:
                r = (-INF, INF)  # ids, positions: only ranges derived from tables bound them
            self.iv[id(a)] = r
        for op in fn.ops:
            self.visit(op, it)

    def visit(self, op: Op, it: Interpreter) -> None:
        ins = [self.iv.get(id(v), (-INF, INF)) for v in op.operands]
        if all(id(v) in self.arr for v in op.operands) and self._small(op):
            try:
                outs = it.eval_op(op, [self.arr[id(v)] for v in op.operands], {})
            except Exception:  # noqa: BLE001 - e.g. a missing weight file: ranges only
                outs = None
            if outs is not None:
                for r, o in zip(op.results, outs):
                    self.arr[id(r)] = o
                    self.iv[id(r)] = _range_of(o)
                return
        rng = op_range(op, ins)
        if not all(math.isfinite(x) for x in rng) and self._depth < MAX_DEPTH:
            self._depth += 1
            try:  # a fused or target op: the range its definition computes
                d = _decomposed(op, self)
            finally:
                self._depth -= 1
            if d is not None:
                for res, o in zip(op.results, d[1]):
                    self.iv[id(res)] = d[2].range(o)
                return
        w = self.value(op.operands[1]) if op.name == "core.matmul" else None
        if w is not None and w.ndim == 2 and not op.attrs.get("transpose_a"):
            m = _absmax(ins[0]) * row_norm(w, bool(op.attrs.get("transpose_b")))
            rng = (max(rng[0], -m), min(rng[1], m))  # |x @ w| <= max|x| * max_n sum_k |w|
        for res in op.results:
            self.iv[id(res)] = rng

    @staticmethod
    def _small(op: Op) -> bool:
        n = 1
        for r in op.results:
            t = r.type
            if not isinstance(t, TensorType) or not all(isinstance(d, int) for d in t.shape):
                return False
            n = max(n, math.prod([int(str(d)) for d in t.shape]))
        return n <= MAX_CONCRETE

    def range(self, v: Value) -> Iv:
        return self.iv.get(id(v), (-INF, INF))

    def value(self, v: Value) -> np.ndarray | None:
        a = self.arr.get(id(v))
        return np.asarray(a, np.float64) if isinstance(a, np.ndarray) else None


def _range_of(a: Any) -> Iv:
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "fiub" or a.size == 0:
        return (-INF, INF)
    x = a.astype(np.float64)
    return (float(np.nanmin(x)), float(np.nanmax(x)))


def op_range(op: Op, ins: list[Iv]) -> Iv:
    _, rule = interval_rule(op.name)
    try:
        r: Iv = rule(op, ins if ins else [(-INF, INF)], {}, MAX_DIM)
    except Exception:  # noqa: BLE001 - unknown structure: no bound
        r = (-INF, INF)
    return r


# -- per-op error rules: (op, operand errors, operand ranges, ranges) -> error of result 0 -----

Rule = Callable[[Op, list[float], list[Iv], Ranges], float]


def _k(op: Op, i: int = 0, axis: int = -1) -> int:
    return rg.dim(op.operands[i].type, axis, {}, MAX_DIM)


def row_norm(w: np.ndarray, transpose_b: bool) -> float:
    """max over outputs n of sum_k |w|: the L-inf operator norm of x -> x @ w (or w^T)."""
    a = np.abs(w.reshape(-1, w.shape[-1]) if w.ndim >= 2 else w.reshape(1, -1))
    return float((a.sum(axis=1) if transpose_b else a.sum(axis=0)).max(initial=0.0))


def matmul_err(
    ea: float, eb: float, a: Iv, b: Iv, k: int, w: np.ndarray | None, transpose_b: bool
) -> float:
    """|a'b' - ab| <= |a'-a| |b| + |a'| |b'-b|, summed over the contraction."""
    if eb == 0.0 and w is not None and w.ndim == 2:
        return ea * row_norm(w, transpose_b)
    am = _absmax(a) + ea
    return k * (ea * _absmax(b) + am * eb)


def _matmul(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    if op.attrs.get("transpose_a"):
        return INF
    tb = bool(op.attrs.get("transpose_b"))
    return matmul_err(e[0], e[1], iv[0], iv[1], _k(op), r.value(op.operands[1]), tb)


def _linear(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    y = matmul_err(e[0], e[1], iv[0], iv[1], _k(op), r.value(op.operands[1]), True)
    return y + (e[2] if len(e) > 2 else 0.0)


def _qmatmul(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    if any(e[1:]):
        return INF
    w = _dequantized(op, r)
    if w is None:
        return INF
    return e[0] * row_norm(w, bool(op.attrs.get("transpose_b", True)))


def _dequantized(op: Op, r: Ranges) -> np.ndarray | None:
    from llmir_core.quant import dequantize

    packed = r.arr.get(id(op.operands[1]))
    if packed is None:
        return None
    extra = [r.arr.get(id(v)) for v in op.operands[2:]]
    try:
        return np.asarray(dequantize(packed, *extra), np.float64)
    except Exception:  # noqa: BLE001 - not decodable here: no norm
        return None


def _act_lip(kind: str) -> float:
    return {"none": 1.0, "relu": 1.0, "silu": SILU_LIP}.get(kind, GELU_LIP)


def gated(eg: float, eu: float, g: Iv, u: Iv, lip: float, act: Iv) -> float:
    """|act(g')u' - act(g)u| <= |act(g')| |u'-u| + lip |g'-g| |u|."""
    return (_absmax(act) + lip * eg) * eu + lip * eg * _absmax(u)


def _silu_mul(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    return gated(e[0], e[1], iv[0], iv[1], SILU_LIP, rg.activation("silu", iv[0]))


def _gated_mlp(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    return gated_mlp_err(op, e, iv, r, {})


def gated_mlp_err(
    op: Op, e: list[float], iv: list[Iv], r: Ranges, werr: dict[int, np.ndarray]
) -> float:
    """down(act(x Wg^T) * (x Wu^T)): operand errors e (x and the three weights: 0, or inf when
    perturbed without a concrete error), plus elementwise weight errors `werr` by operand index
    (a quantized weight's |w - q*s| <= s/2)."""
    if any(e[1:]):
        return INF
    ws = [r.value(v) for v in op.operands[1:4]]
    if any(w is None or w.ndim != 2 for w in ws):
        return INF
    kind = str(op.attrs.get("activation", "silu"))
    xm = _absmax(iv[0]) + e[0]
    out = []
    for j, w in enumerate(ws[:2]):  # gate, up: [F, K] rows
        assert w is not None
        ew = werr.get(j + 1)
        err = e[0] * row_norm(w, True) + (xm * row_norm(ew, True) if ew is not None else 0.0)
        out.append(err)
    g = (-xm * row_norm(ws[0], True), xm * row_norm(ws[0], True))  # type: ignore[arg-type]
    u = (-xm * row_norm(ws[1], True), xm * row_norm(ws[1], True))  # type: ignore[arg-type]
    eh = gated(out[0], out[1], g, u, _act_lip(kind), rg.activation(kind, g))
    wd = ws[2]
    assert wd is not None
    hm = _absmax(rg.mul(rg.activation(kind, g), u)) + eh
    ed = werr.get(3)
    return eh * row_norm(wd, True) + (hm * row_norm(ed, True) if ed is not None else 0.0)


def _add(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    return sum(e)


def _mul(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    a, b = iv[0], iv[1]
    return e[0] * _absmax(b) + (_absmax(a) + e[0]) * e[1]


def _div(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    """|a'/b' - a/b| <= e_a / (lo - e_b) + max|a| e_b / (lo (lo - e_b)), lo = min |b| over a
    divisor range of one sign, while e_b < lo (b' keeps its sign)."""
    lo = min(abs(iv[1][0]), abs(iv[1][1]))
    if iv[1][0] <= 0 <= iv[1][1] or lo == 0 or e[1] >= lo:
        return INF
    return e[0] / (lo - e[1]) + _absmax(iv[0]) * e[1] / (lo * (lo - e[1]))


def _lipschitz(c: float) -> Rule:
    return lambda op, e, iv, r: c * max(e, default=0.0)


def _exp(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    return math.exp(min(iv[0][1] + e[0], 700.0)) * e[0]


def _pow(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    """A constant exponent p: |x'^p - x^p| <= |p| max|x|^(p-1) |x' - x| (p >= 1, mean value)."""
    p = r.value(op.operands[1])
    if e[1] or p is None or p.size == 0 or not (p == p.reshape(-1)[0]).all():
        return INF
    k = float(p.reshape(-1)[0])
    if k == 1.0:
        return e[0]
    if k < 1.0:
        return INF
    return abs(k) * (_absmax(iv[0]) + e[0]) ** (k - 1.0) * e[0]


def _sqrt(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    """|sqrt(a') - sqrt(a)| <= sqrt(|a' - a|), and <= |a' - a| / (2 sqrt(lo)) above lo > 0."""
    lo = iv[0][0] - e[0]
    best = math.sqrt(e[0])
    return min(best, e[0] / (2.0 * math.sqrt(lo))) if lo > 0 else best


def _rsqrt(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    lo = iv[0][0] - e[0]
    return e[0] / (2.0 * lo**1.5) if lo > 0 else INF


def _log(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    lo = iv[0][0] - e[0]
    return e[0] / lo if lo > 0 else INF


def _rotary(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    if any(e[1:3]):
        return INF
    return e[0] * (_absmax(iv[1]) + _absmax(iv[2]))


def _norm_lip(op: Op, iv: list[Iv], wi: int) -> float:
    """L-inf Lipschitz constant of x -> x / sqrt(mean(x^2) + eps) * w:
    row sums of the Jacobian are <= (1 + sqrt(n)) / r with r >= sqrt(eps)."""
    n = _k(op)
    eps = float(op.attrs.get("eps", 1e-6))
    if eps <= 0:
        return INF
    w = _absmax(iv[wi]) + float(op.attrs.get("offset", 0.0)) if len(iv) > wi else 1.0
    c = 2.0 if op.name == "llm.layer_norm" else 1.0  # centring: at most doubles the row sum
    return c * (1.0 + math.sqrt(n)) / math.sqrt(eps) * abs(w)


def _rms_norm(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    if any(e[1:]):
        return INF
    return e[0] * _norm_lip(op, iv, 1)


def _add_rms_norm(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    if any(e[2:]):
        return INF
    s = e[0] + e[1]
    return max(s, s * _norm_lip(op, iv, 2))


def _attention(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    """out = softmax(s) v, s = scale q k^T + mask: |ds| <= scale D (|q| ek + |k| eq + eq ek);
    softmax's Jacobian has L-inf -> L1 norm <= 2, so |dout| <= 2 |ds| max|v'| + ev."""
    if len(e) > 3 and any(e[3:]):
        return INF
    d = _k(op)
    scale = op.attrs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale in (None, 0, 0.0) else abs(float(scale))
    es = scale * d * (_absmax(iv[0]) * e[1] + (_absmax(iv[1]) + e[1]) * e[0])
    return 2.0 * es * (_absmax(iv[2]) + e[2]) + e[2]


def _embedding(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    return INF if e[1] else e[0]


def _structural(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    """Moves, slices, gathers of elements and max/min: no element grows by more than the largest
    operand error (index and condition operands must carry none)."""
    return max(e, default=0.0)


def _cast(op: Op, e: list[float], iv: list[Iv], r: Ranges) -> float:
    return e[0]  # the rounding of the result is added for every op


_STRUCTURAL = (
    "core.reshape core.transpose core.concat core.slice core.squeeze core.unsqueeze core.tile "
    "core.expand core.broadcast_to core.split core.identity core.neg core.abs core.relu "
    "core.reduce_max core.reduce_min core.max core.min llm.to_device core.pad"
).split()

_RULES: dict[str, Rule] = {
    **{n: _structural for n in _STRUCTURAL},
    "core.add": _add,
    "core.sub": _add,
    "core.mul": _mul,
    "core.div": _div,
    "core.matmul": _matmul,
    "llm.linear": _linear,
    "llm.quantized_matmul": _qmatmul,
    "llm.gated_mlp": _gated_mlp,
    "llm.silu_mul": _silu_mul,
    "core.silu": _lipschitz(SILU_LIP),
    "core.gelu": _lipschitz(GELU_LIP),
    "core.sigmoid": _lipschitz(0.25),
    "core.tanh": _lipschitz(1.0),
    "core.exp": _exp,
    "core.pow": _pow,
    "core.sqrt": _sqrt,
    "core.rsqrt": _rsqrt,
    "core.log": _log,
    "core.erf": _lipschitz(2.0 / math.sqrt(math.pi)),
    "core.softmax": _lipschitz(0.5),  # Jacobian row sums 2 p_i (1 - p_i) <= 1/2
    "core.reduce_mean": _lipschitz(1.0),
    "core.cast": _cast,
    "llm.rms_norm": _rms_norm,
    "llm.layer_norm": _rms_norm,
    "llm.add_rms_norm": _add_rms_norm,
    "llm.rotary_embedding": _rotary,
    "llm.scaled_dot_product_attention": _attention,
    "llm.embedding": _embedding,
    "core.gather": lambda op, e, iv, r: INF if any(e[1:]) else e[0],
    "core.where": lambda op, e, iv, r: INF if e[0] else max(e[1:]),
}


def op_error(op: Op, errs: list[float], r: Ranges, depth: int = 0) -> tuple[float, str]:
    """(error bound of op's results given its operands' errors, the rule used)."""
    if not any(errs):
        return 0.0, "exact"
    ivs = [r.range(v) for v in op.operands]
    rule = _RULES.get(op.name)
    how = "rule"
    try:
        lip = rule(op, errs, ivs, r) if rule is not None else INF
    except Exception:  # noqa: BLE001 - an operand shape the rule does not cover
        lip = INF
    if rule is None and depth < MAX_DEPTH:
        through = _through_decomposition(op, errs, r, depth + 1)
        if through is not None:  # its ops' own rounding is already counted there
            return (INF if math.isnan(through) else through), "decomposition"
    wide = op_range(op, [_widen(iv, x) for iv, x in zip(ivs, errs)])
    if not all(math.isfinite(x) for x in wide) and op.results:
        # the widened operands leave the op's domain (sqrt of a range reaching below 0: the
        # interval rule gives up), while the error rule covers it: the result's own range widened
        # by the rule's bound holds the perturbed result too
        own = _widen(r.range(op.results[0]), lip)
        if all(math.isfinite(x) for x in own):
            wide = own
    diameter = wide[1] - wide[0]
    if diameter < lip:
        lip, how = diameter, "range"
    if rule is None and how == "rule":
        return INF, "no rule"
    rounding = 2.0 * max(_u(res.type) for res in op.results) * _absmax(wide) if op.results else 0.0
    out = lip + rounding
    return (INF if math.isnan(out) else out), how


MAX_DEPTH = 4  # nested decompositions followed by op_error


def _decomposed(op: Op, r: Ranges) -> tuple[Function, list[Value], Ranges] | None:
    """op's decomposition (its definition) over fresh arguments, with the ranges and constants
    of op's operands flowed through it. None when it has none at these types."""
    from llmir_core.builder import Builder
    from llmir_core.dialects.registry import get_op

    od = get_op(op.name)
    if od is None or od.decompose is None:
        return None
    fn = Function(f"{op.name}.def", [Value(f"a{i}", v.type) for i, v in enumerate(op.operands)])
    try:
        outs = od.decompose(Builder(fn), fn.args, od.with_defaults(op.attrs))
    except Exception:  # noqa: BLE001 - no decomposition at these types
        return None
    if not outs:
        return None
    sub = Ranges.__new__(Ranges)
    sub.module, sub.input_range, sub.iv, sub.arr = r.module, r.input_range, {}, {}
    sub._depth = r._depth
    for a, v in zip(fn.args, op.operands):
        sub.iv[id(a)] = r.range(v)
        if id(v) in r.arr:
            sub.arr[id(a)] = r.arr[id(v)]
    it = Interpreter(r.module)
    for o in fn.ops:
        sub.visit(o, it)
    return fn, list(outs), sub


def _through_decomposition(op: Op, errs: list[float], r: Ranges, depth: int) -> float | None:
    """The error of an op without a rule of its own (a fused or target op) through its
    decomposition, its definition: the operands' ranges, constants and errors flow through the
    ops it stands for. None when it has none."""
    d = _decomposed(op, r)
    if d is None:
        return None
    fn, outs, sub = d
    err: dict[int, float] = {id(a): e for a, e in zip(fn.args, errs)}
    for o in fn.ops:
        e, _ = op_error(o, [err.get(id(v), 0.0) for v in o.operands], sub, depth)
        for res in o.results:
            err[id(res)] = e
    return max(err.get(id(v), 0.0) for v in outs)


@dataclass
class Composition:
    bound: float  # max over the float outputs
    outputs: list[float]  # per output
    blocker: str | None  # the first op whose error is unbounded, where B = inf


LocalFn = Callable[[Callable[[Value], float]], float]


def compose(module: Module, r: Ranges, local: dict[str, LocalFn]) -> Composition:
    """Propagate errors through `module` (the original) to its outputs. `local` maps the roots of
    the approximate instances (value names) to their local error bound, a function of the error
    of any value (the instance's leaves are widened by theirs)."""
    err: dict[int, float] = {}
    blocker = None

    def of(v: Value) -> float:
        return err.get(id(v), 0.0)

    for op in module.main.ops:
        out, _ = op_error(op, [of(v) for v in op.operands], r)
        if math.isinf(out) and blocker is None:
            where = f" at {op.pos}" if op.pos else ""
            blocker = f"{op.name}{where} (%{op.results[0].name}): no error rule over its operands"
        for res in op.results:
            fn = local.get(res.name)
            extra = fn(of) if fn is not None else 0.0
            if math.isinf(extra) and blocker is None:
                blocker = f"%{res.name}: an approximate rule instance without a bound"
            err[id(res)] = out + extra
    outs = [of(v) for v in module.main.outputs]
    floats = [
        x
        for x, v in zip(outs, module.main.outputs)
        if isinstance(v.type, TensorType)
        and isinstance(v.type.dtype, DType)
        and v.type.dtype.is_float
    ]
    bound = max(floats, default=0.0)
    bound = INF if math.isnan(bound) else bound
    # an unbounded error upstream can still be bounded downstream (a norm's range): B stands
    return Composition(bound, outs, blocker if math.isinf(bound) else None)


def quant_weight_error(
    w: np.ndarray, packed: Any, scales: np.ndarray, zp: Any, kn: bool
) -> tuple[np.ndarray, str | None]:
    """(s/2 per weight, the precondition's failure): the quantizer lemma |w - q*s| <= s/2 holds
    for these codes exactly when every dequantized weight is within half its block's scale."""
    from llmir_core.quant import dequantize

    q = getattr(packed, "qtype", None)
    if not isinstance(q, QuantType):
        return np.zeros(0), "the codes are not a block-quantized weight"
    wt = np.asarray(w, np.float64).T if kn else np.asarray(w, np.float64)
    s = np.abs(np.asarray(scales, np.float64)).reshape(wt.shape[0], -1)
    half = np.repeat(s, q.block, axis=1)[:, : wt.shape[1]] / 2.0
    deq = np.asarray(dequantize(packed, scales, zp), np.float64).reshape(wt.shape)
    excess = np.abs(deq - wt) - half * (1 + 1e-6) - 1e-12
    if (excess > 0).any():
        j = tuple(int(i) for i in np.argwhere(excess > 0)[0])
        return half, (
            f"weight {list(j)}: dequantized {deq[j]:.6g} is not within scale/2 = {half[j]:.3g} "
            f"of {wt[j]:.6g}"
        )
    return (half.T if kn else half), None


__all__ = ["Ranges", "compose", "op_error", "quant_weight_error", "Composition", "INF"]
