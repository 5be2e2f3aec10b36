"""dce: dead code elimination.

Rewrite: remove pure ops none of whose results is used (transitively). Ops whose OpDef declares
`effects` are kept; a KV-cache write is an op whose new cache is an explicit result that the
function returns, so it is live by data flow and DCE can never drop it.
Invariant: the function's outputs are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from llmir_core.ir.core import Module

from .base import PassContext, erase_dead


@dataclass(frozen=True)
class Dce:
    name: ClassVar[str] = "dce"
    summary: ClassVar[str] = "remove pure ops whose results are unused"

    def run(self, module: Module, ctx: PassContext) -> bool:
        removed = 0
        for fn in module.functions:
            removed += erase_dead(fn)
        if removed:
            ctx.rewrites.append(_rw(ctx.current, removed))
        return removed > 0


def _rw(pass_name: str, n: int):  # type: ignore[no-untyped-def]
    from .base import Rewrite

    return Rewrite(pass_name, "dce", "module", f"removed {n} dead op(s)")
