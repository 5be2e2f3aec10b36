"""What the onnxruntime lowering passes share (not a pass): the decoder signature, an indexed
view of a function, how a static weight is stored (and so which MatMulNBits format it takes),
and the options every lowering pass accepts.

Nothing here imports onnx: the passes run in `llmir optimize`, the serializer imports onnx.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.errors import InputError
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import GGUF_QUANTS, DType, QuantType, TensorType
from llmir_core.quant import int32_packed
from llmir_core.quant.gguf_repack import LOSSLESS, REQUANT

QUANT_MODES = ("int4", "int8")
ACCURACY_LEVEL = 4  # MatMulNBits int8 activations: measured fastest on AVX2
LAST_LOGITS = True  # decoders compute logits for the last position only (lower-ort-logits)
TARGET = "onnxruntime"
# When onnxruntime repacks matmul weights into its kernels' layout (`ort.options.prepack`):
# "session" = when the session opens (a heap copy of the weights; fastest decode and prefill),
# "none" = never: f32 weights stay in the memory-mapped data file (load without touching them,
# peak RSS ~ the file; decode and prefill slower). Measured in docs/load.md.
PREPACK_MODES = ("session", "none")
PREPACK = "session"
# How GGUF tensors outside NBITS_GGUF run (option `gguf_kernels`): "exact" = ort.matmul_gguf, the
# stored blocks read in place by llmir's kernel; "requant" = the faster MatMulNBits form
# (q4_1/q5_1/q2_k/q4_k/q5_k/iq4 requantized to blocks with zero points, q3_k/q6_k repacked to
# blocks of 16), whose error the report gives.
GGUF_KERNELS = ("exact", "requant")
GGUF_KERNEL = GGUF_KERNELS[0]
# GGUF formats that keep MatMulNBits (lossless 32-element blocks, its tuned kernels). q5_0 would
# repack losslessly too, but to int8 codes (9 bits a weight against its stored 5.5): it runs as
# stored on MatMulGGUF (fewer bytes a token), like the other formats
NBITS_GGUF = ("q4_0", "q8_0")


# -- what is a decoder ---------------------------------------------------------------------------


def cache_args(fn: Function) -> list[Value]:
    return fn.args[2:]


def is_decoder(module: Module) -> bool:
    """True when main has the decoder signature: input_ids, positions, then per layer
    past_key_values.{l}.key/.value [batch, kv_heads, past, head_dim] (f32; or i8 codes, each
    followed by its `_scale` [batch, kv_heads, past, 1] f32 with kv-cache-int8{interface=true},
    alone with kv-cache-int8{scales=calibrated}) ->
    logits + one present per past."""
    if not module.functions:
        return False
    fn = module.main
    names = [a.name for a in fn.args]
    if names[:2] != ["input_ids", "positions"] or len(names) < 4:
        return False
    want = []
    i = 2
    layer = 0
    while i < len(fn.args):
        for kind in ("key", "value"):
            if i >= len(fn.args):
                return False
            a = fn.args[i]
            t = a.type
            if (
                a.name != f"past_key_values.{layer}.{kind}"
                or not isinstance(t, TensorType)
                or t.rank != 4
                or t.is_quantized
                or not isinstance(t.shape[1], int)
                or not isinstance(t.shape[3], int)
            ):
                return False
            want.append(a)
            i += 1
            if t.dtype == DType.i8:  # per-position scales follow; static ones are constants
                if i < len(fn.args) and fn.args[i].name == a.name + "_scale":
                    i += 1
            elif t.dtype != DType.f32:
                return False
        layer += 1
    return len(fn.outputs) == len(fn.args) - 1 and bool(want)


def kv_bytes_per_token(fn: Function) -> int:
    """Bytes one position of the KV cache takes (codes and scales), per batch row."""
    total = 0
    for a in cache_args(fn):
        t = tt(a)
        heads, dim = t.shape[1], t.shape[3]
        assert isinstance(heads, int) and isinstance(dim, int)  # is_decoder checked them
        total += heads * dim * (t.dtype.bits // 8 if isinstance(t.dtype, DType) else 4)
    return total


# -- options ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NbitsFormat:
    bits: int
    block: int
    asym: bool  # integer zero points stored


def parse_quant(quant: str | None, block: int = 32, symmetric: bool = True) -> NbitsFormat | None:
    """`int4`/`int8` (or None/""/`f32` for none) -> the MatMulNBits format float weights get."""
    if quant in (None, "", "none", "f32"):
        return None
    if quant not in QUANT_MODES:
        raise InputError(f"unknown --quant '{quant}'", hint=f"use one of: {', '.join(QUANT_MODES)}")
    if block < 16 or block & (block - 1):
        raise InputError(f"quantization block size must be a power of two >= 16, got {block}")
    return NbitsFormat(4 if quant == "int4" else 8, block, not symmetric)


def check_gguf_kernels(kind: str) -> None:
    if kind not in GGUF_KERNELS:
        raise InputError(
            f"unknown gguf_kernels '{kind}'",
            hint="exact: GGUF blocks read in place by llmir's kernel (the default); requant: "
            "the faster requantized MatMulNBits form (the report gives its error)",
        )


def gguf_exact_format(src: WSrc, quant: NbitsFormat | None, gguf_kernels: str) -> str | None:
    """The GGUF format `ort.matmul_gguf` reads src in, or None: src is not a GGUF tensor, its
    format repacks losslessly to 32-element MatMulNBits blocks (NBITS_GGUF), or the build asked
    for requantization (`--quant`, or gguf_kernels = requant)."""
    if src.kind != "gguf" or quant is not None or gguf_kernels != "exact":
        return None
    scheme = src.scheme
    return None if scheme in NBITS_GGUF else scheme


def check_accuracy_level(level: int) -> None:
    if level not in (0, 1, 2, 3, 4):
        raise InputError(f"accuracy level must be 0..4, got {level}")


def declare_ort(module: Module) -> None:
    """List the ort dialect in the module header (the verifier requires it)."""
    ds = tuple(module.attrs.get("llmir.dialects") or ("core",))
    if "ort" not in ds:
        module.attrs["llmir.dialects"] = (*ds, "ort")


# -- the IR, indexed ---------------------------------------------------------------------------------


class Graph:
    """Users, output positions and statically computable values of one function."""

    def __init__(self, fn: Function) -> None:
        self.fn = fn
        self.index = {id(op): i for i, op in enumerate(fn.ops)}
        self.users: dict[int, list[Op]] = {}
        for op in fn.ops:
            for v in op.operands:
                self.users.setdefault(id(v), []).append(op)
        self.outputs = {id(v): i for i, v in enumerate(fn.outputs)}
        self.static: set[int] = set()
        for op in fn.ops:
            if op.name in ("core.weight", "core.constant") or (
                op.operands and all(id(v) in self.static for v in op.operands)
            ):
                self.static.update(id(r) for r in op.results)

    def uses(self, v: Value) -> list[Op]:
        return self.users.get(id(v), [])

    def only_use(self, v: Value, user: Op) -> bool:
        return id(v) not in self.outputs and all(u is user for u in self.uses(v))

    def producer(self, v: Value, name: str) -> Op | None:
        op = v.owner
        return op if op is not None and op.name == name else None


def tt(v: Value) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise InputError(f"%{v.name} is not a tensor")
    return t


# -- weights -------------------------------------------------------------------------------------


@dataclass
class WSrc:
    """A static 2-D weight [rows, cols] and how it is stored."""

    value: Value
    kind: str  # f32 (file bytes as is) | cast | gguf | nbits | packed (GPTQ/AWQ/ctpack) | eval
    op: Op | None  # the core.weight op (None for eval)
    rows: int
    cols: int
    extra: tuple[Value, ...] = ()  # nbits / packed scales, zero points (packed: then g_idx)
    transpose: bool = False  # eval only: the value is [cols, rows] and is transposed

    @property
    def scheme(self) -> str | None:
        if self.op is None:
            return None
        q = tt(self.op.results[0]).dtype
        return q.scheme if isinstance(q, QuantType) else None

    @property
    def label(self) -> str:
        if self.op is not None:
            return str(self.op.attrs.get("name", self.value.name))
        return self.value.name


def weight_src(g: Graph, v: Value) -> WSrc | None:
    """How to read a static 2-D float weight value, or None if v is not one."""
    if id(v) not in g.static:
        return None
    t = tt(v)
    shape = t.static_shape()
    if shape is None or len(shape) != 2 or not isinstance(t.dtype, DType) or not t.dtype.is_float:
        return None
    rows, cols = shape
    op = v.owner
    assert op is not None
    if op.name == "core.weight" and t.dtype == DType.f32:
        return WSrc(v, "f32", op, rows, cols)
    if op.name == "core.cast" and op.attrs.get("to") == DType.f32:
        src = op.operands[0].owner
        if (
            src is not None
            and src.name == "core.weight"
            and isinstance(tt(op.operands[0]).dtype, DType)
        ):
            return WSrc(v, "cast", src, rows, cols)
    if op.name == "llm.dequantize" and t.dtype == DType.f32:
        src = op.operands[0].owner
        q = tt(op.operands[0]).dtype
        if src is not None and src.name == "core.weight" and isinstance(q, QuantType):
            if q.scheme in GGUF_QUANTS:
                return WSrc(v, "gguf", src, rows, cols)
            if q.scheme == "nbits":
                return WSrc(v, "nbits", src, rows, cols, tuple(op.operands[1:]))
            if q.scheme in int32_packed.SCHEMES:
                return WSrc(v, "packed", src, rows, cols, tuple(op.operands[1:]))
    return WSrc(v, "eval", None, rows, cols)


def weight_srcs(g: Graph, v: Value) -> list[WSrc] | None:
    """The weight v, or the parts of its row-concatenation (core.concat axis 0 of weights)."""
    op = v.owner
    if op is not None and op.name == "core.concat" and op.attrs.get("axis") == 0:
        parts = [weight_src(g, p) for p in op.operands]
        if all(p is not None for p in parts):
            return parts  # type: ignore[return-value]
    one = weight_src(g, v)
    return None if one is None else [one]


def packed_src(g: Graph, w: Value, extra: list[Value]) -> WSrc | None:
    """An nbits-, GGUF- or checkpoint-packed (GPTQ/AWQ/ctpack) core.weight [N, K] used as is
    (llm.quantized_matmul's weight)."""
    wop = w.owner
    q = tt(w).dtype
    if wop is None or wop.name != "core.weight" or not isinstance(q, QuantType) or tt(w).rank != 2:
        return None
    rows, cols = tt(w).static_shape() or (0, 0)
    if q.scheme == "nbits":
        return WSrc(w, "nbits", wop, rows, cols, tuple(extra))
    if q.scheme in int32_packed.SCHEMES:
        return WSrc(w, "packed", wop, rows, cols, tuple(extra))
    if q.scheme in GGUF_QUANTS:
        return WSrc(w, "gguf", wop, rows, cols)
    return None


# -- int32-packed checkpoint weights (GPTQ / AWQ / compressed-tensors) --------------------------

Evaluate = Callable[[Value], Any]  # a static value's array (scales, zero points, g_idx)


@dataclass(frozen=True)
class PackedParts:
    qtype: QuantType
    scales: np.ndarray
    zero_points: np.ndarray | None  # int32-packed as the checkpoint stores them
    g_idx: np.ndarray | None


def static_evaluator(module: Module) -> Evaluate:
    """Static values of module (a packed weight's scales, zero points, g_idx), each evaluated once."""
    from llmir_core.passes.static_eval import static_value

    cache: dict[int, np.ndarray] = {}

    def ev(v: Value) -> np.ndarray:
        if id(v) not in cache:
            val = static_value(module, v)
            if val is None:
                raise InputError(
                    f"%{v.name}: the packed weight's scales, zero points or g_idx cannot be "
                    "read at compile time (a missing weight file?)"
                )
            cache[id(v)] = np.asarray(val)
        return cache[id(v)]

    return ev


def packed_parts(src: WSrc, ev: Evaluate) -> PackedParts:
    """The packed weight's type and its small tensors (extra = scales, zero points, g_idx)."""
    assert src.kind == "packed" and src.op is not None
    q = tt(src.op.results[0]).dtype
    assert isinstance(q, QuantType)
    ex = [np.asarray(ev(v)) for v in src.extra]
    n_fixed = 2 if q.zero == "int" else 1
    return PackedParts(
        q, ex[0], ex[1] if q.zero == "int" else None, ex[-1] if len(ex) > n_fixed else None
    )


def packed_requant_reason(src: WSrc, ev: Evaluate) -> str | None:
    """Why the packed weight has no exact MatMulNBits form (it is requantized), or None."""
    p = packed_parts(src, ev)
    q = p.qtype
    return int32_packed.lossless_nbits(
        q.scheme, q.bits, q.block, (src.rows, src.cols), p.zero_points, p.g_idx
    )


def packed_asym(src: WSrc, ev: Evaluate) -> bool:
    """A losslessly repacked weight needs zero points (some zero is not the midpoint)."""
    p = packed_parts(src, ev)
    q = p.qtype
    if p.zero_points is None:
        return False
    z = int32_packed.zeros(q.scheme, p.zero_points, q.bits, src.rows, src.cols // q.block)
    return not bool(np.all(z == (1 << (q.bits - 1))))


def _packed_format(src: WSrc, ev: Evaluate) -> NbitsFormat | None:
    q = packed_parts(src, ev).qtype
    if packed_requant_reason(src, ev) is None:
        return NbitsFormat(q.bits, q.block, packed_asym(src, ev))
    block = next(
        (b for b in (q.block, 128, 64, 32, 16) if int32_packed.nbits_block_ok(b, src.cols)), 0
    )
    return NbitsFormat(8 if q.bits == 8 else 4, block, True) if block else None


def nbits_format(
    src: WSrc, quant: NbitsFormat | None, ev: Evaluate | None = None
) -> NbitsFormat | None:
    """The MatMulNBits format this weight takes, or None (kept f32). Packed checkpoint weights
    (which need `ev` to read their zero points and g_idx) keep their bits and group size when
    they repack losslessly, else are requantized with zero points (4 or 8 bits). A GGUF tensor
    keeps its own format unless `quant` (`--quant`) is narrower: a q8_0 tensor (llama.cpp's
    tied embedding / lm_head in q4_0 files) built with --quant int4 is requantized to it."""
    if src.kind == "packed":
        if ev is None:
            raise ValueError("nbits_format of a packed weight needs an evaluator")
        return _packed_format(src, ev)
    if src.kind == "gguf":
        scheme = src.scheme
        assert scheme is not None
        own = (
            NbitsFormat(*LOSSLESS[scheme], False)
            if scheme in LOSSLESS
            else NbitsFormat(*REQUANT[scheme], True)
        )
        if quant is not None and quant.bits < own.bits and src.cols % quant.block == 0:
            return quant
        return own
    if src.kind == "nbits":
        assert src.op is not None
        q = tt(src.op.results[0]).dtype
        assert isinstance(q, QuantType)
        return NbitsFormat(q.bits, q.block, q.zero == "int")
    if quant is not None and src.cols % quant.block == 0:
        return quant
    return None


def packed_lossless(src: WSrc, fmt: NbitsFormat, ev: Evaluate) -> bool:
    """The packed weight is written as its own codes in format fmt (no requantization)."""
    q = packed_parts(src, ev).qtype
    return packed_requant_reason(src, ev) is None and (fmt.bits, fmt.block) == (q.bits, q.block)


def quantize_mode(src: WSrc, fmt: NbitsFormat, ev: Evaluate | None = None) -> str:
    """ort.matmul_nbits' `quantize`: none when the packing is lossless, else sym/asym."""
    if src.kind == "nbits" or (
        src.kind == "gguf"
        and src.scheme in LOSSLESS
        and LOSSLESS[src.scheme] == (fmt.bits, fmt.block)
    ):
        return "none"
    if src.kind == "packed":
        if ev is None:
            raise ValueError("quantize_mode of a packed weight needs an evaluator")
        if packed_lossless(src, fmt, ev):
            return "none"
    return "asym" if fmt.asym else "sym"


def check_prepack(mode: str) -> None:
    if mode not in PREPACK_MODES:
        raise InputError(
            f"--prepack must be one of {', '.join(PREPACK_MODES)}, got {mode!r}",
            hint="session: weights repacked when the session opens (fastest decode); none: "
            "f32 weights memory-mapped as stored (fastest load, slower decode)",
        )


def module_options(module: Module) -> dict[str, Any]:
    """The lowering options recorded on a lowered module (`ort.options`)."""
    opts = module.attrs.get("ort.options")
    return dict(opts) if isinstance(opts, dict) else {}


__all__ = [
    "is_decoder",
    "cache_args",
    "NbitsFormat",
    "parse_quant",
    "Graph",
    "WSrc",
    "weight_src",
    "weight_srcs",
    "packed_src",
    "nbits_format",
    "quantize_mode",
    "Evaluate",
    "static_evaluator",
    "PackedParts",
    "packed_parts",
    "packed_requant_reason",
    "packed_asym",
    "packed_lossless",
    "declare_ort",
    "tt",
    "ACCURACY_LEVEL",
    "LAST_LOGITS",
    "QUANT_MODES",
    "kv_bytes_per_token",
    "TARGET",
    "module_options",
    "check_accuracy_level",
    "check_prepack",
    "PREPACK",
    "PREPACK_MODES",
    "GGUF_KERNELS",
    "GGUF_KERNEL",
    "NBITS_GGUF",
    "check_gguf_kernels",
    "gguf_exact_format",
]


def legal(name: str) -> bool:
    """Whether the onnxruntime target runs the op `name`: the legal set of the lowering passes'
    conversion-pattern tables (its capabilities, read lazily: the target imports the passes)."""
    from llmir_core.targets import get_target

    return bool(get_target("onnxruntime").capabilities.runs(name))
