"""`llmir serve ARTIFACT`: an OpenAI-compatible HTTP server with continuous batching, and the Playground."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from llmir_core.errors import InputError

from .._options import ChatTemplateOpt, TemplateTimeoutOpt
from .._render import Ctx
from ._command import command
from ._serve_ray import AddressOpt, AutoscaleOpt, RayOpt, ReplicasOpt, serve_ray, wanted

HELP = """Serve a decoder artifact over HTTP with OpenAI's API, and the Playground at /.

Endpoints: GET /v1/models, POST /v1/completions (logprobs and echo score text, as
lm-evaluation-harness's local-completions model asks; build with --logits all to score prompts
in one forward each), POST /v1/chat/completions (the model's chat template, or the one
--chat-template names: a built-in chatml, gemma or llama3, or a Jinja file; stream: true gives
server-sent events ending with usage), POST /tokenize and /detokenize, GET /tokenizer_info,
GET /health, GET /metrics (Prometheus). Requests decode together: up to --max-batch sequences
share one forward per token (continuous batching), prompts prefill in chunks of --prefill-chunk
tokens between decode steps, and up to --max-queue more wait (then HTTP 429 with Retry-After).
A client that disconnects frees its slot. Without --max-context each slot holds the model's
context, capped so the KV buffers of all slots fit in half of MemAvailable less the weights;
the start-up lines say what was chosen and why, and the KV bytes reserved (/metrics also gives
the bytes touched). SIGTERM or Ctrl-C finishes the requests in flight, refuses new ones, and
exits 0 (130 after Ctrl-C).

