"""`llmir import SRC -o OUT.llmir`: an ONNX model, a Hugging Face folder or a GGUF file to .llmir."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from llmir_core.errors import InputError
from llmir_core.frontends import detect_kind, import_model

from .._render import Ctx
from ._command import command

HELP = """Import a model into a readable .llmir file.

SRC is an .onnx file (ONNX opsets 13 and newer; older ones are converted with
onnx.version_converter; plus the com.microsoft ops LLM exports use), a
Hugging Face model folder (with config.json), a .gguf file, or a model reference resolved as
`llmir init` does: a registry NAME:TAG (`smollm2:135m`) or `hf:ORG/REPO[@REV]` (pulled into the
Hugging Face cache and sha256-checked; inside an `llmir init` project the locked files are used). Weights are not copied into the
text: they stay where they are and the .llmir references them by file and offset (tensors stored
inside an .onnx protobuf are written once to OUT.weights.bin beside OUT.llmir). Nothing is
written when the import fails.

Examples:

  llmir import model.onnx -o model.llmir

  llmir import model.onnx -o model.llmir --keep-unknown   # keep unmapped ops as onnx.opaque

  llmir import ./SmolLM2-135M -o smol.llmir

  llmir import smollm2:135m -o smol.llmir --offline       # from the HF cache or a mirror
"""


_MODEL_SUFFIXES = (".onnx", ".gguf", ".llmir", ".json", ".safetensors", ".bin")
_FORMAT_NAMES = {"onnx": "onnx", "hf": "huggingface", "gguf": "gguf"}
_FORMAT_TEXT = {"onnx": "ONNX model", "hf": "Hugging Face folder", "gguf": "GGUF file"}


def _looks_like_ref(src: str) -> bool:
    """A registry NAME:TAG (or a bare NAME, resolved as NAME:latest like `llmir init` does) or an
    hf:ORG/REPO reference rather than a local path."""
    if os.path.exists(src):
        return False
    if src.startswith("hf:") or (":" in src and "/" not in src.split(":", 1)[0]):
        return True
    bare = not any(c in src for c in "/\\") and not src.lower().endswith(_MODEL_SUFFIXES)
    return bare and src[:1].isalnum()


@command
def import_cmd(
    ctx: Ctx,
    src: Annotated[
        str,
        typer.Argument(
            help="Model to import: .onnx, .gguf, a HF folder, NAME:TAG or hf:ORG/REPO.",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The .llmir file to write.", show_default=False)
    ],
    keep_unknown: Annotated[
        bool,
        typer.Option(
            "--keep-unknown",
            help="Keep ops llmir does not know as opaque onnx.opaque ops (only the onnxruntime backend can build them).",
        ),
    ] = False,
    no_tokenizer: Annotated[
        bool,
        typer.Option(
            "--no-tokenizer",
            help="Import an LLM without its tokenizer (the build then takes token ids only).",
        ),
    ] = False,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            envvar="LLMIR_REGISTRY",
            help="Registry index (path, URL or mirror folder) for NAME:TAG references.",
        ),
    ] = None,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline", help="Resolve NAME:TAG / hf: references without any network call."
        ),
    ] = False,
) -> None:
    if output.exists() and output.is_dir():
        raise InputError(f"{output}: is a folder, expected a .llmir file path")
    if _looks_like_ref(src):
        from llmir_core.registry import resolve_model_ref

        ctx.log(f"resolving {src}")
        src = str(resolve_model_ref(src, registry=registry, offline=offline))
    kind = detect_kind(src)
    ctx.detail(f"importing {src} ({kind})")
    t0 = time.perf_counter()
    module = import_model(
        src, keep_unknown=keep_unknown, out_path=output, require_tokenizer=not no_tokenizer
    )
    _report(ctx, module, src, kind, output, time.perf_counter() - t0)


def _report(ctx: Ctx, module: Any, src: str, kind: str, output: Path, dt: float) -> None:
    converted = module.attrs.get("onnx.converted_from_opset")
    if converted is not None:
        ctx.log(
            f"note: {src}: ONNX opset {converted} converted to opset {module.attrs.get('onnx.opset')} "
            "with onnx.version_converter"
        )
    weights = sum(1 for f in module.functions for op in f.ops if op.name == "core.weight")
    opaque = sum(1 for f in module.functions for op in f.ops if op.name == "onnx.opaque")
    if ctx.json:
        ctx.emit_json(
            "import",
            {
                "ok": True,
                "source": str(src),
                "source_format": _FORMAT_NAMES[kind],
                "output": str(output),
                "ops": module.op_count(),
                "weights": weights,
                "opaque_ops": opaque,
                "converted_from_opset": converted,
                "seconds": round(dt, 3),
            },
        )
    elif not ctx.quiet:
        extra = f", {opaque} opaque" if opaque else ""
        ctx.result(
            f"{output}: {module.op_count()} ops, {weights} weights{extra} "
            f"(from {_FORMAT_TEXT[kind]} {src}, {dt:.2f} s)"
        )


def register(app: typer.Typer) -> None:
    app.command("import", help=HELP)(import_cmd)
