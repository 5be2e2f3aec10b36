"""The onnxruntime decoder serializer: a lowered decoder module (ort ops) to an artifact folder.

`serialize_decoder(module, out_dir)` maps each op of a module lowered by the onnxruntime lowering
passes (llmir_core/passes/lower_ort_*.py) to its ONNX node(s), with no pattern matching:

- `ort.group_query_attention` -> com.microsoft.GroupQueryAttention (ai.llmir's with
  `kernel = "llmir"`: the same inputs and attributes; plus `seqlens_k` and
  `total_sequence_length` computed from its positions operand, and com.microsoft.RotaryEmbedding
  on q and k when the rotary table is too narrow for the op's own rotary; `kv_quant` ->
  k/v_quant_type PER_CHANNEL/PER_TENSOR, kv_cache_bit_width 8, k_scale/v_scale inputs). Its
  present outputs keep the IR's names, so the runtime binds past and present to one buffer;
- `ort.pack` (pack-ort-weights) -> its initializers, written when a reader first names it: the
  weight in the pack's format, nothing decided here. "nbits": MatMulNBits' blocks, scales (and
  zero points) of its weight (GGUF and GPTQ/AWQ/compressed-tensors checkpoints repacked, nbits
  passed through, float weights quantized as the pack's `quantize` says; the manifest lists
  each); "panel16": f32 16-row panels;
- `ort.matmul_nbits` -> MatMulNBits over its pack's blocks (or over a packed core.weight with its
  scales and zero points, repacked here: not yet an ort.pack);
- `ort.matmul_gguf` -> ai.llmir MatMulGGUF (llmir's kernel) over the GGUF tensor's rows exactly
  as the file stores them (uint8 [N, row_bytes], copied byte for byte into the data file: the
  artifact stays self-contained, and onnxruntime reads external data only inside the model's
  folder, so it cannot reference the GGUF file in place);
- `ort.fused_matmul` -> FusedMatMul; `ort.(skip_)simplified_layer_norm` ->
  (Skip)SimplifiedLayerNormalization; `ort.quick_gelu` -> QuickGelu;
- `llm.embedding` -> Gather over the streamed table; `ort.gather_block_quantized` ->
  GatherBlockQuantized over the table's MatMulNBits blocks (a tied lm_head's stored once);
- everything else through the generic op-by-op lowering (`ort_lower.Lowering`).

Weights are streamed into the data file (row chunks), each stored once, and the files are
byte-identical across builds of the same input. The artifact holds `model.onnx`,
`model.onnx.data`, `manifest.json` (with a `decoder` section), the tokenizer and chat template,
and `model.lowered.llmir` (the lowered module as `build` printed it: each node's `llmir.line` tag
is a line of it, `llmir.loc` the op's source location).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from llmir_core import __version__
from llmir_core.artifact import ArtifactWriter, jsonable, manifest_head
from llmir_core.errors import BuildError, InputError
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.dims import format_dim
from llmir_core.ir.types import DType, TensorType, numpy_dtype
from llmir_core.quant import gguf_blocks, int32_packed, nbits
from llmir_core.quant.gguf_repack import LOSSLESS, REQUANT, repack_gguf
from llmir_core.targets.onnxruntime.graph import (
    DATA_FILE,
    MODEL_FILE,
    MS,
    Lowering,
    onnx_dtype,
)
from llmir_core.targets.onnxruntime.lower_common import (
    ACCURACY_LEVEL,
    LAST_LOGITS,
    Graph,
    NbitsFormat,
    WSrc,
    cache_args,
    is_decoder,
    kv_bytes_per_token,
    module_options,
    packed_lossless,
    packed_parts,
    packed_requant_reason,
    packed_src,
    parse_quant,
    tt,
    weight_src,
    weight_srcs,
)
from llmir_core.targets.onnxruntime.onnx_lower import DataWriter
from llmir_core.weights import expected_nbytes, load_weight, resolve_path

DECODER_SCHEMA = 1
_LARGE = 1 << 20  # tensors of at least this many bytes are aligned to 4 KiB (ort_lower)
_FOLD_MAX = 1 << 16  # elements: static values up to this size are folded into constants
_COMPUTE_FOLD = (
    1 << 8
)  # elements: below a computed rotary table, values up to this (inv_freq) are folded
_CHUNK = 32 << 20  # bytes of f32 rows processed at once when a weight is transformed


# -- the data file ---------------------------------------------------------------------------------

# -- weights ---------------------------------------------------------------------------------------


@dataclass
class _QuantLog:
    lossless: dict[str, int] = field(default_factory=dict)  # format -> tensors
    exact: dict[str, int] = field(default_factory=dict)  # format -> tensors read as stored
    requantized: list[dict[str, Any]] = field(default_factory=list)
    quantized: dict[str, int] = field(default_factory=dict)
    passthrough: int = 0
    embedding: list[dict[str, Any]] = field(default_factory=list)  # gather_block_quantized tables


def _weight_type(op: Op) -> TensorType:
    t = op.results[0].type
    assert isinstance(t, TensorType)
    return t


class _Weights:
    """Materializes static values as initializers in the data file, each once."""

    def __init__(
        self, L: Lowering, data: DataWriter, interp: Interpreter, base_dir: str, log: _QuantLog
    ) -> None:
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
    def rows_f32(self, src: WSrc) -> Iterator[np.ndarray]:
        step = max(1, _CHUNK // max(1, src.cols * 4))
        if src.kind == "eval":
            arr = self.eval(src.value).astype(np.float32, copy=False)
            if src.transpose:
                arr = arr.T
            for r in range(0, src.rows, step):
                yield np.ascontiguousarray(arr[r : r + step])
            return
        assert src.op is not None
        w = load_weight(src.op.attrs, _weight_type(src.op), self.base_dir)
        if src.kind in ("f32", "cast"):
            for r in range(0, src.rows, step):
                yield np.asarray(w[r : r + step], dtype=np.float32)
        elif src.kind == "gguf":
            raw = np.asarray(w.data).reshape(src.rows, -1)
            for r in range(0, src.rows, step):
                yield gguf_blocks.dequantize(
                    raw[r : r + step], w.qtype.scheme, (min(step, src.rows - r), src.cols)
                )
        elif src.kind == "packed":
            yield self._packed_f32(src, w)
        else:  # nbits
            q = w.qtype
            codes = np.asarray(w.data).reshape(src.rows, -1)
            sc = self.eval(src.extra[0])
            zp = self.eval(src.extra[1]) if len(src.extra) > 1 else None
            for r in range(0, src.rows, step):
                n = min(step, src.rows - r)
                yield nbits.dequantize(
                    codes[r : r + n],
                    sc[r : r + n],
                    None if zp is None else zp[r : r + n],
                    q.bits,
                    q.block,
                    (n, src.cols),
                )

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
    def f32(self, srcs: list[WSrc], name: str) -> str:
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
                self.data.copy(
                    resolve_path(s.op.attrs["file"], self.base_dir),
                    int(s.op.attrs.get("offset", 0)),
                    s.rows * s.cols * 4,
                )
            else:
                for chunk in self.rows_f32(s):
                    self.data.write(chunk)
        out = self._init(name, TensorProto.FLOAT, [rows, cols], off, nbytes)
        self.names[key] = out
        return out

    def f32_panels(self, srcs: list[WSrc], name: str) -> str:
        """The row-concatenation of srcs as one f32 [ceil(rows/16), cols, 16] initializer in
        16-row panels, zero-padded (`ort.matmul_f32 {layout = "panel16"}`,
        llmir_core/targets/onnxruntime/panels.py), converted a run of whole panels at a time."""
        from llmir_core.targets.onnxruntime.panels import PANEL, panel_shape, to_panels

        key = ("f32_panels", tuple((id(s.value), s.transpose) for s in srcs))
        if key in self.names:
            return str(self.names[key])
        rows, cols = sum(s.rows for s in srcs), srcs[0].cols
        shape = list(panel_shape(rows, cols))
        nbytes = shape[0] * cols * PANEL * 4
        off = self.data.start(nbytes >= _LARGE)
        rest = np.empty((0, cols), np.float32)  # rows short of a whole panel, carried over
        for s in srcs:
            for chunk in self.rows_f32(s):
                rest = np.concatenate([rest, chunk]) if rest.size else chunk
                whole = rest.shape[0] // PANEL * PANEL
                if whole:
                    self.data.write(to_panels(rest[:whole]))
                    rest = rest[whole:]
        if rest.shape[0]:
            self.data.write(to_panels(rest))  # the last panel, zero-padded
        out = self._init(name + ".panel16", TensorProto.FLOAT, shape, off, nbytes)
        self.names[key] = out
        return out

    # -- 16-bit storage (ort.cast operands) -----------------------------------------
    def stored(self, v: Value, name: str, srcs: list[WSrc] | None) -> str:
        """A constant in its own float dtype (f16/bf16) as an initializer in the data file: a
        16-bit weight's file bytes as they are, or a cast of an f32 weight (or row-concatenation
        of weights: srcs, the cast's operand) converted row chunk by row chunk."""
        key = ("stored", id(v))
        if key in self.names:
            return str(self.names[key])
        t = tt(v)
        shape = [int(d) for d in (t.static_shape() or ())]
        if len(shape) != len(t.shape):
            raise BuildError(f"%{v.name}: a stored weight needs a static shape")
        assert isinstance(t.dtype, DType)
        npd = numpy_dtype(t.dtype)
        nbytes = int(np.prod(shape)) * npd.itemsize
        op = v.owner
        assert op is not None
        off = self.data.start(nbytes >= _LARGE)
        if op.name == "core.weight" and not _weight_type(op).is_quantized:
            self.data.copy(
                resolve_path(op.attrs["file"], self.base_dir),
                int(op.attrs.get("offset", 0)),
                nbytes,
            )
        elif srcs is not None:
            for s in srcs:
                for chunk in self.rows_f32(s):
                    self.data.write(np.ascontiguousarray(chunk.astype(npd)))
        else:
            self.data.write(np.ascontiguousarray(np.asarray(self.eval(v)).astype(npd)))
        out = self._init(name, onnx_dtype(t.dtype), shape, off, nbytes)
        self.names[key] = out
        return out

    # -- int32-packed checkpoint weights (GPTQ / AWQ / compressed-tensors) -------------
    def _packed_f32(self, src: WSrc, w: Any) -> np.ndarray:
        p = packed_parts(src, self.eval)
        q = p.qtype
        return int32_packed.dequantize(
            q.scheme,
            np.asarray(w.data),
            p.scales,
            p.zero_points,
            p.g_idx,
            q.bits,
            q.block,
            (src.rows, src.cols),
        )

    # -- GGUF rows as stored (ai.llmir MatMulGGUF) -------------------------------------
    def gguf_rows(self, srcs: list[WSrc], name: str) -> str:
        """The row-concatenation of GGUF tensors of one format as one uint8 [rows, row_bytes]
        initializer: each tensor's bytes copied from its file as they are (no decoding)."""
        key = ("gguf_rows", tuple(id(s.value) for s in srcs))
        if key in self.names:
            return str(self.names[key])
        rows = sum(s.rows for s in srcs)
        nbytes = 0
        off = self.data.start(True)
        for s in srcs:
            assert s.op is not None and s.scheme is not None
            t = _weight_type(s.op)
            n = expected_nbytes(t)
            assert n is not None  # a static 2-D weight
            self.data.copy(
                resolve_path(s.op.attrs["file"], self.base_dir), int(s.op.attrs.get("offset", 0)), n
            )
            nbytes += n
            self.log.exact[s.scheme] = self.log.exact.get(s.scheme, 0) + 1
        out = self._init(name + ".gguf", TensorProto.UINT8, [rows, nbytes // rows], off, nbytes)
        self.names[key] = out
        return out

    # -- MatMulNBits ---------------------------------------------------------------
    def nbits(
        self, srcs: list[WSrc], fmt: NbitsFormat, name: str, f16: bool = False
    ) -> tuple[str, str, str | None]:
        """(B, scales, zero points) initializers of the row-concatenation of srcs; f16: the
        weights this build quantizes get f16 scales (the op's `scale_dtype`)."""
        key = ("nbits", tuple(id(s.value) for s in srcs), fmt, f16)
        if key in self.names:
            return self.names[key]  # type: ignore[no-any-return]
        rows, cols = sum(s.rows for s in srcs), srcs[0].cols
        nb = cols // fmt.block
        b_bytes = rows * cols * fmt.bits // 8
        off = self.data.start(b_bytes >= _LARGE)
        scales: list[np.ndarray] = []
        zps: list[np.ndarray] = []
        sd = np.dtype(np.float16 if f16 else np.float32)
        for s in srcs:
            for codes, sc, zp in self._nbits_chunks(s, fmt, sd):
                self.data.write(codes)
                scales.append(sc.astype(np.float32).reshape(-1))
                if zp is not None:
                    zps.append(zp.reshape(-1))
        b = self._init(
            name + ".qweight",
            TensorProto.UINT8,
            [rows, nb, fmt.block * fmt.bits // 8],
            off,
            b_bytes,
        )
        sc_all = np.concatenate(scales)
        half = sc_all.astype(np.float16)
        if np.array_equal(half.astype(np.float32), sc_all):
            # every scale is an f16 (GGUF's own, for the lossless formats): stored as f16, half
            # the bytes, and cast to the f32 MatMulNBits takes (onnxruntime folds the Cast once,
            # when the session is made)
            off = self.data.start(half.nbytes >= _LARGE)
            self.data.write(half)
            s16 = self._init(
                name + ".scales_f16", TensorProto.FLOAT16, [rows, nb], off, half.nbytes
            )
            s_name = s16  # f32 for MatMulNBits: f32_scales (a Cast, made on first use)
            self.names[("f16_scales", s16)] = True
        else:
            off = self.data.start(sc_all.nbytes >= _LARGE)
            self.data.write(sc_all)
            s_name = self._init(name + ".scales", TensorProto.FLOAT, [rows, nb], off, sc_all.nbytes)
        z_name = None
        if fmt.asym:
            z_all = np.concatenate(zps).astype(np.uint8)
            off = self.data.start(z_all.nbytes >= _LARGE)
            self.data.write(z_all)
            z_name = self._init(
                name + ".zero_points", TensorProto.UINT8, [z_all.size], off, z_all.nbytes
            )
        self.names[key] = (b, s_name, z_name)
        return b, s_name, z_name

    def f32_scales(self, s: str) -> str:
        """The f32 scales MatMulNBits / GatherBlockQuantized take: `s` itself, or for f16 scales
        (`nbits`) a Cast, which onnxruntime folds once when the session is made."""
        key = ("f32_scales", s)
        if key not in self.names:
            f16 = ("f16_scales", s) in self.names
            self.names[key] = self.L.one("Cast", s, to=TensorProto.FLOAT) if f16 else s
        return str(self.names[key])

    def _nbits_chunks(
        self, s: WSrc, fmt: NbitsFormat, sd: np.dtype = np.dtype(np.float32)
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
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
            if LOSSLESS.get(scheme) == (fmt.bits, fmt.block):
                self.log.lossless[scheme] = self.log.lossless.get(scheme, 0) + 1
                for r in range(0, s.rows, step):
                    codes, sc, _, _ = repack_gguf(raw[r : r + step], scheme, s.cols)
                    yield codes, sc, None
                return
            err, peak = 0.0, 0.0
            for r in range(0, s.rows, step):
                x = gguf_blocks.dequantize(
                    raw[r : r + step], scheme, (min(step, s.rows - r), s.cols)
                )
                codes, sc, zp = nbits.quantize(x, fmt.bits, fmt.block, not fmt.asym, sd)
                back = nbits.dequantize(codes, sc, zp, fmt.bits, fmt.block, x.shape)
                err, peak = (
                    max(err, float(np.abs(back - x).max())),
                    max(peak, float(np.abs(x).max())),
                )
                yield codes, sc, zp
            self.log.requantized.append(
                {
                    "weight": label,
                    "from": scheme,
                    "to": f"int{fmt.bits}",
                    "block": fmt.block,
                    "max_abs_error": err,
                    "max_rel_error": err / peak if peak else 0.0,
                }
            )
            return
        if s.kind == "packed":
            yield from self._packed_chunks(s, fmt, str(label), sd)
            return
        tag = f"int{fmt.bits}"
        self.log.quantized[tag] = self.log.quantized.get(tag, 0) + 1
        for x in self.rows_f32(s):
            yield nbits.quantize(x, fmt.bits, fmt.block, not fmt.asym, sd)

    def _packed_chunks(
        self, s: WSrc, fmt: NbitsFormat, label: str, sd: np.dtype = np.dtype(np.float32)
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
        """A packed checkpoint weight as written: its own codes when it repacks losslessly in
        fmt, else requantized (the reason and the error go to the manifest)."""
        assert s.op is not None
        w = load_weight(s.op.attrs, _weight_type(s.op), self.base_dir)
        p = packed_parts(s, self.eval)
        q = p.qtype
        if packed_lossless(s, fmt, self.eval):
            self.log.lossless[q.scheme] = self.log.lossless.get(q.scheme, 0) + 1
            codes, sc32, zpk = int32_packed.to_nbits(
                q.scheme,
                np.asarray(w.data),
                p.scales,
                p.zero_points,
                q.bits,
                q.block,
                (s.rows, s.cols),
            )
            if fmt.asym and zpk is None:  # a sibling of a row-concatenation has zero points
                mid = 1 << (fmt.bits - 1)
                zpk = nbits.pack_codes(
                    np.full((s.rows, s.cols // fmt.block), mid, np.uint8), fmt.bits, mid
                )
            yield codes, sc32, (zpk if fmt.asym else None)
            return
        x = self._packed_f32(s, w)
        codes, sc32, zpk = nbits.quantize(x, fmt.bits, fmt.block, not fmt.asym, sd)
        back = nbits.dequantize(codes, sc32, zpk, fmt.bits, fmt.block, x.shape)
        err, peak = float(np.abs(back - x).max()), float(np.abs(x).max())
        why = (
            packed_requant_reason(s, self.eval)
            or f"the op's format is int{fmt.bits} block {fmt.block}"
        )
        self.log.requantized.append(
            {
                "weight": label,
                "from": q.scheme,
                "to": f"int{fmt.bits}",
                "block": fmt.block,
                "reason": why,
                "max_abs_error": err,
                "max_rel_error": err / peak if peak else 0.0,
            }
        )
        yield codes, sc32, zpk

    # -- DynamicQuantizeMatMul ------------------------------------------------------
    def qgemm(self, srcs: list[WSrc], weights: str, name: str) -> tuple[str, str, str | None]:
        """(B [K, N], b_scale [N], b_zero_point [N] or None) initializers of the
        row-concatenation of srcs, quantized per row (`ort.dynamic_quantize_matmul`)."""
        from llmir_core.targets.onnxruntime.dialect import qgemm_weight

        key = ("qgemm", tuple((id(s.value), s.transpose) for s in srcs), weights)
        if key in self.names:
            return self.names[key]  # type: ignore[no-any-return]
        rows, cols = sum(s.rows for s in srcs), srcs[0].cols
        codes = np.empty((cols, rows), np.uint8 if weights == "u8" else np.int8)
        scales = np.empty(rows, np.float32)
        r = 0
        for s in srcs:
            for chunk in self.rows_f32(s):
                q, sc = qgemm_weight(chunk, weights)
                n = q.shape[0]
                codes[:, r : r + n] = (
                    (q.T.astype(np.int16) + 128).astype(np.uint8) if weights == "u8" else q.T
                )
                scales[r : r + n] = sc
                r += n
        off = self.data.start(codes.nbytes >= _LARGE)
        self.data.write(codes)
        dt = TensorProto.UINT8 if weights == "u8" else TensorProto.INT8
        b = self._init(name + ".qweight", dt, [cols, rows], off, codes.nbytes)
        off = self.data.start(scales.nbytes >= _LARGE)
        self.data.write(scales)
        s_name = self._init(name + ".scales", TensorProto.FLOAT, [rows], off, scales.nbytes)
        z_name = None
        if weights == "u8":
            zp = np.full(rows, 128, np.uint8)
            off = self.data.start(zp.nbytes >= _LARGE)
            self.data.write(zp)
            z_name = self._init(name + ".zero_points", TensorProto.UINT8, [rows], off, zp.nbytes)
        self.log.quantized[f"qgemm {weights}"] = self.log.quantized.get(
            f"qgemm {weights}", 0
        ) + len(srcs)
        self.names[key] = (b, s_name, z_name)
        return b, s_name, z_name

    def s8(self, srcs: list[WSrc], name: str) -> tuple[str, str]:
        """(W [ceil(N/4), ceil(K/32), 4, 32] int8, S [N] f32) initializers of the
        row-concatenation of srcs for `ort.matmul_s8` (llmir_core/quant/s8.py)."""
        from llmir_core.quant import s8

        key = ("s8", tuple((id(s.value), s.transpose) for s in srcs))
        if key in self.names:
            return self.names[key]  # type: ignore[no-any-return]
        rows, cols = sum(s.rows for s in srcs), srcs[0].cols
        codes = np.empty((rows, cols), np.int8)
        scales = np.empty(rows, np.float32)
        r = 0
        for s in srcs:
            for chunk in self.rows_f32(s):
                q, sc = s8.quantize_rows(chunk)
                codes[r : r + q.shape[0]], scales[r : r + q.shape[0]] = q, sc
                r += q.shape[0]
        packed = s8.interleave(codes)
        del codes
        off = self.data.start(packed.nbytes >= _LARGE)
        self.data.write(packed)
        w_name = self._init(name + ".s8", TensorProto.INT8, list(packed.shape), off, packed.nbytes)
        off = self.data.start(scales.nbytes >= _LARGE)
        self.data.write(scales)
        s_name = self._init(name + ".scales", TensorProto.FLOAT, [rows], off, scales.nbytes)
        self.log.quantized["s8"] = self.log.quantized.get("s8", 0) + len(srcs)
        self.names[key] = (w_name, s_name)
        return w_name, s_name

    def small(self, arr: np.ndarray, name: str) -> str:
        """A small computed constant (norm scales, rotary tables)."""
        return self.L.const(np.ascontiguousarray(arr), name)


class DecoderSerializer:
    """Maps a lowered decoder module to ONNX, op by op, writing weights into `data_path`."""

    def __init__(self, module: Module, data_path: str) -> None:
        self.module = module
        self.fn = module.main
        opts = module_options(module)
        base = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
        self.base_dir = base
        self.L = Lowering(module, base, inline_weights=False)
        self.g = Graph(self.fn)
        self.data = DataWriter(data_path)
        self.log = _QuantLog()
        self.w = _Weights(self.L, self.data, Interpreter(module, check_types=False), base, self.log)
        self.quant = parse_quant(str(opts.get("quant", "f32")), int(opts.get("quant_block", 32)))
        self.accuracy_level = int(opts.get("accuracy_level", ACCURACY_LEVEL))
        self.max_len_opt: int | None = int(opts.get("max_len") or 0) or None
        # last-position logits are the IR's own (lower-ort-logits): the logits type says which
        self.last_logits = tt(self.fn.outputs[0]).rank == 3 and tt(self.fn.outputs[0]).shape[1] == 1
        self.max_len: int | None = None
        self.generic_ops: dict[str, int] = {}
        self.load_ops: dict[str, int] = {}  # ops computing the rotary tables (folded at load)
        self.gqa_ops = [op for op in self.fn.ops if op.name == "ort.group_query_attention"]
        self._seqlens: dict[int, tuple[str, str]] = {}
        self.last_positions: set[str] = set()  # the Gathers of each row's last position
        self._rope_tables: dict[int, tuple[str, str]] = {}
        # computed rotary tables: their named output -> [rows, columns], declared as value_info
        # so that the artifact check reads the positions they cover without running the graph
        self.rope_shapes: dict[str, list[int]] = {}

    # -- helpers -------------------------------------------------------------------------
    def name(self, v: Value) -> str:
        """The ONNX name of v, lowering static producers on first use."""
        L = self.L
        if id(v) in L.names:
            return L.names[id(v)]
        if id(v) in L.weights:
            return L.name_of(v)
        op = v.owner
        if op is None:
            raise BuildError(f"value %{v.name} is used before it is defined")
        t = v.type
        if op.name == "ort.cast" and id(op.operands[0]) in self.g.static:
            return _stored_cast(self, op)  # a 16-bit constant widened when the session loads
        if (
            id(v) in self.g.static
            and op.name not in ("core.weight", "core.constant")
            and isinstance(t, TensorType)
            and t.static_shape() is not None
            and int(np.prod(t.static_shape() or ())) <= _FOLD_MAX
        ):
            name = self.w.small(
                self.w.eval(v), _label(op, "const")
            )  # computed from constants: folded
            self.bind(v, name)
            return name
        for o in op.operands:
            self.name(o)
        self._generic(op)
        return L.name_of(v)

    def _generic(self, op: Op) -> None:
        for o in op.operands:
            self.name(o)
        if op.name not in ("core.weight", "core.constant"):  # initializers, not nodes
            self.generic_ops[op.name] = self.generic_ops.get(op.name, 0) + 1
        self.L.lower_op(op)

    def bind(self, v: Value, name: str) -> None:
        self.L.names[id(v)] = name

    def node(
        self,
        op_type: str,
        inputs: list[str],
        n_out: int = 1,
        domain: str = "",
        out_names: list[str] | None = None,
        **attrs: Any,
    ) -> list[str]:
        return self.L.node(op_type, inputs, n_out, domain, out_names, **attrs)

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
        for op in fn.ops:
            L.origin, L.src_op = op.origin, op  # src_op tags nodes (nodeinfo) for bench --profile
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
        ins = [
            _value_info(n, a.type, "past_len" if i >= 2 else None)
            for i, (n, a) in enumerate(zip(input_names, fn.args))
        ]
        outs = []
        for i, (n, v) in enumerate(zip(out_names, fn.outputs)):
            t = tt(v)
            outs.append(_value_info(n, t, "present_len" if i else None))
        graph = helper.make_graph(
            self.L.nodes,
            self.module.name or "main",
            ins,
            outs,
            initializer=self.L.inits,
            value_info=[
                helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                for n, shape in self.rope_shapes.items()
            ],
        )
        opsets = [helper.make_opsetid(d, v) for d, v in sorted(self.L.opsets.items())]
        model = helper.make_model(
            graph, opset_imports=opsets, producer_name="llmir", producer_version=__version__
        )
        model.ir_version = 10
        return model

    def finish_data(self) -> None:
        """Append the generic lowering's constants after the streamed weights; fix their offsets."""
        plan = self.L.plan
        if plan.chunks:
            base = self.data.append_plan(plan)
            for t in self.L.inits:
                if t.data_location == TensorProto.EXTERNAL and t.name not in self.w.own:
                    for e in t.external_data:
                        if e.key == "offset":
                            e.value = str(int(e.value) + base)
        self.data.close()

    # -- pieces ----------------------------------------------------------------------------
    def seqlens(self, positions: Value) -> tuple[str, str]:
        """seqlens_k [B] i32 (last position) and total_sequence_length (max + 1), from positions."""
        if id(positions) in self._seqlens:
            return self._seqlens[id(positions)]
        origin, self.L.origin = self.L.origin, None
        pos = self.name(positions)
        last = self.L.one("Gather", pos, self.L.const(np.array(-1, np.int64), "last_index"), axis=1)
        self.last_positions.add(last)
        seqlens = self.L.one("Cast", last, to=TensorProto.INT32)
        top = self.L.one("ReduceMax", last, keepdims=0)
        total = self.L.one(
            "Cast",
            self.L.one("Add", top, self.L.const(np.array(1, np.int64), "one")),
            to=TensorProto.INT32,
        )
        self.L.origin = origin
        self._seqlens[id(positions)] = (seqlens, total)
        return seqlens, total

    def rope_tables(self, cos_v: Value, sin_v: Value) -> tuple[str, str]:
        """The rotary tables as GroupQueryAttention / RotaryEmbedding inputs, cut to --max-len
        rows. A table the module computes from constants (positions x inv_freq -> cos/sin, as
        the importers emit it) is emitted as those nodes, which onnxruntime folds once when the
        session loads: the artifact stores inv_freq, not [context, rotary_dim/2] floats twice (for
        Qwen2.5's 32768 positions, 8 MB). A table stored as a constant stays an initializer."""
        key = id(cos_v)
        if key in self._rope_tables:
            return self._rope_tables[key]
        rows = tt(cos_v).shape[0]
        if not isinstance(rows, int):
            raise BuildError(f"%{cos_v.name}: the rotary table has no static length")
        if self.max_len_opt is not None and self.max_len_opt > rows:
            raise InputError(
                f"--max-len {self.max_len_opt} exceeds the {rows} positions the model's "
                "rotary table covers",
                hint=f"use --max-len {rows} or less",
            )
        n = self.max_len_opt or rows
        self.max_len = n if self.max_len is None else min(self.max_len, n)
        out = (self._rope_table(cos_v, n, "cos_cache"), self._rope_table(sin_v, n, "sin_cache"))
        self._rope_tables[key] = out
        return out

    def _rope_table(self, v: Value, n: int, label: str) -> str:
        rows = tt(v).shape[0]
        assert isinstance(rows, int)  # checked by rope_tables
        op = v.owner
        if op is None or op.name in ("core.weight", "core.constant"):
            arr = self.w.eval(v).astype(np.float32)
            return self.w.small(arr[:n], label)  # a stored table stays stored
        L = self.L
        name = self._computed(v)
        if n < rows:
            name = L.one("Slice", name, L.ints([0]), L.ints([n]), L.ints([0]))
        named = L.fresh(label)  # cos_cache / sin_cache, as a stored table would be called
        L.node("Identity", [name], out_names=[named])
        static = tt(v).static_shape()  # the table is a constant: its shape is static
        self.rope_shapes[named] = [n, *(list(static[1:]) if static is not None else [])]
        return named

    def _computed(self, v: Value) -> str:
        """v, a static value, as the nodes computing it from its constants; intermediate values
        up to _COMPUTE_FOLD elements are folded (inv_freq), larger ones computed."""
        L = self.L
        if id(v) in L.names or id(v) in L.weights:
            return self.name(v)
        op = v.owner
        assert op is not None
        if op.name in ("core.weight", "core.constant") or _numel(v) <= _COMPUTE_FOLD:
            return self.name(v)
        for o in op.operands:
            self._computed(o)
        for o in op.operands:
            self.name(o)
        self.load_ops[op.name] = self.load_ops.get(op.name, 0) + 1
        L.lower_op(op)
        return L.name_of(v)

    def weight(self, v: Value) -> list[WSrc]:
        srcs = weight_srcs(self.g, v)
        if srcs is None:
            raise BuildError(f"%{v.name} is not a constant 2-D float weight")
        return srcs


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


def _output_names(fn: Function) -> list[str]:
    return ["logits"] + [
        "present." + a.name.removeprefix("past_key_values.") for a in cache_args(fn)
    ]


def _weight_dtype(D: DecoderSerializer, module: Module) -> str:
    """--dtype, or without it the width the weights are stored in: the 16-bit dtype the
    source's stored weights keep (`ort.cast` of a constant, or a weight `ort.matmul16` or an
    embedding reads as stored), else f32."""
    opt = module_options(module).get("dtype")
    if opt:
        return str(opt)
    slot = {"ort.cast": 0, "ort.matmul16": 1, "llm.embedding": 0}
    dts = {
        str(tt(op.operands[slot[op.name]]).dtype)
        for op in D.fn.ops
        if op.name in slot
        and len(op.operands) > slot[op.name]
        and id(op.operands[slot[op.name]]) in D.g.static
        and tt(op.operands[slot[op.name]]).dtype in (DType.f16, DType.bf16)
    }
    return dts.pop() if len(dts) == 1 else ("mixed" if dts else "f32")


def _numel(v: Value) -> int:
    """Elements of v's static shape (dynamic: counted as large)."""
    shape = tt(v).static_shape()
    return int(np.prod(shape)) if shape is not None else 1 << 62


def _label(op: Op, default: str) -> str:
    origin = op.origin or ""
    base = origin.split(":", 1)[-1] if origin else ""
    return (base + "." + default) if base and not base.endswith(default) else (base or default)


# -- one emitter per op (return True when handled) -----------------------------------------------------


def _emit_gqa(D: DecoderSerializer, op: Op) -> bool:
    at = op.attrs
    L = D.L
    packed, rotary = bool(at.get("packed")), bool(at.get("do_rotary"))
    n_in = 1 if packed else 3
    ops_ = op.operands
    past_k, past_v, positions = ops_[n_in], ops_[n_in + 1], ops_[n_in + 2]
    heads, kv_heads = int(at["num_heads"]), int(at["kv_num_heads"])
    d = int(tt(past_k).shape[3])  # type: ignore[arg-type]
    if packed:
        ins = [D.name(ops_[0]), "", ""]
    else:
        ins = []
        for v, n in zip(ops_[:3], (heads, kv_heads, kv_heads)):
            x = D.name(v)
            ins.append(x if tt(v).rank == 3 else L.one("Reshape", x, L.ints([0, 0, n * d])))
    attrs: dict[str, Any] = {"num_heads": heads, "kv_num_heads": kv_heads}
    if at.get("scale"):
        attrs["scale"] = float(at["scale"])
    if at.get("softcap"):
        attrs["softcap"] = float(at["softcap"])
    if at.get("local_window_size"):
        attrs["local_window_size"] = int(at["local_window_size"])
    cos = sin = ""
    in_op = False
    if rotary:
        cos, sin = D.rope_tables(ops_[n_in + 3], ops_[n_in + 4])
        width = tt(ops_[n_in + 3]).shape[1]
        # GroupQueryAttention's own rotary needs a table width that is a multiple of 8
        in_op = isinstance(width, int) and width % 8 == 0 and 2 * width <= d
        if not in_op:
            if packed:
                ins = D.node(
                    "Split", [ins[0], L.ints([heads * d, kv_heads * d, kv_heads * d])], 3, axis=-1
                )
            rd = int(at.get("rotary_dim", 0)) or d
            inter = int(bool(at.get("rotary_interleaved", False)))
            for i, n in ((0, heads), (1, kv_heads)):
                ins[i] = L.one(
                    "RotaryEmbedding",
                    ins[i],
                    D.name(positions),
                    cos,
                    sin,
                    domain=MS,
                    num_heads=n,
                    rotary_embedding_dim=rd,
                    interleaved=inter,
                )
    seqlens, total = D.seqlens(positions)
    ins += [D.name(past_k), D.name(past_v), seqlens, total]
    if in_op:
        attrs["do_rotary"] = 1
        attrs["rotary_interleaved"] = int(bool(at.get("rotary_interleaved", False)))
    if in_op or (not rotary and at.get("kernel") == "llmir"):  # llmir's: pads (mixed_batch)
        ins += [cos, sin, D.name(positions)]
    quant = str(at.get("kv_quant", "none"))
    if quant != "none":  # int8 cache: k_scale and v_scale are inputs 12 and 13
        rot = 2 if rotary else 0
        k_scale, v_scale = ops_[n_in + 3 + rot], ops_[n_in + 4 + rot]
        ins += [""] * (12 - len(ins)) + [D.name(k_scale), D.name(v_scale)]
        attrs["k_quant_type"] = attrs["v_quant_type"] = quant.upper()
        attrs["kv_cache_bit_width"] = 8
    if at.get("qkv_bias"):  # llmir's kernel only: the packed projection's bias is input 14
        bias = D.w.small(D.w.eval(ops_[-1]).astype(np.float32), _label(op, "qkv_bias"))
        ins += [""] * (14 - len(ins)) + [bias]
    names, outs = _output_names(D.fn), D.fn.outputs
    ik = next(i for i, v in enumerate(outs) if v is op.results[1])
    iv = next(i for i, v in enumerate(outs) if v is op.results[2])
    out = L.fresh(f"attn{ik // 2}")
    if at.get("kernel") == "llmir":  # llmir's kernel: the same node in the ai.llmir domain
        from llmir_core.targets.onnxruntime.native import DOMAIN

        D.node("GroupQueryAttention", ins, 3, DOMAIN, [out, names[ik], names[iv]], **attrs)
    else:
        D.node("GroupQueryAttention", ins, 3, MS, [out, names[ik], names[iv]], **attrs)
    D.bind(op.results[0], out)
    D.bind(op.results[1], names[ik])
    D.bind(op.results[2], names[iv])
    return True


def _emit_norm(D: DecoderSerializer, op: Op) -> bool:
    w = op.operands[-1]
    gamma = D.w.eval(w).astype(np.float64) + float(op.attrs.get("offset", 0.0))
    g = D.w.small(gamma.astype(np.float32), _label(op, "weight"))
    eps = float(op.attrs.get("epsilon", 1e-6))
    llmir = op.attrs.get("kernel") == "llmir"  # llmir's kernel: the same node in ai.llmir
    if llmir:
        from llmir_core.targets.onnxruntime.native import DOMAIN
    if op.name == "ort.skip_simplified_layer_norm":
        a, b = (D.name(v) for v in op.operands[:2])
        y, s = D.L.fresh("norm"), D.L.fresh("residual")
        dom = DOMAIN if llmir else MS
        D.node("SkipSimplifiedLayerNormalization", [a, b, g], 4, dom, [y, "", "", s], epsilon=eps)
        D.bind(op.results[1], s)
    elif llmir:
        y = D.node(
            "SimplifiedLayerNormalization", [D.name(op.operands[0]), g], 1, DOMAIN, epsilon=eps
        )[0]
    else:
        y = D.node(
            "SimplifiedLayerNormalization",
            [D.name(op.operands[0]), g],
            axis=-1,
            epsilon=eps,
            stash_type=1,
        )[0]
    D.bind(op.results[0], y)
    return True


def _emit_fused_matmul(D: DecoderSerializer, op: Op) -> bool:
    trans_b = bool(op.attrs.get("transB", True))
    wop = op.operands[1].owner
    if wop is not None and wop.name == "ort.cast":  # a stored 16-bit weight (--dtype)
        w = D.name(op.operands[1])
        y = D.node(
            "FusedMatMul", [D.name(op.operands[0]), w], domain=MS, transA=0, transB=int(trans_b)
        )
        D.bind(op.results[0], y[0])
        return True
    srcs = D.weight(op.operands[1])
    if not trans_b:
        srcs = [WSrc(s.value, "eval", None, s.cols, s.rows, transpose=True) for s in srcs]
    w = D.w.f32(srcs, _label(op, "weight"))
    D.bind(
        op.results[0],
        D.node("FusedMatMul", [D.name(op.operands[0]), w], domain=MS, transA=0, transB=1)[0],
    )
    return True


def _emit_matmul_nbits(D: DecoderSerializer, op: Op) -> bool:
    at = op.attrs
    if len(op.operands) > 2:
        src = packed_src(D.g, op.operands[1], list(op.operands[2:]))
        if src is None:
            raise BuildError(f"%{op.operands[1].name}: ort.matmul_nbits needs a packed core.weight")
        fmt = NbitsFormat(int(at["bits"]), int(at["block_size"]), len(op.operands) > 3)
        srcs = [src]
        b, s, z = D.w.nbits(srcs, fmt, _label(op, "weight"))
    else:
        pack = _pack(D, op.operands[1], "nbits", op)
        fmt, srcs = _nbits_format(pack), D.weight(pack.operands[0])
        b, s, z = D.w.nbits(srcs, fmt, _label(pack, "weight"), _f16_scales(pack))
    n, k = sum(x.rows for x in srcs), srcs[0].cols
    if at.get("kernel") == "llmir":  # llmir's kernel: the same blocks, f16 or f32 scales as stored
        from llmir_core.targets.onnxruntime.native import DOMAIN, NBITS_OP_NAMES

        ins = [D.name(op.operands[0]), b, s] + ([z] if z else [])
        D.bind(op.results[0], D.L.one(NBITS_OP_NAMES[fmt.bits], *ins, domain=DOMAIN, **_epi(op)))
        return True
    ins = [D.name(op.operands[0]), b, D.w.f32_scales(s)] + ([z] if z else [])
    D.bind(
        op.results[0],
        D.node(
            "MatMulNBits",
            ins,
            domain=MS,
            K=k,
            N=n,
            bits=fmt.bits,
            block_size=fmt.block,
            accuracy_level=int(at.get("accuracy_level", ACCURACY_LEVEL)),
        )[0],
    )
    return True


def _pack(D: DecoderSerializer, v: Value, fmt: str, reader: Op) -> Op:
    """The `ort.pack {format = fmt}` that v comes from (pack-ort-weights put it there)."""
    op = v.owner
    if op is None or op.name != "ort.pack" or op.attrs.get("format") != fmt:
        raise BuildError(
            f'%{v.name}: {reader.name} reads a weight with no ort.pack {{format = "{fmt}"}} '
            "(lower the module with the pack-ort-weights pass)"
        )
    return op


def _nbits_format(pack: Op) -> NbitsFormat:
    at = pack.attrs
    return NbitsFormat(int(at["bits"]), int(at["block_size"]), bool(at.get("zero_points")))


def _f16_scales(pack: Op) -> bool:
    return pack.attrs.get("scale_dtype") == "f16"


def _emit_matmul_gguf(D: DecoderSerializer, op: Op) -> bool:
    """ort.matmul_gguf -> ai.llmir MatMulGGUF (X, W = the GGUF rows as stored, `format`)."""
    from llmir_core.targets.onnxruntime.native import DOMAIN, GGUF_OP_NAME

    fmt = str(op.attrs["format"])
    srcs = D.weight(op.operands[1])
    bad = [s.label for s in srcs if s.kind != "gguf" or s.scheme != fmt]
    if bad:
        raise BuildError(
            f'ort.matmul_gguf {{format = "{fmt}"}}: weight {", ".join(bad)} is not a GGUF '
            f"tensor stored as {fmt}"
        )
    w = D.w.gguf_rows(srcs, _label(op, "weight"))
    x = D.name(op.operands[0])
    D.bind(op.results[0], D.L.one(GGUF_OP_NAME, x, w, domain=DOMAIN, format=fmt, **_epi(op)))
    return True


def _emit_dynamic_quantize_matmul(D: DecoderSerializer, op: Op) -> bool:
    srcs = D.weight(op.operands[1])
    b, s, z = D.w.qgemm(srcs, str(op.attrs.get("weights", "s8pair")), _label(op, "weight"))
    ins = [D.name(op.operands[0]), b, s] + ([z] if z else [])
    D.bind(op.results[0], D.node("DynamicQuantizeMatMul", ins, domain=MS)[0])
    return True


def _emit_matmul_s8(D: DecoderSerializer, op: Op) -> bool:
    """ort.matmul_s8 -> llmir's custom op ai.llmir MatMulS8 (int8 weights read in place)."""
    from llmir_core.targets.onnxruntime.native import DOMAIN

    w, s = D.w.s8(D.weight(op.operands[1]), _label(op, "weight"))
    ins = [D.name(op.operands[0]), w, s]
    D.bind(op.results[0], D.node("MatMulS8", ins, domain=DOMAIN, **_epi(op))[0])
    return True


def _epi(op: Op) -> dict[str, Any]:
    """The `epilogue` node attribute of llmir's matmuls (absent: none)."""
    e = str(op.attrs.get("epilogue", "none"))
    return {} if e == "none" else {"epilogue": e}


def _emit_embedding(D: DecoderSerializer, op: Op) -> bool:
    t16 = op.operands[0]
    if id(t16) in D.g.static and tt(t16).dtype in (DType.f16, DType.bf16):  # --dtype
        stored = _stored16(D, t16, _label(op, "weight"))
        D.bind(op.results[0], D.L.one("Gather", stored, D.name(op.operands[1]), axis=0))
        return True
    top = op.operands[0].owner
    if top is not None and top.name == "ort.cast":  # a stored 16-bit table (--dtype)
        table = D.name(op.operands[0])
        D.bind(op.results[0], D.L.one("Gather", table, D.name(op.operands[1]), axis=0))
        return True
    src = weight_src(D.g, op.operands[0])
    if src is None:
        return False
    table = D.w.f32([src], _label(op, "weight"))
    D.bind(op.results[0], D.L.one("Gather", table, D.name(op.operands[1]), axis=0))
    return True


def _emit_gather_block_quantized(D: DecoderSerializer, op: Op) -> bool:
    """GatherBlockQuantized over the table's MatMulNBits blocks (the same initializers as a
    tied lm_head's: one copy), [vocab, blocks, bytes] as stored; its [..., blocks, block]
    rows are reshaped to [..., hidden]."""
    pack = _pack(D, op.operands[0], "nbits", op)
    src = weight_src(D.g, pack.operands[0])
    if src is None:
        raise BuildError(f"%{op.operands[0].name}: ort.gather_block_quantized needs a weight")
    at = pack.attrs
    fmt = _nbits_format(pack)
    b, s, _ = D.w.nbits([src], fmt, _label(pack, "weight"), _f16_scales(pack))
    nb = src.cols // fmt.block
    s3 = D.L.one("Reshape", D.w.f32_scales(s), D.L.ints([src.rows, nb, 1]))
    rows = D.L.one(
        "GatherBlockQuantized",
        b,
        D.name(op.operands[1]),
        s3,
        domain=MS,
        bits=fmt.bits,
        block_size=fmt.block,
        gather_axis=0,
        quantize_axis=2,
    )
    rank = tt(op.operands[1]).rank
    D.bind(op.results[0], D.L.one("Reshape", rows, D.L.ints([0] * rank + [src.cols])))
    quantize = str(at.get("quantize", "none"))
    info: dict[str, Any] = {
        "weight": src.label,
        "bits": fmt.bits,
        "block": fmt.block,
        "quantize": quantize,
        "shared_with_lm_head": any(u.name == "ort.matmul_nbits" for u in D.g.uses(pack.results[0])),
    }
    if quantize != "none":
        from llmir_core.targets.onnxruntime.lower_embedding import embedding_error

        info["max_abs_error"] = embedding_error(src, fmt, D.w.base_dir)
    D.w.log.embedding.append(info)
    return True


def _emit_moe(D: DecoderSerializer, op: Op) -> bool:
    from llmir_core.targets.onnxruntime.serialize_moe import emit_moe

    return emit_moe(D, op)


def _emit_quick_gelu(D: DecoderSerializer, op: Op) -> bool:
    D.bind(
        op.results[0],
        D.L.one(
            "QuickGelu", D.name(op.operands[0]), domain=MS, alpha=float(op.attrs.get("alpha", 1.0))
        ),
    )
    return True


def _stored_cast(D: DecoderSerializer, op: Op) -> str:
    """ort.cast of a constant: the constant as an initializer in its own (16-bit) dtype and a
    Cast node, which onnxruntime runs once when the session loads."""
    v = op.results[0]
    if id(v) in D.L.names:
        return D.L.names[id(v)]
    stored = _stored16(D, op.operands[0], _label(op, "weight"))
    to = op.attrs["to"]
    out = D.L.one("Cast", stored, to=onnx_dtype(to))
    D.bind(v, out)
    return out


def _stored16(D: DecoderSerializer, v16: Value, label: str) -> str:
    """The initializer of a static 16-bit weight: its file bytes, or `core.cast` of an f32
    weight (or row-concatenation of weights) converted row chunk by row chunk."""
    p = v16.owner
    srcs = weight_srcs(D.g, p.operands[0]) if p is not None and p.name == "core.cast" else None
    return D.w.stored(v16, label, srcs)


def _emit_matmul16(D: DecoderSerializer, op: Op) -> bool:
    """ort.matmul16 -> llmir's custom op (ai.llmir MatMulF16/MatMulBf16) on the stored 16-bit
    weight (node attribute `epilogue` as the op's); the manifest's `custom_ops` names the library
    the runtime registers."""
    from llmir_core.targets.onnxruntime.native import DOMAIN, OP_NAMES

    w16 = op.operands[1]
    w = _stored16(D, w16, _label(op, "weight"))
    op_type = OP_NAMES[str(tt(w16).dtype)]
    D.bind(op.results[0], D.L.one(op_type, D.name(op.operands[0]), w, domain=DOMAIN, **_epi(op)))
    return True


def _emit_matmul_f32(D: DecoderSerializer, op: Op) -> bool:
    """ort.matmul_f32 -> ai.llmir MatMulF32 on the f32 weight as stored (no prepacked copy):
    [N, K] rows, or with `layout = "panel16"` [ceil(N/16), K, 16] panels (of the concatenation
    [gate; up] with `epilogue = "swiglu"`) and attribute N; node attribute `epilogue` as the op's."""
    from llmir_core.targets.onnxruntime.native import DOMAIN, OP_NAMES

    x = D.name(op.operands[0])
    if op.attrs.get("layout", "rows") == "panel16":
        pack = _pack(D, op.operands[1], "panel16", op)
        srcs = D.weight(pack.operands[0])
        w = D.w.f32_panels(srcs, _label(pack, "weight"))
        n = sum(s.rows for s in srcs)
        D.bind(op.results[0], D.L.one(OP_NAMES["f32"], x, w, domain=DOMAIN, N=n, **_epi(op)))
        return True
    w = D.w.f32(D.weight(op.operands[1]), _label(op, "weight"))
    D.bind(op.results[0], D.L.one(OP_NAMES["f32"], x, w, domain=DOMAIN, **_epi(op)))
    return True


def _emit_ort_cast(D: DecoderSerializer, op: Op) -> bool:
    if id(op.operands[0]) in D.g.static:
        return False  # lowered on first use (_stored_cast)
    D.bind(
        op.results[0],
        D.L.one("Cast", D.name(op.operands[0]), to=onnx_dtype(op.attrs["to"])),
    )
    return True


_EMIT = {
    "ort.cast": _emit_ort_cast,
    "ort.group_query_attention": _emit_gqa,
    "ort.simplified_layer_norm": _emit_norm,
    "ort.skip_simplified_layer_norm": _emit_norm,
    "ort.fused_matmul": _emit_fused_matmul,
    "ort.matmul_nbits": _emit_matmul_nbits,
    "ort.matmul_gguf": _emit_matmul_gguf,
    "ort.matmul16": _emit_matmul16,
    "ort.matmul_f32": _emit_matmul_f32,
    "ort.dynamic_quantize_matmul": _emit_dynamic_quantize_matmul,
    "ort.matmul_s8": _emit_matmul_s8,
    "ort.quick_gelu": _emit_quick_gelu,
    "llm.embedding": _emit_embedding,
    "ort.moe": _emit_moe,
    "ort.qmoe": _emit_moe,
    "ort.gather_block_quantized": _emit_gather_block_quantized,
}


# -- the artifact ----------------------------------------------------------------------------------------


def _signature(
    names: list[str], values: list[Value], len_name: str, last_logits: bool = False
) -> list[dict[str, Any]]:
    out = []
    for n, v in zip(names, values):
        t = tt(v)
        shape: list[Any] = [d if isinstance(d, int) else format_dim(d) for d in t.shape]
        if t.rank == 4 and n != "input_ids":
            shape[2] = "?" + len_name
        if n == "logits" and last_logits:
            shape[1] = 1
        out.append({"name": n, "dtype": str(t.dtype), "shape": shape})
    return out


def build_decoder(
    module: Module,
    out_dir: str,
    *,
    max_len: int | None = None,
    accuracy_level: int = ACCURACY_LEVEL,
    quant: str | None = None,
    quant_block: int = 32,
    last_logits: bool = LAST_LOGITS,
    source_path: str | None = None,
    gguf_kernels: str | None = None,
) -> dict[str, Any]:
    """Lower a decoder module for onnxruntime and write its artifact (= `llmir build` with these
    options); return the manifest.

    max_len: KV positions the artifact supports (the rotary table is cut to it; default: the
      model's whole table). accuracy_level: MatMulNBits' activation precision (4 = int8, the
      fastest measured on AVX2; 1 = fp32, exact against the reference). quant: `int4`/`int8`
      quantizes float weights (block `quant_block`; GGUF-quantized weights keep their format
      regardless). last_logits: logits only for the last position ([batch, 1, vocab]: what
      generation reads; lower-ort-logits), else for every position (perplexity, tensors).
      gguf_kernels: exact (GGUF blocks read in place, the default) or requant.
    """
    if not is_decoder(module):
        raise InputError(
            f"module @{module.name} is not a decoder (inputs input_ids, positions, "
            "past_key_values.{l}.key/.value; outputs logits and one present per past)",
            hint="import a Hugging Face folder or a GGUF file with `llmir import`, or build "
            "with the generic onnxruntime backend",
        )
    from llmir_core.targets import build

    options: dict[str, Any] = {
        "accuracy_level": accuracy_level,
        "quant": quant or "none",
        "quant_block": quant_block,
        "last_logits": last_logits,
    }
    if max_len is not None:
        options["max_len"] = max_len
    if gguf_kernels is not None:
        options["gguf_kernels"] = gguf_kernels
    return build(module, out_dir, "onnxruntime", source_path=source_path, options=options)


def serialize_decoder(
    module: Module, out_dir: str, *, lowered_text: str | None = None
) -> dict[str, Any]:
    """Write the artifact of a lowered decoder module into out_dir (atomically); the manifest.

    lowered_text: the text `build` parsed the module from; written as `model.lowered.llmir`
    (manifest `lowered`), the file the nodes' `llmir.line` tags point into. Without it the tags
    point into the module's own file (manifest `source.file`)."""
    with ArtifactWriter(out_dir) as w:
        D = DecoderSerializer(module, w.path(DATA_FILE))
        try:
            model, ins, outs = D.run()
        finally:
            D.data.fh.close()
        layout = None
        if module_options(module).get("prepack", "session") == "session":
            from llmir_core.targets.onnxruntime.load_layout import alias_and_order

            layout = alias_and_order(model)  # peak RSS while onnxruntime prepacks
        w.write_bytes(MODEL_FILE, model.SerializeToString(deterministic=True))
        w.add(DATA_FILE)
        head = manifest_head(
            "onnxruntime",
            model=MODEL_FILE,
            source=module.attrs.get("llmir.source") or {},
            pipeline=module.attrs.get("llmir.pipeline"),
            builder="decoder",
            lowered=w.write_lowered(lowered_text),
            target_options=module.attrs.get("llmir.target_options"),
        )
        dec = _decoder_section(
            module, D, outs, w.write_tokenizer(module), w.write_chat_template(module)
        )
        if layout and layout["aliases"]:
            dec["load_layout"] = layout
        fn = module.main
        return w.finish(
            {
                **head,
                "opset": {d.domain or "ai.onnx": d.version for d in model.opset_import},
                "custom_ops": _custom_ops(model),
                "inputs": _signature(ins, list(fn.args), "past_len"),
                "outputs": _signature(outs, list(fn.outputs), "present_len", D.last_logits),
                "decoder": dec,
            }
        )


def _decoder_section(
    module: Module,
    D: DecoderSerializer,
    outs: list[str],
    tok: dict[str, Any] | None,
    template: str | None,
) -> dict[str, Any]:
    """The manifest's `decoder` section: what the runtime needs to run the decoder."""
    fn = module.main
    caches = cache_args(fn)
    t0 = tt(caches[0])
    layers = sum(1 for a in caches if a.name.endswith(".key"))
    shared = len(D.gqa_ops) == layers and len(caches) == 2 * layers
    vocab = tt(fn.outputs[0]).shape[-1]
    ctx = module.attrs.get("llm.context_length")
    max_len = D.max_len or D.max_len_opt or (int(ctx) if isinstance(ctx, int) else None)
    eos = module.attrs.get("llm.eos_token_ids") or ()
    decoder: dict[str, Any] = {
        "schema": DECODER_SCHEMA,
        "layers": layers,
        "kv_heads": t0.shape[1],
        "head_dim": t0.shape[3],
        "kv_dtype": str(t0.dtype),
        "kv_bytes_per_token": kv_bytes_per_token(fn),
        "heads": int(D.gqa_ops[0].attrs["num_heads"]) if D.gqa_ops else None,
        "vocab": vocab,
        "max_len": max_len,
        "context_length": ctx,
        "kv_cache": "shared_buffer" if shared else "concat",
        "cache": [
            {
                "input": a.name,
                "output": o,
                "kv_heads": tt(a).shape[1],
                "head_dim": tt(a).shape[3],
                "dtype": str(tt(a).dtype),
            }
            for a, o in zip(caches, outs[1:])
        ],
        "logits": "last" if D.last_logits else "all",
        "accuracy_level": D.accuracy_level,
        "weight_dtype": _weight_dtype(D, module),
        # how the session treats the weights (lower-ort-module's `prepack`; the runtime follows)
        "prepack": str(module_options(module).get("prepack") or "session"),
        "quant": {
            "f32_weights": (f"int{D.quant.bits}" if D.quant else "f32"),
            "block": D.quant.block if D.quant else None,
            "symmetric": (not D.quant.asym) if D.quant else None,
            "gguf_lossless": dict(sorted(D.log.lossless.items())),
            "gguf_exact": dict(sorted(D.log.exact.items())),
            "gguf_requantized": D.log.requantized,
            "quantized": dict(sorted(D.log.quantized.items())),
            "nbits_passthrough": D.log.passthrough,
            "embedding": D.log.embedding,
        },
        "fused_attention_layers": len(D.gqa_ops),
        "mixed_batch": shared and _mixed_batch(D, fn.args[1]),
        "packed_qkv_layers": sum(1 for op in D.gqa_ops if op.attrs.get("packed")),
        "generic_ops": dict(sorted(D.generic_ops.items())),
        "rope_table_ops": dict(sorted(D.load_ops.items())),  # constant: folded at session load
        "not_fused": jsonable(module.attrs.get("ort.not_fused") or {}),
        "eos_token_ids": [int(e) for e in eos],
        "bos_token_id": module.attrs.get("llm.bos_token_id"),
        "tokenizer": tok,
        "chat_template": template,
        "generation": jsonable(module.attrs.get("llm.generation") or {}),
        "architecture": module.attrs.get("llm.architecture"),
    }
    return decoder


def _mixed_batch(D: DecoderSerializer, positions: Value) -> bool:
    """Whether the graph takes left-padded steps (position -1: a pad; serve's mixed prefill +
    decode batches): positions feed only each row's last position (seqlens_k) and llmir's
    attention kernels as their position_ids (which know pads); onnxruntime's kernel and a
    rotary outside the attention do not."""
    from llmir_core.targets.onnxruntime.native import DOMAIN

    pos = D.L.names.get(id(positions))
    gqa = [nd for nd in D.L.nodes if nd.op_type == "GroupQueryAttention"]
    if not gqa or pos is None:
        return False
    if not all(nd.domain == DOMAIN and len(nd.input) > 9 and nd.input[9] == pos for nd in gqa):
        return False
    users = [nd for nd in D.L.nodes if pos in nd.input and nd not in gqa]
    return all(nd.op_type == "Gather" and nd.output[0] in D.last_positions for nd in users)


def _custom_ops(model: onnx.ModelProto) -> list[str]:
    """The llmir custom-op libraries the model needs (the runtime registers them)."""
    from llmir_core.targets.onnxruntime.native import DOMAIN, LIBRARY

    return [LIBRARY] if any(d.domain == DOMAIN for d in model.opset_import) else []


__all__ = [
    "build_decoder",
    "serialize_decoder",
    "is_decoder",
    "DecoderSerializer",
    "LOSSLESS",
    "REQUANT",
    "repack_gguf",
    "ACCURACY_LEVEL",
    "DECODER_SCHEMA",
]
