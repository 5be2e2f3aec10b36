"""Optimization passes: one module per pass, the table of passes, presets and the manager.

`PASSES` maps each pass's kebab-case name to its class; `llmir optimize --list` reads it.
"""

from __future__ import annotations

from typing import Any

from llmir_core.passes.assign_precision import AssignPrecision
from llmir_core.passes.base import Pass, PassContext
from llmir_core.passes.canonicalize import Canonicalize
from llmir_core.passes.constant_fold import ConstantFold
from llmir_core.passes.cse import Cse
from llmir_core.passes.dce import Dce
from llmir_core.passes.fuse_add_rms_norm import FuseAddRmsNorm
from llmir_core.passes.fuse_gated_mlp import FuseGatedMlp
from llmir_core.passes.fuse_linear import FuseLinear
from llmir_core.passes.fuse_matmul_transpose import FuseMatmulTranspose
from llmir_core.passes.fuse_silu_mul import FuseSiluMul
from llmir_core.passes.kv_cache_int8 import KvCacheInt8
from llmir_core.passes.lift_activations import LiftActivations
from llmir_core.passes.lift_attention import LiftAttention
from llmir_core.passes.lift_layer_norm import LiftLayerNorm
from llmir_core.passes.lift_rms_norm import LiftRmsNorm
from llmir_core.passes.lift_rotary import LiftRotary
from llmir_core.passes.merge_qkv import MergeQkv
from llmir_core.passes.quantize_weights import QuantizeWeights
from llmir_core.targets import pass_classes

CORE_PASS_CLASSES: list[type] = [
    Canonicalize,
    ConstantFold,
    Cse,
    Dce,
    LiftActivations,
    LiftRmsNorm,
    FuseMatmulTranspose,
    FuseSiluMul,
    FuseGatedMlp,
    MergeQkv,
    LiftLayerNorm,
    LiftRotary,
    LiftAttention,
    FuseAddRmsNorm,
    FuseLinear,
    QuantizeWeights,
    KvCacheInt8,
    AssignPrecision,
]

# set on first use by __getattr__ (declared here for the type checker)
PASS_CLASSES: list[type]
PASSES: dict[str, type]


def __getattr__(name: str) -> Any:
    """PASS_CLASSES and PASSES (name -> class): the core passes, then every target's lowering
    passes from the target table (llmir_core.targets.pass_classes), collected on first use (a
    target's pass module imports llmir_core.passes.base, so not at this package's import)."""
    if name in ("PASS_CLASSES", "PASSES"):
        classes = CORE_PASS_CLASSES + pass_classes()
        globals()["PASS_CLASSES"] = classes
        globals()["PASSES"] = {c.name: c for c in classes}  # type: ignore[attr-defined]
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_CLEANUP = ["canonicalize", "constant-fold", "cse", "dce"]
PRESETS: dict[str, list[str]] = {
    "O0": [],
    "O1": list(_CLEANUP),
    "O2": _CLEANUP
    + [
        "lift-activations",
        "lift-rms-norm",
        "fuse-matmul-transpose",
        "fuse-silu-mul",
        "fuse-gated-mlp",
        "merge-qkv",
        "fuse-add-rms-norm",
        "cse",
        "dce",
    ],
}
# -O3 also lifts exported LayerNorm (before RMSNorm: a LayerNorm is an RMSNorm of x - mean), rotary
# and attention patterns and fuses matmul + bias + activation (a granularity not every backend has)
PRESETS["O3"] = _CLEANUP + [
    "lift-activations",
    "lift-layer-norm",
    "lift-rms-norm",
    "lift-rotary",
    "lift-attention",
    "fuse-matmul-transpose",
    "fuse-silu-mul",
    "fuse-gated-mlp",
    "merge-qkv",
    "fuse-add-rms-norm",
    "fuse-linear",
    "constant-fold",
    "cse",
    "dce",
]

__all__ = ["PASSES", "PRESETS", "Pass", "PassContext"]
