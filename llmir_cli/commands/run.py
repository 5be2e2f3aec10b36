"""`llmir run TARGET`: tensors in and out (`--input`), or text generation (`--prompt`, `--chat`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from llmir_core.artifact_check import full_checks
from llmir_core.errors import EXIT_CHECK_FAILED, InputError
from llmir_core.runtime.grammar import grammar_option
from llmir_core.runtime.tensors import parse_input_specs, run_target, summarize, write_outputs
from llmir_core.runtime.textgen import (
    TextGenOptions,
    TextResult,
    chat_loop,
    generate_texts,
    read_prompts_file,
    results_json,
)

from .._options import ChatTemplateOpt, TemplateTimeoutOpt
from .._render import Ctx
from ._command import command

HELP = """Run a model: generate text from a prompt, or run it on input tensors.

With --prompt, --prompts-file or --chat, TARGET is an artifact folder built from an LLM
(`llmir build`): tokens stream to stdout as they are generated, greedy unless --temperature is
set, stopping at an end-of-sequence token, a --stop string, --max-new-tokens or the model's
context (with a warning). --chat applies the model's chat template; on a terminal with no
--prompt it starts an interactive conversation (/exit ends it). --chat-template NAME|FILE
(implies --chat) uses another template: a built-in one (chatml, gemma, llama3) or a Jinja file;
the end-of-turn token it declares also stops generation. --format json gives the text,
token ids and timings.

A chat template renders in a sandbox that stops it past a work limit or --template-timeout
seconds (LLMIR_TEMPLATE_TIMEOUT, default 2): one error line, exit 2. With --format json the
"text" fields carry the exact generated text (JSON-escaped); on a terminal, control characters
are shown escaped (\\x1b).

Before a session opens, the artifact's files are checked against manifest.json: every file's
size always; its sha256 when the file's size, mtime or inode, or the manifest, changed since the
last check that hashed it (recorded in $LLMIR_HOME/artifact-checks.json), or always with
--verify-artifact. So an edit that keeps a file's size, mtime and inode (an in-place write
followed by resetting the mtime) goes unnoticed by `run` until --verify-artifact; `llmir serve`
hashes every file at each start.

