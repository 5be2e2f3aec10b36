"""Optimization passes: one module per pass, the table of passes, presets and the manager.

`PASSES` maps each pass's kebab-case name to its class; `llmir optimize --list` reads it.
"""

from __future__ import annotations

from .assign_precision import AssignPrecision
from .base import Pass, PassContext
from .canonicalize import Canonicalize
from .constant_fold import ConstantFold
from .cse import Cse
from .dce import Dce
from .fuse_add_rms_norm import FuseAddRmsNorm
from .fuse_gated_mlp import FuseGatedMlp
from .fuse_linear import FuseLinear
from .fuse_matmul_transpose import FuseMatmulTranspose
from .fuse_silu_mul import FuseSiluMul
from .kv_cache_int8 import KvCacheInt8
from .lift_activations import LiftActivations
from .lift_attention import LiftAttention
from .lift_layer_norm import LiftLayerNorm
from .lift_rms_norm import LiftRmsNorm
from .lift_rotary import LiftRotary
from .lower_ort_attention import LowerOrtAttention
from .lower_ort_embedding import LowerOrtEmbedding
from .lower_ort_logits import LowerOrtLogits
from .lower_ort_matmul import LowerOrtMatmul
from .lower_ort_module import LowerOrtModule
from .lower_ort_moe import LowerOrtMoe
from .lower_ort_norms import LowerOrtNorms
from .lower_ort_precision import LowerOrtPrecision
from .lower_ort_weight_dtype import LowerOrtWeightDtype
from .lower_triton import LowerTriton
from .merge_qkv import MergeQkv
from .quantize_weights import QuantizeWeights

PASS_CLASSES: list[type] = [
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
    LowerOrtPrecision,
    LowerOrtAttention,
    LowerOrtNorms,
    LowerOrtMoe,
    LowerOrtMatmul,
    LowerOrtEmbedding,
    LowerOrtWeightDtype,
    LowerOrtLogits,
    LowerOrtModule,
    LowerTriton,
]
PASSES: dict[str, type] = {c.name: c for c in PASS_CLASSES}  # type: ignore[attr-defined]

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
