"""Op declarations, one module per dialect; `registry.all_ops()` lists them."""

from .opdef import REQUIRED, Attr, InferCtx, OpDef, Operand, OpVerifyError
from .registry import all_ops, get_op

__all__ = ["REQUIRED", "Attr", "InferCtx", "OpDef", "Operand", "OpVerifyError", "all_ops", "get_op"]
