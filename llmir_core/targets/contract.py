"""The target contract: what a target declares and does.

A target lives in one folder, `llmir_core/targets/<name>/` (or in another package, registered
through the `llmir.targets` entry-point group). It declares:

- `name`, and `capabilities` (the ops, dtypes and devices it runs);
- `dialects`: the modules that register its ops (imported by the op registry on first use);
- `passes`: its lowering pass classes as "module:Class" (`llmir optimize --passes` names them);
- `options`: its build options as typed data (`TargetOption`: `--target-opt KEY=VALUE`,
  `llmir build --target T --list-options`, recorded in the manifest);
- `lowering(options)`: the passes `llmir optimize --target NAME` appends (their output is a
  `.llmir` file in the target's dialect), `serialize` (lowered module -> artifact folder whose
  manifest names the target);
- `open(artifact)`: a runner, the `Decoder` protocol (llmir_core.runtime.generate) for LLM
  artifacts, a `TensorRunner` otherwise; `open_batch(artifact, slots=...)`: a `BatchDecoder`
  (llmir_core.runtime.batch_decoder) for the server. Optional on the opened decoder:
  `kernel_variants() -> {op name: variant}`, the instruction-set variant each of the target's
  own kernels in the artifact runs with (`llmir bench --format json` reports it as `kernels`;
  a decoder without it reports `{}`); `kv_bytes` and `kv_touched_bytes` on a batch decoder, the
  KV memory it reserved and wrote (serve's /metrics).

Targets register in `llmir_core.targets.TARGETS` (name -> lazily imported object), the only
registration point.
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
    # op name -> {dtype: "native" | "cast"} for the narrow float dtypes (f16, bf16) the target
    # has a kernel for ("cast": it computes in f32 through its own casts). None: no per-op table
    # (every op runs in every dtype of `dtypes`). Wider floats (f32, f64) run everywhere.
    kernels: Mapping[str, Mapping[str, str]] | None = None
    kernels_source: str = ""  # where the per-op table comes from (named in refusals)

    def kernel(self, op_name: str, dtype: DType) -> str | None:
        """How the target computes op_name in dtype: native, cast (in f32 through its own
        casts) or None (no kernel). The table covers the 16-bit floats (f16, bf16); other dtypes
        (f32, f64, integers, the 8-bit and 4-bit floats casts carry) are not its business."""
        if self.kernels is None or dtype not in (DType.f16, DType.bf16):
            return "native"
        return self.kernels.get(op_name, {}).get(str(dtype))

    def kernel_problem(self, op: Op) -> str | None:
        """Why the target has no kernel for op in the narrow float dtype it computes in."""
        for v in [*op.operands, *op.results]:
            t = v.type
            if isinstance(t, TensorType) and isinstance(t.dtype, DType):
                if self.kernel(op.name, t.dtype) is None:
                    src = f" ({self.kernels_source})" if self.kernels_source else ""
                    return (
                        f"{op.name} computes in {t.dtype}, for which the target has no kernel{src}"
                    )
        return None

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

    def check(self, module: Module, kernels: bool = False) -> list[Diagnostic]:
        """One error per op the target cannot run, with its location. kernels: also each op
        computing in a narrow float dtype the target has no kernel for (after lowering: the
        lowering casts such ops to f32 where it can)."""
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
                if why is None and kernels:
                    why = self.kernel_problem(op)
                if why is not None:
                    out.append(Diagnostic("error", why, op.pos, op.origin))
        return out


@dataclass(frozen=True)
class TargetOption:
    """One build option a target declares: `--target-opt NAME=VALUE` on build and optimize.

    kind: "str" | "int" | "bool"; choices: the allowed values (strings; empty = any value of
    the kind); default: what the lowering uses when the option is not given (None: decided by
    the module, said in `help`)."""

    name: str
    kind: str
    help: str
    default: Any = None
    choices: tuple[str, ...] = ()


class TensorRunner(Protocol):
    input_names: list[str]
    output_names: list[str]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class Target(Protocol):
    name: str
    capabilities: Capabilities
    dialects: tuple[str, ...]
    passes: tuple[str, ...]
    options: tuple[TargetOption, ...]

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

    def open_batch(self, artifact_dir: str, slots: int, **options: Any) -> Any: ...


__all__ = ["Capabilities", "Target", "TargetOption", "TensorRunner"]
