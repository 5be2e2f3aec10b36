"""The dequantized twin of an imported GGUF module: the same graph, each GGUF-quantized weight
stored as the f32 values its blocks decode to.

A Q4_K_M file has no float weights, so `--quant int8`, `--dtype f16` or an f32 build have
nothing to act on; its twin does: its f32 build computes what the exact build computes, with the
weights llama.cpp's dequantizer gives and no int8 activations, and its `--quant int8` build
quantizes those weights again (the real activations then meet llmir's int8 matmul paths).

Each `llm.dequantize` of a GGUF-quantized `core.weight` becomes a `core.weight` of f32 read from
one side file (the bytes `llmir_core.quant.gguf_blocks.dequantize` gives, bit-identical to the
gguf package's reference dequantizer); the quantized weight it read is dropped. The twin is
written next to the module it comes from, so the relative paths of its other weights and of its
tokenizer hold.
"""

from __future__ import annotations

import os
from collections.abc import Container
from pathlib import Path

import numpy as np

from llmir_core.ir.core import Op
from llmir_core.ir.parser import parse_file
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import QuantType, TensorType
from llmir_core.passes.base import erase_dead
from llmir_core.quant import gguf_blocks
from llmir_core.weights import load_weight

_ALIGN = 64  # each tensor's offset in the side file


def _dequantized(weight: Op, base: str) -> np.ndarray:
    t = weight.results[0].type
    assert isinstance(t, TensorType) and isinstance(t.dtype, QuantType)
    shape = t.static_shape()
    assert shape is not None
    packed = load_weight(weight.attrs, t, base)
    return gguf_blocks.dequantize(np.asarray(packed.data), t.dtype.scheme, tuple(shape))


def write_twin(src: Path, out: Path, keep: Container[str] = ()) -> int:
    """Write the twin of the imported module `src` to `out` (same folder as `src`) and its f32
    weights to `out` + '.bin'; a weight whose name is in `keep` stays quantized. Returns how many
    weights were dequantized."""
    if src.resolve().parent != out.resolve().parent:
        raise ValueError(f"{out}: the twin goes in the folder of {src} (relative paths hold)")
    module = parse_file(str(src))
    base = os.path.dirname(os.path.abspath(str(src)))
    data = out.with_name(out.name + ".bin")
    done = 0
    with data.open("wb") as fh:
        for fn in module.functions:
            for op in fn.ops:
                w = op.operands[0].owner if op.name == "llm.dequantize" else None
                if w is None or w.name != "core.weight":
                    continue
                q = w.results[0].type
                if not isinstance(q, TensorType) or not isinstance(q.dtype, QuantType):
                    continue
                if q.dtype.scheme not in gguf_blocks.BLOCKS or w.attrs.get("name") in keep:
                    continue
                arr = _dequantized(w, base)
                fh.write(b"\0" * (-fh.tell() % _ALIGN))
                offset = fh.tell()
                fh.write(np.ascontiguousarray(arr, np.float32).tobytes())
                op.name = "core.weight"
                op.operands = []
                op.attrs = {
                    "file": data.name,
                    "name": str(w.attrs.get("name", w.results[0].name)),
                    "nbytes": arr.size * 4,
                    "offset": offset,
                }
                done += 1
            erase_dead(fn)
    out.write_text(print_module(module))
    return done
