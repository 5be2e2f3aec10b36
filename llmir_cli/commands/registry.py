"""`llmir registry list|show|search|mirror`: browse the model index, or mirror it for air-gapped use."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from llmir_core.registry import Entry, load_index, write_mirror
from llmir_core.registry.pull import human_size

from .._render import Ctx
from ._command import command

if TYPE_CHECKING:
    from rich.progress import Progress

RegistryOpt = Annotated[
    str | None,
    typer.Option(
        "--registry",
        envvar="LLMIR_REGISTRY",
        metavar="PATH_OR_URL",
        help="Model index to use: an index file, a mirror folder, or an http(s) URL "
        "[default: the index shipped with llmir].",
    ),
]
OfflineOpt = Annotated[
    bool,
    typer.Option(
        "--offline",
        help="Make no network call: use the hub cache, a directory "
        "registry, or a cached copy of a URL registry. "
        "HF_HUB_OFFLINE=1 does the same.",
    ),
]

registry_app = typer.Typer(
    name="registry",
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Browse the model index (name:tag -> hub repository, revision, files and digests).\n\n"
    "\b\nExamples:\n  llmir registry list\n  llmir registry show smollm2:135m\n"
    "  llmir registry search gguf --format json\n"
    "  llmir registry mirror ./mirror smollm2:135m",
)


def register(app: typer.Typer) -> None:
    app.add_typer(registry_app)


class _RichProgress:
    """A download bar per file, drawn on stderr (only on a terminal)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, Any] = {}  # name -> rich TaskID

    def start(self, name: str, total: int | None, initial: int) -> None:
        if name in self.tasks:
            self.progress.update(self.tasks[name], total=total, completed=initial)
        else:
            self.tasks[name] = self.progress.add_task(name, total=total, completed=initial)

    def advance(self, name: str, n: int) -> None:
        self.progress.advance(self.tasks[name], n)

    def finish(self, name: str) -> None:
        pass


@contextmanager
def pull_progress(ctx: Ctx) -> Iterator[_RichProgress | None]:
    """Progress bars when stderr is a terminal and not --quiet; nothing in a pipe."""
    if ctx.quiet or not ctx.err.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=ctx.err,
        transient=True,
    ) as progress:
        yield _RichProgress(progress)


def _params(n: int) -> str:
    """A parameter count for a table: 1.24B, 135M, 123K, 950."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.0f}M"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


_COLUMNS = ("NAME", "FORMAT", "QUANT", "PARAMS", "LICENSE", "PINNED", "SOURCE")


def _rows(entries: list[Entry]) -> list[tuple[str, ...]]:
    return [
        (
            e.name,
            e.format,
            e.quantization,
            _params(e.parameters),
            e.license,
            "yes" if e.pinned else "no",
            f"hf:{e.repo}@{e.revision[:12]}",
        )
        for e in entries
    ]


def _emit_entries(ctx: Ctx, kind: str, entries: list[Entry], origin: str, **extra: object) -> None:
    if ctx.json:
        ctx.emit_json(
            kind,
            {"ok": True, "registry": origin, **extra, "models": [e.to_json() for e in entries]},
        )
        return
    if not entries:
        return
    rows = _rows(entries)
    if ctx.out.is_terminal:
        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for column in _COLUMNS:
            table.add_column(column, no_wrap=True)
        for row in rows:
            table.add_row(*row)
        ctx.out.print(table)
        return
    # A pipe gets plain aligned columns: nothing truncated, easy to cut/awk.
    widths = [max(len(r[i]) for r in [_COLUMNS, *rows]) for i in range(len(_COLUMNS))]
    ctx.result(
        "\n".join(
            "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip()
            for r in [_COLUMNS, *rows]
        )
    )


@registry_app.command("list")
@command
def list_models(
    ctx: Ctx,
    registry: RegistryOpt = None,
    offline: OfflineOpt = False,
) -> None:
    """List every model of the index.

    \b
    Examples:
      llmir registry list
      llmir registry list --format json
      llmir registry list --registry ./mirror
    """
    index = load_index(registry, offline=offline)
    ctx.detail(f"{len(index.entries)} models in the {index.describe()}")
    _emit_entries(ctx, "registry.list", list(index.entries.values()), index.origin)


@registry_app.command("search")
@command
def search_models(
    ctx: Ctx,
    word: Annotated[
        str,
        typer.Argument(help="Text to look for in names, descriptions, repos, formats, licenses."),
    ],
    registry: RegistryOpt = None,
    offline: OfflineOpt = False,
) -> None:
    """List the models whose name, description, repository, format or license contains WORD.

    \b
    Examples:
      llmir registry search smollm2
      llmir registry search q8_0 --format json
    """
    index = load_index(registry, offline=offline)
    found = index.search(word)
    if not found:
        ctx.log(f"no model matches {word!r}; `llmir registry list` shows all {len(index.entries)}")
    _emit_entries(ctx, "registry.search", found, index.origin, query=word)


@registry_app.command("show")
@command
def show_model(
    ctx: Ctx,
    name: Annotated[str, typer.Argument(metavar="NAME:TAG", help="A model of the index.")],
    registry: RegistryOpt = None,
    offline: OfflineOpt = False,
) -> None:
    """Show one model: its source, format, license and the files with their digests.

    \b
    Examples:
      llmir registry show smollm2:135m
      llmir registry show qwen2.5:0.5b-q4_0 --format json
    """
    index = load_index(registry, offline=offline)
    key = name.lower() if ":" in name else f"{name.lower()}:latest"
    entry = index.get(key)
    if ctx.json:
        ctx.emit_json(
            "registry.show", {"ok": True, "registry": index.origin, "model": entry.to_json()}
        )
        return
    lines = [
        f"{entry.name}: {entry.description}",
        f"  source        hf:{entry.repo}@{entry.revision}",
        f"  format        {entry.format} ({entry.quantization})",
        f"  parameters    {entry.parameters:,} ({_params(entry.parameters)})",
        f"  license       {entry.license}",
    ]
    lines += [
        f"  file          {f.path}  {human_size(f.size)}  "
        f"{'sha256:' + f.sha256 if f.sha256 else 'not pinned (pinned on first pull)'}"
        for f in entry.files
    ]
    lines += [f"  include       {pattern}" for pattern in entry.include]
    if entry.notes:
        lines.append(f"  notes         {entry.notes}")
    ctx.result("\n".join(lines))


@registry_app.command("mirror")
@command
def mirror_models(
    ctx: Ctx,
    directory: Annotated[Path, typer.Argument(help="Mirror folder (created if missing).")],
    names: Annotated[list[str], typer.Argument(metavar="NAME:TAG...", help="Models to add.")],
    registry: RegistryOpt = None,
    offline: OfflineOpt = False,
) -> None:
    """Pull models and write them, pinned, into a folder usable as an offline registry.

    The folder gets index.json and blobs/<sha256>; copy it to an air-gapped machine and use
    `--registry FOLDER --offline` there.

    \b
    Examples:
      llmir registry mirror ./mirror smollm2:135m qwen2.5:0.5b-q4_0
      llmir init demo --model smollm2:135m --registry ./mirror --offline
    """
    with pull_progress(ctx) as progress:
        result = write_mirror(
            directory,
            names,
            registry=registry,
            offline=offline,
            progress=progress,
            reporter=ctx,
        )
    if ctx.json:
        ctx.emit_json("registry.mirror", {"ok": True, **result.to_json()})
    else:
        ctx.result(
            f"mirrored {', '.join(result.added)} into {directory} "
            f"({result.blobs_written} new blobs, {human_size(result.bytes_written)})"
        )
