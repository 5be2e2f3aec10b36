"""A plugin target whose lowering pass is named like a built-in pass (`cse`): the pass is left
out, and the target's other pass is kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_ext_demo.target import LowerNumpyExt, NumpyExtTarget


@dataclass(frozen=True)
class Cse(LowerNumpyExt):
    name: ClassVar[str] = "cse"


@dataclass(frozen=True)
class Mine(LowerNumpyExt):
    name: ClassVar[str] = "lower-shadow-pass"


TARGET = NumpyExtTarget(
    name="shadow-pass",
    passes=("llmir_ext_bad.shadow_pass:Cse", "llmir_ext_bad.shadow_pass:Mine"),
)
