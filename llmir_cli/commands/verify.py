"""`llmir verify FILE`: parse and check a .llmir module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import EXIT_CHECK_FAILED, InputError
from llmir_core.ir.parser import parse_file
from llmir_core.verifier import verify

from .._render import Ctx
from ._command import command

HELP = """Check a .llmir file: syntax, SSA, op signatures, attributes, types and weight references.

Exit 0 when it verifies, 1 when it does not, 2 when the file cannot be read or parsed.
With --rules: prove every rewrite rule (exit 0 all equivalent or within their bound, 1 one not
equivalent, 3 one inconclusive or unproved); --rules --mutants: every mutant must be refused.
With --against ORIGINAL: translation validation, one verdict: `equivalent` (proved exact),
`within bound B` (approximate rewrites: B, the max |error| of the outputs over inputs in [-1, 1],
composed over the rule instances found, printed), `not equivalent` (an input and the op where they
differ) or `inconclusive` (exit 0 equivalent or within bound, 1 not equivalent, 3 inconclusive).
With --target NAME: also list every op the target cannot run, with file:line (exit 1 if any).

Examples:

  llmir verify model.llmir

  llmir verify model.llmir --format json | jq .diagnostics

  llmir verify --rules

  llmir verify optimized.llmir --against model.llmir

  llmir verify model.llmir --target onnxruntime
"""


@command
def verify_cmd(
    ctx: Ctx,
    file: Annotated[
        Path | None, typer.Argument(help="The .llmir file to check.", show_default=False)
    ] = None,
    no_weights: Annotated[
        bool, typer.Option("--no-weight-files", help="Do not check that weight files exist.")
    ] = False,
    rules: Annotated[
        bool, typer.Option("--rules", help="Prove every rewrite rule in the library (z3).")
    ] = False,
    rule_filter: Annotated[
        str | None,
        typer.Option("--rule", help="With --rules: only rules whose name contains this."),
    ] = None,
    mutants: Annotated[
        bool,
        typer.Option(
            "--mutants",
            help="With --rules: prove mechanical mutants of each rule's rhs; all must be refused.",
        ),
    ] = False,
    update_certificate: Annotated[
        bool,
        typer.Option(
            "--update-certificate", hidden=True, help="With --rules: rewrite the proof certificate."
        ),
    ] = False,
    against: Annotated[
        Path | None,
        typer.Option("--against", help="Check FILE is equivalent to this original module."),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds per solver call (killed after).")
    ] = 10.0,
    ranges: Annotated[
        bool,
        typer.Option(
            "--ranges",
            help="Interval analysis: value ranges, fp16 overflow, verify_invariant attributes.",
        ),
    ] = False,
    input_range: Annotated[
        float, typer.Option("--input-range", help="With --ranges: inputs lie in [-R, R].")
    ] = 1.0,
    target: Annotated[
        str | None, typer.Option("--target", help="Also check every op runs on this target.")
    ] = None,
) -> None:
    if rules:
        from ._verify_smt import verify_mutants, verify_rules

        if mutants:
            verify_mutants(ctx, rule_filter, timeout)
        else:
            verify_rules(ctx, rule_filter, update_certificate, timeout)
        return
    if file is None:
        raise InputError("missing FILE", hint="llmir verify FILE.llmir, or llmir verify --rules")
    if against is not None:
        from ._verify_smt import verify_against

        verify_against(ctx, file, against, timeout)
    elif ranges:
        from ._verify_smt import verify_ranges

        verify_ranges(ctx, file, input_range, timeout)
    else:
        _verify(ctx, file, no_weights, target)


def _verify(ctx: Ctx, file: Path, no_weights: bool, target: str | None) -> None:
    """The module's diagnostics (and, with a target, every op it cannot run); exit 1 on an
    error."""
    module = parse_file(str(file))
    diags = verify(module, check_files=not no_weights)
    if target is not None:
        from llmir_core.targets import get_target

        diags = diags + get_target(target).capabilities.check(module)
    errors = [d for d in diags if d.severity == "error"]
    if ctx.json:
        ctx.emit_json(
            "verify",
            {
                "ok": not errors,
                "file": str(file),
                "functions": len(module.functions),
                "ops": module.op_count(),
                "diagnostics": [d.to_json() for d in diags],
            },
        )
    else:
        ctx.diagnostics(diags)
        if errors:
            ctx.log(f"{file}: {len(errors)} error(s)")
        elif not ctx.quiet:
            ctx.result(f"{file}: ok ({len(module.functions)} function(s), {module.op_count()} ops)")
    if errors:
        raise typer.Exit(EXIT_CHECK_FAILED)


def register(app: typer.Typer) -> None:
    app.command("verify", help=HELP)(verify_cmd)
