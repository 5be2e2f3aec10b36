"""The backend contract: what a target declares and does.

A target has a name, a capability table (the ops, dtypes and devices it runs), a lowering
pipeline (passes `llmir optimize --target NAME` appends; their output is a `.llmir` file in the
target's dialect), a serializer (lowered module -> artifact folder whose manifest names the
target) and `open(artifact)` returning a runner: the `Decoder` protocol
(llmir_core.runtime.generate) for LLM artifacts, a `TensorRunner` otherwise. Targets register
in `llmir_core.backends.TARGETS` (name -> lazily imported object), the only registration point.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llmir_core.errors import Diagnostic
from llmir_core.ir.core import Module, Op
from llmir_core.ir.types import DType, TensorType


@dataclass(frozen=True)
class Capabilities:
    """What a target executes after lowering. `ops` may hold globs ("ort.*")."""

    ops: frozenset[str]
    dtypes: frozenset[str]
    devices: frozenset[str]
    reasons: Mapping[str, str] = field(default_factory=dict)  # op name -> why it is not run
    folds_constants: bool = False  # ops computed from constants only are evaluated at build time

    def runs(self, op_name: str) -> bool:
        return op_name in self.ops or any(
            fnmatch.fnmatchcase(op_name, p) for p in self.ops if "*" in p
        )

    def op_problem(self, op: Op) -> str | None:
        """Why the target cannot run op (None when it can)."""
        if not self.runs(op.name):
            why = self.reasons.get(op.name, "not in the target's capability table")
            return f"{op.name} cannot run here: {why}"
        for r in op.results:
            t = r.type
            if isinstance(t, TensorType):
                if isinstance(t.dtype, DType) and str(t.dtype) not in self.dtypes:
                    return f"{op.name} computes in {t.dtype}, which the target does not support"
                if t.device and t.device not in self.devices:
                    return (
                        f"{op.name} places its result on device '{t.device}' (target devices: "
                        f"{', '.join(sorted(self.devices))})"
                    )
        return None

    def check(self, module: Module) -> list[Diagnostic]:
        """One error per op the target cannot run, with its location."""
        from llmir_core.dialects.registry import get_op

        out = []
        for fn in module.functions:
            static: set[int] = set()
            for op in fn.ops:
                od = get_op(op.name)
                folds = op.name in ("core.weight", "core.constant") or (
                    od is not None
                    and od.reference is not None
                    and not od.effects
                    and bool(op.operands)
                    and all(id(v) in static for v in op.operands)
                )
                if self.folds_constants and folds:
                    static.update(id(r) for r in op.results)
                    continue
                why = self.op_problem(op)
                if why is not None:
                    out.append(Diagnostic("error", why, op.pos, op.origin))
        return out


class TensorRunner(Protocol):
    input_names: list[str]
    output_names: list[str]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class Target(Protocol):
    name: str
    capabilities: Capabilities

    def lowering(self, options: Mapping[str, Any]) -> list[Any]: ...

    def serialize(
        self,
        module: Module,
        out_dir: str,
        *,
        source_path: str | None = None,
        lowered_text: str | None = None,
    ) -> dict[str, Any]: ...

    def open(self, artifact_dir: str, **options: Any) -> Any: ...


__all__ = ["Capabilities", "Target", "TensorRunner"]
