"""Text in, text out on a decoder artifact: the core of `llmir run ARTIFACT --prompt` and `llmir bench`.

`TextGenerator(art_dir, options)` opens the artifact's onnxruntime decoder and its tokenizer
(`tokenizer.json`, through the `tokenizers` library) and generates text for a prompt, or for a
conversation rendered with the model's chat template (full Jinja, through `jinja2`, with the
conventions transformers' `apply_chat_template` uses). Tokens stream to a callback as they are
decoded; generation stops at EOS, a stop string, `max_new_tokens` or the context limit (with a
warning). `bench_artifact` runs `llmir_core.runtime.bench.run_bench` on the artifact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmir_core.errors import InputError
from llmir_core.fileio import read_text, read_text_lines
from llmir_core.runtime.bench import BenchResult, run_bench
from llmir_core.runtime.chat_template import render_chat, template_timeout
from llmir_core.runtime.generate import GenerationResult, generate
from llmir_core.runtime.grammar import compile_grammar
from llmir_core.runtime.grammar_spec import GrammarSpec
from llmir_core.runtime.sampling import Sampler, SamplingConfig
from llmir_core.runtime.textstream import decode_text, decode_tokens, token_bytes_fn
from llmir_core.runtime.tokenizer import Tokenizer, from_hf_file
from llmir_core.runtime.trace_attrs import tokenized  # tracing
from llmir_core.tracing import traced


@dataclass
class TextGenOptions:
    """The options of `llmir run ARTIFACT --prompt ...` (defaults: greedy, 128 new tokens)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    chat: bool = False  # render prompts with the model's chat template
    system: str | None = None  # a system message for --chat
    stop: tuple[str, ...] = ()
    threads: int | None = None
    max_context: int | None = None  # cap on the KV buffers (default: the artifact's max_len)
    template_timeout: float | None = None  # seconds per chat render (None: env var, else 2)
    chat_template: str | None = None  # --chat-template NAME|FILE: replaces the model's (chat)
    display: bool = True  # text made terminal-safe (escapes); False: the exact text (JSON)
    grammar: GrammarSpec | None = None  # --json-schema / --grammar: the output's language

    def sampling(self) -> SamplingConfig:
        cfg = SamplingConfig(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise InputError(
                f"--max-new-tokens must be >= 1, got {self.max_new_tokens}",
                hint="give the number of tokens to generate, e.g. -n 64",
            )
        self.sampling()
        if self.template_timeout is not None:
            template_timeout(self.template_timeout)
        if self.chat_template is not None:  # a bad name or file fails before the model loads
            from llmir_core.runtime.chat_templates import load_chat_template

            load_chat_template(self.chat_template, self.template_timeout)


@dataclass
class TextResult:
    """One prompt's generation, with the prompt and any warnings."""

    prompt: str | list[dict[str, str]]
    result: GenerationResult
    warnings: list[str] = field(default_factory=list)
    grammar_complete: bool | None = None  # --json-schema / --grammar: the output is whole

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt": self.prompt,
            **self.result.to_json(),
            "prompt_token_ids": self.result.prompt_ids,
            "warnings": self.warnings,
            **(
                {} if self.grammar_complete is None else {"grammar_complete": self.grammar_complete}
            ),
        }


def open_decoder(art_dir: str, **options: Any) -> Any:
    """The `Decoder` of an LLM artifact, from the target its manifest names."""
    from llmir_core.targets import open_artifact

    dec = open_artifact(art_dir, **options)
    if not hasattr(dec, "forward"):
        raise InputError(
            f"{art_dir}: not a decoder artifact (its manifest has no 'decoder' section)",
            hint="build an imported LLM with `llmir build MODEL.llmir`",
        )
    return dec


def load_artifact_tokenizer(art_dir: str, manifest: dict[str, Any]) -> Tokenizer:
    dec = manifest["decoder"]
    tok = dec.get("tokenizer")
    if not tok:
        raise InputError(
            f"{art_dir}: the artifact has no tokenizer, so it cannot take text",
            hint="give token ids with `llmir run ARTIFACT --prompt-ids 1,2,3`, or import "
            "the model with its tokenizer and build it again",
        )
    template = None
    if dec.get("chat_template"):
        template = read_text(os.path.join(art_dir, dec["chat_template"]))
    backend = from_hf_file(os.path.join(art_dir, tok["file"]))
    return Tokenizer(
        backend, dec.get("bos_token_id"), tuple(dec.get("eos_token_ids") or ()), template
    )


