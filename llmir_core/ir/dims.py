"""Symbolic dimensions: integer polynomials over named size variables.

A dimension is one of:
- a static size (`int`),
- the anonymous dynamic size `?` (the constant `DYN`), unknown and unrelated to any other,
- a named symbolic size, or a polynomial over names (`?past+?seq`, `2*?seq`, `?batch*?seq`),
  represented by `SymDim` in a canonical form so equal expressions compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


class _Dyn:
    """The anonymous dynamic dimension `?`."""

    _inst: _Dyn | None = None

    def __new__(cls) -> _Dyn:
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "?"

    def __reduce__(self) -> str:
        return "DYN"


DYN = _Dyn()

Monomial = tuple[str, ...]  # sorted names, with repetition for powers


@dataclass(frozen=True)
class SymDim:
    """A polynomial in named sizes with integer coefficients, in canonical order."""

    terms: tuple[tuple[Monomial, int], ...]  # sorted by monomial; no zero coefficients
    const: int = 0

    @staticmethod
    def name(n: str) -> SymDim:
        return SymDim((((n,), 1),), 0)

    def names(self) -> set[str]:
        return {n for mono, _ in self.terms for n in mono}

    def __str__(self) -> str:
        return format_dim(self)


Dim = Union[int, _Dyn, SymDim]


def _make(terms: dict[Monomial, int], const: int) -> Dim:
    items = tuple(sorted((m, c) for m, c in terms.items() if c != 0))
    if not items:
        return const
    return SymDim(items, const)


def _as_poly(d: Dim) -> tuple[dict[Monomial, int], int] | None:
    if isinstance(d, int):
        return {}, d
    if isinstance(d, SymDim):
        return dict(d.terms), d.const
    return None


def dim_add(a: Dim, b: Dim, sign: int = 1) -> Dim:
    pa, pb = _as_poly(a), _as_poly(b)
    if pa is None or pb is None:
        return DYN
    terms = dict(pa[0])
    for m, c in pb[0].items():
        terms[m] = terms.get(m, 0) + sign * c
    return _make(terms, pa[1] + sign * pb[1])


def dim_sub(a: Dim, b: Dim) -> Dim:
    return dim_add(a, b, -1)


def dim_mul(a: Dim, b: Dim) -> Dim:
    pa, pb = _as_poly(a), _as_poly(b)
    if pa is None or pb is None:
        return DYN
    terms: dict[Monomial, int] = {}
    ta = list(pa[0].items()) + ([((), pa[1])] if pa[1] else [])
    tb = list(pb[0].items()) + ([((), pb[1])] if pb[1] else [])
    const = 0
    for ma, ca in ta:
        for mb, cb in tb:
            m = tuple(sorted(ma + mb))
            if m == ():
                const += ca * cb
            else:
                terms[m] = terms.get(m, 0) + ca * cb
    return _make(terms, const)


def dim_div_exact(a: Dim, b: Dim) -> Dim:
    """a / b when the division is exact in the polynomial ring, else DYN."""
    if isinstance(a, int) and isinstance(b, int):
        if b != 0 and a % b == 0:
            return a // b
        return DYN
    pa, pb = _as_poly(a), _as_poly(b)
    if pa is None or pb is None:
        return DYN
    if isinstance(b, int):
        if b == 0 or pa[1] % b or any(c % b for c in pa[0].values()):
            return DYN
        return _make({m: c // b for m, c in pa[0].items()}, pa[1] // b)
    # divide by a single monomial with coefficient
    if pb[1] != 0 or len(pb[0]) != 1 or pa[1] != 0:
        return DYN
    ((mb, cb),) = pb[0].items()
    out: dict[Monomial, int] = {}
    const = 0
    for ma, ca in pa[0].items():
        rest = list(ma)
        for n in mb:
            if n not in rest:
                return DYN
            rest.remove(n)
        if ca % cb:
            return DYN
        if rest:
            out[tuple(rest)] = ca // cb
        else:
            const += ca // cb
    return _make(out, const)


def dims_compatible(a: Dim, b: Dim) -> bool:
    """Could be equal: DYN matches anything; otherwise structurally equal."""
    if a is DYN or b is DYN:
        return True
    return a == b


def eval_dim(d: Dim, env: dict[str, int]) -> int | None:
    """Evaluate under a binding of names; None if a name is unbound or d is DYN."""
    if isinstance(d, int):
        return d
    if d is DYN or not isinstance(d, SymDim):
        return None
    total = d.const
    for mono, c in d.terms:
        v = c
        for n in mono:
            if n not in env:
                return None
            v *= env[n]
        total += v
    return total


def _format_mono(mono: Monomial, coef: int) -> str:
    body = "*".join(f"?{n}" for n in mono)
    if coef == 1:
        return body
    if coef == -1:
        return "-" + body
    return f"{coef}*{body}"


def format_dim(d: Dim) -> str:
    if isinstance(d, int):
        return str(d)
    if d is DYN:
        return "?"
    assert isinstance(d, SymDim)
    out = ""
    for i, (mono, c) in enumerate(d.terms):
        s = _format_mono(mono, c)
        if i and not s.startswith("-"):
            out += "+"
        out += s
    if d.const > 0:
        out += f"+{d.const}"
    elif d.const < 0:
        out += str(d.const)
    return out