Binds 127.0.0.1 unless --host says otherwise. With --api-key (or LLMIR_API_KEY) /v1/*, /api/*
and the tokenizer endpoints need `Authorization: Bearer KEY`.

Hostile input is bounded: bodies over 1 MiB are 413; a prompt longer in bytes than the context
could hold is 400 before it is tokenized; parsing, chat templates and tokenizing run on worker
threads and count against --max-queue; a chat template is stopped past its work limit or
--template-timeout seconds (LLMIR_TEMPLATE_TIMEOUT, default 2) with a 400. At start every file
of the artifact is hashed against manifest.json (a changed byte refuses to serve, exit 1).

The Playground (http://HOST:PORT/) chats with the model and shows the artifact's IR (--ir, or
the .llmir the manifest names when found), --lowered IR, the --report of `llmir optimize`,
per-pass diffs from a --dump-dir of `optimize --print-after-all` (else llmir-dumps/ beside the
artifact when its last dump is the source), and --bench JSON (else bench.json beside it) as charts.

Examples:

  llmir serve tiny.build

  llmir serve tiny.build --port 8080 --max-batch 16 --api-key secret

  llmir serve gemma.build --chat-template gemma

  llmir serve tiny.build --ir tiny.llmir --report report.txt --dump-dir dumps --bench bench.json

  curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "tiny.build", "prompt": "Hello", "max_tokens": 16, "temperature": 0}'
"""


@command(formats=False)
def serve_cmd(
    ctx: Ctx,
    artifact: Annotated[
        Path, typer.Argument(help="Decoder artifact folder (llmir build).", show_default=False)
    ],
    host: Annotated[str, typer.Option("--host", help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port (0 = any free one).")] = 8000,
    max_batch: Annotated[
        int, typer.Option("--max-batch", help="Sequences decoded together (KV slots).")
    ] = 8,
    max_queue: Annotated[
        int, typer.Option("--max-queue", help="Requests waiting for a slot before 429.")
    ] = 64,
    prefill_chunk: Annotated[
        int, typer.Option("--prefill-chunk", help="Prompt tokens prefilled per step.")
    ] = 32,
    max_context: Annotated[
        int | None,
        typer.Option(
            "--max-context",
            help="KV rows per sequence (default: the artifact's max_len, capped to what fits "
            "in half the available memory; said at start).",
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="onnxruntime intra-op threads.")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="LLMIR_API_KEY",
            help="Require this bearer key on /v1 and /api.",
            show_default=False,
        ),
    ] = None,
    model_name: Annotated[
        str | None,
        typer.Option("--model-name", help="Model id clients send (default: the folder name)."),
    ] = None,
    ir: Annotated[Path | None, typer.Option("--ir", help="Playground: the source .llmir.")] = None,
    lowered: Annotated[
        Path | None, typer.Option("--lowered", help="Playground: a lowered/optimized .llmir.")
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="Playground: `llmir optimize --report` output.")
    ] = None,
    dump_dir: Annotated[
        Path | None,
        typer.Option("--dump-dir", help="Playground: `optimize --print-after-all` dumps."),
    ] = None,
    bench: Annotated[
        Path | None, typer.Option("--bench", help="Playground: `llmir bench --format json` output.")
    ] = None,
    template_timeout: TemplateTimeoutOpt = None,
    chat_template: ChatTemplateOpt = None,
    ray: RayOpt = False,
    replicas: ReplicasOpt = None,
    autoscale: AutoscaleOpt = None,
    address: AddressOpt = None,
) -> None:
    # long: typer reads the command's options from this signature; the body is in helpers
    if not artifact.is_dir():
        raise InputError(
            f"{artifact}: no such artifact folder",
            hint="build one with `llmir build MODEL.llmir -o DIR`",
        )
    if not 0 <= port <= 65535:
        raise InputError(f"--port must be in 0..65535, got {port}")
    if api_key is not None and not api_key:
        raise InputError("--api-key is empty", hint="pass a non-empty key or leave it out")
    pages = {"ir": ir, "lowered": lowered, "report": report, "dump_dir": dump_dir, "bench": bench}
    if wanted(ray, replicas, autoscale, address):  # Ray Serve: _serve_ray, docs/cluster.md
        opts: dict[str, Any] = {
            "max_batch": max_batch,
            "max_queue": max_queue,
            "chunk": prefill_chunk,
        }
        opts |= {"threads": threads, "max_context": max_context, "name": model_name}
        opts["template_timeout_s"] = template_timeout
        if chat_template is not None:  # checked here; a file by its absolute path (replicas)
            from llmir_core.runtime.chat_templates import builtin_names, load_chat_template

            load_chat_template(chat_template, template_timeout)
            named = chat_template in builtin_names()
            opts["chat_template"] = chat_template if named else os.path.abspath(chat_template)
        serve_ray(ctx, artifact, (replicas, autoscale, address), (host, port), opts, api_key, pages)
        return
    from llmir_core.serve.model import open_served_model

    model = open_served_model(
        str(artifact),
        max_batch=max_batch,
        max_queue=max_queue,
        chunk=prefill_chunk,
        threads=threads,
        max_context=max_context,
        name=model_name,
        template_timeout_s=template_timeout,
        chat_template=chat_template,
    )
    _serve(ctx, artifact, model, pages, (host, port), api_key, (max_batch, max_queue))


def _serve(
    ctx: Ctx,
    artifact: Path,
    model: Any,
    pages: dict[str, Path | None],
    address: tuple[str, int],
    api_key: str | None,
    slots: tuple[int, int],
) -> None:
    """Bind (host, port), serve until a signal, drain; exit 130 on Ctrl-C. pages: the
    playground's files; slots: (--max-batch, --max-queue), for the log line."""
    from llmir_core.serve.playground import collect
    from llmir_core.serve.server import bind, serve

    extra = collect(str(artifact), model.manifest, **{k: _s(v) for k, v in pages.items()})
    sock = bind(*address)
    addr = sock.getsockname()
    kv = model.kv_line()
    ctx.log(
        f"serving {model.name} on http://{_url_host(addr[0])}:{addr[1]}/ ({slots[0]} slots of "
        f"{model.max_context} tokens{', ' + kv if kv else ''}, queue {slots[1]}"
        f"{', API key required' if api_key else ''}; Ctrl-C stops)"
    )
    if model.context_note:
        ctx.log(model.context_note)
    sig = serve(
        model,
        sock,
        api_key=api_key,
        playground=extra,
        log_level="info" if ctx.verbose else "warning",
    )
    kv = model.kv_line()
    ctx.log(f"stopped: every admitted request finished{' (' + kv + ')' if kv else ''}")
    if sig == signal.SIGINT:
        raise typer.Exit(130)


def _s(p: Path | None) -> str | None:
    return os.fspath(p) if p is not None else None


def _url_host(h: str) -> str:
    return f"[{h}]" if ":" in h else h


def register(app: typer.Typer) -> None:
    app.command("serve", help=HELP)(serve_cmd)
