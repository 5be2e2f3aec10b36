"""Shared launch helpers for the kernel modules (no kernels here)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import triton

ACTIVATIONS = {"none": 0, "silu": 1, "gelu": 2, "gelu_tanh": 3, "relu": 4}

TRITON_DTYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
}
NAME_TO_TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, triton.next_power_of_2(max(1, int(n))))


@dataclass(frozen=True)
class AotSpec:
    """One specialization of a kernel compiled ahead of time: pointer element types and
    constexpr values (every non-constexpr scalar is an i32 unless named in `floats`/`i64s`)."""

    kernel: str
    pointers: dict[str, str]
    constexprs: dict[str, Any]
    floats: tuple[str, ...] = ()
    num_warps: int = 4
    extra: dict[str, str] = field(default_factory=dict)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def ieee_dot(dtype: torch.dtype) -> bool:
    """Whether tl.dot runs on f32 tiles in IEEE precision: for f32 operands (accuracy), and for
    bf16 ones under Triton's interpreter, whose numpy dot reads bf16 tiles wrongly (measured with
    triton 3.9: errors of 1e10 on a 9x40 @ 40x19 product)."""
    return dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting())


def kv_ptr_types(dtype: str, quant: bool) -> dict[str, str]:
    """AOT pointer types of an attention kernel's KV-cache arguments: the cache in `dtype`, or int8
    codes with f32 per-position scales (the scale pointers are unused, typed like the cache, when
    the cache is not quantized)."""
    kv = "i8" if quant else dtype
    scale = "fp32" if quant else kv
    return {"k_ptr": kv, "v_ptr": kv, "ks_ptr": scale, "vs_ptr": scale}


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b
