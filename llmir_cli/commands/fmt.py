"""`llmir fmt FILE [-i]`: print a .llmir file in canonical form."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import EXIT_CHECK_FAILED
from llmir_core.fileio import write_text_atomic
from llmir_core.ir.parser import parse_file
from llmir_core.ir.printer import print_module

from .._render import Ctx
from ._command import command

HELP = """Print a .llmir file in its canonical form (sorted attributes, one op per line).

Examples:

  llmir fmt model.llmir > canonical.llmir

  llmir fmt -i model.llmir          # rewrite in place

  llmir fmt --check model.llmir     # exit 1 if not canonical (for CI)
"""


@command
def fmt_cmd(
    ctx: Ctx,
    file: Annotated[Path, typer.Argument(help="The .llmir file to format.", show_default=False)],
    in_place: Annotated[
        bool, typer.Option("--in-place", "-i", help="Rewrite the file in place.")
    ] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Only check: exit 1 if the file is not canonical.")
    ] = False,
) -> None:
    module = parse_file(str(file))
    text = print_module(module)
    original = file.read_text(encoding="utf-8")
    changed = text != original
    if check:
        if ctx.json:
            ctx.emit_json("fmt", {"file": str(file), "canonical": not changed})
        elif changed:
            ctx.log(f"{file}: not in canonical form (run `llmir fmt -i {file}`)")
        if changed:
            raise typer.Exit(EXIT_CHECK_FAILED)
        return
    if in_place:
        if changed:
            write_text_atomic(file, text)
        if ctx.json:
            ctx.emit_json("fmt", {"file": str(file), "changed": changed})
        else:
            ctx.log(f"{file}: {'reformatted' if changed else 'already canonical'}")
        return
    if ctx.json:
        ctx.emit_json("fmt", {"file": str(file), "changed": changed, "text": text})
    else:
        ctx.result(text)


def register(app: typer.Typer) -> None:
    app.command("fmt", help=HELP)(fmt_cmd)