class _Codec:
    """Decoding for the generation loop: special tokens (e.g. <|im_end|>) are not shown.

    display: the text goes to a terminal, so it is made display-safe (see textstream);
    otherwise it is the exact text (for JSON, which escapes what needs escaping)."""

    def __init__(self, tok: Tokenizer, display: bool = True) -> None:
        self.tok = tok
        self.display = display
        self.token_bytes = token_bytes_fn(tok.backend)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        def fallback(x: list[int]) -> str:
            return self.tok.decode(x, skip_special_tokens=True)

        if self.display:
            return decode_tokens(ids, self.token_bytes, fallback)
        return decode_text(ids, self.token_bytes, fallback)


class TextGenerator:
    """A decoder artifact with its tokenizer, ready to generate."""

    def __init__(self, art_dir: str, options: TextGenOptions | None = None) -> None:
        self.options = options or TextGenOptions()
        self.options.validate()
        self.decoder = open_decoder(
            art_dir, threads=self.options.threads, max_context=self.options.max_context
        )
        self.manifest = self.decoder.manifest
        self.tokenizer = load_artifact_tokenizer(art_dir, self.manifest)
        if self.options.chat_template is not None:
            from llmir_core.runtime.chat_templates import load_chat_template, with_template

            tpl = load_chat_template(self.options.chat_template, self.options.template_timeout)
            self.tokenizer = with_template(self.tokenizer, tpl)
        spec = self.options.grammar
        vocab = self.manifest["decoder"].get("vocab")
        self.grammar = None if spec is None else compile_grammar(spec, self.tokenizer, vocab=vocab)

    def _token(self, tid: int | None) -> str | None:
        if tid is None:
            return None
        tok = self.tokenizer.backend.id_to_token(int(tid))
        return str(tok) if tok is not None else None

    def chat_text(self, messages: Sequence[dict[str, str]]) -> str:
        tpl = self.tokenizer.chat_template
        if not tpl:
            raise InputError("the model has no chat template", hint="run without --chat")
        eos = self.tokenizer.eos_ids[0] if self.tokenizer.eos_ids else None
        return render_chat(
            tpl,
            messages,
            bos_token=self._token(self.tokenizer.bos_id),
            eos_token=self._token(eos),
            timeout=self.options.template_timeout,
        )

    @traced("tokenize", after=tokenized)  # tracing
    def encode(self, prompt: str | Sequence[dict[str, str]]) -> list[int]:
        if isinstance(prompt, str) and not self.options.chat:
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            messages = (
                [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
            )
            if self.options.system and not any(m.get("role") == "system" for m in messages):
                messages = [{"role": "system", "content": self.options.system}, *messages]
            # the template writes the special tokens itself (as transformers does)
            ids = self.tokenizer.encode(self.chat_text(messages), add_special_tokens=False)
        if not ids:
            raise InputError("the prompt encodes to no tokens", hint="pass a non-empty --prompt")
        return ids

    def generate(
        self, prompt: str | Sequence[dict[str, str]], on_text: Callable[[str], None] | None = None
    ) -> TextResult:
        """Generate for one prompt (text, or chat messages), streaming pieces to on_text."""
        opts = self.options
        ids = self.encode(prompt)
        ctx = self.decoder.max_context
        if ctx is not None and len(ids) >= ctx:
            raise InputError(
                f"the prompt has {len(ids)} tokens, but the model's context is {ctx} "
                "(with room for at least one new token)",
                hint="use a shorter prompt",
            )
        self.decoder.reserve(len(ids) + opts.max_new_tokens)
        constraint = self.grammar.constraint() if self.grammar else None
        res = generate(
            self.decoder,
            _Codec(self.tokenizer, opts.display),
            ids,
            max_new_tokens=opts.max_new_tokens,
            sampler=Sampler(opts.sampling()),
            eos_ids=self.tokenizer.eos_ids,
            stop=opts.stop,
            on_text=on_text,
            constraint=constraint,
        )
        warnings = []
        complete = None if constraint is None else constraint.accepting
        if complete is False:
            warnings.append(
                f"the output stopped ({res.stop_reason}) before the grammar was complete: it is "
                "not valid for it (raise --max-new-tokens, or bound the schema: maximum, "
                "maxLength, maxItems)"
            )
        if res.stop_reason == "context":
            warnings.append(
                f"generation stopped at the model's context limit of {ctx} tokens "
                f"after {len(res.ids)} new tokens"
            )
        shown = prompt if isinstance(prompt, str) else [dict(m) for m in prompt]
        return TextResult(shown, res, warnings, complete)


def read_prompts_file(path: str) -> list[str]:
    """Prompts from a file: JSON Lines (a string or {"prompt": ...} per line) for .jsonl, else
    one prompt per non-empty line."""
    if not os.path.isfile(path):
        raise InputError(
            f"{path}: no such file", hint="--prompts-file takes a text file, one prompt per line"
        )
    lines = read_text_lines(path)
    prompts: list[str] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.endswith(".jsonl"):
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
            text = item.get("prompt") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise InputError(
                    f'{path}:{n}: expected a string or an object with a "prompt" string'
                )
            prompts.append(text)
        else:
            prompts.append(line)
    if not prompts:
        raise InputError(f"{path}: holds no prompts")
    return prompts


def generate_texts(
    art_dir: str,
    prompts: Sequence[str],
    options: TextGenOptions | None = None,
    on_text: Callable[[int, str], None] | None = None,
    on_done: Callable[[int, TextResult], None] | None = None,
) -> list[TextResult]:
    """Generate for each prompt in turn, in one session: `llmir run ARTIFACT --prompt/--prompts-file`.

    on_text(i, piece) streams prompt i's text as it is decoded; on_done(i, result) follows each."""
    if not prompts:
        raise InputError("no prompt given", hint="pass --prompt TEXT or --prompts-file FILE")
    gen = TextGenerator(art_dir, options)
    out = []
    for i, p in enumerate(prompts):
        stream = None
        if on_text is not None:

            def stream(piece: str, i: int = i) -> None:
                on_text(i, piece)

        res = gen.generate(p, stream)
        out.append(res)
        if on_done:
            on_done(i, res)
    return out


def chat_loop(
    art_dir: str,
    options: TextGenOptions,
    read: Callable[[], str | None],
    write: Callable[[str], None],
) -> list[TextResult]:
    """An interactive conversation: read() gives the next user line (None, /exit or /quit ends
    it), write() streams the reply. The conversation is re-rendered and prefilled each turn."""
    options.chat = True
    gen = TextGenerator(art_dir, options)
    history: list[dict[str, str]] = []
    turns: list[TextResult] = []
    while True:
        line = read()
        if line is None or line.strip() in ("/exit", "/quit"):
            return turns
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        res = gen.generate(history, write)
        write("\n")
        for w in res.warnings:
            write(f"[warning: {w}]\n")
        history.append({"role": "assistant", "content": res.result.text})
        turns.append(res)


def results_json(results: Sequence[TextResult]) -> dict[str, Any]:
    """The `--format json` payload of `llmir run ARTIFACT --prompt`."""
    return {
        "results": [r.to_json() for r in results],
        "warnings": [w for r in results for w in r.warnings],
    }


def bench_artifact(
    art_dir: str,
    *,
    prompt_len: int = 128,
    gen_len: int = 128,
    batch: int = 1,
    threads: int | None = None,
    runs: int = 3,
    warmup: int = 1,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> BenchResult:
    """`llmir bench ARTIFACT`: prefill and decode timings on random token ids."""
    for name, v, low in (
        ("--prompt-len", prompt_len, 1),
        ("--gen-len", gen_len, 1),
        ("--batch", batch, 1),
        ("--runs", runs, 1),
        ("--warmup", warmup, 0),
    ):
        if v < low:
            raise InputError(f"{name} must be >= {low}, got {v}", hint="see `llmir bench --help`")
    dec = open_decoder(art_dir, threads=threads)
    need = prompt_len + gen_len
    if dec.max_context is not None and need > dec.max_context:
        raise InputError(
            f"--prompt-len + --gen-len = {need} exceeds the model's context of {dec.max_context}"
        )
    dec.reserve(need)
    files = dec.manifest.get("files", {})
    model_hash = _combined_hash({k: v.get("sha256") for k, v in sorted(files.items())})
    res = run_bench(
        dec,
        dec.vocab,
        prompt_len=prompt_len,
        gen_len=gen_len,
        batch=batch,
        runs=runs,
        warmup=warmup,
        threads=dec.threads,
        seed=seed,
        model_hash=model_hash,
        progress=progress,
    )
    variants = getattr(dec, "kernel_variants", None)  # optional in the Decoder protocol
    res.kernels = dict(variants()) if callable(variants) else {}
    d = dec.manifest["decoder"]
    res.fingerprint.update(
        {
            "artifact": os.path.basename(os.path.abspath(art_dir)),
            "kv_cache": d.get("kv_cache"),
            "weights": d.get("quant", {}).get("f32_weights"),
            "accuracy_level": d.get("accuracy_level"),
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        }
    )
    return res


def _combined_hash(parts: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def busy_warning(sample_s: float = 0.3) -> str | None:
    """A warning when other processes keep the CPUs busy (timings would not be trustworthy)."""
    from llmir_core.runtime.cpu_load import busy_cores

    try:
        busy = busy_cores(sample_s)
    except (OSError, ValueError, IndexError):
        return None
    if busy > 0.25:
        return (
            f"other processes keep {busy:.1f} of {os.cpu_count()} cores busy: timings may be "
            "slow and noisy"
        )
    return None


__all__ = [
    "TextGenOptions",
    "TextResult",
    "TextGenerator",
    "render_chat",
    "generate_texts",
    "chat_loop",
    "read_prompts_file",
    "results_json",
    "bench_artifact",
    "busy_warning",
    "load_artifact_tokenizer",
]
