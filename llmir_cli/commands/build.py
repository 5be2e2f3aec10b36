"""`llmir build IN.llmir --target onnxruntime -o DIR`: compile a module into a runnable artifact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from llmir_core.backends import TARGETS, build
from llmir_core.errors import EXIT_CHECK_FAILED, CheckFailed, InputError
from llmir_core.ir.parser import parse_file
from llmir_core.verifier import verify

from .._options import (
    DebugOpt,
    FormatOpt,
    OutputFormat,
    QuietOpt,
    VerboseOpt,
    WeightDTypeOpt,
)
from .._render import handle_errors, make_ctx

HELP = f"""Build a .llmir module into an artifact folder for a runtime.

--target onnxruntime writes DIR/model.onnx (ONNX opset 23 plus com.microsoft ops), its weights as
ONNX external data in DIR/model.onnx.data, and DIR/manifest.json (llmir version, target, the
input/output signature with symbolic dims, sha256 of the source and of every file). The artifact
loads in plain onnxruntime; building the same input twice gives byte-identical files. The module
is verified first; the folder appears only when the build succeeds.

Targets: {", ".join(TARGETS)}.

Examples:

  llmir build model.llmir --target onnxruntime -o model-ort/

  llmir build model.llmir -o model-ort/ --format json | jq .files
"""


def build_cmd(
    file: Annotated[Path, typer.Argument(help="The .llmir module to build.", show_default=False)],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Artifact folder to write.", show_default=False)
    ],
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            "-t",
            help="Runtime to build for [default: [build] target of ./llmir.toml, else onnxruntime].",
            show_default=False,
        ),
    ] = None,
    quant: Annotated[
        str | None,
        typer.Option(
            "--quant",
            help="Decoders: quantize float weights to int4 or int8 (MatMulNBits, blockwise).",
        ),
    ] = None,
    quant_block: Annotated[
        int, typer.Option("--quant-block", help="Decoders: block size for --quant.")
    ] = 32,
    max_len: Annotated[
        int | None,
        typer.Option(
            "--max-len",
            help="Decoders: KV-cache positions to preallocate (default: the model's context).",
        ),
    ] = None,
    accuracy_level: Annotated[
        int | None,
        typer.Option(
            "--accuracy-level",
            help="Decoders: MatMulNBits activation precision 0-4 (4 = int8, fastest; 1 = fp32).",
        ),
    ] = None,
    generic: Annotated[
        bool,
        typer.Option(
            "--generic",
            help="Build a decoder with the generic op-by-op lowering (no KV-cache buffers).",
        ),
    ] = False,
    dtype: WeightDTypeOpt = None,
    fmt: FormatOpt = OutputFormat.human,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    ctx = make_ctx(fmt, quiet, verbose, debug)
    with handle_errors(ctx):
        if target is None:
            from llmir_core.registry.lockfile import project_here

            project = project_here()
            target = project.target if project else "onnxruntime"
        module = parse_file(str(file))
        errors = [d for d in verify(module) if d.severity == "error"]
        if errors:
            raise CheckFailed(
                f"{file}: does not verify ({len(errors)} error(s))",
                diagnostics=errors,
                hint=f"run `llmir verify {file}` for details",
                exit_code=EXIT_CHECK_FAILED,
            )
        t0 = time.perf_counter()
        from llmir_core.passes.ort_common import is_decoder

        given = {
            k: v
            for k, v in (
                ("quant", quant),
                ("max_len", max_len),
                ("accuracy_level", accuracy_level),
                ("dtype", dtype),
            )
            if v is not None
        }
        if given and (target != "onnxruntime" or generic or not is_decoder(module)):
            raise InputError(
                "--quant, --max-len, --accuracy-level and --dtype apply to decoder builds only",
                hint="import an LLM (HF folder or GGUF) to get a decoder module",
            )
        if quant:
            given["quant_block"] = quant_block
        if generic:
            given["generic"] = True
        manifest = build(module, str(output), target, source_path=str(file), options=given or None)
        dt = time.perf_counter() - t0
        if ctx.json:
            ctx.emit_json(
                "build", {"ok": True, "output": str(output), "seconds": round(dt, 3), **manifest}
            )
        elif not quiet:
            size = sum(f["bytes"] for f in manifest["files"].values())
            ctx.result(
                f"{output}: {target} artifact, {len(manifest['files'])} files, "
                f"{size / 1e6:.1f} MB ({dt:.2f} s)"
            )
            for name, info in manifest["files"].items():
                ctx.detail(f"  {name}  {info['bytes']} bytes  sha256 {info['sha256']}")


def register(app: typer.Typer) -> None:
    app.command("build", help=HELP)(build_cmd)
