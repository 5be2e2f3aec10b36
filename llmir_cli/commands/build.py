"""`llmir build IN.llmir --target onnxruntime -o DIR`: compile a module into a runnable artifact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from llmir_core.errors import EXIT_CHECK_FAILED, CheckFailed, InputError
from llmir_core.targets import TARGETS

from .._options import OptLevelOpt
from .._render import Ctx
from ._command import ListOptionsFlag, LoweringFlags, command

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

  llmir build model.llmir --target triton --target-opt arch=sm_80 -o model-triton/

  llmir build --target triton --list-options

Each target declares its build options (`--target-opt KEY=VALUE`, repeatable; `--list-options`
lists them, docs/targets.md too); --quant, --max-len, --dtype and the other decoder flags are
aliases of the onnxruntime options of the same name. The manifest records every option with the
value the build used (`target_options`).

A decoder artifact's report names how its session treats the weights (`prepack`: repacked by
onnxruntime when the artifact opens, or memory-mapped as stored); see docs/load.md.
"""


@command(lowering=True)
def build_cmd(
    ctx: Ctx,
    file: Annotated[
        Path | None, typer.Argument(help="The .llmir module to build.", show_default=False)
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Artifact folder to write.", show_default=False),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            "-t",
            help="Runtime to build for [default: [build] target of ./llmir.toml, else onnxruntime].",
            show_default=False,
        ),
    ] = None,
    list_options: ListOptionsFlag = False,
    opt_level: OptLevelOpt = None,
    *,
    lowering: LoweringFlags,
) -> None:
    project = None
    if target is None or opt_level is None:
        from llmir_core.registry.lockfile import project_here

        project = project_here()
    if target is None:
        target = project.target if project else "onnxruntime"
    if list_options:
        from ._target_options import list_options as print_options

        print_options(ctx, target)
        return
    if file is None or output is None:
        raise InputError(
            "missing " + ("input file" if file is None else "--output"),
            hint="llmir build IN.llmir -o DIR (or --target T --list-options)",
        )
    project_level = project.opt_level if project is not None else None
    _build(ctx, file, output, target, lowering, opt_level, project_level)


def _build(
    ctx: Ctx,
    file: Path,
    output: Path,
    target: str,
    lowering: LoweringFlags,
    opt_level: int | None,
    project_level: int | None,
) -> None:
    """Verify, lower (-O opt_level, else the project's for an unlowered module) and build."""
    from llmir_core.fileio import writing_output
    from llmir_core.ir.parser import parse_file
    from llmir_core.targets import build
    from llmir_core.verifier import verify

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
    options = lowering.options(module, target)
    if opt_level is None and "target" not in module.attrs:
        opt_level = project_level  # a lowered module keeps the pipeline it was lowered by
    with writing_output(output, "artifact"):
        manifest = build(
            module,
            str(output),
            target,
            source_path=str(file),
            options=options or None,
            opt_level=opt_level,
        )
    _report(ctx, output, target, manifest, time.perf_counter() - t0)


def _report(ctx: Ctx, output: Path, target: str, manifest: dict[str, Any], dt: float) -> None:
    if ctx.json:
        ctx.emit_json(
            "build", {"ok": True, "output": str(output), "seconds": round(dt, 3), **manifest}
        )
        return
    if ctx.quiet:
        return
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
