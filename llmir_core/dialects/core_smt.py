"""Element-level SMT encodings of the `core` ops (each declaration names its own with
`smt=lazy("llmir_core.dialects.core_smt:NAME")`).

An encoding takes the encoder (`llmir_core.smt.semantics.Encoder`, whose helpers do the shared
work: broadcasting, sums, reductions, matmul), the operands as symbolic tensors and the
attributes (defaults filled) and returns the result tensor(s). Transcendental functions are
uninterpreted (`enc.uf`), with the ground lemmas the encoder adds. Attribute values the prover
passes as hints start with `__` (`__from__`, `__merge__`, `__shape__`, `__neg_inf__`).

Imports z3 at the top: only the solver child and tests import this module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import z3

from llmir_core.smt.semantics import EncodeError, Encoder, MaskTensor, STensor, shift

Idx = tuple[Any, ...]
Args = Sequence[STensor]
At = dict[str, Any]


def _ew(fn: Callable[[Encoder, Any, Any], Any]) -> Callable[[Encoder, Args, At], STensor]:
    return lambda enc, a, at: enc.elementwise(lambda x, y: fn(enc, x, y), a[0], a[1])


def _ew1(fn: Callable[[Encoder, Any], Any]) -> Callable[[Encoder, Args, At], STensor]:
    return lambda enc, a, at: enc.elementwise(lambda x: fn(enc, x), a[0])


def _uf1(name: str) -> Callable[[Encoder, Args, At], STensor]:
    return lambda enc, a, at: enc.apply_uf(name, a[0])


# -- elementwise ---------------------------------------------------------------------------------


def add(enc: Encoder, args: Args, attrs: At) -> STensor:
    if any(isinstance(a, MaskTensor) for a in args):  # x + (-inf where masked, else 0)
        m = next(a for a in args if isinstance(a, MaskTensor))
        x = next((a for a in args if a is not m), None)
        if x is None or isinstance(x, MaskTensor):
            raise EncodeError("adding two masks is not encoded")
        shape, maps = enc.broadcast(*args)
        mi = list(args).index(m)
        return STensor(
            shape, lambda i: z3.If(m.cond(maps[mi](i)), enc.neg_inf, x.f(maps[1 - mi](i)))
        )
    return enc.elementwise(lambda a, b: a + b, *args)


sub = _ew(lambda e, a, b: a - b)
mul = _ew(lambda e, a, b: a * b)
div = _ew(lambda e, a, b: a / b)
max_ = _ew(lambda e, a, b: z3.If(a >= b, a, b))
min_ = _ew(lambda e, a, b: z3.If(a <= b, a, b))
mod = _ew(lambda e, a, b: e.uf("mod", 2)(e.as_real(a), e.as_real(b)))
equal = _ew(lambda e, a, b: a == b)
not_equal = _ew(lambda e, a, b: a != b)
less = _ew(lambda e, a, b: a < b)
less_equal = _ew(lambda e, a, b: a <= b)
greater = _ew(lambda e, a, b: a > b)
greater_equal = _ew(lambda e, a, b: a >= b)
and_ = _ew(lambda e, a, b: z3.And(e.as_bool(a), e.as_bool(b)))
or_ = _ew(lambda e, a, b: z3.Or(e.as_bool(a), e.as_bool(b)))
xor = _ew(lambda e, a, b: z3.Xor(e.as_bool(a), e.as_bool(b)))
not_ = _ew1(lambda e, x: z3.Not(e.as_bool(x)))

neg = _ew1(lambda e, x: -x)
abs_ = _ew1(lambda e, x: z3.If(x >= 0, x, -x))
relu = _ew1(lambda e, x: z3.If(x > 0, x, 0))
exp = _ew1(lambda e, x: e.exp(x))
sqrt = _ew1(lambda e, x: e.sqrt(x))
rsqrt = _ew1(lambda e, x: e.rsqrt(x))
reciprocal = _ew1(lambda e, x: 1 / x)
sigmoid = _ew1(lambda e, x: e.sigmoid(x))
silu = _ew1(lambda e, x: e.silu(x))
sign = _ew1(lambda e, x: z3.If(x > 0, 1, z3.If(x < 0, -1, 0)))
# no closed form over the reals: uninterpreted functions of one element
log, tanh, erf, sin, cos, floor, ceil, round_ = (
    _uf1(n) for n in ("log", "tanh", "erf", "sin", "cos", "floor", "ceil", "round")
)


def gelu(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.gelu(args[0], attrs["approximate"])


def pow_(enc: Encoder, args: Args, attrs: At) -> STensor:
    a, b = args
    if b.rank == 0:
        e = z3.simplify(b.f(()))
        if z3.is_rational_value(e) and e.as_fraction() == 2:
            return STensor(a.shape, lambda i: a.f(i) * a.f(i))
    return enc.elementwise(enc.uf("pow", 2), a, b)


def where(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.elementwise(lambda c, a, b: z3.If(enc.as_bool(c), a, b), *args)


def cast(enc: Encoder, args: Args, attrs: At) -> STensor:
    """Identity from a dtype to itself; otherwise rounding to `to`, uninterpreted per dtype."""
    x = args[0]
    if str(attrs.get("to")) == str(attrs.get("__from__", attrs.get("to"))):
        return x
    return enc.apply_uf(f"cast_{attrs['to']}", x)


def identity(enc: Encoder, args: Args, attrs: At) -> STensor:
    return args[0]


def constant(enc: Encoder, args: Args, attrs: At) -> STensor:
    """A splat is its value; a small array an if-chain over the flat index; a larger one an
    uninterpreted function named by its contents' hash (equal constants meet)."""
    arr = np.asarray(attrs["value"].array)
    shape = tuple(int(d) for d in arr.shape)
    flat = arr.reshape(-1)
    vals = [enc.as_real(v.item() if not isinstance(v, (bool, np.bool_)) else bool(v)) for v in flat]
    if flat.size and bool(np.all(flat == flat[0])):
        return STensor(shape, lambda i: vals[0])
    if flat.size <= 64:

        def f(i: Idx) -> Any:
            lin = _linear(i, shape)
            out = vals[-1]
            for j in range(len(vals) - 2, -1, -1):
                out = z3.If(lin == j, vals[j], out)
            return out

        return STensor(shape, f)
    digest = hashlib.sha1(arr.tobytes() + str(arr.dtype).encode()).hexdigest()[:12]
    g = z3.Function(f"const_{digest}", *([z3.IntSort()] * len(shape)), z3.RealSort())
    return STensor(shape, lambda i: g(*i))


