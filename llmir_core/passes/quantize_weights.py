"""quantize-weights: weight-only blockwise quantization (int8 or int4, symmetric or asymmetric) of
the float weights of matmuls and gated MLPs, written once to a weights file.

Rewrite: `x @ W^T` (or `x @ W`) and `llm.gated_mlp(x, Wg, Wu, Wd)` whose weights are parameters
(core.weight / core.constant, possibly through a cast: known at build time) ->
`llm.quantized_matmul(x, codes, scales[, zero_points])` over the `nbits` layout (onnxruntime
MatMulNBits: blocks of `block` along the reduction dim), by the approximate rules
quantize-weights-int{4,8}-{sym,asym}-* (through the rewrite engine). The codes, scales and zero points go to `weights_file`
(default: `<input stem>.q<bits>.weights.bin` beside the input), referenced by new core.weight
ops with their sha256; each rewrite's report line gives the op's error: the weight's max |error|
and its ratio to the proved bound scale/2, the weight's relative (Frobenius) error, and the op
output's max |error| and relative error on seeded random inputs.
Quantizer: symmetric s = amax / L per block (L = 127 or 7), q = round(w / s) in [-L, L], stored
as q + 2^(bits-1); asymmetric as MLAS (s = (max(hi,0) - min(lo,0)) / (2^bits - 1), integer zero
point). A weight with any other use (an embedding table tied to the output head) is left alone.
Invariant: every result keeps its type; each quantized weight element is within scale/2 of the
original (the proved lemma), so an op's output error is bounded by |x| . (scale/2) per row.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from llmir_core.errors import InputError
from llmir_core.fileio import atomic_write
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType, QuantType, TensorType
from llmir_core.quant import nbits
from llmir_core.rewrite.library import RULES, is_proved
from llmir_core.rewrite.quant_rules import levels, weight_rule_name
from llmir_core.rewrite.terms import Match

from .base import PassContext, erase_dead, scratch_builder, use_counts
from .rewriting import Part, rewrite
from .static_eval import static_slice, static_value

ALIGN = 64
_GATED = ("wg", "wu", "wd")


@dataclass
class Quantized:
    """One weight's codes and scales, its values and where they were written."""

    qtype: QuantType
    shape: tuple[int, int]  # [N, K]: the nbits layout (blocks along K)
    codes: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    original: np.ndarray  # [N, K] float32
    restored: np.ndarray  # dequantized, [N, K] float32
    refs: dict[str, dict[str, Any]] = field(default_factory=dict)  # part -> core.weight attrs

    def weight_error(self) -> tuple[float, float, float]:
        """(max |error|, max of |error| / (scale/2) per block, relative Frobenius error)."""
        err = np.abs(self.restored.astype(np.float64) - self.original)
        n, k = self.shape
        blk = self.qtype.block
        half = np.repeat(np.abs(self.scales.astype(np.float64)), blk, axis=-1).reshape(n, k) / 2
        ratio = (
            float(np.max(np.where(half > 0, err / np.where(half > 0, half, 1), 0.0)))
            if err.size
            else 0.0
        )
        den = float(np.linalg.norm(self.original))
        return float(err.max(initial=0.0)), ratio, float(np.linalg.norm(err)) / den if den else 0.0


def quantize_matrix(w: np.ndarray, bits: int, block: int, symmetric: bool) -> Quantized:
    """Quantize an [N, K] float matrix (blocks of `block` along K) to nbits codes."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    qt = QuantType("nbits", bits, block, DType.f32, "none" if symmetric else "int")
    if symmetric:
        top = levels(bits, True)
        blocks = w.reshape(n, k // block, block)
        amax = np.abs(blocks).max(axis=-1)
        scales = (amax / np.float32(top)).astype(np.float32)
        safe = np.where(scales > 0, scales, np.float32(1))
        q = np.clip(np.rint(blocks / safe[..., None]), -top, top)
        codes = nbits.pack_codes(
            (q + (1 << (bits - 1))).astype(np.uint8).reshape(n, k), bits
        ).reshape(-1)
        zeros = None
    else:
        codes, scales, zeros = nbits.quantize(w, bits, block, False, np.dtype(np.float32))
    restored = nbits.dequantize(codes, scales, zeros, bits, block, (n, k))
    return Quantized(qt, (n, k), codes, scales, zeros, w, restored)


def _consumers(fn: Function) -> list[tuple[Op, list[tuple[str, Value]]]]:
    """Ops whose weights could be quantized: (op, [(leaf, weight value), ...])."""
    out = []
    for op in fn.ops:
        if op.name == "core.matmul" and not op.attrs.get("transpose_a"):
            out.append((op, [("w", op.operands[1])]))
        elif op.name == "llm.gated_mlp":
            out.append((op, list(zip(_GATED, op.operands[1:4]))))
    return out


def _output_error(
    op: Op, x: np.ndarray, ws: list[np.ndarray], qs: list[np.ndarray]
) -> tuple[float, float]:
    """(max |error|, relative error) of the op's output on x with the quantized weights."""

    def f(mats: list[np.ndarray]) -> np.ndarray:
        if op.name == "core.matmul":
            return x @ mats[0].T
        g, u, d = (m.astype(np.float64) for m in mats)
        a = x @ g.T
        act = op.attrs.get("activation", "silu")
        if act == "silu":
            a = a / (1 + np.exp(-a))
        else:
            a = (
                0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
                if act == "gelu_tanh"
                else 0.5 * a * (1 + np.vectorize(_erf)(a / np.sqrt(2)))
            )
        return (a * (x @ u.T)) @ d.T

    y, yq = f([w.astype(np.float64) for w in ws]), f([q.astype(np.float64) for q in qs])
    den = float(np.linalg.norm(y))
    return float(np.abs(yq - y).max(initial=0.0)), float(
        np.linalg.norm(yq - y)
    ) / den if den else 0.0


