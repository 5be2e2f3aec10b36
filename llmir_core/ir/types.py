"""IR types: element dtypes, block-quantized element types, tensors and KV caches."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Union

import numpy as np

from .dims import DYN, Dim, SymDim, format_dim


class DType(str, Enum):
    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    f8e4m3 = "f8e4m3"
    f8e5m2 = "f8e5m2"
    f8e4m3fnuz = "f8e4m3fnuz"
    f8e5m2fnuz = "f8e5m2fnuz"
    f8e8m0 = "f8e8m0"
    f4e2m1 = "f4e2m1"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"
    i4 = "i4"
    u4 = "u4"
    i2 = "i2"
    u2 = "u2"
    bool = "bool"

    def __str__(self) -> str:
        return self.value

    # `builtins.bool`: inside this class, `bool` is the member DType.bool
    @property
    def is_float(self) -> builtins.bool:
        return self in _FLOATS

    @property
    def is_int(self) -> builtins.bool:
        return self in _INTS

    @property
    def bits(self) -> int:
        return _BITS[self]

    def to_numpy(self) -> np.dtype[Any]:
        return numpy_dtype(self)


_FLOATS = {
    DType.f64,
    DType.f32,
    DType.f16,
    DType.bf16,
    DType.f8e4m3,
    DType.f8e5m2,
    DType.f8e4m3fnuz,
    DType.f8e5m2fnuz,
    DType.f8e8m0,
    DType.f4e2m1,
}
_INTS = {
    DType.i64,
    DType.i32,
    DType.i16,
    DType.i8,
    DType.u8,
    DType.u16,
    DType.u32,
    DType.u64,
    DType.i4,
    DType.u4,
    DType.i2,
    DType.u2,
}
_BITS = {
    DType.f64: 64,
    DType.f32: 32,
    DType.f16: 16,
    DType.bf16: 16,
    DType.f8e4m3: 8,
    DType.f8e5m2: 8,
    DType.f8e4m3fnuz: 8,
    DType.f8e5m2fnuz: 8,
    DType.f8e8m0: 8,
    DType.f4e2m1: 4,
    DType.i64: 64,
    DType.i32: 32,
    DType.i16: 16,
    DType.i8: 8,
    DType.u8: 8,
    DType.u16: 16,
    DType.u32: 32,
    DType.u64: 64,
    DType.i4: 4,
    DType.u4: 4,
    DType.i2: 2,
    DType.u2: 2,
    DType.bool: 8,
}
DTYPE_NAMES = {d.value: d for d in DType}


def numpy_dtype(d: DType) -> np.dtype[Any]:
    simple = {
        DType.f64: np.float64,
        DType.f32: np.float32,
        DType.f16: np.float16,
        DType.i64: np.int64,
        DType.i32: np.int32,
        DType.i16: np.int16,
        DType.i8: np.int8,
        DType.u8: np.uint8,
        DType.u16: np.uint16,
        DType.u32: np.uint32,
        DType.u64: np.uint64,
        DType.bool: np.bool_,
    }
    if d in simple:
        return np.dtype(simple[d])
    import ml_dtypes  # numpy has no bf16/f8/f4/int4/int2: ml_dtypes (an onnx dependency) has them

    exotic = {
        DType.bf16: ml_dtypes.bfloat16,
        DType.f8e4m3: ml_dtypes.float8_e4m3fn,
        DType.f8e5m2: ml_dtypes.float8_e5m2,
        DType.i4: ml_dtypes.int4,
        DType.u4: ml_dtypes.uint4,
        DType.f8e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
        DType.f8e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
        DType.f8e8m0: ml_dtypes.float8_e8m0fnu,
        DType.f4e2m1: ml_dtypes.float4_e2m1fn,
        DType.i2: ml_dtypes.int2,
        DType.u2: ml_dtypes.uint2,
    }
    out: np.dtype[Any] = np.dtype(exotic[d])
    return out


def pack_sub_byte(arr: np.ndarray, bits: int) -> bytes:
    """Elements of a 2- or 4-bit dtype (ml_dtypes keeps one per byte, the code in the low bits)
    packed as ONNX and onnxruntime store them: element i in bits (i*bits) % 8 of byte i*bits // 8."""
    per = 8 // bits
    codes = np.ascontiguousarray(arr).reshape(-1).view(np.uint8) & ((1 << bits) - 1)
    if codes.size % per:
        codes = np.concatenate([codes, np.zeros(per - codes.size % per, np.uint8)])
    out = np.zeros(codes.size // per, np.uint8)
    for k in range(per):
        out |= (codes[k::per] << (k * bits)).astype(np.uint8)
    return out.tobytes()


def unpack_sub_byte(raw: bytes | np.ndarray, d: DType, shape: tuple[int, ...]) -> np.ndarray:
    """The inverse of pack_sub_byte: packed bytes to an array of dtype `d` and `shape`."""
    bits = d.bits
    per = 8 // bits
    n = int(np.prod(shape)) if shape else 1
    b = np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else np.asarray(raw, np.uint8)
    codes = np.stack([(b >> (k * bits)) & ((1 << bits) - 1) for k in range(per)], axis=-1)
    flat = codes.reshape(-1)[:n].astype(np.uint8)
    return flat.view(numpy_dtype(d)).reshape(shape).copy()


def dtype_from_numpy(dt: np.dtype[Any]) -> DType:
    for d in DType:
        try:
            if numpy_dtype(d) == dt:
                return d
        except Exception:  # pragma: no cover - ml_dtypes missing
            continue
    raise ValueError(f"no llmir dtype for numpy dtype {dt}")


@dataclass(frozen=True)
class QuantType:
    """A block-quantized element type (stored packed; logical values are floats).

    `scheme` names the exact byte layout: GGUF block formats (`q4_0`, `q8_0`, `q4_k`, ...) or
    `nbits` for onnxruntime MatMulNBits-style packing (int4/int8 codes, per-block scale and an
    optional packed zero point). `bits`, `block`, `scale` and `zero` describe the numbers;
    `super_block` is set for k-quants (256-element super-blocks).
    """

    scheme: str
    bits: int
    block: int
    scale: DType
    zero: str  # "none" (symmetric), "int" (integer zero point), "min" (float minimum)
    super_block: int | None = None

    def __str__(self) -> str:
        preset = GGUF_QUANTS.get(self.scheme)
        if preset == self:
            return f"!quant.{self.scheme}"
        sb = f", super_block={self.super_block}" if self.super_block else ""
        return (
            f"!quant<{self.scheme}, bits={self.bits}, block={self.block}, "
            f"scale={self.scale}, zero={self.zero}{sb}>"
        )

    @property
    def block_bytes(self) -> int:
        """Bytes per block for GGUF formats; packed bits for nbits (codes only)."""
        return GGUF_BLOCK_BYTES.get(self.scheme, self.block * self.bits // 8)


GGUF_QUANTS: dict[str, QuantType] = {
    "q4_0": QuantType("q4_0", 4, 32, DType.f16, "none"),
    "q4_1": QuantType("q4_1", 4, 32, DType.f16, "min"),
    "q5_0": QuantType("q5_0", 5, 32, DType.f16, "none"),
    "q5_1": QuantType("q5_1", 5, 32, DType.f16, "min"),
    "q8_0": QuantType("q8_0", 8, 32, DType.f16, "none"),
    "q2_k": QuantType("q2_k", 2, 16, DType.f16, "min", 256),
    "q3_k": QuantType("q3_k", 3, 16, DType.f16, "none", 256),
    "q4_k": QuantType("q4_k", 4, 32, DType.f16, "min", 256),
    "q5_k": QuantType("q5_k", 5, 32, DType.f16, "min", 256),
    "q6_k": QuantType("q6_k", 6, 16, DType.f16, "none", 256),
    # 4-bit codes indexing a fixed non-linear table of 16 values, times the block scale
    "iq4_nl": QuantType("iq4_nl", 4, 32, DType.f16, "none"),
    "iq4_xs": QuantType("iq4_xs", 4, 32, DType.f16, "none", 256),
}
# bytes per block (GGUF's own type_size), over `super_block or block` elements
GGUF_BLOCK_BYTES = {
    "q4_0": 18,
    "q4_1": 20,
    "q5_0": 22,
    "q5_1": 24,
    "q8_0": 34,
    "q2_k": 84,
    "q3_k": 110,
    "q4_k": 144,
    "q5_k": 176,
    "q6_k": 210,
    "iq4_nl": 18,
    "iq4_xs": 136,
}

ElemType = Union[DType, QuantType]

TENSOR_OPTION_KEYS = ("layout", "device", "sema")


@dataclass(frozen=True)
class TensorType:
    """`tensor<DIMS x ELEM, layout=..., device=..., sema=...>`; an empty shape is a scalar."""

    shape: tuple[Dim, ...]
    dtype: ElemType
    layout: str | None = None
    device: str | None = None
    sema: str | None = None
    _text: str = field(default="", compare=False, repr=False, hash=False)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_quantized(self) -> bool:
        return isinstance(self.dtype, QuantType)

    def with_shape(self, shape: tuple[Dim, ...]) -> TensorType:
        return TensorType(tuple(shape), self.dtype, self.layout, self.device, self.sema)

    def with_dtype(self, dtype: ElemType) -> TensorType:
        return TensorType(self.shape, dtype, self.layout, self.device, self.sema)

    def static_shape(self) -> tuple[int, ...] | None:
        if all(isinstance(d, int) for d in self.shape):
            return self.shape  # type: ignore[return-value]
        return None

    def __hash__(self) -> int:
        # cached: the verifier and the parser's caches hash the same type objects many times
        h: int | None = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.shape, self.dtype, self.layout, self.device, self.sema))
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuild from the fields: never carry the cached hash (str hashes differ per process)
        return (TensorType, (self.shape, self.dtype, self.layout, self.device, self.sema))

    def __str__(self) -> str:
        if self._text:
            return self._text
        named = any(isinstance(d, SymDim) for d in self.shape)
        sep = " x " if named else "x"
        parts = [format_dim(d) for d in self.shape] + [str(self.dtype)]
        body = sep.join(parts)
        for key in TENSOR_OPTION_KEYS:
            v = getattr(self, key)
            if v is not None:
                body += f', {key}="{v}"'
        text = f"tensor<{body}>"
        object.__setattr__(self, "_text", text)
        return text