--json-schema FILE constrains the generated text to JSON valid for that JSON Schema, --grammar
FILE to a Lark grammar (llguidance's dialect; a .gbnf file is llama.cpp GBNF), by masking every
token the grammar does not allow next; a schema or grammar that cannot be used is one error
line, exit 2. An output that --max-new-tokens (or the context) cuts before the grammar is
complete is not valid for it: a warning says so and run exits 1 (JSON: grammar_complete false).

With --prompt-ids (a model imported with --no-tokenizer has no tokenizer), the prompt is token
ids and the generated token ids are printed.

With --input, the model runs on tensors and writes its outputs as NAME.npy.

TARGET is an artifact folder from `llmir build` (run on onnxruntime) or a .llmir file (run on the
numpy reference interpreter, or with --backend onnxruntime built into a temp folder and run
there). Inputs are .npy files or ONNX TensorProto .pb files; they are checked against the model's
signature (names, dtypes, static and symbolic dims) before anything runs. A summary of every
output (shape, dtype, min/max/mean) goes to stdout.

Examples:

  llmir run tiny.build --prompt "Once upon a time" --max-new-tokens 32

  llmir run tiny.build --chat --prompt "Hi!" --temperature 0.7 --top-p 0.9 --seed 1

  llmir run gemma.build --chat-template gemma --prompt "Name a colour."

  llmir run tiny.build --prompts-file prompts.txt --format json > out.json

  llmir run tiny.build --prompt "A user as JSON:" --json-schema user.schema.json

  llmir run ids.build --prompt-ids 1,15043,3186 -n 16   # built with import --no-tokenizer

  llmir run model.llmir --input x=x.npy --output-dir out/

  llmir run model-ort/ --backend onnxruntime --input input_ids=ids.npy --output-dir out/

  llmir run model.llmir --input x=input_0.pb --output-dir out/ --format json
"""


@command
def run_cmd(
    ctx: Ctx,
    target: Annotated[
        Path, typer.Argument(help="Artifact folder or .llmir file.", show_default=False)
    ],
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", "-i", help="NAME=FILE (.npy or .pb); repeat per input."),
    ] = None,
    output_dir: Annotated[
        Path | None,
        typer.Option(
            "--output-dir",
            "-o",
            help="Folder for the outputs: NAME.npy, or NAME.pb (ONNX TensorProto) for types .npy cannot carry (bfloat16, float8, float4, int4, uint4, int2, uint2).",
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            "-b",
            help="reference or onnxruntime (default: reference for .llmir, onnxruntime for a folder).",
        ),
    ] = None,
    threads: Annotated[
        int | None, typer.Option("--threads", help="onnxruntime intra-op threads.")
    ] = None,
    prompt: Annotated[
        list[str] | None,
        typer.Option("--prompt", "-p", help="Text to continue (repeat for several prompts)."),
    ] = None,
    prompt_ids: Annotated[
        list[str] | None,
        typer.Option(
            "--prompt-ids",
            help="Token ids to continue, e.g. 1,2,3 (repeat for several prompts); prints ids.",
        ),
    ] = None,
    prompts_file: Annotated[
        Path | None,
        typer.Option(
            "--prompts-file",
            help='One prompt per line (.jsonl: a string or {"prompt": ...} per line).',
        ),
    ] = None,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", "-n", help="Tokens to generate at most.")
    ] = 128,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    top_k: Annotated[
        int, typer.Option("--top-k", help="Sample from the k most likely tokens (0 = off).")
    ] = 0,
    top_p: Annotated[
        float,
        typer.Option(
            "--top-p", help="Sample from the smallest set with this probability mass (1 = off)."
        ),
    ] = 1.0,
    repetition_penalty: Annotated[
        float, typer.Option("--repetition-penalty", help="Penalize tokens already seen (1 = off).")
    ] = 1.0,
    min_p: Annotated[
        float,
        typer.Option(
            "--min-p",
            help="Drop tokens under this fraction of the top one's probability (0 = off).",
        ),
    ] = 0.0,
    presence_penalty: Annotated[
        float,
        typer.Option(
            "--presence-penalty",
            help="Subtract from the logit of every token generated so far, -2..2 (0 = off).",
        ),
    ] = 0.0,
    frequency_penalty: Annotated[
        float,
        typer.Option(
            "--frequency-penalty",
            help="Subtract this times its count so far from each generated token's logit, -2..2 "
            "(0 = off).",
        ),
    ] = 0.0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Random seed: the same seed gives the same text.")
    ] = None,
    chat: Annotated[
        bool,
        typer.Option(
            "--chat",
            help="Use the model's chat template (interactive on a terminal without --prompt).",
        ),
    ] = False,
    system: Annotated[
        str | None, typer.Option("--system", help="System message for --chat.")
    ] = None,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Stop when this text appears (repeatable).")
    ] = None,
    verify_artifact: Annotated[
        bool,
        typer.Option(
            "--verify-artifact",
            help="Hash every artifact file against manifest.json (by default only when they changed since the last check).",
        ),
    ] = False,
    template_timeout: TemplateTimeoutOpt = None,
    json_schema: Annotated[
        Path | None,
        typer.Option(
            "--json-schema", help="Constrain the output to JSON valid for this JSON Schema file."
        ),
    ] = None,
    grammar: Annotated[
        Path | None,
        typer.Option(
            "--grammar",
            help="Constrain the output to this grammar file: Lark (llguidance's dialect), or llama.cpp GBNF for a .gbnf file.",
        ),
    ] = None,
    chat_template: ChatTemplateOpt = None,
) -> None:
    # long: typer reads the command's options from this signature; the body is in helpers
    with full_checks(verify_artifact):
        if not target.exists():
            raise InputError(
                f"{target}: no such file or folder", hint="pass an artifact folder or a .llmir file"
            )
        options = TextGenOptions(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            min_p=min_p,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            seed=seed,
            chat=chat or chat_template is not None,
            system=system,
            stop=tuple(stop or ()),
            threads=threads,
            template_timeout=template_timeout,
            chat_template=chat_template,
            display=not ctx.json,  # JSON carries the exact text; the terminal gets escapes
            grammar=grammar_option(json_schema, grammar),
        )
        if options.grammar is not None and (prompt_ids or not (prompt or prompts_file or chat)):
            raise InputError(
                "--json-schema / --grammar constrain generated text: give --prompt, "
                "--prompts-file or --chat (not --prompt-ids or --input)"
            )
        if prompt_ids:
            if inputs or prompt or prompts_file is not None:
                raise InputError(
                    "--prompt-ids gives token ids; --prompt, --prompts-file and --input: pick one"
                )
            if chat_template is not None:
                raise InputError("--chat-template renders text; --prompt-ids gives ids: pick one")
            _generate_ids(ctx, target, prompt_ids, options)
            return
        if prompt or prompts_file is not None or options.chat:
            if inputs:
                raise InputError("--input runs tensors; --prompt/--chat generate text: pick one")
            _generate(ctx, target, list(prompt or []), prompts_file, options)
            return
        if not inputs:
            raise InputError(
                "nothing to run: give --input NAME=FILE (tensors) or --prompt TEXT (text)",
                hint="see `llmir run --help`",
            )
        _run_tensors(ctx, target, inputs, backend, threads, output_dir)


def _run_tensors(
    ctx: Ctx,
    target: Path,
    inputs: list[str],
    backend: str | None,
    threads: int | None,
    output_dir: Path | None,
) -> None:
    """--input NAME=FILE: the outputs summarized (and written to --output-dir)."""
    chosen = backend or ("onnxruntime" if target.is_dir() else "reference")
    values = parse_input_specs(list(inputs))
    outputs = run_target(str(target), values, chosen, threads)
    paths = write_outputs(outputs, str(output_dir)) if output_dir is not None else []
    rows = summarize(outputs)
    if ctx.json:
        ctx.emit_json(
            "run",
            {"ok": True, "target": str(target), "backend": chosen, "outputs": rows, "files": paths},
        )
        return
    for row in rows:
        stats = (
            f"  min {row['min']:.6g}  max {row['max']:.6g}  mean {row['mean']:.6g}"
            if "min" in row
            else ""
        )
        ctx.result(f"{row['name']}: {row['dtype']}{row['shape']}{stats}")
    if paths:
        ctx.log(f"wrote {len(paths)} file(s) to {output_dir}")
        for p in paths:
            if p.endswith(".pb"):
                ctx.log(
                    f"note: {os.path.basename(p)} is an ONNX TensorProto: .npy cannot carry its "
                    "element type (read it with onnx.numpy_helper.to_array)"
                )


def _generate(
    ctx: Ctx, target: Path, prompts: list[str], prompts_file: Path | None, options: TextGenOptions
) -> None:
    if not target.is_dir():
        raise InputError(
            f"{target}: text generation needs an artifact folder",
            hint=f"build one first: llmir build {target} -o {target.stem}.build",
        )
    if prompts_file is not None:
        prompts += read_prompts_file(str(prompts_file))
    options.validate()
    if options.chat and not prompts:
        if not sys.stdin.isatty():
            lines = iter(sys.stdin.read().splitlines())
            read = lambda: next(lines, None)  # noqa: E731  (scripted turns from a pipe)
        else:

            def read() -> str | None:
                try:
                    return input("> ")
                except EOFError:
                    return None

        turns = chat_loop(str(target), options, read, _write)
        if ctx.json:
            ctx.emit_json("run", {"ok": True, "target": str(target), **results_json(turns)})
        return
    results = generate_texts(str(target), prompts, options, *_streaming(ctx, timings=True))
    cut = sum(r.grammar_complete is False for r in results)
    if ctx.json:
        ctx.emit_json("run", {"ok": not cut, "target": str(target), **results_json(results)})
    if cut:  # each one's warning is on stderr (and in the JSON): exit 1, one document on stdout
        raise typer.Exit(EXIT_CHECK_FAILED)


def _generate_ids(ctx: Ctx, target: Path, prompt_ids: list[str], options: TextGenOptions) -> None:
    from llmir_core.runtime.idgen import generate_ids, parse_prompt_ids

    if not target.is_dir():
        raise InputError(
            f"{target}: generation needs an artifact folder",
            hint=f"build one first: llmir build {target} -o {target.stem}.build",
        )
    prompts = [parse_prompt_ids(p) for p in prompt_ids]
    results = generate_ids(str(target), prompts, options, *_streaming(ctx, timings=False))
    if ctx.json:
        ctx.emit_json("run", {"ok": True, "target": str(target), **results_json(results)})


def _streaming(
    ctx: Ctx, timings: bool
) -> tuple[Callable[[int, str], None], Callable[[int, TextResult], None]]:
    """(on_text, on_done) of a generation: text streams to stdout (not with --format json),
    each result's warnings to stderr, with timings: its token counts and speed (--verbose)."""
    stream = not ctx.json

    def on_text(i: int, piece: str) -> None:
        if stream:
            _write(piece)

    def on_done(i: int, res: TextResult) -> None:
        if not stream:
            return
        _write("\n")
        for w in res.warnings:
            ctx.err.print(f"warning: {w}", markup=False)
        if timings:
            r = res.result
            ctx.detail(
                f"[{len(r.prompt_ids)} prompt tokens, {len(r.ids)} generated, "
                f"prefill {r.prefill_s * 1000:.1f} ms, {r.decode_tokens_per_s:.1f} tok/s, "
                f"stop: {r.stop_reason}]"
            )

    return on_text, on_done


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def register(app: typer.Typer) -> None:
    app.command("run", help=HELP)(run_cmd)