def _linear(i: Idx, shape: Sequence[Any]) -> Any:
    lin: Any = 0
    for v, d in zip(i, shape):
        lin = lin * d + v
    return lin


def _unflatten(lin: Any, shape: Sequence[Any]) -> Idx:
    out: list[Any] = []
    for d in reversed(shape):
        out.append(lin % d)
        lin = lin / d
    return tuple(reversed(out))


# -- matmul, reductions --------------------------------------------------------------------------


def matmul(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.matmul(
        args[0], args[1], bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    )


def _reduce(kind: str) -> Callable[[Encoder, Args, At], STensor]:
    return lambda enc, a, at: enc.reduce(a[0], at.get("axes", ()), at.get("keepdims", True), kind)


reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_prod = (
    _reduce(k) for k in ("sum", "mean", "max", "min", "prod")
)


def _arg(kind: str) -> Callable[[Encoder, Args, At], STensor]:
    def enc_arg(enc: Encoder, args: Args, attrs: At) -> STensor:
        x = args[0]
        ax = attrs["axis"] % x.rank
        keep = attrs["keepdims"]
        name = f"{kind}{'_last' if attrs['select_last_index'] else ''}"
        shape = tuple((1 if i == ax else d) for i, d in enumerate(x.shape) if keep or i != ax)

        def f(idx: Idx) -> Any:
            full = list(idx) if keep else list(idx[:ax]) + [0] + list(idx[ax:])
            return enc.reduction(
                name, x.shape[ax], lambda k: x.f(tuple(full[:ax]) + (k,) + tuple(full[ax + 1 :]))
            )

        return STensor(shape, f)

    return enc_arg


argmax, argmin = _arg("argmax"), _arg("argmin")


def softmax(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.softmax(args[0], attrs.get("axis", -1))


def log_softmax(enc: Encoder, args: Args, attrs: At) -> STensor:
    """x - max - log(sum(exp(x - max)))."""
    x = args[0]
    ax = attrs.get("axis", -1) % x.rank
    mx = enc.reduce(x, (ax,), True, "max")
    c = STensor(x.shape, lambda i: x.f(i) - mx.f(_zero(i, ax)))
    s = enc.reduce(STensor(x.shape, lambda i: enc.exp(c.f(i))), (ax,), True, "sum")
    return STensor(x.shape, lambda i: c.f(i) - enc.uf("log")(s.f(_zero(i, ax))))


def _zero(i: Idx, ax: int) -> Idx:
    return tuple(0 if j == ax else v for j, v in enumerate(i))


def cumsum(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    ax = attrs["axis"] % x.rank
    n = x.shape[ax]
    excl, rev = attrs["exclusive"], attrs["reverse"]

    def f(i: Idx) -> Any:
        p = i[ax]
        if rev:  # elements p (p + 1 when exclusive) .. n - 1
            start = p + 1 if excl else p
            count = n - start
        else:  # elements 0 .. p (p - 1 when exclusive)
            start, count = 0, (p if excl else p + 1)
        return enc.sum(
            count, lambda k: x.f(tuple(k + start if j == ax else v for j, v in enumerate(i)))
        )

    return STensor(x.shape, f)


def top_k(enc: Encoder, args: Args, attrs: At) -> list[STensor]:
    """values[.., j] and indices[.., j]: the j-th of the row's k extreme entries, uninterpreted
    functions of the row (as a lambda), j, and the order (largest, sorted)."""
    x = args[0]
    ax = attrs["axis"] % x.rank
    k = attrs["k"]
    tag = f"{'largest' if attrs['largest'] else 'smallest'}{'_sorted' if attrs['sorted'] else ''}"
    arr = z3.ArraySort(z3.IntSort(), z3.RealSort())
    vf = z3.Function(f"topk_values_{tag}", z3.IntSort(), z3.IntSort(), arr, z3.RealSort())
    jf = z3.Function(f"topk_indices_{tag}", z3.IntSort(), z3.IntSort(), arr, z3.IntSort())
    shape = tuple(k if i == ax else d for i, d in enumerate(x.shape))
    n = x.shape[ax]
    nn = n if not isinstance(n, int) else z3.IntVal(n)

    def row(i: Idx) -> Any:
        kk, e = enc.bound(lambda q: x.f(tuple(q if j == ax else v for j, v in enumerate(i))))
        return z3.Lambda([kk], e)

    return [
        STensor(shape, lambda i: vf(nn, i[ax], row(i))),
        STensor(shape, lambda i: jf(nn, i[ax], row(i))),
    ]


# -- shapes ----------------------------------------------------------------------------------


def transpose(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    perm = attrs.get("perm") or tuple(range(x.rank - 1, -1, -1))
    return enc.transpose(x, perm)


def concat(enc: Encoder, args: Args, attrs: At) -> STensor:
    return enc.concat(args, attrs["axis"])


def split(enc: Encoder, args: Args, attrs: At) -> list[STensor]:
    x = args[0]
    ax = attrs["axis"] % x.rank
    sizes = attrs.get("sizes") or ()
    if not sizes:
        n, parts = x.shape[ax], attrs.get("num_outputs", 0)
        if not parts:
            raise EncodeError("a split with neither sizes nor num_outputs has no parts")
        if isinstance(n, int):
            step = -(-n // parts)
            sizes = tuple(min(step, n - j * step) for j in range(parts))
        else:  # ceil(n / parts) each, the last the rest (z3 integer arithmetic)
            step_ = (n + parts - 1) / parts
            sizes = tuple(z3.If(step_ < n - j * step_, step_, n - j * step_) for j in range(parts))
    outs, off = [], 0
    for s in sizes:
        shape = tuple(s if i == ax else d for i, d in enumerate(x.shape))
        outs.append(STensor(shape, (lambda o: lambda idx: x.f(shift(idx, ax, o)))(off)))
        off = off + s
    return outs


def slice_(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    axes = attrs.get("axes") or tuple(range(len(attrs["starts"])))
    steps = attrs.get("steps") or (1,) * len(axes)
    shape = list(x.shape)
    starts: list[Any] = [0] * x.rank
    stride: list[Any] = [1] * x.rank
    for ax, s0, e, st in zip(axes, attrs["starts"], attrs["ends"], steps):
        a = ax % x.rank
        d = x.shape[a]
        if isinstance(d, int):  # a concrete dim: numpy's clamping, any step
            lo, hi, step = _py_slice(d, s0, e, st)
            shape[a] = len(range(lo, hi, step))
            starts[a], stride[a] = lo, step
            continue
        if st == 1 and not (isinstance(s0, int) and s0 < 0) and not (isinstance(e, int) and e < 0):
            end = d if isinstance(e, int) and e >= 2**62 else e
            shape[a] = end - s0
            starts[a] = s0
            continue
        if not isinstance(st, int) or st < 1:
            raise EncodeError(
                "a slice of a symbolic dim with a negative step is not encoded (its start "
                "clamps to the dim's end, which is not known)"
            )
        lo = _sym_bound(d, s0)
        hi = _sym_bound(d, e)
        shape[a] = z3.If(hi > lo, (hi - lo + st - 1) / st, 0)
        starts[a], stride[a] = lo, st

    def f(i: Idx) -> Any:
        return x.f(
            tuple(
                (v if isinstance(s, int) and s == 0 else v + s) if st == 1 else s + v * st
                for v, s, st in zip(i, starts, stride)
            )
        )

    return STensor(tuple(shape), f)


def _sym_bound(d: Any, v: Any) -> Any:
    """A slice bound of a symbolic dim d as numpy clamps it for a positive step: v < 0 counts
    from the end; the result lies in [0, d]."""
    if isinstance(v, int) and v >= 2**62:
        return d
    if isinstance(v, int) and v >= 0:
        return z3.If(d < v, d, z3.IntVal(v)) if v > 0 else z3.IntVal(0)
    w = d + v
    return z3.If(w < 0, z3.IntVal(0), w)


def _py_slice(d: int, s: int, e: int, st: int) -> tuple[int, int, int]:
    return slice(s, e, st).indices(d)


def unsqueeze(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    rank = x.rank + len(attrs["axes"])
    axes = sorted(a % rank for a in attrs["axes"])
    shape: list[Any] = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return STensor(tuple(shape), lambda i: x.f(tuple(v for j, v in enumerate(i) if j not in axes)))


def squeeze(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    axes = {a % x.rank for a in attrs.get("axes", ())} or {
        i for i, d in enumerate(x.shape) if isinstance(d, int) and d == 1
    }
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)

    def f(i: Idx) -> Any:
        it = iter(i)
        return x.f(tuple(0 if j in axes else next(it) for j in range(x.rank)))

    return STensor(shape, f)


def expand(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    target = STensor(tuple(_dim(d) for d in attrs["shape"]), lambda i: 0)
    shape, (mx, _) = enc.broadcast(x, target)
    return STensor(shape, lambda i: x.f(mx(i)))


def _dim(d: Any) -> Any:
    return d if isinstance(d, int) else z3.Int(str(d).lstrip("?") or "d")


def tile(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    reps = attrs["repeats"]
    shape = tuple(
        d if isinstance(r, int) and r == 1 else (r if isinstance(d, int) and d == 1 else d * r)
        for d, r in zip(x.shape, reps)
    )

    def f(i: Idx) -> Any:
        return x.f(
            tuple(
                v
                if isinstance(r, int) and r == 1
                else (0 if isinstance(d, int) and d == 1 else v % d)
                for v, d, r in zip(i, x.shape, reps)
            )
        )

    return STensor(shape, f)


def pad(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    pads = attrs["pads"]
    r = x.rank
    if any(p < 0 for p in pads):
        raise EncodeError("negative pads (crops) are not encoded")
    before, after = pads[:r], pads[r:]
    shape = tuple(d + b + a for d, b, a in zip(x.shape, before, after))
    mode = attrs["mode"]
    value = enc.as_real(float(attrs["value"]))

    def f(i: Idx) -> Any:
        src = [v - b for v, b in zip(i, before)]
        if mode == "constant":
            inside = z3.And([z3.And(s >= 0, s < d) for s, d in zip(src, x.shape)] or [True])
            return z3.If(inside, x.f(tuple(src)), value)
        if mode == "edge":
            return x.f(
                tuple(z3.If(s < 0, 0, z3.If(s >= d, d - 1, s)) for s, d in zip(src, x.shape))
            )
        if mode == "reflect":
            return x.f(
                tuple(
                    z3.If(s < 0, -s, z3.If(s >= d, 2 * (d - 1) - s, s))
                    for s, d in zip(src, x.shape)
                )
            )
        raise EncodeError(f"pad mode {mode!r} is not encoded")

    return STensor(shape, f)


def flatten(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    ax = attrs["axis"] % (x.rank + 1) if attrs["axis"] != x.rank else x.rank
    outer, inner = x.shape[:ax], x.shape[ax:]
    shape = (_prod(outer), _prod(inner))
    return STensor(shape, lambda i: x.f(_unflatten(i[0], outer) + _unflatten(i[1], inner)))


def _prod(ds: Sequence[Any]) -> Any:
    out: Any = 1
    for d in ds:
        out = out * d
    return out


def reshape(enc: Encoder, args: Args, attrs: At) -> STensor:
    """Merging two adjacent dims (the `__merge__` hint of the GQA repeat), or any reshape of a
    tensor of known shape (through the row-major flat index)."""
    x = args[0]
    at = attrs.get("__merge__")
    if at is not None and x.rank >= 2:
        inner = x.shape[at + 1]
        shape = tuple(x.shape[:at]) + (x.shape[at] * inner,) + tuple(x.shape[at + 2 :])
        return STensor(
            shape,
            lambda i: x.f(tuple(i[:at]) + (i[at] / inner, i[at] % inner) + tuple(i[at + 1 :])),
        )
    total: Any = 1
    for d in x.shape:
        total = total * d
    want: list[Any] = [
        x.shape[j] if isinstance(d, int) and d == 0 and not attrs.get("allowzero") else d
        for j, d in enumerate(attrs["shape"])
    ]
    if any(isinstance(d, int) and d == -1 for d in want):
        at_ = next(j for j, d in enumerate(want) if isinstance(d, int) and d == -1)
        known: Any = 1
        for j, d in enumerate(want):
            if j != at_:
                known = known * d
        if isinstance(total, int) and isinstance(known, int):
            want[at_] = total // known if known else 0
        elif isinstance(known, int) and known == 0:
            want[at_] = 0
        else:  # symbolic: the quotient of the element count (integer division of z3 Ints)
            want[at_] = total / known
    out = tuple(want)
    return STensor(out, lambda i: x.f(_unflatten(_linear(i, out), x.shape)))


def gather(enc: Encoder, args: Args, attrs: At) -> STensor:
    x, idx = args
    ax = attrs.get("axis", 0) % x.rank
    n = idx.rank

    def f(i: Idx) -> Any:
        j = enc.as_int(idx.f(tuple(i[ax : ax + n])))
        j = z3.If(j < 0, j + x.shape[ax], j)
        return x.f(tuple(i[:ax]) + (j,) + tuple(i[ax + n :]))

    if ax == 0:  # the common case: no wrap for negative indices (the prover's normal form)

        def f0(i: Idx) -> Any:
            return x.f((enc.as_int(idx.f(i[:n])),) + tuple(i[n:]))

        return STensor(tuple(idx.shape) + tuple(x.shape[1:]), f0)
    return STensor(tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1 :]), f)


def gather_elements(enc: Encoder, args: Args, attrs: At) -> STensor:
    x, idx = args
    ax = attrs.get("axis", 0) % x.rank

    def f(i: Idx) -> Any:
        j = enc.as_int(idx.f(i))
        j = z3.If(j < 0, j + x.shape[ax], j)
        return x.f(tuple(j if a == ax else v for a, v in enumerate(i)))

    return STensor(idx.shape, f)


def shape(enc: Encoder, args: Args, attrs: At) -> STensor:
    x = args[0]
    lo, hi, _ = slice(attrs["start"], attrs["end"]).indices(x.rank)
    dims = [enc.as_real(d) if isinstance(d, int) else z3.ToReal(d) for d in x.shape[lo:hi]]

    def f(i: Idx) -> Any:
        out = dims[-1]
        for j in range(len(dims) - 2, -1, -1):
            out = z3.If(i[0] == j, dims[j], out)
        return out

    return STensor((len(dims),), f if dims else (lambda i: z3.RealVal(0)))


def size(enc: Encoder, args: Args, attrs: At) -> STensor:
    n = _prod(args[0].shape)
    return STensor((), lambda i: enc.as_real(n) if isinstance(n, int) else z3.ToReal(n))


def constant_of_shape(enc: Encoder, args: Args, attrs: At) -> STensor:
    """The shape comes from the operand's values, so it must be known (`__shape__`): a -inf fill
    (`__neg_inf__`) is an additive mask, any other the attribute's value."""
    shp = attrs.get("__shape__")
    if shp is None:
        raise EncodeError("constant_of_shape needs its shape as a hint (__shape__)")
    if attrs.get("__neg_inf__"):
        return MaskTensor(tuple(shp), lambda i: enc.neg_inf, lambda i: z3.BoolVal(True))
    v = attrs.get("value")
    c = enc.as_real(float(np.asarray(v.array).reshape(-1)[0]) if v is not None else 0.0)
    return STensor(tuple(shp), lambda i: c)


def trilu(enc: Encoder, args: Args, attrs: At) -> STensor:
    """The upper (lower) triangle of the last two dims, zero elsewhere; of a -inf fill, a mask."""
    x = args[0]
    k: Any = enc.as_int(args[1].f(())) if len(args) > 1 else z3.IntVal(0)
    upper = attrs.get("upper", True)

    def keep(i: Idx) -> Any:
        r, c = i[-2], i[-1]
        return (c - r >= k) if upper else (c - r <= k)

    if isinstance(x, MaskTensor):
        if x.rank != 2:
            raise EncodeError("only a 2-D trilu of a -inf fill is encoded")
        return MaskTensor(x.shape, x.f, lambda i: z3.And(x.cond(i), keep(i)))
    return STensor(x.shape, lambda i: z3.If(keep(i), x.f(i), 0))
