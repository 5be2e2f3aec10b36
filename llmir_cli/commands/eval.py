"""`llmir eval TARGET --text FILE [--against REF]`: perplexity, and KL divergence to a reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from llmir_core.errors import InputError

from .._render import Ctx
from ._command import command

HELP = """Measure a model on a text: perplexity, and with --against how far its token
distributions are from a reference model's (the quantization-quality report).

The text is tokenized once with TARGET's tokenizer and scored in sliding windows of --ctx
tokens (the model's BOS first, when its tokenizer adds one) advancing by --stride (default
ctx/2); every window scores only the tokens no earlier window scored, so each token is scored
once (docs/eval.md gives the exact scheme). With --against REF, REF scores the same windows and
the report adds its perplexity, the mean and 99th percentile of KL(P_ref || P_target) per token,
top-1 agreement (both models' most likely token equal) and the mean log-prob difference.

TARGET and REF: an artifact folder built with `llmir build --logits all` (onnxruntime), or a
.llmir decoder module (the numpy reference interpreter; --backend onnxruntime builds it into a
temporary folder instead). REF may also be a .gguf file (run by llama.cpp; needs the package
llama-cpp-python) or a Hugging Face model folder (run by transformers on torch, float32). Both
must share one vocabulary.

A progress bar over the windows goes to stderr (on a terminal); the table, or JSON with
--format json, to stdout. Exit 0 ok, 2 usage or input error, 130 interrupted.

Examples:

  llmir eval tiny.build --text tests/data/northanger_abbey.txt --max-tokens 4096

  llmir eval int4.build --text book.txt --against f32.build --ctx 512 --format json

  llmir eval model.gguf.llmir --backend onnxruntime --text book.txt --against model.gguf
"""


@contextmanager
def _progress(ctx: Ctx) -> Iterator[Callable[[int, int], None] | None]:
    """A bar over the windows on stderr, when it is a terminal and not --quiet."""
    if ctx.quiet or not ctx.err.is_terminal:
        yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("windows"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=ctx.err,
        transient=True,
    ) as bar:
        task = bar.add_task("windows", total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _read_tokens(ctx: Ctx, path: Path, tokenizer: Any, max_tokens: int | None) -> list[int]:
    from llmir_core.fileio import read_text

    if not path.exists():
        raise InputError(f"{path}: no such file", hint="pass the text to score with --text FILE")
    text = read_text(path)
    if not text.strip():
        raise InputError(f"{path}: the text is empty", hint="pass a file with some prose in it")
    if tokenizer is None:
        raise InputError(
            "the target has no tokenizer, so it cannot read a text",
            hint="import the model with its tokenizer and build it again",
        )
    ids = tokenizer.encode(text, add_special_tokens=False)
    if max_tokens is not None:
        if max_tokens < 2:
            raise InputError(f"--max-tokens must be at least 2, got {max_tokens}")
        ids = ids[:max_tokens]
    ctx.detail(f"{path}: {len(text)} characters, {len(ids)} tokens")
    return list(ids)


def _table(ctx: Ctx, data: dict[str, Any]) -> None:
    from rich.table import Table

    tgt, ref, cmp = data["target"], data["reference"], data["comparison"]
    title = (
        f"{data['scored_tokens']} tokens scored in {data['windows']} windows "
        f"(ctx {data['ctx']}, stride {data['stride']}, "
        f"{'BOS first' if data['bos_id'] is not None else 'no BOS'}), {data['seconds']:.1f} s"
    )
    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("target", f"{tgt['path']} ({tgt['runtime']})")
    t.add_row("perplexity", f"{tgt['perplexity']:.4f}")
    t.add_row("mean NLL (nats)", f"{tgt['nll_mean']:.5f} ± {tgt['nll_stderr']:.5f}")
    if ref is not None and cmp is not None:
        t.add_row("reference", f"{ref['path']} ({ref['runtime']})")
        t.add_row("reference perplexity", f"{ref['perplexity']:.4f}")
        t.add_row("perplexity difference", f"{cmp['perplexity_diff']:+.4g}")
        t.add_row("perplexity ratio", f"{cmp['perplexity_ratio']:.5f}")
        t.add_row("mean KL divergence", f"{cmp['kl_mean']:.4g} ± {cmp['kl_stderr']:.2g}")
        t.add_row("99th percentile KL", f"{cmp['kl_p99']:.4g}")
        t.add_row("max KL", f"{cmp['kl_max']:.4g}")
        t.add_row("top-1 agreement", f"{100 * cmp['top1_agreement']:.2f} %")
        t.add_row("mean log-prob difference", f"{cmp['logprob_diff_mean']:+.4g}")
    ctx.out.print(t)


@command
def eval_cmd(
    ctx: Ctx,
    target: Annotated[
        Path,
        typer.Argument(
            help="Artifact folder (built with --logits all) or .llmir file.", show_default=False
        ),
    ],
    text: Annotated[
        Path,
        typer.Option("--text", "-t", help="The text file to score (UTF-8).", show_default=False),
    ],
    against: Annotated[
        Path | None,
        typer.Option(
            "--against",
            help="Reference: an artifact, .llmir, .gguf (llama.cpp) or Hugging Face folder.",
            show_default=False,
        ),
    ] = None,
    ctx_len: Annotated[
        int | None,
        typer.Option(
            "--ctx",
            help="Tokens per window, the BOS included (default 512, capped at the model's context).",
            show_default=False,
        ),
    ] = None,
    stride: Annotated[
        int | None,
        typer.Option(
            "--stride",
            help="Tokens each window advances, 1 to ctx - 1 (default ctx/2).",
            show_default=False,
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            help="Score only the first N tokens of the text (default: all).",
            show_default=False,
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            "-b",
            help=".llmir files: reference (the default) or onnxruntime (built in a temp folder).",
            show_default=False,
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="Intra-op threads.", show_default=False)
    ] = None,
) -> None:
    from llmir_core.runtime.evaluate import plan_windows, resolve_ctx

    if ctx_len is not None:  # fail on bad settings before loading anything
        plan_windows(2, resolve_ctx(ctx_len, None), stride, False)
    llmir_backend = backend if str(target).lower().endswith(".llmir") else None
    if backend is not None and llmir_backend is None:
        raise InputError(
            "--backend applies to a .llmir TARGET only",
            hint="an artifact runs on the runtime it was built for",
        )
    ref_backend = backend if str(against).lower().endswith(".llmir") else None
    windows = (ctx_len, stride, max_tokens)
    _evaluate(ctx, target, text, against, (llmir_backend, ref_backend), threads, windows)


def _evaluate(
    ctx: Ctx,
    target: Path,
    text: Path,
    against: Path | None,
    backends: tuple[str | None, str | None],
    threads: int | None,
    windows: tuple[int | None, int | None, int | None],
) -> None:
    """Score the text on target (and against the reference); windows: --ctx, --stride and
    --max-tokens."""
    from llmir_core.runtime.evaluate import evaluate
    from llmir_core.runtime.scoring import open_model

    ctx_len, stride, max_tokens = windows
    model = open_model(str(target), threads=threads, backend=backends[0])
    ids = _read_tokens(ctx, text, model.tokenizer, max_tokens)
    ref = None
    if against is not None:
        ref = open_model(str(against), threads=threads, backend=backends[1])
    with _progress(ctx) as on_window:
        report = evaluate(
            model, ids, ctx=ctx_len, stride=stride, reference=ref, on_window=on_window
        )
    data = {"ok": True, "text": str(text), **report.to_json()}
    if ctx.json:
        ctx.emit_json("eval", data)
        return
    _table(ctx, data)


def register(app: typer.Typer) -> None:
    app.command("eval", help=HELP)(eval_cmd)
