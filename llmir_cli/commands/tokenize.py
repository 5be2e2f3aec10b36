"""`llmir tokenize SRC [TEXT]`: text to token ids (or back) with a model's own tokenizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmir_core.errors import InputError
from llmir_core.fileio import read_text_lines

from .._render import Ctx
from ._command import command

HELP = """Tokenize text with a model's tokenizer, or decode token ids back to text.

SRC is anything llmir reads that carries a tokenizer: a Hugging Face model folder
(tokenizer.json), a .gguf file (a whole model, or a vocabulary-only GGUF with no tensors), an
artifact folder from `llmir build`, or an imported .llmir file. TEXT is read from stdin when
not given. The ids include the BOS/EOS tokens the model adds (as llama.cpp adds them for GGUF);
--no-special leaves them out (with --decode: special tokens are not shown).

--jsonl FILE tokenizes one JSON string per line and prints one JSON array of ids per line, in
the same order (with --decode: one JSON array of ids per line in, one JSON string per line out).

Examples:

  llmir tokenize ./SmolLM2-135M "Hello world"

  llmir tokenize model.gguf "Hello world" --format json

  llmir tokenize model.gguf --decode "9707 1879"

  llmir tokenize tiny.build --jsonl prompts.jsonl > ids.jsonl
"""


@command
def tokenize_cmd(
    ctx: Ctx,
    src: Annotated[
        str,
        typer.Argument(
            help="HF folder, .gguf, artifact folder or .llmir file.", show_default=False
        ),
    ],
    text: Annotated[
        str | None,
        typer.Argument(help="Text (or ids with --decode); stdin if absent.", show_default=False),
    ] = None,
    no_special: Annotated[
        bool,
        typer.Option("--no-special", help="Add no BOS/EOS (with --decode: hide special tokens)."),
    ] = False,
    decode: Annotated[
        bool,
        typer.Option(
            "--decode", "-d", help="TEXT is token ids (1,2,3 or '1 2 3'): print the text."
        ),
    ] = False,
    jsonl: Annotated[
        Path | None,
        typer.Option(
            "--jsonl", help="One JSON string per line in, one JSON id array per line out."
        ),
    ] = None,
) -> None:
    from llmir_core.runtime.tokenize_src import (
        check_ids,
        decode_lines,
        encode_lines,
        open_tokenizer,
        parse_ids,
    )

    if jsonl is not None and text is not None:
        raise InputError("give TEXT or --jsonl FILE, not both")
    lines = None
    if jsonl is not None:
        lines = read_text_lines(jsonl)
    elif text is None:
        text = sys.stdin.read()
    tok = open_tokenizer(src)
    if lines is not None:
        out = (
            decode_lines(tok, lines, str(jsonl), no_special)
            if decode
            else encode_lines(tok, lines, str(jsonl), not no_special)
        )
        sys.stdout.write("".join(json.dumps(v, ensure_ascii=False) + "\n" for v in out))
        return
    assert text is not None
    if decode:
        ids = parse_ids(text, "TEXT")
        check_ids(tok, ids, "TEXT")
        decoded = tok.decode(ids, skip_special_tokens=no_special)
        if ctx.json:
            ctx.emit_json("tokenize", {"ok": True, "ids": ids, "text": decoded})
        else:
            ctx.result(decoded)
        return
    ids = tok.encode(text, add_special_tokens=not no_special)
    if ctx.json:
        pieces = [tok.backend.id_to_token(i) for i in ids]
        ctx.emit_json(
            "tokenize",
            {"ok": True, "text": text, "ids": ids, "tokens": pieces, "count": len(ids)},
        )
        return
    ctx.result(" ".join(str(i) for i in ids))
    ctx.detail(f"{len(ids)} tokens")


def register(app: typer.Typer) -> None:
    app.command("tokenize", help=HELP)(tokenize_cmd)
