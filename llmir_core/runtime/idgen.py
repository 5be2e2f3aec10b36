"""Generation from token ids, for artifacts built without a tokenizer (`llmir run --prompt-ids`).

A model imported with `--no-tokenizer` builds an artifact that takes and gives token ids only:
the prompt is a list of ids and the "text" streamed is the generated ids, each followed by a space.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmir_core.errors import InputError
from llmir_core.runtime.generate import generate
from llmir_core.runtime.sampling import Sampler
from llmir_core.runtime.textgen import TextGenOptions, TextResult
from llmir_core.runtime.tokenize_src import parse_ids


class IdsCodec:
    """Ids as text: every id then a space, so a longer run only appends (safe to stream)."""

    def encode(self, text: str) -> list[int]:
        return parse_prompt_ids(text)

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f"{int(i)} " for i in ids)


def parse_prompt_ids(text: str) -> list[int]:
    """'1,2,3' or '1 2 3' (or a JSON array) -> [1, 2, 3]; InputError naming the bad item."""
    ids = parse_ids(text, f"--prompt-ids '{text}'")
    if not ids:
        raise InputError(
            f"--prompt-ids '{text}': no token ids", hint="pass ids like --prompt-ids 1,2,3"
        )
    return ids


def generate_ids(
    art_dir: str,
    prompts: Sequence[Sequence[int]],
    options: TextGenOptions,
    on_text: Callable[[int, str], None] | None = None,
    on_done: Callable[[int, TextResult], None] | None = None,
) -> list[TextResult]:
    """Generate after each id prompt in turn; stops at the artifact's end-of-generation ids."""
    from llmir_core.artifact_check import decoder_section
    from llmir_core.targets import open_artifact

    options.validate()
    if options.chat or options.stop or options.system:
        raise InputError(
            "--chat, --system and --stop work on text; --prompt-ids takes and gives token ids"
        )
    dec = open_artifact(art_dir, threads=options.threads, max_context=options.max_context)
    eos = tuple(int(i) for i in decoder_section(art_dir, dec.manifest).get("eos_token_ids") or ())
    vocab, ctx = dec.vocab, dec.max_context
    out = []
    for n, ids in enumerate(prompts):
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise InputError(
                f"--prompt-ids: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})"
            )
        if ctx is not None and len(ids) >= ctx:
            raise InputError(
                f"the prompt has {len(ids)} tokens, but the model's context is {ctx} "
                "(with room for at least one new token)",
                hint="use a shorter prompt",
            )
        dec.reserve(len(ids) + options.max_new_tokens)
        stream = None
        if on_text is not None:

            def stream(piece: str, n: int = n) -> None:
                on_text(n, piece)

        res = generate(
            dec,
            IdsCodec(),
            list(ids),
            max_new_tokens=options.max_new_tokens,
            sampler=Sampler(options.sampling()),
            eos_ids=eos,
            on_text=stream,
        )
        warnings = (
            [f"generation stopped at the model's context limit of {ctx} tokens"]
            if res.stop_reason == "context"
            else []
        )
        result = TextResult(" ".join(str(i) for i in ids), res, warnings)
        out.append(result)
        if on_done:
            on_done(n, result)
    return out


__all__ = ["IdsCodec", "parse_prompt_ids", "generate_ids"]
