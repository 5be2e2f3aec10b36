"""`llmir import SRC -o OUT.llmir`: an ONNX model, a Hugging Face folder or a GGUF file to .llmir."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import InputError
from llmir_core.frontends import detect_kind, import_model

from .._options import DebugOpt, FormatOpt, OutputFormat, QuietOpt, VerboseOpt
from .._render import handle_errors, make_ctx

HELP = """Import a model into a readable .llmir file.

SRC is an .onnx file (ONNX opsets 13 and newer, plus the com.microsoft ops LLM exports use), a
Hugging Face model folder (with config.json) or a .gguf file. Weights are not copied into the
text: they stay where they are and the .llmir references them by file and offset (tensors stored
inside an .onnx protobuf are written once to OUT.weights.bin beside OUT.llmir). Nothing is
written when the import fails.

Examples:

  llmir import model.onnx -o model.llmir

  llmir import model.onnx -o model.llmir --keep-unknown   # keep unmapped ops as onnx.opaque

  llmir import ./SmolLM2-135M -o smol.llmir
"""


def import_cmd(
    src: Annotated[Path, typer.Argument(help="Model to import: .onnx, .gguf or a HF folder.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="The .llmir file to write.", show_default=False)],
    keep_unknown: Annotated[bool, typer.Option("--keep-unknown", help="Keep ops llmir does not know as opaque onnx.opaque ops (only the onnxruntime backend can build them).")] = False,
    fmt: FormatOpt = OutputFormat.human,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    ctx = make_ctx(fmt, quiet, verbose, debug)
    with handle_errors(ctx):
        if output.exists() and output.is_dir():
            raise InputError(f"{output}: is a folder, expected a .llmir file path")
        kind = detect_kind(str(src))
        ctx.detail(f"importing {src} ({kind})")
        t0 = time.perf_counter()
        module = import_model(src, keep_unknown=keep_unknown, out_path=output)
        dt = time.perf_counter() - t0
        weights = sum(1 for f in module.functions for op in f.ops if op.name == "core.weight")
        opaque = sum(1 for f in module.functions for op in f.ops if op.name == "onnx.opaque")
        if ctx.json:
            ctx.emit_json("import", {"ok": True, "source": str(src), "kind": kind, "output": str(output),
                                     "ops": module.op_count(), "weights": weights, "opaque_ops": opaque,
                                     "seconds": round(dt, 3)})
        elif not quiet:
            extra = f", {opaque} opaque" if opaque else ""
            ctx.result(f"{output}: {module.op_count()} ops, {weights} weights{extra} "
                       f"(from {kind} {src}, {dt:.2f} s)")


def register(app: typer.Typer) -> None:
    app.command("import", help=HELP)(import_cmd)
