"""lower-reference: mark a module as lowered for the reference target, after checking it runs.

The numpy reference interpreter runs every op that declares reference semantics or a
decomposition, so lowering rewrites no op: it checks each op against the reference target's
capability table (an op with neither, a dtype or a device the interpreter has not: one error per
op, with its location) and records `target = "reference"` (so `llmir build` of the output only
serializes it: building a module and building its `llmir optimize --target reference` output
give the same artifact) and `llmir.source` (the file it was lowered from) when it has none.
Invariant: no op, value or type changes; only the module's `target` and `llmir.source`
attributes are set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.errors import CheckFailed
from llmir_core.ir.core import Module
from llmir_core.passes.base import PassContext

NAME = "reference"


@dataclass(frozen=True)
class LowerReference:
    name: ClassVar[str] = "lower-reference"
    summary: ClassVar[str] = (
        "check every op runs on the reference interpreter; record target = reference"
    )

    def run(self, module: Module, ctx: PassContext) -> bool:
        from llmir_core.targets import get_target
        from llmir_core.targets.onnxruntime.lower_module import source_record

        problems = get_target(NAME).capabilities.check(module)
        if problems:
            raise CheckFailed(
                f"{len(problems)} op(s) cannot run on the reference target: {problems[0].message}",
                diagnostics=problems,
                hint="give each op a reference or a decomposition in its dialect "
                "(see `llmir verify FILE --target reference`)",
            )
        before = dict(module.attrs)
        module.attrs.setdefault("llmir.source", source_record(module))
        module.attrs["target"] = NAME
        return module.attrs != before


__all__ = ["LowerReference"]
