"""`llmir optimize IN -o OUT`: run a pass pipeline (presets or --passes), with verification,
dumps, timings, translation validation and a report."""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import EXIT_CHECK_FAILED, EXIT_INCONCLUSIVE, InputError
from llmir_core.fileio import new_files, write_text_atomic
from llmir_core.ir.parser import parse_file
from llmir_core.ir.printer import print_module
from llmir_core.weights import rebase_weight_paths

from .._options import (
    AccuracyLevelOpt,
    AttentionKernelOpt,
    DebugOpt,
    F32MatmulOpt,
    FormatOpt,
    GenericOpt,
    GgufKernelsOpt,
    Int8MatmulOpt,
    LogitsOpt,
    MaxLenOpt,
    OptLevelOpt,
    OutputFormat,
    PrepackOpt,
    QuantBlockOpt,
    QuantOpt,
    QuietOpt,
    VerboseOpt,
    WeightDTypeOpt,
)
from .._render import handle_errors, make_ctx
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

--target NAME appends the target's lowering passes after -O (default 2, as for `llmir build`)
or --passes; -O0 --target runs only the lowering. `llmir build` of the result gives the artifact
`llmir build` of the input gives with the same -O and the same build options (--quant,
--quant-block, --max-len, --accuracy-level, --logits, --dtype, --prepack, --generic: they apply
with --target only). The
lowered module records the passes that ran (`llmir.pipeline`; the artifact's manifest copies it).
"""


def optimize_cmd(  # noqa: C901 (one branch per CLI option)
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
    quant: QuantOpt = None,
    quant_block: QuantBlockOpt = 32,
    max_len: MaxLenOpt = None,
    accuracy_level: AccuracyLevelOpt = None,
    logits: LogitsOpt = None,
    dtype: WeightDTypeOpt = None,
    prepack: PrepackOpt = None,
    int8_matmul: Int8MatmulOpt = None,
    f32_matmul: F32MatmulOpt = None,
    attention_kernel: AttentionKernelOpt = None,
    gguf_kernels: GgufKernelsOpt = None,
    generic: GenericOpt = False,
    allow_unproved: Annotated[
        bool,
        typer.Option("--allow-unproved", help="Let passes use rules without a proof certificate."),
    ] = False,
    fmt: FormatOpt = OutputFormat.human,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    ctx = make_ctx(fmt, quiet, verbose, debug)
    with handle_errors(ctx):
        # the pass and rule tables load here, when a pipeline is run or listed (not at startup)
        from llmir_core.passes import PRESETS
        from llmir_core.passes.manager import run_pipeline
        from llmir_core.passes.pipeline import describe_passes, parse_pipeline, preset
        from llmir_core.passes.report import format_list, format_report, format_times

        if list_:
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
            return
        if file is None:
            raise InputError(
                "missing input file", hint="llmir optimize IN.llmir -o OUT.llmir (or --list)"
            )
        if passes is not None and level is not None:
            raise InputError("give either -O or --passes, not both")
        lowering_flags = [
            flag
            for flag, given in (
                ("--quant", quant is not None),
                ("--max-len", max_len is not None),
                ("--accuracy-level", accuracy_level is not None),
                ("--logits", logits is not None),
                ("--dtype", dtype is not None),
                ("--prepack", prepack is not None),
                ("--int8-matmul", int8_matmul is not None),
                ("--f32-matmul", f32_matmul is not None),
                ("--attention-kernel", attention_kernel is not None),
                ("--gguf-kernels", gguf_kernels is not None),
                ("--generic", generic),
            )
            if given
        ]
        if lowering_flags and target is None:
            raise InputError(
                f"{', '.join(lowering_flags)}: lowering options need --target",
                hint=f"llmir optimize {file} --target onnxruntime {' '.join(lowering_flags)} ...",
            )
        if passes is None and level is None:
            from llmir_core.registry.lockfile import project_here

            project = project_here()
            level = project.opt_level if project else None  # else 2 (a target may say otherwise)
        module = parse_file(str(file))
        if passes is not None:
            pipeline = parse_pipeline(passes)
        elif target is None:
            pipeline = preset(level if level is not None else 2)
        if target is not None:
            from llmir_core import targets as backends

            options = backends.build_options(
                module,
                target,
                quant=quant,
                quant_block=quant_block,
                max_len=max_len,
                accuracy_level=accuracy_level,
                logits=logits,
                dtype=dtype,
                generic=generic,
                prepack=prepack,
                int8_matmul=int8_matmul,
                f32_matmul=f32_matmul,
                attention_kernel=attention_kernel,
                gguf_kernels=gguf_kernels,
            )
            if passes is None:  # what `llmir build` runs for this -O and these options
                pipeline = backends.pipeline(target, options, level)
            else:
                pipeline = pipeline + list(backends.get_target(target).lowering(options))
        if output is not None:  # weights a pass writes (quantize-weights) go beside OUT
            pipeline = [
                dataclasses.replace(
                    p, weights_file=str(output.with_name(f"{output.stem}.q{p.bits}.weights.bin"))
                )
                if getattr(p, "weights_file", None) == ""
                else p
                for p in pipeline
            ]
        if print_after:
            from llmir_core.passes import PASSES

            for n in print_after:
                if n not in PASSES:
                    raise InputError(
                        f"--print-after: unknown pass {n!r}",
                        hint="valid passes: " + ", ".join(PASSES),
                    )
        validator = None
        if verify_each:
            from llmir_core.smt.tv import validate_pass

            validator = validate_pass
        command = "llmir optimize " + shlex.quote(str(file))
        # weights a pass writes beside OUT go again when OUT is not written (an error, a pass
        # that did not validate): nothing of a failed run stays behind
        side_files = new_files([getattr(p, "weights_file", "") for p in pipeline] if output else [])
        with side_files.removed_on_error():
            result = run_pipeline(
                module,
                pipeline,
                allow_unproved=allow_unproved,
                validator=validator,
                dump_dir=str(dump_dir),
                print_after=set(print_after or ()),
                print_after_all=print_after_all,
                command=command,
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
        else:
            rep = format_report(result) if report else ""
            times = format_times(result) if time_passes or verify_each else ""
            side = rep + times
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
        if failed is not None:
            raise typer.Exit(EXIT_CHECK_FAILED)
        if result.inconclusive:
            raise typer.Exit(EXIT_INCONCLUSIVE)


def register(app: typer.Typer) -> None:
    app.command("optimize", help=HELP)(optimize_cmd)
