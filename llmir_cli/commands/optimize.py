"""`llmir optimize IN -o OUT`: run a pass pipeline (presets or --passes), with verification,
dumps, timings, translation validation and a report."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from llmir_core.errors import EXIT_CHECK_FAILED, EXIT_INCONCLUSIVE, InputError
from llmir_core.fileio import new_files, write_text_atomic
from llmir_core.ir.parser import parse_file
from llmir_core.ir.printer import print_module
from llmir_core.weights import rebase_weight_paths

from .._options import OptLevelOpt
from .._render import Ctx
from ._command import ListOptionsFlag, LoweringFlags, command
from ._verdicts import render_verdicts

HELP = """Optimize a .llmir module with a pass pipeline; every pass is verified, and with
--verify-each translation-validated: each pass gets one verdict, `equivalent` (proved exact),
`within bound B` (approximate rules: B, the max |error| of the outputs over inputs in [-1, 1],
composed over the applied rule instances, printed), `not equivalent` (a counterexample input, the
op and line) or `inconclusive` (no proof either way; differential agreement alone is reported so).

Exit 0 ok (every pass equivalent or within bound), 1 a pass broke the module or was not
equivalent (nothing written), 2 bad input or pipeline, 3 a validation was inconclusive (the
output is written; the inconclusive passes are listed). See docs/optimize.md, "Verdicts".

Examples:

  llmir optimize model.llmir -O2 -o model.opt.llmir

  llmir optimize model.llmir --passes canonicalize,cse,dce

  llmir optimize model.llmir -O2 --verify-each --report --time-passes -o out.llmir

  llmir optimize model.llmir -O2 --print-after-all --dump-dir dumps/ -o out.llmir

  llmir optimize model.llmir -O2 --target onnxruntime --verify-each --report -o lowered.llmir

  llmir optimize model.llmir --target onnxruntime --quant int4 --max-len 4096 -o q4.llmir

  llmir optimize --list

  llmir optimize --target triton --list-options

