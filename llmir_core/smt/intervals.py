"""Interval analysis and `verify_invariant` expressions.

`analyze(module, input_range)` propagates a value range [lo, hi] through every op by the rule on
its declaration (`OpDef.interval`, sound over-approximations in `llmir_core.dialects.ranges`: a
matmul is bounded by K * max|a| * max|b|, an RMSNorm by sqrt(n) * max|w|, attention by the range
of V, sigmoid/tanh/softmax by their images; no rule: unbounded) and reports, for every
f16 value, whether overflow (|x| > 65504) is excluded. Quantized values are covered by the proved
error-bound rules (codes always fit: `quant-int8-sym-error-bound`, `quant-int4-sym-error-bound`).

Invariant expressions (`docs/optimize.md` has the grammar): comparisons of arithmetic over
`output`, `output[i]`, operand names and numbers, with `sum/max/min/mean(e[, axis])`, `abs(e)`,
`softmax(e[, axis])`, and an optional tolerance `== 1.0 +- 1e-5`. `check_invariant` decides one
by SMT where it can (softmax normalisation for a symbolic row length) and by intervals otherwise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from llmir_core.dialects import ranges
from llmir_core.errors import InputError
from llmir_core.ir.core import Module, Op
from llmir_core.ir.types import DType, TensorType

INF = math.inf
F16_MAX = 65504.0
Iv = tuple[float, float]


_mul, _absmax = ranges.mul, ranges.absmax


def _bool_result(op: Op) -> bool:
    return any(isinstance(r.type, TensorType) and r.type.dtype == DType.bool for r in op.results)


def interval_rule(name: str) -> tuple[str, Any]:
    """(where the rule comes from, the rule) for op `name`: `explicit` (its declaration's
    `interval`) or `fallback` ([0, 1] for bool results, unbounded otherwise)."""
    from llmir_core.dialects.registry import get_op

    od = get_op(name)
    if od is not None and od.interval is not None:
        return "explicit", od.interval
    return "fallback", lambda op, ins, env, md: (0.0, 1.0) if _bool_result(op) else (-INF, INF)


def _op_range(op: Op, ins: list[Iv], env: dict[str, int], max_dim: int) -> Iv:
    _, rule = interval_rule(op.name)
    r: Iv = rule(op, ins if ins else [(-INF, INF)], env, max_dim)
    return r


@dataclass
class RangeReport:
    ranges: dict[str, Iv]
    f16_risks: list[str]
    f16_values: int
    outputs: list[Iv]

    def to_json(self) -> dict[str, Any]:
        return {
            "outputs": [list(r) for r in self.outputs],
            "f16_values": self.f16_values,
            "f16_overflow_possible": self.f16_risks,
            "f16_overflow_excluded": not self.f16_risks,
        }


def analyze(
    module: Module,
    input_range: Iv = (-1.0, 1.0),
    arg_ranges: dict[str, Iv] | None = None,
    dims: dict[str, int] | None = None,
    max_dim: int = 4096,
) -> RangeReport:
    fn = module.main
    env = dict(dims or {})
    ranges: dict[str, Iv] = {}
    by_id: dict[int, Iv] = {}
    for a in fn.args:
        t = a.type
        r = (arg_ranges or {}).get(a.name, input_range)
        if isinstance(t, TensorType) and isinstance(t.dtype, DType) and not t.dtype.is_float:
            r = (0.0, float(2 ** (t.dtype.bits - 1)))
        by_id[id(a)] = r
        ranges[a.name] = r
    risks: list[str] = []
    n16 = 0
    for op in fn.ops:
        ins = [by_id.get(id(v), (-INF, INF)) for v in op.operands]
        try:
            r = _op_range(op, ins, env, max_dim)
        except Exception:  # noqa: BLE001 - unknown structure: no bound
            r = (-INF, INF)
        for res in op.results:
            by_id[id(res)] = r
            ranges[res.name] = r
            t = res.type
            if isinstance(t, TensorType) and t.dtype == DType.f16:
                n16 += 1
                if _absmax(r) > F16_MAX:
                    where = f" at {op.pos}" if op.pos else ""
                    risks.append(
                        f"%{res.name} ({op.name}{where}) may reach {_absmax(r):.3g} > 65504"
                    )
    return RangeReport(ranges, risks, n16, [by_id.get(id(v), (-INF, INF)) for v in fn.outputs])


# -- invariant expressions ------------------------------------------------------------------

_TOK = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\+-|==|!=|<=|>=|[-+*/()<>\[\],]))"
)


class InvariantSyntaxError(InputError):
    def __init__(self, message: str, text: str, col: int) -> None:
        super().__init__(
            f"invariant {text!r}, column {col + 1}: {message}",
            hint="see docs/optimize.md, 'Invariant expressions'",
        )
        self.col = col


@dataclass(frozen=True)
class Node:
    kind: str  # num, name, index, call, bin, cmp
    value: Any = None
    args: tuple[Any, ...] = ()


def parse_invariant(text: str) -> Node:
    """`lhs CMP rhs [+- tol]` (arithmetic over names, `name[i]`, numbers and the functions
    sum, max, min, mean, abs, softmax) as a `cmp` node; InvariantSyntaxError with the column."""
    return _InvariantParser(text).invariant()


_FUNCTIONS = ("sum", "max", "min", "mean", "abs", "softmax")


def _invariant_tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, column) tokens, ending with an `eof` token."""
    toks: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOK.match(text, pos)
        if not m or m.end() == pos:
            raise InvariantSyntaxError(
                f"unexpected character {text[pos:].lstrip()[0]!r}",
                text,
                len(text) - len(text[pos:].lstrip()),
            )
        kind = m.lastgroup or "op"
        toks.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    toks.append(("eof", "", len(text)))
    return toks


