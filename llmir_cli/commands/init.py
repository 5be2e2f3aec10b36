"""`llmir init`: create a project folder for a model, pulled, verified and pinned."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmir_core.registry import InitResult, init_project
from llmir_core.registry.pull import human_size

from .._render import Ctx
from ._command import command
from .registry import OfflineOpt, RegistryOpt, pull_progress


def register(app: typer.Typer) -> None:
    app.command("init")(init)


@command
def init(
    ctx: Ctx,
    directory: Annotated[Path, typer.Argument(help="Project folder, created if missing.")] = Path(
        "."
    ),
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            metavar="REF",
            help="NAME:TAG from the index, hf:ORG/REPO[/FILE][@REV], or a local PATH "
            "[default: the model in llmir.toml / llmir.lock].",
        ),
    ] = None,
    registry: RegistryOpt = None,
    offline: OfflineOpt = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Initialise a non-empty folder; replaces llmir.toml and llmir.lock "
            "(re-pins the model) and keeps other files.",
        ),
    ] = False,
    target: Annotated[
        str | None,
        typer.Option(
            "--target", help="Build target recorded in llmir.toml [default: onnxruntime]."
        ),
    ] = None,
    opt_level: Annotated[
        int | None,
        typer.Option(
            "--opt-level",
            "-O",
            min=0,
            max=3,
            help="Optimization level recorded in llmir.toml [default: 2].",
        ),
    ] = None,
) -> None:
    """Create a project: pull the model, check every file's sha256, write llmir.toml and llmir.lock.

    Files go to the Hugging Face cache (HF_HOME); a directory registry serves them with no
    network. With an llmir.lock in DIR, init reproduces exactly the locked files or fails.

    \b
    Examples:
      llmir init demo --model smollm2:135m
      llmir init demo --model hf:HuggingFaceTB/SmolLM2-135M-Instruct@main
      llmir init demo --model ./my-model --target onnxruntime -O 3
      llmir init demo --model smollm2:135m --registry ./mirror --offline
      cd demo && llmir init          # reproduce llmir.lock (e.g. on a CI machine)
    """
    with pull_progress(ctx) as progress:
        result = init_project(
            directory,
            model=model,
            registry=registry,
            offline=offline,
            force=force,
            target=target,
            opt_level=opt_level,
            progress=progress,
            reporter=ctx,
        )
    _render(ctx, result)


def _render(ctx: Ctx, result: InitResult) -> None:
    if ctx.json:
        ctx.emit_json("init", {"ok": True, **result.to_json()})
        return
    pulled, lock = result.pulled, result.pulled.lock
    total = sum(f.size for f in pulled.files)
    first = sum(1 for f in pulled.files if f.pinned_by == "first pull")
    verdict = f"{first} pinned on this first pull" if first else "all matched their pins"
    source = (
        f"{lock.repo}@{lock.commit or lock.revision}" if lock.kind != "path" else str(lock.path)
    )
    head = (
        f"reproduced llmir.lock in {result.project}"
        if result.reproduced
        else f"initialised {result.project} for {pulled.ref}"
    )
    lines = [
        head,
        f"  source   {source}",
        f"  files    {len(pulled.files)} files, {human_size(total)}, sha256-checked, {verdict}",
        f"  model    {pulled.local_path}",
    ]
    if result.wrote:
        lines.append(f"  wrote    {', '.join(p.name for p in result.wrote)}")
    ctx.result("\n".join(lines))
