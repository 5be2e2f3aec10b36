"""onnxruntime build tuned for decoder modules: one GroupQueryAttention per layer over a KV buffer
shared between past and present, fused norms, and MatMulNBits for quantized weights.

`build_decoder(module, out_dir)` takes a decoder function in the convention `llm_graph` emits
(`input_ids`, `positions`, `past_key_values.{l}.key/.value` -> `logits`, `present.{l}.key/.value`)
and writes an artifact folder like the generic backend's (`model.onnx`, `model.onnx.data`,
`manifest.json`) plus the tokenizer and chat template, and a `decoder` section in the manifest.

What the recognised pattern becomes:

- per layer, rotary + KV concat + `llm.scaled_dot_product_attention` (+ the head reshapes and
  transposes around it) -> `com.microsoft.GroupQueryAttention` with `do_rotary` and the
  position ids. The past and present cache tensors keep the IR's names and layout
  [batch, kv_heads, len, head_dim]; bound to one preallocated buffer (I/O binding) the op
  writes only the new rows (onnxruntime's past/present buffer sharing), so decoding never
  copies the whole cache. `seqlens_k` and `total_sequence_length` are computed in the graph
  from `positions`, so the signature stays the IR's;
- Q, K and V projections of one activation -> one packed matmul feeding the op's packed-QKV form;
- `llm.rms_norm` -> `SimplifiedLayerNormalization`, or `SkipSimplifiedLayerNormalization` when
  its input is a residual `core.add` (the sum comes out of the same op);
- `core.matmul` by a weight -> `FusedMatMul` (transB, f32; the tied embedding table is shared
  with the `Gather`) or `com.microsoft.MatMulNBits`: GGUF q4_0, q8_0, q5_0, q6_k and q3_k repack
  losslessly (same dequantized values), q4_1, q5_1, q2_k, q4_k and q5_k are requantized (the
  max error is recorded in the manifest), nbits weights pass through, and f32/f16/bf16
  weights are quantized to int4/int8 when `quant` asks for it;
- `llm.gated_mlp` -> two matmuls, `QuickGelu` (SiLU) or `Gelu`, `Mul`, a matmul.

Every other op is lowered by the generic backend (`llmir_core.backends.ort.Lowering`), so a
module that only partly matches still builds. Weights are streamed into the data file (row
chunks; never a whole large tensor in memory unless it has to be computed), each stored once,
and the files are byte-identical across builds of the same input.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from llmir_core import SPEC_VERSION, __version__
from llmir_core.errors import InputError
from llmir_core.fileio import replace_dir, sha256_file
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.dims import format_dim
from llmir_core.ir.types import DType, QuantType, TensorType
from llmir_core.quant import gguf_blocks, nbits
from llmir_core.runtime import trace_attrs  # perf: tracing
from llmir_core.tracing import traced  # perf: tracing
from llmir_core.weights import load_weight, resolve_path

from .ort import (
    DATA_FILE,
    MANIFEST,
    MODEL_FILE,
    MS,
    BuildError,
    Lowering,
    artifact_tmp_dir,
    check_artifact_dir,
    onnx_dtype,
    source_digest,
)

DECODER_SCHEMA = 1
ACCURACY_LEVEL = 4  # MatMulNBits int8 activations: measured fastest on AVX2 (see the report)
QUANT_MODES = ("int4", "int8")
TOKENIZER_FILE = "tokenizer.json"
TEMPLATE_FILE = "chat_template.jinja"
_ALIGN_SMALL, _ALIGN_LARGE, _LARGE = 64, 65536, 1 << 20
_CHUNK = 32 << 20  # bytes of f32 rows processed at once when a weight is transformed

# GGUF block formats that map exactly onto MatMulNBits (bits, block): x = scale * q with a
# symmetric integer q, so code = q + 2**(bits-1) and the block scale is kept as float32
LOSSLESS = {"q4_0": (4, 32), "q8_0": (8, 32), "q5_0": (8, 32), "q6_k": (8, 16), "q3_k": (4, 16)}
# formats with a float minimum per block: requantized (asymmetric) at these (bits, block)
REQUANT = {"q4_1": (4, 32), "q4_k": (4, 32), "q2_k": (4, 16), "q5_1": (8, 32), "q5_k": (8, 32)}


# -- what is a decoder ---------------------------------------------------------------------------

def _cache_args(fn: Function) -> list[Value]:
    return fn.args[2:]


def is_decoder(module: Module) -> bool:
    """True when main has the decoder signature: input_ids, positions, then pairs of
    past_key_values.{l}.key/.value [batch, kv_heads, past, head_dim] -> logits + one present each."""
    if not module.functions:
        return False
    fn = module.main
    names = [a.name for a in fn.args]
    if names[:2] != ["input_ids", "positions"] or len(names) < 4 or len(names) % 2:
        return False
    for i, a in enumerate(_cache_args(fn)):
        want = f"past_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}"
        t = a.type
        if a.name != want or not isinstance(t, TensorType) or t.rank != 4 or t.is_quantized \
                or not isinstance(t.shape[1], int) or not isinstance(t.shape[3], int):
            return False
    return len(fn.outputs) == len(fn.args) - 1


def _output_names(fn: Function) -> list[str]:
    return ["logits"] + ["present." + a.name.removeprefix("past_key_values.") for a in _cache_args(fn)]


# -- options -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NbitsFormat:
    bits: int
    block: int
    asym: bool  # integer zero points stored


def parse_quant(quant: str | None, block: int = 32, symmetric: bool = True) -> NbitsFormat | None:
    """`int4`/`int8` (or None/`f32` for none) -> the MatMulNBits format float weights get."""
    if quant in (None, "", "none", "f32"):
        return None
    if quant not in QUANT_MODES:
        raise InputError(f"unknown --quant '{quant}'", hint=f"use one of: {', '.join(QUANT_MODES)}")
    if block < 16 or block & (block - 1):
        raise InputError(f"quantization block size must be a power of two >= 16, got {block}")
    return NbitsFormat(4 if quant == "int4" else 8, block, not symmetric)


# -- the data file ---------------------------------------------------------------------------------

class _DataFile:
    """The external data file, written tensor by tensor as the graph is built (aligned)."""

    def __init__(self, path: str) -> None:
        self.fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.pos = 0

    def start(self, large: bool) -> int:
        align = _ALIGN_LARGE if large else _ALIGN_SMALL
        pad = (-self.pos) % align
        if pad:
            self.fh.write(b"\0" * pad)
            self.pos += pad
        return self.pos

    def write(self, arr: np.ndarray | bytes) -> None:
        data = arr if isinstance(arr, bytes) else np.ascontiguousarray(arr).tobytes()
        self.fh.write(data)
        self.pos += len(data)

    def copy(self, path: str, offset: int, nbytes: int) -> None:
        with open(path, "rb") as src:
            src.seek(offset)
            left = nbytes
            while left > 0:
                chunk = src.read(min(left, 16 << 20))
                if not chunk:
                    raise BuildError(f"weight file {path} ended early while copying")
                self.fh.write(chunk)
                left -= len(chunk)
        self.pos += nbytes

    def close(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()


# -- weights ---------------------------------------------------------------------------------------

@dataclass
class _WSrc:
    """A static 2-D weight [rows, cols] and how to read it in row chunks."""

    value: Value
    kind: str  # f32 (file bytes as is) | cast | gguf | nbits | eval
    op: Op | None  # the core.weight op (None for eval)
    rows: int
    cols: int
    extra: tuple[Value, ...] = ()  # nbits scales / zero points
    transpose: bool = False  # eval only: the value is [cols, rows] and is transposed


@dataclass
class _QuantLog:
    lossless: dict[str, int] = field(default_factory=dict)  # format -> tensors
    requantized: list[dict[str, Any]] = field(default_factory=list)
    quantized: dict[str, int] = field(default_factory=dict)
    passthrough: int = 0


def _weight_type(op: Op) -> TensorType:
    t = op.results[0].type
    assert isinstance(t, TensorType)
    return t


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def gguf_block_scales(raw: np.ndarray, scheme: str) -> np.ndarray:
    """Per-(sub)block float32 scales of lossless-repackable GGUF blocks ([n_blocks, bytes])."""
    if scheme in ("q4_0", "q8_0", "q5_0"):
        return _f16(raw[:, 0:2])
    if scheme == "q6_k":
        return _f16(raw[:, 208:210]) * np.ascontiguousarray(raw[:, 192:208]).view(np.int8).astype(np.float32)
    if scheme == "q3_k":
        n = raw.shape[0]
        s = raw[:, 96:108]
        low = np.concatenate([s[:, :8] & 0x0F, s[:, :8] >> 4], axis=1)
        high = (s[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8)[None, :, None]).reshape(n, 16) & 3
        sc = (low | (high << 4)).astype(np.int8) - np.int8(32)
        return _f16(raw[:, 108:110]) * sc.astype(np.float32)
    raise ValueError(f"{scheme} has no lossless MatMulNBits form")


def repack_gguf(raw_rows: np.ndarray, scheme: str, cols: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Losslessly repack GGUF rows ([n, row_bytes] uint8) for MatMulNBits: (codes [n, cols*bits/8],
    scales [n, cols/block] f32, bits, block); nbits.dequantize gives exactly gguf's values."""
    bits, block = LOSSLESS[scheme]
    n = raw_rows.shape[0]
    elems, nbytes = gguf_blocks.BLOCKS[scheme]
    x = gguf_blocks.dequantize(raw_rows, scheme, (n, cols)).reshape(n, cols // block, block)
    scales = gguf_block_scales(np.ascontiguousarray(raw_rows).reshape(-1, nbytes), scheme).reshape(n, cols // block)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(scales[..., None] != 0, np.rint(x / scales[..., None]), 0)
    codes = (q + (1 << (bits - 1))).astype(np.uint8).reshape(n, cols)
    return nbits.pack_codes(codes, bits), scales.astype(np.float32), bits, block


class _Weights:
    """Materializes static values as initializers in the data file, each once."""

    def __init__(self, L: Lowering, data: _DataFile, interp: Interpreter, base_dir: str,
                 log: _QuantLog) -> None:
        self.L, self.data, self.interp, self.base_dir, self.log = L, data, interp, base_dir, log
        self.names: dict[Any, Any] = {}
        self.own: set[str] = set()  # initializers placed in the data file by this class
        self._evals: dict[int, np.ndarray] = {}

    # -- static evaluation ---------------------------------------------------------
    def eval(self, v: Value) -> np.ndarray:
        if id(v) in self._evals:
            return self._evals[id(v)]
        op = v.owner
        if op is None:
            raise BuildError(f"%{v.name} is an input, not a constant")
        args = [self.eval(o) for o in op.operands]
        outs = self.interp.eval_op(op, args, {})
        for r, o in zip(op.results, outs):
            if isinstance(o, np.ndarray) and o.nbytes <= (64 << 20):
                self._evals[id(r)] = o
        return outs[op.results.index(v)]

    # -- reading a weight in row chunks --------------------------------------------
    def rows_f32(self, src: _WSrc) -> Iterator[np.ndarray]:
        step = max(1, _CHUNK // max(1, src.cols * 4))
        if src.kind == "eval":
            arr = self.eval(src.value).astype(np.float32, copy=False)
            if src.transpose:
                arr = arr.T
            for r in range(0, src.rows, step):
                yield np.ascontiguousarray(arr[r:r + step])
            return
        assert src.op is not None
        w = load_weight(src.op.attrs, _weight_type(src.op), self.base_dir)
        if src.kind in ("f32", "cast"):
            for r in range(0, src.rows, step):
                yield np.asarray(w[r:r + step], dtype=np.float32)
        elif src.kind == "gguf":
            raw = np.asarray(w.data).reshape(src.rows, -1)
            for r in range(0, src.rows, step):
                yield gguf_blocks.dequantize(raw[r:r + step], w.qtype.scheme, (min(step, src.rows - r), src.cols))
        else:  # nbits
            q = w.qtype
            codes = np.asarray(w.data).reshape(src.rows, -1)
            sc = self.eval(src.extra[0])
            zp = self.eval(src.extra[1]) if len(src.extra) > 1 else None
            for r in range(0, src.rows, step):
                n = min(step, src.rows - r)
                yield nbits.dequantize(codes[r:r + n], sc[r:r + n], None if zp is None else zp[r:r + n],
                                       q.bits, q.block, (n, src.cols))

    def _init(self, name: str, dt: int, shape: list[int], offset: int, nbytes: int) -> str:
        name = self.L.fresh(name)
        t = TensorProto(name=name, data_type=dt, dims=shape)
        t.data_location = TensorProto.EXTERNAL
        for k, val in (("location", DATA_FILE), ("offset", str(offset)), ("length", str(nbytes))):
            e = t.external_data.add()
            e.key, e.value = k, val
        self.L.inits.append(t)
        self.own.add(name)
        return name

    # -- f32 -------------------------------------------------------------------------
    def f32(self, srcs: list[_WSrc], name: str) -> str:
        """The row-concatenation of srcs as one f32 [rows, cols] initializer."""
        key = ("f32", tuple((id(s.value), s.transpose) for s in srcs))
        if key in self.names:
            return str(self.names[key])
        rows, cols = sum(s.rows for s in srcs), srcs[0].cols
        nbytes = rows * cols * 4
        off = self.data.start(nbytes >= _LARGE)
        for s in srcs:
            if s.kind == "f32":
                assert s.op is not None
                self.data.copy(resolve_path(s.op.attrs["file"], self.base_dir), int(s.op.attrs.get("offset", 0)),
                               s.rows * s.cols * 4)
            else:
                for chunk in self.rows_f32(s):
                    self.data.write(chunk)
        out = self._init(name, TensorProto.FLOAT, [rows, cols], off, nbytes)
        self.names[key] = out
        return out

    # -- MatMulNBits ---------------------------------------------------------------
    def nbits_format(self, src: _WSrc, quant: NbitsFormat | None) -> NbitsFormat | None:
        """The MatMulNBits format this weight takes, or None for f32."""
        if src.kind == "gguf":
            assert src.op is not None
            scheme = _weight_type(src.op).dtype.scheme  # type: ignore[union-attr]
            if scheme in LOSSLESS:
                bits, block = LOSSLESS[scheme]
                return NbitsFormat(bits, block, False)
            bits, block = REQUANT[scheme]
            return NbitsFormat(bits, block, True)
        if src.kind == "nbits":
            assert src.op is not None
            q = _weight_type(src.op).dtype
            assert isinstance(q, QuantType)
            return NbitsFormat(q.bits, q.block, q.zero == "int")
        if quant is not None and src.cols % quant.block == 0:
            return quant
        return None

    def nbits(self, srcs: list[_WSrc], fmt: NbitsFormat, name: str) -> tuple[str, str, str | None]:
        """(B, scales, zero points) initializers of the row-concatenation of srcs."""
        key = ("nbits", tuple(id(s.value) for s in srcs), fmt)
        if key in self.names:
            return self.names[key]  # type: ignore[no-any-return]
        rows, cols = sum(s.rows for s in srcs), srcs[0].cols
        nb = cols // fmt.block
        b_bytes = rows * cols * fmt.bits // 8
        off = self.data.start(b_bytes >= _LARGE)
        scales: list[np.ndarray] = []
        zps: list[np.ndarray] = []
        for s in srcs:
            for codes, sc, zp in self._nbits_chunks(s, fmt):
                self.data.write(codes)
                scales.append(sc.astype(np.float32).reshape(-1))
                if zp is not None:
                    zps.append(zp.reshape(-1))
        b = self._init(name + ".qweight", TensorProto.UINT8, [rows, nb, fmt.block * fmt.bits // 8], off, b_bytes)
        sc_all = np.concatenate(scales)
        off = self.data.start(sc_all.nbytes >= _LARGE)
        self.data.write(sc_all)
        s_name = self._init(name + ".scales", TensorProto.FLOAT, [rows, nb], off, sc_all.nbytes)
        z_name = None
        if fmt.asym:
            z_all = np.concatenate(zps).astype(np.uint8)
            off = self.data.start(z_all.nbytes >= _LARGE)
            self.data.write(z_all)
            z_name = self._init(name + ".zero_points", TensorProto.UINT8, [z_all.size], off, z_all.nbytes)
        self.names[key] = (b, s_name, z_name)
        return b, s_name, z_name

    def _nbits_chunks(self, s: _WSrc, fmt: NbitsFormat) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        label = s.op.attrs.get("name", s.value.name) if s.op is not None else s.value.name
        if s.kind == "nbits":
            assert s.op is not None
            w = load_weight(s.op.attrs, _weight_type(s.op), self.base_dir)
            sc = self.eval(s.extra[0])
            zp = self.eval(s.extra[1]) if len(s.extra) > 1 else None
            self.log.passthrough += 1
            yield np.asarray(w.data), sc, zp
            return
        if s.kind == "gguf":
            assert s.op is not None
            w = load_weight(s.op.attrs, _weight_type(s.op), self.base_dir)
            scheme = w.qtype.scheme
            raw = np.asarray(w.data).reshape(s.rows, -1)
            step = max(1, _CHUNK // max(1, s.cols * 4))
            if scheme in LOSSLESS:
                self.log.lossless[scheme] = self.log.lossless.get(scheme, 0) + 1
                for r in range(0, s.rows, step):
                    codes, sc, _, _ = repack_gguf(raw[r:r + step], scheme, s.cols)
                    yield codes, sc, None
                return
            err, peak = 0.0, 0.0
            for r in range(0, s.rows, step):
                x = gguf_blocks.dequantize(raw[r:r + step], scheme, (min(step, s.rows - r), s.cols))
                codes, sc, zp = nbits.quantize(x, fmt.bits, fmt.block, not fmt.asym, np.dtype(np.float32))
                back = nbits.dequantize(codes, sc, zp, fmt.bits, fmt.block, x.shape)
                err, peak = max(err, float(np.abs(back - x).max())), max(peak, float(np.abs(x).max()))
                yield codes, sc, zp
            self.log.requantized.append({"weight": label, "from": scheme, "to": f"int{fmt.bits}",
                                         "block": fmt.block, "max_abs_error": err,
                                         "max_rel_error": err / peak if peak else 0.0})
            return
        tag = f"int{fmt.bits}"
        self.log.quantized[tag] = self.log.quantized.get(tag, 0) + 1
        for x in self.rows_f32(s):
            codes, sc, zp = nbits.quantize(x, fmt.bits, fmt.block, not fmt.asym, np.dtype(np.float32))
            yield codes, sc, zp

    def small(self, arr: np.ndarray, name: str) -> str:
        """A small computed constant (norm scales, rotary tables)."""
        return self.L.const(np.ascontiguousarray(arr), name)


# -- the IR, indexed ---------------------------------------------------------------------------------

class _Graph:
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
                    op.operands and all(id(v) in self.static for v in op.operands)):
                self.static.update(id(r) for r in op.results)

    def uses(self, v: Value) -> list[Op]:
        return self.users.get(id(v), [])

    def only_use(self, v: Value, user: Op) -> bool:
        return id(v) not in self.outputs and all(u is user for u in self.uses(v))

    def producer(self, v: Value, name: str) -> Op | None:
        op = v.owner
        return op if op is not None and op.name == name else None


def _tt(v: Value) -> TensorType:
    t = v.type
    if not isinstance(t, TensorType):
        raise BuildError(f"%{v.name} is not a tensor")
    return t


def _weight_src(g: _Graph, v: Value) -> _WSrc | None:
    """How to read a static 2-D weight value, or None if v is not static 2-D float."""
    if id(v) not in g.static:
        return None
    t = _tt(v)
    shape = t.static_shape()
    if shape is None or len(shape) != 2 or not isinstance(t.dtype, DType) or not t.dtype.is_float:
        return None
    rows, cols = shape
    op = v.owner
    assert op is not None
    if op.name == "core.weight" and t.dtype == DType.f32:
        return _WSrc(v, "f32", op, rows, cols)
    if op.name == "core.cast" and op.attrs.get("to") == DType.f32:
        src = op.operands[0].owner
        if src is not None and src.name == "core.weight" and isinstance(_tt(op.operands[0]).dtype, DType):
            return _WSrc(v, "cast", src, rows, cols)
    if op.name == "llm.dequantize" and t.dtype == DType.f32:
        src = op.operands[0].owner
        q = _tt(op.operands[0]).dtype
        if src is not None and src.name == "core.weight" and isinstance(q, QuantType):
            if q.scheme in LOSSLESS or q.scheme in REQUANT:
                return _WSrc(v, "gguf", src, rows, cols)
            if q.scheme == "nbits":
                return _WSrc(v, "nbits", src, rows, cols, tuple(op.operands[1:]))
    return _WSrc(v, "eval", None, rows, cols)


def _qmatmul_src(op: Op) -> _WSrc | None:
    """The weight of llm.quantized_matmul(x, packed core.weight [, scales[, zero points]])."""
    w = op.operands[1]
    wop = w.owner
    q = _tt(w).dtype
    if wop is None or wop.name != "core.weight" or not isinstance(q, QuantType) or _tt(w).rank != 2 \
            or not op.attrs.get("transpose_b", True):
        return None
    rows, cols = _tt(w).static_shape() or (0, 0)
    if q.scheme == "nbits":
        return _WSrc(w, "nbits", wop, rows, cols, tuple(op.operands[2:]))
    if q.scheme in LOSSLESS or q.scheme in REQUANT:
        return _WSrc(w, "gguf", wop, rows, cols)
    return None


def _projection(g: _Graph, op: Op | None) -> tuple[_WSrc, Value | None] | None:
    """x @ W^T by a static weight, as core.matmul, llm.quantized_matmul or llm.linear (no
    activation): its weight and static bias (or None)."""
    if op is None or op.attrs.get("transpose_a") or not op.attrs.get("transpose_b", op.name != "core.matmul"):
        return None
    if op.name == "core.matmul":
        src = _weight_src(g, op.operands[1])
        return (src, None) if src is not None else None
    if op.name == "llm.quantized_matmul":
        src = _qmatmul_src(op)
        return (src, None) if src is not None else None
    if op.name == "llm.linear" and op.attrs.get("activation", "none") == "none":
        src = _weight_src(g, op.operands[1])
        bias = op.operands[2] if len(op.operands) > 2 else None
        if src is None or (bias is not None and id(bias) not in g.static):
            return None
        return src, bias
    return None


@dataclass
class _Attn:
    """One matched attention block."""

    sdpa: Op
    claims: list[Op]
    q: tuple[str, Value]  # ("lin", [B,S,H*D] value) or ("4d", [B,S,H,D] value)
    k: tuple[str, Value]
    v: tuple[str, Value]
    out: Value  # the value GQA's [B,S,H*D] output stands for
    out_is_3d: bool
    past_k: Value
    past_v: Value
    present_k: int  # output index
    present_v: int
    heads: int
    kv_heads: int
    head_dim: int
    rope: Op | None = None  # the rotary op on q (k's matches it)
    rope_in_gqa: bool = True  # else com.microsoft.RotaryEmbedding on q and k before the op
    packed: list[Op] | None = None  # q/k/v matmuls fused into one packed projection
    packed_bias: list[Value] | None = None  # their static biases (added after the matmul)
    packed_srcs: list[_WSrc] | None = None  # their weights


class DecoderLowering:
    """Lowers a decoder module to ONNX, writing weights into `data_path` as it goes."""

    def __init__(self, module: Module, data_path: str, *, quant: NbitsFormat | None,
                 accuracy_level: int, max_len: int | None, last_logits: bool,
                 fuse_gate_up: bool = False) -> None:
        self.module = module
        self.fn = module.main
        base = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
        self.base_dir = base
        self.L = Lowering(module, base, inline_weights=False)
        self.g = _Graph(self.fn)
        self.data = _DataFile(data_path)
        self.log = _QuantLog()
        self.w = _Weights(self.L, self.data, Interpreter(module, check_types=False), base, self.log)
        self.quant, self.accuracy_level = quant, accuracy_level
        self.max_len_opt, self.last_logits = max_len, last_logits
        self.fuse_gate_up = fuse_gate_up
        self.max_len: int | None = None
        self.claimed: set[int] = set()
        self.fused_adds: dict[int, Op] = {}  # id(rms_norm op) -> the add it absorbs
        self.attn: dict[int, _Attn] = {}
        self.fallback_reasons: dict[str, int] = {}
        self.generic_ops: dict[str, int] = {}
        self._seqlens: dict[int, tuple[str, str]] = {}
        self._rope_tables: dict[int, tuple[str, str]] = {}

    # -- helpers -------------------------------------------------------------------------
    def name(self, v: Value) -> str:
        """The ONNX name of v, lowering static producers on first use."""
        L = self.L
        if id(v) in L.names:
            return L.names[id(v)]
        if id(v) in L.weights:
            return L.name_of(v)
        op = v.owner
        if op is None or id(op) in self.claimed:
            raise BuildError(f"value %{v.name} is used before it is defined")
        for o in op.operands:
            self.name(o)
        self._generic(op)
        return L.name_of(v)

    def _generic(self, op: Op) -> None:
        for o in op.operands:
            self.name(o)
        if op.name != "core.weight":
            self.generic_ops[op.name] = self.generic_ops.get(op.name, 0) + 1
        self.L.lower_op(op)

    def bind(self, v: Value, name: str) -> None:
        self.L.names[id(v)] = name

    def node(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "",
             out_names: list[str] | None = None, **attrs: Any) -> list[str]:
        return self.L.node(op_type, inputs, n_out, domain, out_names, **attrs)

    def reason(self, why: str) -> None:
        self.fallback_reasons[why] = self.fallback_reasons.get(why, 0) + 1

    # -- matching ------------------------------------------------------------------------
    def _heads(self, v: Value, user: Op, n: int, d: int, claims: list[Op]) -> tuple[str, Value] | None:
        """v = transpose([B,S,n,D], perm 0,2,1,3): the projection it came from."""
        g = self.g
        t = g.producer(v, "core.transpose")
        if t is None or tuple(t.attrs.get("perm") or ()) != (0, 2, 1, 3) or not g.only_use(v, user):
            return None
        x4 = t.operands[0]
        xt = _tt(x4)
        if xt.rank != 4 or xt.shape[2:] != (n, d):
            return None
        claims.append(t)
        r = g.producer(x4, "core.reshape")
        if r is not None and g.only_use(x4, t):
            lin = r.operands[0]
            lt = _tt(lin)
            if lt.rank == 3 and lt.shape[2] == n * d and lt.shape[:2] == xt.shape[:2]:
                claims.append(r)
                return ("lin", lin)
        return ("4d", x4)

    def _match_attention(self, op: Op) -> _Attn | None:
        g, fn = self.g, self.fn
        at = op.attrs
        if len(op.operands) != 3 or not at.get("causal") or at.get("softmax_eps", 0.0):
            self.reason("attention with a mask, non-causal or softmax_eps")
            return None
        q, k_all, v_all = op.operands
        qt, kt = _tt(q), _tt(k_all)
        if qt.dtype != DType.f32 or not all(isinstance(d, int) for d in (qt.shape[1], kt.shape[1], qt.shape[3])):
            self.reason("attention not f32 or with symbolic heads")
            return None
        heads, kv_heads, d = int(qt.shape[1]), int(kt.shape[1]), int(qt.shape[3])  # type: ignore[arg-type]
        claims: list[Op] = [op]
        cache_args = {id(a): a for a in _cache_args(fn)}
        parts = []
        for val in (k_all, v_all):
            c = g.producer(val, "core.concat")
            if c is None or len(c.operands) != 2 or c.attrs.get("axis") not in (2, -2) \
                    or id(c.operands[0]) not in cache_args or id(val) not in g.outputs \
                    or any(u is not op for u in g.uses(val)) or list(g.outputs).count(id(val)) != 1:
                self.reason("KV concat of a past input not found")
                return None
            claims.append(c)
            parts.append((c.operands[0], c.operands[1], g.outputs[id(val)]))
        (past_k, k_new, ok), (past_v, v_new, ov) = parts
        rope_q = g.producer(q, "llm.rotary_embedding")
        rope_k = g.producer(k_new, "llm.rotary_embedding")
        if (rope_q is None) != (rope_k is None):
            self.reason("rotary on only one of q and k")
            return None
        if rope_q is not None and rope_k is not None:
            same = rope_q.attrs == rope_k.attrs and all(a is b for a, b in zip(rope_q.operands[1:], rope_k.operands[1:]))
            if not same or id(rope_q.operands[1]) not in g.static or not g.only_use(q, op) \
                    or not all(u is claims[1] for u in g.uses(k_new)):
                self.reason("rotary tables of q and k differ or are not constant")
                return None
            claims += [rope_q, rope_k]
            q_src, k_src, q_user, k_user = rope_q.operands[0], rope_k.operands[0], rope_q, rope_k
        else:
            q_src, k_src, q_user, k_user = q, k_new, op, claims[1]
        qh = self._heads(q_src, q_user, heads, d, claims)
        kh = self._heads(k_src, k_user, kv_heads, d, claims)
        vh = self._heads(v_new, claims[2], kv_heads, d, claims)
        if qh is None or kh is None or vh is None:
            self.reason("q/k/v head split (reshape + transpose) not found")
            return None
        out, out_3d = op.results[0], False
        users = g.uses(out)
        if len(users) == 1 and users[0].name == "core.transpose" and id(out) not in g.outputs \
                and tuple(users[0].attrs.get("perm") or ()) == (0, 2, 1, 3):
            t = users[0]
            tu = g.uses(t.results[0])
            if len(tu) == 1 and tu[0].name == "core.reshape" and id(t.results[0]) not in g.outputs:
                rt = _tt(tu[0].results[0])
                if rt.rank == 3 and rt.shape[2] == heads * d:
                    claims += [t, tu[0]]
                    out, out_3d = tu[0].results[0], True
        a = _Attn(op, claims, qh, kh, vh, out, out_3d, past_k, past_v, ok, ov, heads, kv_heads, d, rope_q)
        if rope_q is not None:
            # GroupQueryAttention's own rotary needs a table width that is a multiple of 8
            width = _tt(rope_q.operands[1]).shape[1]
            a.rope_in_gqa = isinstance(width, int) and width % 8 == 0 and 2 * width <= d
        return a

    def _match_packed(self, a: _Attn) -> None:
        """q, k and v projections of one activation by static weights -> one packed matmul."""
        g = self.g
        if not all(kind == "lin" for kind, _ in (a.q, a.k, a.v)) or not a.rope_in_gqa:
            return
        mms: list[Op] = []
        adds: list[Op] = []
        biases: list[Value] = []
        srcs: list[_WSrc] = []
        for _, lin in (a.q, a.k, a.v):
            if len(g.uses(lin)) != 1 or id(lin) in g.outputs or lin.owner is None:
                return
            op: Op | None = lin.owner
            bias = None
            if op is not None and op.name == "core.add":  # projection + bias
                mmv, bias = op.operands
                if id(mmv) in g.static:
                    mmv, bias = bias, mmv
                if id(bias) not in g.static or _tt(bias).rank != 1 or len(g.uses(mmv)) != 1 \
                        or id(mmv) in g.outputs:
                    return
                adds.append(op)
                op = mmv.owner
            proj = _projection(g, op)
            if proj is None or op is None:
                return
            if proj[1] is not None:
                if bias is not None:
                    return
                bias = proj[1]
            mms.append(op)
            srcs.append(proj[0])
            if bias is not None:
                biases.append(bias)
        if biases and len(biases) != 3:
            return
        x = mms[0].operands[0]
        if any(m.operands[0] is not x for m in mms):
            return
        fmts = {self.w.nbits_format(s, self.quant) for s in srcs}
        if len(fmts) != 1:
            self.reason("q/k/v weights in different formats: not packed")
            return
        a.packed = mms
        a.packed_srcs = srcs
        a.packed_bias = biases or None
        a.claims += mms + adds

    def match(self) -> None:
        for op in self.fn.ops:
            if op.name == "llm.scaled_dot_product_attention":
                a = self._match_attention(op)
                if a is not None:
                    self._match_packed(a)
                    self.attn[id(op)] = a
                    self.claimed.update(id(c) for c in a.claims if c is not op)
        g = self.g
        for op in self.fn.ops:
            if op.name != "llm.rms_norm" or id(op) in self.claimed or _tt(op.operands[0]).dtype != DType.f32:
                continue
            add = g.producer(op.operands[0], "core.add")
            if add is None or id(add) in self.claimed or id(op.operands[1]) not in g.static:
                continue
            s = add.results[0]
            if _tt(add.operands[0]).shape != _tt(s).shape or _tt(add.operands[1]).shape != _tt(s).shape:
                continue
            if any(g.index[id(u)] < g.index[id(op)] for u in g.uses(s)):
                continue
            self.fused_adds[id(op)] = add
            self.claimed.add(id(add))

    # -- emitting ------------------------------------------------------------------------
    def run(self) -> tuple[onnx.ModelProto, list[str], list[str]]:
        fn, L = self.fn, self.L
        input_names = [a.name for a in fn.args]
        for a in fn.args:
            L.names[id(a)] = a.name
            L.used_names.add(a.name)
        out_names = _output_names(fn)
        L.used_names.update(out_names)
        L.bind_dims(fn, input_names)
        self.match()
        for op in fn.ops:
            if id(op) in self.claimed:
                continue
            L.origin, L.src_op = op.origin, op  # perf: src_op tags nodes (nodeinfo)
            handler = _EMIT.get(op.name)
            if handler is not None and handler(self, op):
                continue
            if all(id(r) in self.g.static for r in op.results) and op.results:
                continue  # lowered on first use by a generic op
            self._generic(op)
        L.origin, L.src_op = None, None
        fixed = set(input_names) | {t.name for t in L.inits}
        for v, want in zip(fn.outputs, out_names):
            got = self.name(v)
            if got == want:
                continue
            if got in fixed:  # an input or a constant returned as is
                self.node("Identity", [got], out_names=[want])
            else:  # rename the producing node's output (an Identity would copy, e.g., a whole cache)
                self._rename(got, want)
            fixed.add(want)
        self.finish_data()  # before the graph is made: make_graph copies the initializers
        return self._model(input_names, out_names), input_names, out_names

    def _rename(self, old: str, new: str) -> None:
        for nd in self.L.nodes:
            for i, o in enumerate(nd.output):
                if o == old:
                    nd.output[i] = new
            for i, x in enumerate(nd.input):
                if x == old:
                    nd.input[i] = new
        for k, v in list(self.L.names.items()):
            if v == old:
                self.L.names[k] = new

    def _model(self, input_names: list[str], out_names: list[str]) -> onnx.ModelProto:
        fn = self.fn
        ins = [_value_info(n, a.type, "past_len" if i >= 2 else None) for i, (n, a) in enumerate(zip(input_names, fn.args))]
        outs = []
        for i, (n, v) in enumerate(zip(out_names, fn.outputs)):
            t = _tt(v)
            if i == 0 and self.last_logits:
                t = TensorType((t.shape[0], 1, t.shape[2]), t.dtype)
            outs.append(_value_info(n, t, "present_len" if i else None))
        graph = helper.make_graph(self.L.nodes, self.module.name or "main", ins, outs, initializer=self.L.inits)
        opsets = [helper.make_opsetid(d, v) for d, v in sorted(self.L.opsets.items())]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="llmir", producer_version=__version__)
        model.ir_version = 10
        return model

    def finish_data(self) -> None:
        """Append the generic lowering's constants after the streamed weights; fix their offsets."""
        plan = self.L.plan
        if plan.chunks:
            base = self.data.start(True)
            for t in self.L.inits:
                if t.data_location == TensorProto.EXTERNAL and t.name not in self.w.own:
                    for e in t.external_data:
                        if e.key == "offset":
                            e.value = str(int(e.value) + base)
            pos = 0
            for c in plan.chunks:
                if c.offset > pos:
                    self.data.write(b"\0" * (c.offset - pos))
                if c.data is not None:
                    self.data.write(c.data)
                else:
                    assert c.src is not None
                    self.data.copy(c.src, c.src_offset, c.nbytes)
                pos = c.offset + c.nbytes
        self.data.close()

    # -- pieces ----------------------------------------------------------------------------
    def linear(self, x: str, src: _WSrc, label: str, srcs: list[_WSrc] | None = None) -> str:
        """x @ W^T for a static weight (or the row-concatenation of several)."""
        srcs = srcs or [src]
        fmt = self.w.nbits_format(src, self.quant)
        if fmt is not None and srcs[0].cols % fmt.block == 0:
            b, s, z = self.w.nbits(srcs, fmt, label)
            n, k = sum(x.rows for x in srcs), src.cols
            ins = [x, b, s] + ([z] if z else [])
            return self.node("MatMulNBits", ins, domain=MS, K=k, N=n, bits=fmt.bits, block_size=fmt.block,
                             accuracy_level=self.accuracy_level)[0]
        w = self.w.f32(srcs, label)
        return self.node("FusedMatMul", [x, w], domain=MS, transA=0, transB=1)[0]

    def seqlens(self, positions: Value) -> tuple[str, str]:
        """seqlens_k [B] i32 (last position) and total_sequence_length (max + 1), from positions."""
        if id(positions) in self._seqlens:
            return self._seqlens[id(positions)]
        origin, self.L.origin = self.L.origin, None
        pos = self.name(positions)
        last = self.L.one("Gather", pos, self.L.const(np.array(-1, np.int64), "last_index"), axis=1)
        seqlens = self.L.one("Cast", last, to=TensorProto.INT32)
        top = self.L.one("ReduceMax", last, keepdims=0)
        total = self.L.one("Cast", self.L.one("Add", top, self.L.const(np.array(1, np.int64), "one")),
                           to=TensorProto.INT32)
        self.L.origin = origin
        self._seqlens[id(positions)] = (seqlens, total)
        return seqlens, total

    def rope_tables(self, rope: Op) -> tuple[str, str]:
        key = id(rope.operands[1])
        if key in self._rope_tables:
            return self._rope_tables[key]
        cos = self.w.eval(rope.operands[1]).astype(np.float32)
        sin = self.w.eval(rope.operands[2]).astype(np.float32)
        rows = cos.shape[0]
        if self.max_len_opt is not None and self.max_len_opt > rows:
            raise InputError(f"--max-len {self.max_len_opt} exceeds the {rows} positions the model's "
                             "rotary table covers", hint=f"use --max-len {rows} or less")
        n = self.max_len_opt or rows
        self.max_len = n if self.max_len is None else min(self.max_len, n)
        out = (self.w.small(cos[:n], "cos_cache"), self.w.small(sin[:n], "sin_cache"))
        self._rope_tables[key] = out
        return out


def _value_info(name: str, t: Any, len_name: str | None) -> onnx.ValueInfoProto:
    shape: list[Any] = []
    for i, d in enumerate(t.shape):
        if isinstance(d, int):
            shape.append(d)
        elif len_name is not None and i == 2:
            shape.append(len_name)
        else:
            shape.append(format_dim(d).replace("?", "") if format_dim(d) != "?" else None)
    return helper.make_tensor_value_info(name, onnx_dtype(t), shape)


# -- per-op emitters (return True when handled) -------------------------------------------------------

def _emit_attention(D: DecoderLowering, op: Op) -> bool:
    a = D.attn.get(id(op))
    if a is None:
        return False
    L = D.L
    ins: list[str]
    if a.packed is not None and a.packed_srcs is not None:
        srcs = a.packed_srcs
        qkv = D.linear(D.name(a.packed[0].operands[0]), srcs[0], _label(a.packed[0], "qkv_proj"), srcs)
        if a.packed_bias:
            bias = np.concatenate([D.w.eval(b).astype(np.float32) for b in a.packed_bias])
            qkv = L.one("Add", qkv, D.w.small(bias, _label(a.packed[0], "qkv_proj.bias")))
        ins = [qkv, "", ""]
    else:
        def three(part: tuple[str, Value], n: int) -> str:
            kind, val = part
            name = D.name(val)
            return name if kind == "lin" else L.one("Reshape", name, L.ints([0, 0, n * a.head_dim]))
        ins = [three(a.q, a.heads), three(a.k, a.kv_heads), three(a.v, a.kv_heads)]
    positions = a.rope.operands[3] if a.rope is not None else D.fn.args[1]
    if a.rope is not None and not a.rope_in_gqa:
        cos, sin = D.rope_tables(a.rope)
        rd = int(a.rope.attrs.get("rotary_dim", 0)) or a.head_dim
        inter = int(bool(a.rope.attrs.get("interleaved", False)))
        for i, n in ((0, a.heads), (1, a.kv_heads)):
            ins[i] = L.one("RotaryEmbedding", ins[i], D.name(positions), cos, sin, domain=MS,
                           num_heads=n, rotary_embedding_dim=rd, interleaved=inter)
    seqlens, total = D.seqlens(positions)
    attrs: dict[str, Any] = {"num_heads": a.heads, "kv_num_heads": a.kv_heads}
    at = op.attrs
    if at.get("scale"):
        attrs["scale"] = float(at["scale"])
    if at.get("softcap"):
        attrs["softcap"] = float(at["softcap"])
    if at.get("sliding_window"):
        attrs["local_window_size"] = int(at["sliding_window"])
    ins += [D.name(a.past_k), D.name(a.past_v), seqlens, total]
    if a.rope is not None and a.rope_in_gqa:
        cos, sin = D.rope_tables(a.rope)
        attrs["do_rotary"] = 1
        attrs["rotary_interleaved"] = int(bool(a.rope.attrs.get("interleaved", False)))
        ins += [cos, sin, D.name(positions)]
    names = _output_names(D.fn)
    out = D.L.fresh(f"attn{a.present_k // 2}")
    D.node("GroupQueryAttention", ins, 3, MS, [out, names[a.present_k], names[a.present_v]], **attrs)
    D.bind(D.fn.outputs[a.present_k], names[a.present_k])
    D.bind(D.fn.outputs[a.present_v], names[a.present_v])
    if a.out_is_3d:
        D.bind(a.out, out)
    else:
        r = L.one("Reshape", out, L.ints([0, 0, a.heads, a.head_dim]))
        D.bind(a.out, L.one("Transpose", r, perm=[0, 2, 1, 3]))
    return True


def _label(op: Op, default: str) -> str:
    origin = op.origin or ""
    base = origin.split(":", 1)[-1] if origin else ""
    return (base + "." + default) if base and not base.endswith(default) else (base or default)


def _emit_rms_norm(D: DecoderLowering, op: Op) -> bool:
    x, w = op.operands
    if _tt(x).dtype != DType.f32 or id(w) not in D.g.static:
        return False
    gamma = D.w.eval(w).astype(np.float64) + float(op.attrs.get("offset", 0.0))
    g = D.w.small(gamma.astype(np.float32), _label(op, "weight"))
    eps = float(op.attrs.get("eps", 1e-6))
    add = D.fused_adds.get(id(op))
    if add is not None:
        a, b = (D.name(v) for v in add.operands)
        y, s = D.L.fresh("norm"), D.L.fresh("residual")
        D.node("SkipSimplifiedLayerNormalization", [a, b, g], 4, MS, [y, "", "", s], epsilon=eps)
        D.bind(add.results[0], s)
    else:
        y = D.node("SimplifiedLayerNormalization", [D.name(x), g], axis=-1, epsilon=eps, stash_type=1)[0]
    D.bind(op.results[0], y)
    return True


def _emit_matmul(D: DecoderLowering, op: Op) -> bool:
    if op.attrs.get("transpose_a"):
        return False
    x, wv = op.operands
    src = _weight_src(D.g, wv)
    if src is None or _tt(x).dtype != DType.f32 or _tt(x).rank < 2:
        return False
    if not op.attrs.get("transpose_b"):
        src = _WSrc(wv, "eval", None, src.cols, src.rows, transpose=True)
    xn = D.name(x)
    if D.last_logits and _feeds_logits(D, op):
        xn = D.L.one("Gather", xn, D.L.const(np.array([-1], np.int64), "last_position"), axis=1)
    D.bind(op.results[0], D.linear(xn, src, _label(op, "weight")))
    return True


def _feeds_logits(D: DecoderLowering, op: Op) -> bool:
    """The lm_head: the last matmul on the way to the logits output through elementwise ops."""
    v = op.results[0]
    for _ in range(8):
        if v is D.fn.outputs[0]:
            return True
        users = D.g.uses(v)
        if len(users) != 1 or users[0].name not in ("core.mul", "core.div", "core.tanh", "core.add"):
            return False
        v = users[0].results[0]
    return False


def _emit_gated_mlp(D: DecoderLowering, op: Op) -> bool:
    x, wg, wu, wd = op.operands
    srcs = [_weight_src(D.g, w) for w in (wg, wu, wd)]
    if any(s is None for s in srcs) or _tt(x).dtype != DType.f32:
        return False
    sg, su, sd = srcs
    assert sg is not None and su is not None and sd is not None
    xn = D.name(x)
    if D.fuse_gate_up and D.w.nbits_format(sg, D.quant) == D.w.nbits_format(su, D.quant):
        both = D.linear(xn, sg, _label(op, "gate_up_proj"), [sg, su])
        gate, up = D.node("Split", [both, D.L.ints([sg.rows, su.rows])], 2, axis=-1)
    else:
        gate = D.linear(xn, sg, _label(op, "gate_proj"))
        up = D.linear(xn, su, _label(op, "up_proj"))
    h = _activation(D, gate, op.attrs.get("activation", "silu"))
    D.bind(op.results[0], D.linear(D.L.one("Mul", h, up), sd, _label(op, "down_proj")))
    return True


def _emit_embedding(D: DecoderLowering, op: Op) -> bool:
    src = _weight_src(D.g, op.operands[0])
    if src is None:
        return False
    ids = D.name(op.operands[1])
    fmt = D.w.nbits_format(src, D.quant) if _tied_head(D, op.operands[0]) else None
    if fmt is not None and not fmt.asym:
        # the lm_head is this table, quantized: look rows up in its blocks (stored once)
        b, s, _ = D.w.nbits([src], fmt, _label(op, "weight"))
        flat = D.L.one("Reshape", b, D.L.ints([src.rows, src.cols * fmt.bits // 8]))
        D.bind(op.results[0], D.L.one("GatherBlockQuantized", flat, ids, s, domain=MS, bits=fmt.bits,
                                      block_size=fmt.block, gather_axis=0, quantize_axis=1))
        return True
    table = D.w.f32([src], _label(op, "weight"))
    D.bind(op.results[0], D.L.one("Gather", table, ids, axis=0))
    return True


def _tied_head(D: DecoderLowering, table: Value) -> bool:
    """The embedding table is also a matmul weight (x @ table^T): a tied lm_head."""
    return any(u.name == "core.matmul" and u.operands[1] is table and u.attrs.get("transpose_b")
               for u in D.g.uses(table))


def _emit_silu(D: DecoderLowering, op: Op) -> bool:
    if _tt(op.operands[0]).dtype != DType.f32:
        return False
    D.bind(op.results[0], D.L.one("QuickGelu", D.name(op.operands[0]), domain=MS, alpha=1.0))
    return True


def _emit_qmatmul(D: DecoderLowering, op: Op) -> bool:
    """llm.quantized_matmul by a GGUF or nbits weight: like a matmul by its dequantized value."""
    src = _qmatmul_src(op)
    if src is None or _tt(op.operands[0]).dtype != DType.f32:
        return False
    D.bind(op.results[0], D.linear(D.name(op.operands[0]), src, _label(op, "weight")))
    return True


def _activation(D: DecoderLowering, x: str, act: str) -> str:
    if act == "silu":
        return D.L.one("QuickGelu", x, domain=MS, alpha=1.0)
    if act == "relu":
        return D.L.one("Relu", x)
    return D.L.one("Gelu", x, approximate="none" if act == "gelu" else "tanh")


def _emit_linear(D: DecoderLowering, op: Op) -> bool:
    """llm.linear: act(x @ W^T + bias) with a static weight."""
    src = _weight_src(D.g, op.operands[1])
    if src is None or _tt(op.operands[0]).dtype != DType.f32:
        return False
    if not op.attrs.get("transpose_b", True):
        src = _WSrc(op.operands[1], "eval", None, src.cols, src.rows, transpose=True)
    y = D.linear(D.name(op.operands[0]), src, _label(op, "weight"))
    if len(op.operands) > 2:
        y = D.L.one("Add", y, D.name(op.operands[2]))
    act = op.attrs.get("activation", "none")
    D.bind(op.results[0], y if act == "none" else _activation(D, y, act))
    return True


def _emit_add_rms_norm(D: DecoderLowering, op: Op) -> bool:
    """llm.add_rms_norm (-O3's fused residual add) -> SkipSimplifiedLayerNormalization."""
    x, r, w = op.operands
    if _tt(x).dtype != DType.f32 or id(w) not in D.g.static:
        return False
    gamma = D.w.eval(w).astype(np.float64) + float(op.attrs.get("offset", 0.0))
    g = D.w.small(gamma.astype(np.float32), _label(op, "weight"))
    y, s = D.L.fresh("norm"), D.L.fresh("residual")
    D.node("SkipSimplifiedLayerNormalization", [D.name(x), D.name(r), g], 4, MS, [y, "", "", s],
           epsilon=float(op.attrs.get("eps", 1e-6)))
    D.bind(op.results[0], y)
    D.bind(op.results[1], s)
    return True


def _emit_silu_mul(D: DecoderLowering, op: Op) -> bool:
    gate, up = op.operands
    if _tt(gate).dtype != DType.f32:
        return False
    D.bind(op.results[0], D.L.one("Mul", _activation(D, D.name(gate), "silu"), D.name(up)))
    return True


_EMIT = {
    "llm.scaled_dot_product_attention": _emit_attention,
    "llm.rms_norm": _emit_rms_norm,
    "core.matmul": _emit_matmul,
    "llm.gated_mlp": _emit_gated_mlp,
    "llm.embedding": _emit_embedding,
    "core.silu": _emit_silu,
    "llm.quantized_matmul": _emit_qmatmul,
    "llm.linear": _emit_linear,
    "llm.add_rms_norm": _emit_add_rms_norm,
    "llm.silu_mul": _emit_silu_mul,
}


# -- the artifact ----------------------------------------------------------------------------------------


def _signature(names: list[str], values: list[Value], len_name: str, last_logits: bool = False) -> list[dict[str, Any]]:
    out = []
    for n, v in zip(names, values):
        t = _tt(v)
        shape: list[Any] = [d if isinstance(d, int) else format_dim(d) for d in t.shape]
        if t.rank == 4 and n != "input_ids":
            shape[2] = "?" + len_name
        if n == "logits" and last_logits:
            shape[1] = 1
        out.append({"name": n, "dtype": str(t.dtype), "shape": shape})
    return out


def _copy_tokenizer(module: Module, tmp: str) -> dict[str, Any] | None:
    """tokenizer.json into the artifact: copied (HF) or rebuilt from GGUF metadata."""
    spec = module.attrs.get("llm.tokenizer")
    if not isinstance(spec, dict) or "file" not in spec:
        return None
    base = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
    path = resolve_path(str(spec["file"]), base)
    dst = os.path.join(tmp, TOKENIZER_FILE)
    if spec.get("format") == "hf":
        if not os.path.isfile(path):
            raise InputError(f"{path}: tokenizer file not found (module attribute llm.tokenizer)",
                             hint="import the model again, or build from a module without a tokenizer")
        shutil.copyfile(path, dst)
    elif spec.get("format") == "gguf":
        from llmir_core.runtime.tokenizer import load_tokenizer

        load_tokenizer(module, base).backend.save(dst, pretty=True)
    else:
        raise InputError(f"module @{module.name}: llm.tokenizer format '{spec.get('format')}' is not known (hf, gguf)")
    return {"format": "hf", "file": TOKENIZER_FILE}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


@traced("build", trace_attrs.build_args, trace_attrs.built)  # perf: tracing
def build_decoder(module: Module, out_dir: str, *, max_len: int | None = None,
                  accuracy_level: int = ACCURACY_LEVEL, quant: str | None = None, quant_block: int = 32,
                  quant_symmetric: bool = True, last_logits: bool = False, fuse_gate_up: bool = False,
                  source_path: str | None = None) -> dict[str, Any]:
    """Write the decoder artifact for `module` into out_dir (atomically); return its manifest.

    max_len: KV positions the artifact supports (the rotary table is cut to it; default: the
      model's whole table). accuracy_level: MatMulNBits' activation precision (4 = int8, the
      fastest measured on AVX2; 1 = fp32, exact against the reference). quant: `int4`/`int8`
      quantizes float weights (block `quant_block`, symmetric unless quant_symmetric=False;
      GGUF-quantized weights keep their format regardless). last_logits: logits only for the
      last position ([batch, 1, vocab]; prefill 14-16% faster on SmolLM2-135M). fuse_gate_up:
      one matmul for gate and up (measured no faster; off).
    """
    if not is_decoder(module):
        raise InputError(f"module @{module.name} is not a decoder (inputs input_ids, positions, "
                         "past_key_values.{l}.key/.value; outputs logits and one present per past)",
                         hint="import a Hugging Face folder or a GGUF file with `llmir import`, or build "
                              "with the generic onnxruntime backend")
    if accuracy_level not in (0, 1, 2, 3, 4):
        raise InputError(f"accuracy level must be 0..4, got {accuracy_level}")
    fmt = parse_quant(quant, quant_block, quant_symmetric)
    if max_len is not None and max_len < 1:
        raise InputError(f"--max-len must be >= 1, got {max_len}")
    out_dir = os.path.abspath(out_dir)
    check_artifact_dir(out_dir)
    src_sha, src_name = source_digest(module, source_path)
    tmp = artifact_tmp_dir(out_dir)
    try:
        D = DecoderLowering(module, os.path.join(tmp, DATA_FILE), quant=fmt, accuracy_level=accuracy_level,
                            max_len=max_len, last_logits=last_logits, fuse_gate_up=fuse_gate_up)
        try:
            model, ins, outs = D.run()
        finally:
            if not D.data.fh.closed:
                D.data.fh.close()
        with open(os.path.join(tmp, MODEL_FILE), "wb") as fh:
            fh.write(model.SerializeToString(deterministic=True))
        files = [MODEL_FILE, DATA_FILE]
        tok = _copy_tokenizer(module, tmp)
        if tok:
            files.append(TOKENIZER_FILE)
        template = module.attrs.get("llm.chat_template")
        if isinstance(template, str) and template:
            with open(os.path.join(tmp, TEMPLATE_FILE), "w", encoding="utf-8", newline="") as fh:
                fh.write(template)
            files.append(TEMPLATE_FILE)
        manifest = _manifest(module, D, model, ins, outs, files, tmp, src_name, src_sha, tok,
                             TEMPLATE_FILE if TEMPLATE_FILE in files else None)
        with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _manifest(module: Module, D: DecoderLowering, model: onnx.ModelProto, ins: list[str], outs: list[str],
              files: list[str], tmp: str, src_name: str | None, src_sha: str,
              tok: dict[str, Any] | None, template: str | None) -> dict[str, Any]:
    fn = module.main
    caches = _cache_args(fn)
    t0 = _tt(caches[0])
    shared = len(D.attn) * 2 == len(caches)
    vocab = _tt(fn.outputs[0]).shape[-1]
    ctx = module.attrs.get("llm.context_length")
    max_len = D.max_len or D.max_len_opt or (int(ctx) if isinstance(ctx, int) else None)
    eos = module.attrs.get("llm.eos_token_ids") or ()
    decoder = {
        "schema": DECODER_SCHEMA,
        "layers": len(caches) // 2, "kv_heads": t0.shape[1], "head_dim": t0.shape[3],
        "heads": next(iter(D.attn.values())).heads if D.attn else None,
        "vocab": vocab, "max_len": max_len, "context_length": ctx,
        "kv_cache": "shared_buffer" if shared else "concat",
        "cache": [{"input": a.name, "output": o, "kv_heads": _tt(a).shape[1], "head_dim": _tt(a).shape[3]}
                  for a, o in zip(caches, outs[1:])],
        "logits": "last" if D.last_logits else "all",
        "accuracy_level": D.accuracy_level,
        "quant": {"f32_weights": (f"int{D.quant.bits}" if D.quant else "f32"),
                  "block": D.quant.block if D.quant else None,
                  "symmetric": (not D.quant.asym) if D.quant else None,
                  "gguf_lossless": dict(sorted(D.log.lossless.items())),
                  "gguf_requantized": D.log.requantized,
                  "quantized": dict(sorted(D.log.quantized.items())),
                  "nbits_passthrough": D.log.passthrough},
        "fused_attention_layers": len(D.attn),
        "packed_qkv_layers": sum(1 for a in D.attn.values() if a.packed),
        "generic_ops": dict(sorted(D.generic_ops.items())),
        "not_fused": dict(sorted(D.fallback_reasons.items())),
        "eos_token_ids": [int(e) for e in eos],
        "bos_token_id": module.attrs.get("llm.bos_token_id"),
        "tokenizer": tok, "chat_template": template,
        "generation": _jsonable(module.attrs.get("llm.generation") or {}),
        "architecture": module.attrs.get("llm.architecture"),
    }
    return {
        "schema_version": 1, "llmir_version": __version__, "spec_version": SPEC_VERSION,
        "target": "onnxruntime", "builder": "decoder",
        "opset": {d.domain or "ai.onnx": d.version for d in model.opset_import},
        "model": MODEL_FILE,
        "source": {"file": src_name, "sha256": src_sha},
        "inputs": _signature(ins, list(fn.args), "past_len"),
        "outputs": _signature(outs, list(fn.outputs), "present_len", D.last_logits),
        "files": {f: {"sha256": sha256_file(os.path.join(tmp, f)), "bytes": os.path.getsize(os.path.join(tmp, f))}
                  for f in files},
        "decoder": decoder,
    }


__all__ = ["is_decoder", "build_decoder", "parse_quant", "repack_gguf", "gguf_block_scales", "NbitsFormat",
           "DecoderLowering", "LOSSLESS", "REQUANT", "ACCURACY_LEVEL", "DECODER_SCHEMA"]