def _erf(v: float) -> float:
    import math

    return math.erf(v)


@dataclass(frozen=True)
class QuantizeWeights:
    name: ClassVar[str] = "quantize-weights"
    summary: ClassVar[str] = (
        "weight-only int8/int4 blockwise quantization of matmul and gated-MLP weights"
    )
    bits: int = 4
    block: int = 32
    symmetric: bool = True
    weights_file: str = ""  # where the codes go; default <input stem>.q<bits>.weights.bin
    seed: int = 0  # of the random inputs the output error is measured on

    def run(self, module: Module, ctx: PassContext) -> bool:
        if self.bits not in (4, 8):
            raise InputError(f"quantize-weights{{bits={self.bits}}}: bits must be 4 or 8")
        if self.block < 2 or self.block % 2 or self.block & (self.block - 1):
            raise InputError(
                f"quantize-weights{{block={self.block}}}: block must be a power of two >= 2",
                hint="onnxruntime's MatMulNBits takes 16, 32, 64, 128 or 256",
            )
        kinds = ("matmul", "matmul-kn", "gated-mlp-silu", "gated-mlp-gelu", "gated-mlp-gelu_tanh")
        if not ctx.allow_unproved and not any(  # each rewrite checks its own rule's proof
            is_proved(RULES[weight_rule_name(self.bits, self.symmetric, k)]) for k in kinds
        ):
            return False
        path, attr_file = self._paths(module)
        blob = bytearray()
        changed = False
        for fn in module.functions:
            changed |= self._run_fn(module, fn, ctx, blob, attr_file)
        if changed:
            with atomic_write(path, "wb") as fh:
                fh.write(bytes(blob))
        return changed

    def _paths(self, module: Module) -> tuple[str, str]:
        base_dir = os.path.dirname(os.path.abspath(module.source)) if module.source else None
        stem = (
            os.path.splitext(os.path.basename(module.source))[0] if module.source else module.name
        )
        default = f"{stem}.q{self.bits}.weights.bin"
        path = (
            os.path.abspath(self.weights_file)
            if self.weights_file
            else os.path.join(base_dir or os.getcwd(), default)
        )
        rel = os.path.relpath(path, base_dir) if base_dir else path
        return path, path if rel.startswith("..") else rel  # outside the module's folder: absolute

    def _run_fn(
        self, module: Module, fn: Function, ctx: PassContext, blob: bytearray, attr_file: str
    ) -> bool:
        uses = use_counts(fn)
        slots: dict[int, int] = {}  # weight value -> uses as a quantizable weight operand
        for _, ws in _consumers(fn):
            for _, w in ws:
                slots[id(w)] = slots.get(id(w), 0) + 1
        cache: dict[tuple[int, bool], Quantized | str] = {}
        changed = False
        replaced: list[Op] = []
        rng = np.random.default_rng(self.seed)
        for op, ws in _consumers(fn):
            transposed = op.name == "core.matmul" and not op.attrs.get("transpose_b")
            got: list[Quantized] = []
            reason = None
            for _, w in ws:
                r = self._quantized(module, w, transposed, uses, slots, cache, blob, attr_file)
                if isinstance(r, str):
                    reason = r
                    break
                got.append(r)
            if reason is not None:
                ctx.rejected(self._rule(op), op.results[0], reason)
                continue
            if not self._rewrite(fn, op, ws, got, ctx, rng):
                continue
            replaced.append(op)
            for _, w in ws:
                replaced.extend(static_slice(w) or [])
            changed = True
        if changed:
            erase_dead(fn, replaced)  # the replaced ops and the float weights they read
        return changed

    def _rule(self, op: Op) -> str:
        if op.name == "core.matmul":
            kind = "matmul" if op.attrs.get("transpose_b") else "matmul-kn"
        else:
            kind = f"gated-mlp-{op.attrs.get('activation', 'silu')}"
        return weight_rule_name(self.bits, self.symmetric, kind)

    def _quantized(
        self,
        module: Module,
        w: Value,
        transposed: bool,
        uses: dict[int, int],
        slots: dict[int, int],
        cache: dict[tuple[int, bool], Quantized | str],
        blob: bytearray,
        attr_file: str,
    ) -> Quantized | str:
        key = (id(w), transposed)
        if key in cache:
            return cache[key]
        t = w.type
        if (
            not isinstance(t, TensorType)
            or t.rank != 2
            or t.static_shape() is None
            or not isinstance(t.dtype, DType)
            or not t.dtype.is_float
        ):
            cache[key] = f"weight %{w.name} is not a static float matrix"
        elif uses.get(id(w), 0) != slots.get(id(w), 0):
            cache[key] = f"weight %{w.name} has other uses (quantizing it would keep two copies)"
        elif static_slice(w) is None:
            cache[key] = f"weight %{w.name} is known only at run time"
        else:
            k = t.static_shape()[0 if transposed else 1]  # type: ignore[index]
            if k % self.block:
                cache[key] = f"its reduction dim ({k}) is not a multiple of block {self.block}"
            else:
                arr = static_value(module, w)
                if not isinstance(arr, np.ndarray):
                    cache[key] = f"the value of weight %{w.name} cannot be read at build time"
                else:
                    mat = arr.astype(np.float32)
                    q = quantize_matrix(
                        mat.T if transposed else mat, self.bits, self.block, self.symmetric
                    )
                    self._write(q, _source_name(w), blob, attr_file)
                    cache[key] = q
        return cache[key]

    def _write(self, q: Quantized, name: str, blob: bytearray, attr_file: str) -> None:
        parts = {"q": q.codes, "scales": q.scales}
        if q.zeros is not None:
            parts["zeros"] = q.zeros
        for part, arr in parts.items():
            data = np.ascontiguousarray(arr).tobytes()
            blob.extend(b"\0" * (-len(blob) % ALIGN))
            q.refs[part] = {
                "file": attr_file,
                "name": f"{name}.{part}",
                "offset": len(blob),
                "nbytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
            blob.extend(data)

    def _rewrite(
        self,
        fn: Function,
        op: Op,
        ws: list[tuple[str, Value]],
        got: list[Quantized],
        ctx: PassContext,
        rng: np.random.Generator,
    ) -> bool:
        rule = RULES[self._rule(op)]
        b, prelude = scratch_builder(fn, op.origin)
        seed = Match()
        for (leaf, w), q in zip(ws, got):
            prefix = "w" if leaf == "w" else leaf[1]
            types = {
                "q": TensorType(q.shape, q.qtype),
                "scales": TensorType(q.scales.shape, DType.f32),
            }
            if q.zeros is not None:
                types["zeros"] = TensorType(q.zeros.shape, DType.u8)
            for part, ty in types.items():
                v = b.create(
                    "core.weight",
                    [],
                    dict(q.refs[part]),
                    result_types=[ty],
                    names=[f"{w.name}.{part if part != 'q' else f'q{self.bits}'}"],
                ).results[0]
                seed.values[prefix + {"q": "q", "scales": "s", "zeros": "z"}[part]] = v
        k = got[0].shape[1]
        x = rng.standard_normal((16, k))
        out_abs, out_rel = _output_error(
            op, x, [q.original for q in got], [q.restored for q in got]
        )
        errs = [q.weight_error() for q in got]
        kind = f"int{self.bits} {'sym' if self.symmetric else 'asym'} block {self.block}"
        detail = (
            f"{kind}: weight max|err| {max(e[0] for e in errs):.3g} "
            f"({max(e[1] for e in errs):.3f} of the bound scale/2), rel err "
            f"{max(e[2] for e in errs):.2%}; output max|err| {out_abs:.3g}, rel err {out_rel:.2%}"
        )
        return (
            rewrite(fn, ctx, [Part(rule, op.results[0], detail=detail)], seed, prelude=prelude)
            is None
        )


def _source_name(w: Value) -> str:
    """The tensor's name in its source (through a cast), else the value's name."""
    v = w
    while v.owner is not None and v.owner.name == "core.cast":
        v = v.owner.operands[0]
    if v.owner is not None and v.owner.name == "core.weight" and v.owner.attrs.get("name"):
        return str(v.owner.attrs["name"])
    return w.name
