"""Optimization passes: one module per pass, the table of passes, presets and the manager.

`PASSES` maps each pass's kebab-case name to its class; `llmir optimize --list` reads it.
"""

from __future__ import annotations

from .base import Pass, PassContext
from .canonicalize import Canonicalize
from .constant_fold import ConstantFold
from .cse import Cse
from .dce import Dce
from .fuse_gated_mlp import FuseGatedMlp
from .fuse_matmul_transpose import FuseMatmulTranspose
from .fuse_silu_mul import FuseSiluMul
from .lift_activations import LiftActivations
from .lift_rms_norm import LiftRmsNorm
from .merge_qkv import MergeQkv

PASS_CLASSES: list[type] = [Canonicalize, ConstantFold, Cse, Dce, LiftActivations, LiftRmsNorm,
                            FuseMatmulTranspose, FuseSiluMul, FuseGatedMlp, MergeQkv]
PASSES: dict[str, type] = {c.name: c for c in PASS_CLASSES}  # type: ignore[attr-defined]

_CLEANUP = ["canonicalize", "constant-fold", "cse", "dce"]
PRESETS: dict[str, list[str]] = {
    "O0": [],
    "O1": list(_CLEANUP),
    "O2": _CLEANUP + ["lift-activations", "lift-rms-norm", "fuse-matmul-transpose", "fuse-silu-mul",
                      "fuse-gated-mlp", "merge-qkv", "cse", "dce"],
}
PRESETS["O3"] = list(PRESETS["O2"])

__all__ = ["PASSES", "PRESETS", "Pass", "PassContext"]
