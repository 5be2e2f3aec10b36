"""`llmir verify FILE`: parse and check a .llmir module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import EXIT_CHECK_FAILED, ParseError
from llmir_core.ir.parser import parse_file
from llmir_core.verifier import verify

from .._options import DebugOpt, FormatOpt, OutputFormat, QuietOpt, VerboseOpt
from .._render import handle_errors, make_ctx

HELP = """Check a .llmir file: syntax, SSA, op signatures, attributes, types and weight references.

Exit 0 when it verifies, 1 when it does not, 2 when the file cannot be read or parsed.

Examples:

  llmir verify model.llmir

  llmir verify model.llmir --format json | jq .diagnostics
"""


def verify_cmd(
    file: Annotated[Path, typer.Argument(help="The .llmir file to check.", show_default=False)],
    no_weights: Annotated[bool, typer.Option("--no-weight-files", help="Do not check that weight files exist.")] = False,
    fmt: FormatOpt = OutputFormat.human,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    ctx = make_ctx(fmt, quiet, verbose, debug)
    with handle_errors(ctx):
        try:
            module = parse_file(str(file))
        except ParseError:
            raise
        diags = verify(module, check_files=not no_weights)
        errors = [d for d in diags if d.severity == "error"]
        if ctx.json:
            ctx.emit_json("verify", {
                "ok": not errors, "file": str(file), "functions": len(module.functions),
                "ops": module.op_count(), "diagnostics": [d.to_json() for d in diags],
            })
        else:
            ctx.diagnostics(diags)
            if errors:
                ctx.log(f"{file}: {len(errors)} error(s)")
            elif not quiet:
                ctx.result(f"{file}: ok ({len(module.functions)} function(s), {module.op_count()} ops)")
        if errors:
            raise typer.Exit(EXIT_CHECK_FAILED)


def register(app: typer.Typer) -> None:
    app.command("verify", help=HELP)(verify_cmd)
