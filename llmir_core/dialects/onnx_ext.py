"""The `onnx` dialect: ONNX ops the frontend does not map, kept opaque by `--keep-unknown`.

`onnx.opaque` carries an ONNX node as data (its op_type, domain, opset and attributes); its result
types come from ONNX shape inference and are written out in the text. It has no reference
semantics: only the onnxruntime backend, which emits the node unchanged, can run it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llmir_core.ir.types import Type

from .opdef import Attr, InferCtx, OpDef, Operand, OpVerifyError
from .registry import register, register_dialect

register_dialect("onnx", "ONNX ops kept as opaque nodes (`llmir import --keep-unknown`)")


def _infer_opaque(ctx: InferCtx) -> list[Type]:
    if not ctx.declared:
        raise OpVerifyError(
            "onnx.opaque needs its result types written out (from ONNX shape inference)"
        )
    return list(ctx.declared)


def _no_reference(args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    domain = attrs.get("domain") or "ai.onnx"
    raise ValueError(
        f"ONNX op {domain}:{attrs.get('op_type')} was kept opaque and has no reference "
        "semantics; build it with `llmir build --target onnxruntime` and run that"
    )


register(
    OpDef(
        name="onnx.opaque",
        summary="An ONNX node llmir does not model, kept as-is; only the onnxruntime backend builds it.",
        operands=(Operand("inputs", variadic=True, doc="the node's inputs, in order"),),
        attrs=(
            Attr("op_type", "str", doc="ONNX op type, e.g. HardSigmoid"),
            Attr("domain", "str", "", doc="ONNX domain; empty for the default ai.onnx domain"),
            Attr("opset", "int", doc="the opset version of that domain in the source model"),
            Attr("attributes", "dict", {}, doc="the node's attributes (graphs as base64 strings)"),
        ),
        infer=_infer_opaque,
        reference=_no_reference,
        no_smt="an ONNX node llmir does not model: its meaning is onnxruntime's",
        verifies="the result types are written out.",
        results=("outputs",),
        variadic_results=True,
        example='%y = onnx.opaque %x {attributes = {alpha = 0.2}, domain = "", op_type = "HardSigmoid", '
        "opset = 21} : (tensor<4xf32>) -> tensor<4xf32>",
    )
)
