"""onnxruntime's CPU kernels by float dtype: the data the onnxruntime target's capability table
reads to decide, op by op, the dtype each op computes in (llmir_core/targets/onnxruntime/lower_precision.py).

For each op: the 16-bit float dtypes onnxruntime's CPU provider runs it in, as `native` (a kernel
in that dtype) or `cast` (onnxruntime inserts its own f32 casts around it: it computes in f32).
An op missing here, or a dtype missing from its row, has no CPU kernel: loading a model with it
fails ("Could not find an implementation"). f32 (and f64) kernels exist for every op listed.

The `ort.*` target ops and `llm.embedding` were measured by benchmarks/precision_kernels.py
(onnxruntime 1.32, AVX2 CPU; kernels do not depend on the CPU's features, only their speed);
the `PROBED` part below is written by scripts/probe_ort_kernels.py, which builds every op's
example in f16 and bf16 and loads it.
"""

from __future__ import annotations

MEASURED: dict[str, dict[str, str]] = {
    # MatMul / Gemm / FusedMatMul: onnxruntime casts f16 to f32 (no f16 GEMM on x86); no bf16
    "ort.fused_matmul": {"f16": "cast"},
    # MatMulNBits has f16 activations (4 bits: 3-5x slower than f32 with accuracy_level 4 here)
    "ort.matmul_nbits": {"f16": "native"},
    # GroupQueryAttention f16 runs, 15-48x slower than f32 at the SmolLM2 decode shape; no bf16
    "ort.group_query_attention": {"f16": "native"},
    "ort.simplified_layer_norm": {"f16": "native"},
    "ort.skip_simplified_layer_norm": {"f16": "native"},
    "ort.quick_gelu": {"f16": "cast"},
    "ort.cast": {"f16": "native", "bf16": "native"},
    # llmir's own custom op (llmir_core/targets/onnxruntime/native): 16-bit weights widened in registers
    "ort.matmul16": {"f16": "native", "bf16": "native"},
    "llm.embedding": {"f16": "native", "bf16": "native"},
}

# -- probed (scripts/probe_ort_kernels.py) --
# onnxruntime 1.32.0, CPUExecutionProvider
PROBED: dict[str, dict[str, str]] = {
    "core.abs": {"f16": "cast"},
    "core.add": {"f16": "cast"},
    "core.argmax": {"f16": "cast"},
    "core.argmin": {"f16": "cast"},
    "core.cast": {"f16": "native", "bf16": "native"},
    "core.ceil": {"f16": "cast"},
    "core.concat": {"f16": "native", "bf16": "native"},
    "core.constant": {"f16": "native", "bf16": "native"},
    "core.cos": {"f16": "cast"},
    "core.cumsum": {"f16": "cast"},
    "core.div": {"f16": "cast"},
    "core.equal": {"f16": "cast"},
    "core.erf": {"f16": "cast"},
    "core.exp": {"f16": "cast"},
    "core.expand_dyn": {"f16": "native"},
    "core.flatten": {"f16": "native", "bf16": "native"},
    "core.floor": {"f16": "cast"},
    "core.gather": {"f16": "native", "bf16": "native"},
    "core.gather_elements": {"f16": "native", "bf16": "native"},
    "core.gelu": {"f16": "cast"},
    "core.greater": {"f16": "cast"},
    "core.greater_equal": {"f16": "cast"},
    "core.identity": {"f16": "native", "bf16": "native"},
    "core.less": {"f16": "cast"},
    "core.less_equal": {"f16": "cast"},
    "core.log": {"f16": "cast"},
    "core.log_softmax": {"f16": "cast"},
    "core.matmul": {"f16": "cast"},
    "core.max": {"f16": "native"},
    "core.min": {"f16": "native"},
    "core.mod": {"f16": "native"},
    "core.mul": {"f16": "cast"},
    "core.neg": {"f16": "cast"},
    "core.not_equal": {"f16": "cast"},
    "core.pad": {"f16": "cast", "bf16": "native"},
    "core.pow": {"f16": "cast"},
    "core.range": {"f16": "native", "bf16": "native"},
    "core.reciprocal": {"f16": "cast"},
    "core.reduce_max": {"f16": "cast"},
    "core.reduce_max_dyn": {"f16": "cast"},
    "core.reduce_mean": {"f16": "cast"},
    "core.reduce_mean_dyn": {"f16": "cast"},
    "core.reduce_min": {"f16": "cast"},
    "core.reduce_min_dyn": {"f16": "cast"},
    "core.reduce_prod": {"f16": "cast"},
    "core.reduce_prod_dyn": {"f16": "cast"},
    "core.reduce_sum": {"f16": "cast"},
    "core.reduce_sum_dyn": {"f16": "cast"},
    "core.relu": {"f16": "cast"},
    "core.reshape": {"f16": "native", "bf16": "native"},
    "core.reshape_dyn": {"f16": "native", "bf16": "native"},
    "core.round": {"f16": "native"},
    "core.rsqrt": {"f16": "cast"},
    "core.scatter_elements": {"f16": "native", "bf16": "native"},
    "core.scatter_nd": {"f16": "native", "bf16": "native"},
    "core.shape": {"f16": "native", "bf16": "native"},
    "core.sigmoid": {"f16": "cast"},
    "core.sign": {"f16": "native", "bf16": "native"},
    "core.silu": {"f16": "cast"},
    "core.sin": {"f16": "cast"},
    "core.size": {"f16": "cast"},
    "core.slice": {"f16": "native", "bf16": "native"},
    "core.slice_dyn": {"f16": "native", "bf16": "native"},
    "core.softmax": {"f16": "cast"},
    "core.split": {"f16": "native", "bf16": "native"},
    "core.sqrt": {"f16": "cast"},
    "core.squeeze": {"f16": "native", "bf16": "native"},
    "core.sub": {"f16": "cast"},
    "core.tanh": {"f16": "cast"},
    "core.tile": {"f16": "cast"},
    "core.top_k": {"f16": "cast"},
    "core.transpose": {"f16": "native", "bf16": "native"},
    "core.trilu": {"f16": "cast"},
    "core.unsqueeze": {"f16": "native", "bf16": "native"},
    "core.where": {"f16": "cast"},
    "llm.add_rms_norm": {"f16": "cast"},
    "llm.embedding": {"f16": "native", "bf16": "native"},
    "llm.gated_mlp": {"f16": "cast"},
    "llm.layer_norm": {"f16": "native", "bf16": "native"},
    "llm.linear": {"f16": "cast"},
    "llm.moe": {"f16": "cast"},
    "llm.rms_norm": {"f16": "native"},
    "llm.rotary_embedding": {"f16": "native"},
    "llm.scaled_dot_product_attention": {"f16": "native"},
    "llm.silu_mul": {"f16": "cast"},
    "onnx.opaque": {"f16": "cast"},
}