--target NAME appends the target's lowering passes after -O (default 2, as for `llmir build`)
or --passes; -O0 --target runs only the lowering. `llmir build` of the result gives the artifact
`llmir build` of the input gives with the same -O and the same build options (--target-opt
KEY=VALUE, and the onnxruntime aliases --quant, --quant-block, --max-len, --accuracy-level,
--logits, --dtype, --prepack, --generic, ...: they apply with --target only). The lowered module
records the passes that ran (`llmir.pipeline`) and the build options (`llmir.target_options`);
the artifact's manifest copies both.
"""


@command(lowering=True)
def optimize_cmd(
    ctx: Ctx,
    file: Annotated[
        Path | None, typer.Argument(help="The .llmir file to optimize.", show_default=False)
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the result here (default: stdout).")
    ] = None,
    level: OptLevelOpt = None,
    passes: Annotated[
        str | None, typer.Option("--passes", help="Pipeline: a,b{opt=value},c")
    ] = None,
    list_: Annotated[
        bool, typer.Option("--list", help="List passes, options and presets.")
    ] = False,
    verify_each: Annotated[
        bool, typer.Option("--verify-each", help="Translation-validate every pass.")
    ] = False,
    report: Annotated[
        bool, typer.Option("--report", help="Print the optimization report.")
    ] = False,
    time_passes: Annotated[
        bool, typer.Option("--time-passes", help="Print the time of each pass.")
    ] = False,
    print_after_all: Annotated[
        bool, typer.Option("--print-after-all", help="Dump the module after every pass.")
    ] = False,
    print_after: Annotated[
        list[str] | None,
        typer.Option("--print-after", help="Dump the module after pass NAME (repeatable)."),
    ] = None,
    dump_dir: Annotated[
        Path, typer.Option("--dump-dir", help="Folder for NN-pass.llmir dumps.")
    ] = Path("llmir-dumps"),
    target: Annotated[
        str | None, typer.Option("--target", help="Append this target's lowering passes.")
    ] = None,
    allow_unproved: Annotated[
        bool,
        typer.Option("--allow-unproved", help="Let passes use rules without a proof certificate."),
    ] = False,
    list_options: ListOptionsFlag = False,
    *,
    lowering: LoweringFlags,
) -> None:
    if _listed(ctx, list_, list_options, target):
        return
    if file is None:
        raise InputError(
            "missing input file", hint="llmir optimize IN.llmir -o OUT.llmir (or --list)"
        )
    if passes is not None and level is not None:
        raise InputError("give either -O or --passes, not both")
    flags = lowering.given()
    if flags and target is None:
        raise InputError(
            f"{', '.join(flags)}: lowering options need --target",
            hint=f"llmir optimize {file} --target onnxruntime {' '.join(flags)} ...",
        )
    if passes is None and level is None:
        from llmir_core.registry.lockfile import project_here

        project = project_here()
        level = project.opt_level if project else None  # else 2 (a target may say otherwise)
    module = parse_file(str(file))
    pipeline = _pipeline(module, level, passes, target, lowering, output)
    _check_print_after(print_after)
    run = _Run(verify_each, allow_unproved, dump_dir, print_after, print_after_all)
    result, text, failed = run.run(module, pipeline, file, output)
    _render(ctx, result, text, file, output, report, time_passes, verify_each)
    if failed is not None:
        raise typer.Exit(EXIT_CHECK_FAILED)
    if result.inconclusive:
        raise typer.Exit(EXIT_INCONCLUSIVE)


def _listed(ctx: Ctx, passes: bool, options: bool, target: str | None) -> bool:
    """Print the pass list (--list) or the target's build options (--list-options); whether it
    printed one (the command then stops)."""
    if options:
        if target is None:
            raise InputError(
                "--list-options needs --target",
                hint="llmir optimize --target onnxruntime --list-options",
            )
        from ._target_options import list_options

        list_options(ctx, target)
        return True
    if passes:
        _list_passes(ctx)
    return passes


def _list_passes(ctx: Ctx) -> None:
    # the pass and rule tables load here, when a pipeline is run or listed (not at startup)
    from llmir_core.passes import PRESETS
    from llmir_core.passes.pipeline import describe_passes
    from llmir_core.passes.report import format_list

    items = describe_passes()
    if ctx.json:
        ctx.emit_json(
            "passes",
            {
                "passes": [{k: v for k, v in i.items() if k != "doc"} for i in items],
                "presets": PRESETS,
            },
        )
    else:
        ctx.result(format_list(items, PRESETS))


def _pipeline(
    module: Any,
    level: int | None,
    passes: str | None,
    target: str | None,
    lowering: LoweringFlags,
    output: Path | None,
) -> list[Any]:
    """The passes to run: --passes or the -O preset, then the target's lowering (what `llmir
    build` runs for this -O and these options); weights a pass writes go beside OUT."""
    from llmir_core.passes.pipeline import parse_pipeline, preset

    pipeline: list[Any] = []
    if passes is not None:
        pipeline = parse_pipeline(passes)
    elif target is None:
        pipeline = preset(level if level is not None else 2)
    if target is not None:
        from llmir_core import targets as backends

        options = lowering.options(module, target)
        backends.record_options(module, target, options)
        if passes is None:
            pipeline = backends.pipeline(target, options, level)
        else:
            pipeline = pipeline + list(backends.get_target(target).lowering(options))
    if output is None:
        return pipeline
    return [
        dataclasses.replace(
            p, weights_file=str(output.with_name(f"{output.stem}.q{p.bits}.weights.bin"))
        )
        if getattr(p, "weights_file", None) == ""
        else p
        for p in pipeline
    ]


def _check_print_after(print_after: list[str] | None) -> None:
    from llmir_core.passes import PASSES

    for n in print_after or ():
        if n not in PASSES:
            raise InputError(
                f"--print-after: unknown pass {n!r}", hint="valid passes: " + ", ".join(PASSES)
            )


@dataclasses.dataclass(frozen=True)
class _Run:
    verify_each: bool
    allow_unproved: bool
    dump_dir: Path
    print_after: list[str] | None
    print_after_all: bool

    def run(
        self, module: Any, pipeline: list[Any], file: Path, output: Path | None
    ) -> tuple[Any, str, Any]:
        """Run the pipeline; write OUT unless a pass failed to validate. (result, text, failed)"""
        from llmir_core.passes.manager import run_pipeline

        validator = None
        if self.verify_each:
            from llmir_core.smt.tv import validate_pass

            validator = validate_pass
        # weights a pass writes beside OUT go again when OUT is not written (an error, a pass
        # that did not validate): nothing of a failed run stays behind
        side_files = new_files([getattr(p, "weights_file", "") for p in pipeline] if output else [])
        with side_files.removed_on_error():
            result = run_pipeline(
                module,
                pipeline,
                allow_unproved=self.allow_unproved,
                validator=validator,
                dump_dir=str(self.dump_dir),
                print_after=set(self.print_after or ()),
                print_after_all=self.print_after_all,
                command="llmir optimize " + shlex.quote(str(file)),
            )
            text = print_module(result.module)
            failed = result.failed_validation
            if output is not None and failed is None:
                # weight paths are relative to the file's folder: keep them pointing at the same
                # bytes when OUT is written somewhere else than IN
                if rebase_weight_paths(result.module, str(output.resolve().parent)):
                    text = print_module(result.module)
                write_text_atomic(output, text)
        if failed is not None:
            side_files.remove()
        return result, text, failed


def _render(
    ctx: Ctx,
    result: Any,
    text: str,
    file: Path,
    output: Path | None,
    report: bool,
    time_passes: bool,
    verify_each: bool,
) -> None:
    from llmir_core.passes.report import format_report, format_times

    failed = result.failed_validation
    if ctx.json:
        payload = {
            "ok": failed is None and not result.inconclusive,
            "file": str(file),
            "output": str(output) if output else None,
            **result.to_json(),
        }
        if output is None and failed is None:
            payload["text"] = text
        ctx.emit_json("optimize", payload)
        return
    rep = format_report(result) if report else ""
    side = rep + (format_times(result) if time_passes or verify_each else "")
    if output is None:
        if failed is None:
            ctx.result(text)
        if side:
            sys.stderr.write(side)
    elif side:
        ctx.result(side)
    for r in result.runs:
        if r.dump:
            ctx.detail(f"wrote {r.dump}")
    if verify_each:
        render_verdicts(result, sys.stderr.write)


def register(app: typer.Typer) -> None:
    app.command("optimize", help=HELP)(optimize_cmd)
