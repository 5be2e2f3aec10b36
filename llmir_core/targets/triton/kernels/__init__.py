"""llmir's Triton kernels, one module per family; each docstring names the IR op it implements.

Importing this package imports triton and torch. `TRITON_INTERPRET=1` (set before the import)
runs the kernels on CPU torch tensors through Triton's interpreter.

`FAMILIES` lists the kernel modules; each module has `KERNELS` (its `@triton.jit` functions by
name) and `aot_specs(dtype)` (the launch specializations `aot.py` compiles ahead of time).
"""

from __future__ import annotations

FAMILIES = (
    "embedding",
    "norm",
    "rotary",
    "matmul",
    "quant_matmul",
    "kv_cache",
    "decode_attention",
    "prefill_attention",
    "sampling",
)
