"""What the triton target executes of a lowered decoder: which ops are precomputed at build time
(they depend on no function argument: weights, rotary tables), which run per step, and which ops
the runner can run per step (the triton.* kernels and a few layout/elementwise glue ops).
Pure Python: no triton or torch import."""

from __future__ import annotations

from llmir_core.ir.core import Function, Op

# glue ops the runner executes with torch between kernel launches (views and elementwise)
GLUE_OPS = frozenset(
    {
        "core.reshape",
        "core.transpose",
        "core.add",
        "core.sub",
        "core.mul",
        "core.div",
        "core.cast",
        "core.silu",
        "core.gelu",
        "core.tanh",
        "core.concat",
        "core.slice",
        "core.split",
        "core.unsqueeze",
        "core.squeeze",
        "llm.silu_mul",
        "core.neg",
        "core.exp",
    }
)
KERNEL_OPS = frozenset(
    {
        "triton.embedding",
        "triton.rms_norm",
        "triton.add_rms_norm",
        "triton.rotary",
        "triton.matmul",
        "triton.gated_matmul",
        "triton.q_matmul",
        "triton.kv_append",
        "triton.attention",
        "triton.argmax",
    }
)
RUNTIME_OPS = GLUE_OPS | KERNEL_OPS


def split_static(fn: Function) -> tuple[list[Op], list[Op]]:
    """(ops computed once at build time, ops run at each step), in program order."""
    dynamic = {id(a) for a in fn.args}
    static_ops, step_ops = [], []
    for op in fn.ops:
        if op.name.startswith("triton.") or any(id(v) in dynamic for v in op.operands):
            step_ops.append(op)
            dynamic.update(id(r) for r in op.results)
        else:
            static_ops.append(op)
    return static_ops, step_ops


def static_leaves(fn: Function) -> list[str]:
    """Names of the build-time values the per-step ops read (stored in the artifact)."""
    static_ops, step_ops = split_static(fn)
    static = {id(r): r.name for op in static_ops for r in op.results}
    seen: dict[str, None] = {}
    for op in step_ops:
        for v in op.operands:
            if id(v) in static:
                seen.setdefault(static[id(v)], None)
    for v in fn.outputs:
        if id(v) in static:
            seen.setdefault(static[id(v)], None)
    return list(seen)