@dataclass(frozen=True)
class KVCacheType:
    """`!llm.kv_cache<layers=L, kv_heads=H, max_len=N|?, head_dim=D, dtype=f16>`.

    Holds keys and values for every layer: logically a pair of tensors of shape
    [layers, batch, kv_heads, max_len, head_dim] (batch is dynamic).
    """

    layers: int
    kv_heads: int
    max_len: Dim
    head_dim: int
    dtype: DType

    def __str__(self) -> str:
        return (
            f"!llm.kv_cache<layers={self.layers}, kv_heads={self.kv_heads}, "
            f"max_len={format_dim(self.max_len)}, head_dim={self.head_dim}, dtype={self.dtype}>"
        )


Type = Union[TensorType, KVCacheType]


def tensor(shape: tuple[Dim, ...] | list[Dim], dtype: ElemType | str) -> TensorType:
    """Convenience constructor: `tensor((2, DYN), "f32")`."""
    if isinstance(dtype, str):
        dtype = DTYPE_NAMES[dtype]
    return TensorType(tuple(shape), dtype)


__all__ = [
    "DType",
    "QuantType",
    "TensorType",
    "KVCacheType",
    "Type",
    "ElemType",
    "DYN",
    "tensor",
    "numpy_dtype",
    "dtype_from_numpy",
    "GGUF_QUANTS",
    "DTYPE_NAMES",
    "pack_sub_byte",
    "unpack_sub_byte",
]
