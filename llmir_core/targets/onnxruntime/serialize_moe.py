"""The decoder serializer's `ort.moe` / `ort.qmoe` emitter: com.microsoft MoE / QMoE nodes.

The expert weights are written as onnxruntime's CPU kernels read them: fc1 [E, 2 * inter, ...]
with the gate and up rows interleaved (swiglu_fusion = 1), fc2 [E, hidden, ...]. QMoE codes are
[E, rows, cols * bits / 8] with scales [E, rows, cols / block] (and zero points [E, rows,
ceil(cols / block * bits / 8)] when a weight of the pair needs them). Each expert is packed by
the serializer's own weight machinery (GGUF repacking, requantization with the manifest entry,
nbits pass-through, f32 quantization) in its native format, then widened exactly to the op's
common width and block.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from llmir_core.errors import BuildError
from llmir_core.quant import nbits
from llmir_core.targets.onnxruntime.lower_common import NbitsFormat, WSrc, tt
from llmir_core.targets.onnxruntime.lower_moe import expert_srcs

if TYPE_CHECKING:
    from llmir_core.ir.core import Op
    from llmir_core.targets.onnxruntime.serialize_decoder import DecoderSerializer

MS = "com.microsoft"
_Packed = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes, scales, zero codes: unpacked, per row


def widen(
    codes: np.ndarray,
    scales: np.ndarray,
    zp: np.ndarray | None,
    rows: int,
    cols: int,
    bits: int,
    block: int,
) -> _Packed:
    """Blocks of any width <= bits and size a multiple of block, re-expressed exactly in
    `bits`-bit blocks of `block`: (codes [rows, cols], scales [rows, cols/block], zero codes
    [rows, cols/block]) unpacked, the zero codes the midpoint when the source has none."""
    sc = np.asarray(scales, np.float32).reshape(rows, -1)
    src_block = cols // sc.shape[1]
    flat = np.asarray(codes).reshape(rows, -1)
    src_bits = flat.shape[1] * 8 // cols
    q = nbits.unpack_codes(flat, src_bits, cols).astype(np.int32)
    nb = sc.shape[1]
    if zp is None:
        z = np.full((rows, nb), 1 << (src_bits - 1), np.int32)
    else:
        z = nbits.unpack_codes(np.asarray(zp).reshape(rows, -1), src_bits, nb).astype(np.int32)
    shift = (1 << (bits - 1)) - (1 << (src_bits - 1))
    rep = src_block // block
    return (
        (q + shift).astype(np.uint8),
        np.repeat(sc, rep, axis=1),
        np.repeat(z + shift, rep, axis=1).astype(np.uint8),
    )


def _expert(D: DecoderSerializer, s: WSrc, bits: int, block: int, mode: str) -> _Packed:
    from llmir_core.targets.onnxruntime.lower_common import nbits_format

    if mode == "none":
        fmt = nbits_format(s, None, D.w.eval)
        assert fmt is not None  # lower-ort-moe checked it
    else:
        fmt = NbitsFormat(bits, block, mode == "asym")
    parts = list(D.w._nbits_chunks(s, fmt))
    codes = np.concatenate([np.asarray(c).reshape(-1) for c, _, _ in parts])
    scales = np.concatenate([np.asarray(sc).reshape(-1) for _, sc, _ in parts])
    zps = [zp for _, _, zp in parts]
    zp = None if zps[0] is None else np.concatenate([np.asarray(z).reshape(-1) for z in zps])
    return widen(codes, scales, zp, s.rows, s.cols, bits, block)


def _write(D: DecoderSerializer, arr: np.ndarray, name: str, dtype: int) -> str:
    from llmir_core.targets.onnxruntime.serialize_decoder import _LARGE

    arr = np.ascontiguousarray(arr)
    off = D.w.data.start(arr.nbytes >= _LARGE)
    D.w.data.write(arr)
    return D.w._init(name, dtype, list(arr.shape), off, arr.nbytes)


def _interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty((a.shape[0] * 2, *a.shape[1:]), a.dtype)
    out[0::2], out[1::2] = a, b
    return out


def _f32_weights(D: DecoderSerializer, srcs: list[list[WSrc]], label: str) -> tuple[str, str]:
    def rows(s: WSrc) -> np.ndarray:
        return np.concatenate(list(D.w.rows_f32(s)))

    fc1 = np.stack([_interleave(rows(g), rows(u)) for g, u in zip(srcs[0], srcs[1])])
    fc2 = np.stack([rows(d) for d in srcs[2]])
    return (
        _write(D, fc1, label + ".fc1", TensorProto.FLOAT),
        _write(D, fc2, label + ".fc2", TensorProto.FLOAT),
    )


def _q_weights(D: DecoderSerializer, op: Op, srcs: list[list[WSrc]], label: str) -> list[str]:
    """[fc1, fc1_scales, fc2, fc2_scales, fc1_zero_points, fc2_zero_points] ('' for none)."""
    bits, block = int(op.attrs["bits"]), int(op.attrs["block_size"])
    modes = list(op.attrs.get("quantize", ("none",) * 3))
    packed = [[_expert(D, s, bits, block, m) for s in w] for w, m in zip(srcs, modes)]
    zero_of = [any(not np.all(z == (1 << (bits - 1))) for _, _, z in w) for w in packed]
    mid = 1 << (bits - 1)

    def pack(
        parts: list[_Packed], with_zp: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        codes = np.stack([nbits.pack_codes(c, bits) for c, _, _ in parts])
        scales = np.stack([sc for _, sc, _ in parts])
        zp = np.stack([nbits.pack_codes(z, bits, mid) for _, _, z in parts]) if with_zp else None
        return codes, scales, zp

    g, u, d = packed
    fc1 = [
        (_interleave(c1, c2), _interleave(s1, s2), _interleave(z1, z2))
        for (c1, s1, z1), (c2, s2, z2) in zip(g, u)
    ]
    c1, s1, z1 = pack(fc1, zero_of[0] or zero_of[1])
    c2, s2, z2 = pack(d, zero_of[2])
    names = [
        _write(D, c1, label + ".fc1", TensorProto.UINT8),
        _write(D, s1, label + ".fc1_scales", TensorProto.FLOAT),
        _write(D, c2, label + ".fc2", TensorProto.UINT8),
        _write(D, s2, label + ".fc2_scales", TensorProto.FLOAT),
    ]
    names.append("" if z1 is None else _write(D, z1, label + ".fc1_zero_points", TensorProto.UINT8))
    names.append("" if z2 is None else _write(D, z2, label + ".fc2_zero_points", TensorProto.UINT8))
    return names


def emit_moe(D: DecoderSerializer, op: Op) -> bool:
    from llmir_core.targets.onnxruntime.serialize_decoder import _label

    srcs = [expert_srcs(D.g, w) for w in op.operands[2:5]]
    if any(s is None for s in srcs):
        raise BuildError(f"{op.name}: the expert weights are not read from stored tensors")
    weights: list[list[WSrc]] = [s for s in srcs if s is not None]
    label = _label(op, "experts")
    x, probs = D.name(op.operands[0]), D.name(op.operands[1])
    experts = len(weights[0])

    def rows2d(name: str) -> str:  # onnxruntime takes the router inputs as [tokens, experts]
        if tt(op.operands[0]).rank == 2:
            return name
        return D.L.one("Reshape", name, D.L.ints([-1, experts]))

    probs = rows2d(probs)
    attrs: dict[str, Any] = {
        "k": int(op.attrs["k"]),
        "normalize_routing_weights": int(bool(op.attrs.get("normalize", True))),
        "activation_type": "swiglu",
        "swiglu_fusion": 1,
        "activation_alpha": 1.0,
        "activation_beta": 0.0,
    }
    if op.name == "ort.moe":
        fc1, fc2 = _f32_weights(D, weights, label)
        y = D.node("MoE", [x, probs, fc1, "", fc2], domain=MS, **attrs)[0]
    else:
        fc1, s1, fc2, s2, z1, z2 = _q_weights(D, op, weights, label)
        ins = [x, probs, fc1, s1, "", fc2, s2, "", "", "", "", z1, z2, ""]
        if len(op.operands) > 5:
            ins.append(rows2d(D.name(op.operands[5])))
        while ins[-1] == "":
            ins.pop()
        y = D.node(
            "QMoE",
            ins,
            domain=MS,
            **attrs,
            expert_weight_bits=int(op.attrs["bits"]),
            block_size=int(op.attrs["block_size"]),
            accuracy_level=int(op.attrs.get("accuracy_level", 4)),
        )[0]
    D.bind(op.results[0], y)
    return True


__all__ = ["emit_moe", "widen"]