class _InvariantParser:
    """A recursive-descent parser over the tokens of one invariant."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _invariant_tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i]

    def take(self, want: str | None = None) -> tuple[str, str, int]:
        tok = self.toks[self.i]
        if want is not None and tok[1] != want:
            raise InvariantSyntaxError(
                f"expected {want!r}, found {tok[1] or 'end of text'!r}", self.text, tok[2]
            )
        self.i += 1
        return tok

    def invariant(self) -> Node:
        lhs = self.arith()
        kind, op, col = self.peek()
        if op not in ("==", "!=", "<=", ">=", "<", ">"):
            raise InvariantSyntaxError(
                "expected a comparison (==, <=, >=, <, >, !=)", self.text, col
            )
        self.take()
        rhs = self.arith()
        tol = 0.0
        if self.peek()[1] == "+-":
            self.take()
            k, v, c3 = self.take()
            if k != "num":
                raise InvariantSyntaxError("expected a tolerance number after +-", self.text, c3)
            tol = float(v)
        if self.peek()[0] != "eof":
            raise InvariantSyntaxError(
                f"unexpected {self.peek()[1]!r} after the comparison", self.text, self.peek()[2]
            )
        return Node("cmp", op, (lhs, rhs, Node("num", tol)))

    def arith(self) -> Node:
        e = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            e = Node("bin", op, (e, self.term()))
        return e

    def term(self) -> Node:
        e = self.primary()
        while self.peek()[1] in ("*", "/"):
            op = self.take()[1]
            e = Node("bin", op, (e, self.primary()))
        return e

    def primary(self) -> Node:
        kind, val, col = self.take()
        if kind == "num":
            return Node("num", float(val))
        if val == "-":
            return Node("bin", "-", (Node("num", 0.0), self.primary()))
        if val == "(":
            e = self.arith()
            self.take(")")
            return e
        if kind == "name":
            return self.call(val, col) if self.peek()[1] == "(" else self.name(val)
        raise InvariantSyntaxError(f"unexpected {val or 'end of text'!r}", self.text, col)

    def call(self, val: str, col: int) -> Node:
        self.take("(")
        args = [self.arith()]
        while self.peek()[1] == ",":
            self.take(",")
            args.append(self.arith())
        self.take(")")
        if val not in _FUNCTIONS:
            raise InvariantSyntaxError(
                f"unknown function {val!r} (sum, max, min, mean, abs, softmax)", self.text, col
            )
        return Node("call", val, tuple(args))

    def name(self, val: str) -> Node:
        if self.peek()[1] != "[":
            return Node("name", val)
        self.take("[")
        k, idx, c2 = self.take()
        if k != "num":
            raise InvariantSyntaxError("expected an index", self.text, c2)
        self.take("]")
        return Node("index", val, (int(float(idx)),))


def _softmax_normalized_job(limit_s: float) -> dict[str, Any]:
    """sum_i softmax(x)_i == 1 for a symbolic row length n >= 1 (ground lemmas: a sum of
    positive terms is positive; dividing every term by a constant divides the sum)."""
    import z3

    from .semantics import Encoder, STensor

    enc = Encoder()
    n = z3.Int("n")
    xf = z3.Function("x", z3.IntSort(), z3.RealSort())
    x = STensor((n,), lambda i: xf(i[0]))
    sm = enc.softmax(x, -1)
    total = enc.sum(n, lambda k: sm.f((k,)))
    mx = enc.max_fn(n, z3.Lambda([z3.Int("k1")], xf(z3.Int("k1"))))
    k = z3.Int("k1")
    e_body = z3.simplify(enc.exp(xf(k) - mx), som=True)
    denom = enc.sum_fn(n, z3.Lambda([k], e_body))
    numer = enc.sum_fn(n, z3.Lambda([k], e_body))
    lemmas = enc.lemmas() + [
        denom > 0,  # sum of exp > 0 for n >= 1
        total == numer / denom,  # linearity: sum_i (e_i / S) == (sum_i e_i) / S
    ]
    s = z3.Solver()
    s.set("timeout", int(limit_s * 1000))
    s.add(n >= 1, *lemmas)
    s.add(total != 1)
    r = s.check()
    return {"verdict": "unsat" if r == z3.unsat else ("sat" if r == z3.sat else "unknown")}


def check_invariant(text: str, op: Op, report: RangeReport, limit_s: float = 5.0) -> dict[str, Any]:
    """Decide one invariant on `op`: `proved` (SMT or intervals), `violated`, or `unknown`."""
    node = parse_invariant(text)
    lhs, rhs, tol = node.args
    # SMT: softmax normalisation over a symbolic row length
    if (
        lhs.kind == "call"
        and lhs.value == "sum"
        and lhs.args
        and lhs.args[0].kind == "call"
        and lhs.args[0].value == "softmax"
        and rhs.kind == "num"
        and node.value == "=="
    ):
        from .solver import run_job

        res = run_job(_softmax_normalized_job, limit_s, limit_s=limit_s)
        ok = res["verdict"] == "unsat" and abs(rhs.value - 1.0) <= tol.value
        return {"invariant": text, "verdict": "proved" if ok else "unknown", "method": "smt"}
    env = {}
    for i, r in enumerate(op.results):
        env[f"output[{i}]"] = report.ranges.get(r.name, (-INF, INF))
    if op.results:
        env["output"] = env["output[0]"]
    for v in op.operands:
        env[v.name] = report.ranges.get(v.name, (-INF, INF))
    try:
        a, b = _iv(lhs, env), _iv(rhs, env)
    except KeyError as exc:
        raise InputError(
            f"invariant {text!r}: unknown name {exc}",
            hint="use output, output[i] or an operand name",
        ) from None
    t = tol.value
    op_ = node.value
    holds = {
        "<=": a[1] <= b[0] + t,
        "<": a[1] < b[0] + t,
        ">=": a[0] >= b[1] - t,
        ">": a[0] > b[1] - t,
        "==": a[1] - b[0] <= t and b[1] - a[0] <= t,
        "!=": a[1] < b[0] or b[1] < a[0],
    }
    fails = {
        "<=": a[0] > b[1] + t,
        "<": a[0] >= b[1] + t,
        ">=": a[1] < b[0] - t,
        ">": a[1] <= b[0] - t,
        "==": a[0] > b[1] + t or b[0] > a[1] + t,
        "!=": False,
    }
    verdict = "proved" if holds[op_] else ("violated" if fails[op_] else "unknown")
    return {
        "invariant": text,
        "verdict": verdict,
        "method": "intervals",
        "lhs": list(a),
        "rhs": list(b),
    }


def _iv(n: Node, env: dict[str, Iv]) -> Iv:
    if n.kind == "num":
        return (n.value, n.value)
    if n.kind == "name":
        return env[n.value]
    if n.kind == "index":
        return env[f"{n.value}[{n.args[0]}]"]
    if n.kind == "bin":
        a, b = _iv(n.args[0], env), _iv(n.args[1], env)
        if n.value == "+":
            return (a[0] + b[0], a[1] + b[1])
        if n.value == "-":
            return (a[0] - b[1], a[1] - b[0])
        if n.value == "*":
            return _mul(a, b)
        return (-INF, INF) if b[0] <= 0 <= b[1] else _mul(a, (1 / b[1], 1 / b[0]))
    a = _iv(n.args[0], env)
    if n.value == "abs":
        return (0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1])), _absmax(a))
    if n.value in ("max", "min", "mean"):
        return a
    if n.value == "softmax":
        return (0.0, 1.0)
    return (-INF, INF)  # sum over an unknown length
