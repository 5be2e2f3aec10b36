"""`llmir run TARGET --input NAME=FILE ... --output-dir DIR`: run a model on tensors from files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import InputError
from llmir_core.runtime.tensors import parse_input_specs, run_target, summarize, write_outputs

from .._options import DebugOpt, FormatOpt, OutputFormat, QuietOpt, VerboseOpt
from .._render import handle_errors, make_ctx

HELP = """Run a model on input tensors and write its outputs as NAME.npy.

TARGET is an artifact folder from `llmir build` (run on onnxruntime) or a .llmir file (run on the
numpy reference interpreter, or with --backend onnxruntime built into a temp folder and run
there). Inputs are .npy files or ONNX TensorProto .pb files; they are checked against the model's
signature (names, dtypes, static and symbolic dims) before anything runs. A summary of every
output (shape, dtype, min/max/mean) goes to stdout.

Examples:

  llmir run model.llmir --input x=x.npy --output-dir out/

  llmir run model-ort/ --backend onnxruntime --input input_ids=ids.npy --output-dir out/

  llmir run model.llmir --input x=input_0.pb --output-dir out/ --format json
"""


def run_cmd(
    target: Annotated[Path, typer.Argument(help="Artifact folder or .llmir file.", show_default=False)],
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=FILE (.npy or .pb); repeat per input.")] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="Folder for NAME.npy outputs.")] = None,
    backend: Annotated[str | None, typer.Option("--backend", "-b", help="reference or onnxruntime (default: reference for .llmir, onnxruntime for a folder).")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="onnxruntime intra-op threads.")] = None,
    fmt: FormatOpt = OutputFormat.human,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    ctx = make_ctx(fmt, quiet, verbose, debug)
    with handle_errors(ctx):
        if not target.exists():
            raise InputError(f"{target}: no such file or folder", hint="pass an artifact folder or a .llmir file")
        chosen = backend or ("onnxruntime" if target.is_dir() else "reference")
        values = parse_input_specs(list(inputs or []))
        outputs = run_target(str(target), values, chosen, threads)
        paths = write_outputs(outputs, str(output_dir)) if output_dir is not None else []
        rows = summarize(outputs)
        if ctx.json:
            ctx.emit_json("run", {"ok": True, "target": str(target), "backend": chosen,
                                  "outputs": rows, "files": paths})
            return
        for row in rows:
            stats = (f"  min {row['min']:.6g}  max {row['max']:.6g}  mean {row['mean']:.6g}"
                     if "min" in row else "")
            ctx.result(f"{row['name']}: {row['dtype']}{row['shape']}{stats}")
        if paths:
            ctx.log(f"wrote {len(paths)} file(s) to {output_dir}")


def register(app: typer.Typer) -> None:
    app.command("run", help=HELP)(run_cmd)
