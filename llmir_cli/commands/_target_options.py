"""`llmir build|optimize --target T --list-options`: the build options a target declares, as a
table on a terminal, aligned plain columns in a pipe, or JSON (`--format json`)."""

from __future__ import annotations

from typing import Any

from .._render import Ctx

_COLUMNS = ("option", "kind", "default", "choices", "help")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def rows(options: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per declared option: name, kind, default, choices ("|"-joined), help."""
    return [
        (
            o["name"],
            o["kind"],
            _cell(o["default"]),
            "|".join(o["choices"]) or "-",
            o["help"],
        )
        for o in options
    ]


def list_options(ctx: Ctx, target: str) -> None:
    """Print the options `target` declares (its name is checked against the target table)."""
    from llmir_core.targets import get_target
    from llmir_core.targets.options import describe

    t = get_target(target)
    options = describe(t)
    if ctx.json:
        ctx.emit_json("target_options", {"ok": True, "target": t.name, "options": options})
        return
    body = rows(options)
    if ctx.out.is_terminal:
        from rich import box
        from rich.table import Table

        table = Table(title=f"{t.name} build options (--target-opt KEY=VALUE)", box=box.SIMPLE_HEAD)
        for column in _COLUMNS:
            table.add_column(column, no_wrap=column != "help", overflow="fold")
        for row in body:
            table.add_row(*row)
        ctx.out.print(table)
        return
    head = [r[:4] for r in [_COLUMNS, *body]]
    widths = [max(len(r[i]) for r in head) for i in range(4)]
    ctx.result(
        "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4]
            for r in [_COLUMNS, *body]
        )
    )


__all__ = ["list_options", "rows"]
