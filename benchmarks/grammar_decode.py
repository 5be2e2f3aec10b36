"""Decode speed with a JSON Schema mask vs without, through the serve scheduler, on a real model.

The artifact (`--artifact`, or `--gguf FILE` built once; measured on Gemma 3 270M Q4_K_M, a
262144-token vocabulary) is opened as
`llmir serve` opens it (`open_served_model`); this process submits `GenRequest`s to its
`Scheduler` directly (no HTTP), `--batch` at once, greedy, in three modes:

- `plain`: no constraint, end-of-sequence ids off, so each request decodes exactly as many
  tokens as the schema run's output had;
- `schema`: `response_format`'s path: a JSON Schema (an array of 6 objects) compiled with
  `llmir_core.serve.structured.compile_for`, one `Constraint` per request; the next masks are
  computed on a worker thread while the decoder's forward runs (scheduler `_step`);
- `schema-serial`: the same with `grammar.prefetch` off, so each mask is computed after the
  forward, on the scheduler thread (what the overlap saves).

`--grammar tools` measures the "auto" tool grammar instead of the schema (a strict tool in
the Hermes format, `llmir_core.serve.tool_grammar`: free text until `<tool_call>`): what a
request with strict tools pays while the model writes text. Its output is the plain output
(the text branch allows every token); results in grammar_decode_tools.json by default.

Decode tokens/s = tokens after the first / (last token's time - first token's time), summed over
the batch's requests and divided by the batch's decode span; modes alternate over `--rounds`
rounds and the medians are reported, with the ratios to `plain`. Also: whether llguidance drops
the GIL while it computes a mask (a Python loop's rate on the main thread with masks computed on
another thread, against alone). Results in benchmarks/results/grammar_decode.json.

    python benchmarks/grammar_decode.py --gguf gemma-3-270m-q4_k_m.gguf --batch 1 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMPT = "Six users of the service, as a JSON array:\n"
ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "city": {"enum": ["Paris", "London", "Berlin", "Madrid", "Rome"]},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "active"],
    "additionalProperties": False,
}
SCHEMA = {"type": "array", "items": ITEM, "minItems": 6, "maxItems": 6}
TOOLS = [
    {"type": "function", "function": {"name": "add_users", "parameters": SCHEMA, "strict": True}}
]


def the_grammar(model: Any, kind: str) -> Any:
    """The compiled grammar of `--grammar`: the schema, or the auto tool grammar."""
    from llmir_core.runtime.grammar_spec import GrammarSpec
    from llmir_core.serve.schemas import GenParams
    from llmir_core.serve.structured import compile_for
    from llmir_core.serve.tool_grammar import auto_grammar

    if kind == "schema":
        return compile_for(model, GrammarSpec("json_schema", SCHEMA, "bench"))
    p = GenParams(model="bench", tools=TOOLS, tool_choice="auto")
    return compile_for(model, auto_grammar(p, "hermes", model.tokenizer))


def run_batch(
    model: Any, n: int, max_tokens: int, grammar: Any, eos: tuple[int, ...]
) -> dict[str, Any]:
    from llmir_core.runtime.sampling import Sampler, SamplingConfig
    from llmir_core.serve.scheduler import GenRequest

    ids = (
        model.encode_prompt(PROMPT)
        if hasattr(model, "encode_prompt")
        else model.tokenizer.encode(PROMPT)
    )
    done: list[Any] = []
    cv = threading.Condition()

    def on_done(c: Any) -> None:
        with cv:
            done.append(c)
            cv.notify()

    for _ in range(n):
        req = GenRequest(
            ids, max_tokens, Sampler(SamplingConfig()), lambda s: None, on_done, eos_ids=eos
        )
        req.constraint = grammar.constraint() if grammar is not None else None
        model.scheduler.submit(req)
    with cv:
        while len(done) < n:
            cv.wait()
    for c in done:
        if isinstance(c, BaseException):
            raise c
    first = min(c.token_times[0] for c in done)
    last = max(c.token_times[-1] for c in done)
    toks = sum(len(c.token_ids) - 1 for c in done)
    gaps = [b - a for c in done for a, b in zip(c.token_times, c.token_times[1:])]
    return {
        "tokens": [len(c.token_ids) for c in done],
        "tok_s": toks / (last - first),
        # a step's tokens / the median step: robust to other jobs' bursts on a shared machine
        "step_tok_s": n / statistics.median(g for g in gaps if g > 0),
        "texts": [c.text for c in done],
    }


class Timed:
    """Time spent in `Constraint.apply` and `accept` on the scheduler thread (apply waits for a
    prefetched mask, or computes it when there is none): the mask's cost on the critical path."""

    def __init__(self) -> None:
        from llmir_core.runtime.grammar import Constraint

        self.cls = Constraint
        self.orig = (Constraint.apply, Constraint.accept)
        self.spent = 0.0
        self.calls = 0

    def __enter__(self) -> Timed:
        apply, accept = self.orig

        def timed(fn: Any) -> Any:
            def run(c: Any, *a: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(c, *a)
                finally:
                    self.spent += time.perf_counter() - t0
                    self.calls += fn is apply

            return run

        self.cls.apply, self.cls.accept = timed(apply), timed(accept)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.cls.apply, self.cls.accept = self.orig  # type: ignore[method-assign]


def gil_check(grammar: Any, seconds: float = 1.0) -> dict[str, float]:
    """Python-loop iterations/s on this thread: alone, while another thread computes masks, and
    while another thread runs Python (which holds the GIL: the control)."""

    def spin(until: float) -> int:
        k = 0
        while time.perf_counter() < until:
            k += 1
        return k

    def beside(job: Any) -> tuple[float, int]:
        stop = threading.Event()
        count = [0]

        def work() -> None:
            while not stop.is_set():
                job()
                count[0] += 1

        t = threading.Thread(target=work)
        t.start()
        time.sleep(0.05)
        rate = spin(time.perf_counter() + seconds) / seconds
        stop.set()
        t.join()
        return rate, count[0]

    c = grammar.constraint()

    def mask() -> None:
        c.matcher.unsafe_compute_mask_ptr(c._bits.ctypes.data, c._bits.nbytes)

    alone = spin(time.perf_counter() + seconds) / seconds
    with_masks, masks = beside(mask)
    with_python, _ = beside(lambda: sum(range(20000)))
    return {
        "loop_alone_per_s": alone,
        "loop_with_masks": with_masks / alone,
        "loop_with_python": with_python / alone,
        "masks_per_s": masks / seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", help="a built decoder artifact (or give --gguf)")
    ap.add_argument("--gguf", type=Path, help="a GGUF file, imported and built into --work once")
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-grammar-decode"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--grammar", choices=["schema", "tools"], default="schema")
    ap.add_argument("--out", default=None, help="default: benchmarks/results/grammar_decode.json")
    args = ap.parse_args()
    suffix = "" if args.grammar == "schema" else "_tools"
    args.out = args.out or str(REPO / f"benchmarks/results/grammar_decode{suffix}.json")
    if args.artifact is None:
        if args.gguf is None or not args.gguf.is_file():
            sys.exit("grammar_decode: give --artifact DIR or --gguf FILE (a file that exists)")
        from batch_decode import build  # the same import + build as the batched-decode bench

        args.artifact = build(args.gguf, args.work)
    from llmir_core.runtime import grammar as gmod
    from llmir_core.serve import scheduler as sched_mod
    from llmir_core.serve.model import open_served_model

    model = open_served_model(
        args.artifact, max_batch=max(args.batch, 1), threads=args.threads, max_context=1024
    )
    model.scheduler.start()
    t0 = time.perf_counter()
    g = the_grammar(model, args.grammar)
    setup_s = time.perf_counter() - t0
    real_prefetch = gmod.prefetch
    rows: dict[str, list[float]] = {"plain": [], "schema": [], "schema-serial": []}
    steps: dict[str, list[float]] = {k: [] for k in rows}
    path_us: dict[str, list[float]] = {"schema": [], "schema-serial": []}
    warm = run_batch(model, args.batch, 400, g, model.eos_ids)  # also the plain runs' length
    n = min(warm["tokens"])
    for t in warm["texts"]:
        if args.grammar == "schema":
            json.loads(t)  # the output is the schema's JSON
    sample = warm["texts"][0]
    modes = list(rows)
    for r in range(args.rounds):
        for mode in modes[r % 3 :] + modes[: r % 3]:  # the order rotates: no mode always first
            serial = mode == "schema-serial"
            sched_mod.grammar.prefetch = (lambda cs: None) if serial else real_prefetch  # type: ignore[attr-defined]
            if mode == "plain":
                out = run_batch(model, args.batch, n, None, ())
            else:
                with Timed() as tm:
                    out = run_batch(model, args.batch, 400, g, model.eos_ids)
                path_us[mode].append(tm.spent / tm.calls * 1e6)
                assert min(out["tokens"]) == n and out["texts"][0] == sample
            rows[mode].append(out["tok_s"])
            steps[mode].append(out["step_tok_s"])
        print(
            f"round {r}: {n} tokens  "
            + "  ".join(f"{k} {v[-1]:.1f} tok/s" for k, v in rows.items())
        )
    sched_mod.grammar.prefetch = real_prefetch  # type: ignore[attr-defined]
    med = {k: statistics.median(v) for k, v in rows.items()}
    med_step = {k: statistics.median(v) for k, v in steps.items()}
    res = {
        "artifact": args.artifact,
        "batch": args.batch,
        "grammar": args.grammar,
        "rounds": args.rounds,
        "threads": args.threads,
        "grammar_setup_s": setup_s,
        "tokenizer_index_s": g.index.build_s,
        "tok_s": rows,
        "median_tok_s": med,
        "schema_over_plain": med["schema"] / med["plain"],
        "serial_over_plain": med["schema-serial"] / med["plain"],
        "step_tok_s": steps,
        "mask_on_thread_us_per_token": path_us,
        "median_mask_on_thread_us": {k: statistics.median(v) for k, v in path_us.items()},
        "median_step_ms": 1e3 * args.batch / med_step["schema"],
        "median_step_tok_s": med_step,
        "step_schema_over_plain": med_step["schema"] / med_step["plain"],
        "step_serial_over_plain": med_step["schema-serial"] / med_step["plain"],
        "sample_output": sample,
        "gil": gil_check(g),
        "load": os.getloadavg()[0],
    }
    model.scheduler.close()
    print(
        f"batch {args.batch}: plain {med['plain']:.1f} tok/s, {args.grammar} mask "
        f"{med['schema']:.1f} ({res['schema_over_plain']:.3f}x), without overlap "
        f"{med['schema-serial']:.1f} "
        f"({res['serial_over_plain']:.3f}x); grammar setup {setup_s:.2f} s "
        f"(tokenizer index {g.index.build_s:.2f} s)"
    )
    print(
        f"by the median step: plain {med_step['plain']:.1f} tok/s, {args.grammar} mask "
        f"{res['step_schema_over_plain']:.3f}x, without overlap {res['step_serial_over_plain']:.3f}x"
    )
    on = res["median_mask_on_thread_us"]
    print(
        f"mask work on the scheduler thread per token: {on['schema']:.0f} us overlapped, "
        f"{on['schema-serial']:.0f} us serial; a decode step takes {res['median_step_ms']:.1f} ms"
    )
    gil = res["gil"]
    print(
        f"GIL: a Python loop runs at {gil['loop_with_masks']:.2f}x its rate alone while another "
        f"thread computes masks ({gil['masks_per_s']:.0f}/s), {gil['loop_with_python']:.2f}x "
        "while another thread runs Python"
    )
    print(f"sample: {sample[:120]}")
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
