"""`llmir build IN.llmir --target onnxruntime -o DIR`: compile a module into a runnable artifact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import EXIT_CHECK_FAILED, CheckFailed
from llmir_core.fileio import writing_output
from llmir_core.ir.parser import parse_file
from llmir_core.targets import TARGETS, build, build_options
from llmir_core.verifier import verify

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

PREPACK_NOTE = {
    "session": "onnxruntime repacks the matmul weights when the artifact opens",
    "none": "onnxruntime's repacking is off: weights stay memory-mapped as stored",
}

HELP = f"""Build a .llmir module into an artifact folder for a runtime.

An unlowered module is optimized (-O, default 2) and lowered for the target first, exactly as
`llmir optimize -O2 --target NAME` does: building its output gives a byte-identical artifact. A
lowered module (the output of `llmir optimize --target`) is only serialized. The lowered module
is written into the artifact (model.lowered.llmir) and the manifest names the passes that ran
(`pipeline`).

--target onnxruntime writes DIR/model.onnx (ONNX opset 23 plus com.microsoft ops), its weights as
ONNX external data in DIR/model.onnx.data, and DIR/manifest.json (llmir version, target, the
input/output signature with symbolic dims, sha256 of the source and of every file). The artifact
loads in plain onnxruntime; building the same input twice gives byte-identical files. The module
is verified first; the folder appears only when the build succeeds.

Targets: {", ".join(TARGETS)}.

Examples:

  llmir build model.llmir --target onnxruntime -o model-ort/

  llmir build model.llmir -o model-ort/ --format json | jq .files

  llmir build model.llmir -o model-q4/ --quant int4 --max-len 4096

  llmir build model.llmir -o model-mlas/ --f32-matmul mlas  # f32 on onnxruntime's MLAS

A decoder artifact's report names how its session treats the weights (`prepack`: repacked by
onnxruntime when the artifact opens, or memory-mapped as stored); see docs/load.md.
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
    opt_level: OptLevelOpt = None,
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
    fmt: FormatOpt = OutputFormat.human,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    ctx = make_ctx(fmt, quiet, verbose, debug)
    with handle_errors(ctx):
        project = None
        if target is None or opt_level is None:
            from llmir_core.registry.lockfile import project_here

            project = project_here()
        if target is None:
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
        options = build_options(
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
        if opt_level is None and project is not None and "target" not in module.attrs:
            opt_level = project.opt_level  # a lowered module keeps the pipeline it was lowered by
        with writing_output(output, "artifact"):
            manifest = build(
                module,
                str(output),
                target,
                source_path=str(file),
                options=options or None,
                opt_level=opt_level,
            )
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
            dec = manifest.get("decoder")
            if isinstance(dec, dict) and dec.get("prepack"):
                ctx.result(f"  prepack: {dec['prepack']} ({PREPACK_NOTE[dec['prepack']]})")
            for name, info in manifest["files"].items():
                ctx.detail(f"  {name}  {info['bytes']} bytes  sha256 {info['sha256']}")
            if manifest.get("pipeline"):
                ctx.detail("  pipeline: " + ",".join(manifest["pipeline"]))


def register(app: typer.Typer) -> None:
    app.command("build", help=HELP)(build_cmd)
