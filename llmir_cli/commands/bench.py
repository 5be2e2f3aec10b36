"""`llmir bench ARTIFACT`: prefill and decode speed of a built decoder, with a machine fingerprint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from llmir_core.artifact_check import full_checks
from llmir_core.errors import InputError

from .._render import Ctx
from ._command import command

HELP = """Measure a decoder artifact on random token ids: prefill time and tokens/s, time to first
token, decode tokens/s (for the whole batch, and per sequence: with --batch N the first is N
times the second), inter-token latency P50/P90/P99 and peak RSS, as mean ± stddev over
--runs runs after --warmup runs. The JSON result carries a hardware and model fingerprint (CPU,
cores, flags, llmir and onnxruntime versions, model hash) so runs can be compared, and the
instruction-set variant (avx2, avx512-vnni) each of llmir's kernels in the artifact ran with.

Examples:

  llmir bench smollm2/ --prompt-len 128 --gen-len 128

  llmir bench smollm2/ --threads 1 --runs 5 --format json > bench.json

--profile reports instead where the time goes: onnxruntime's per-kernel profile of one prefill
and of --profile-steps decode steps, mapped back onto the ops of the .llmir file the artifact was
built from (file:line and loc: HF module, GGUF tensor or ONNX node), ranked by share of the
step, with the bytes each op reads and its GB/s against the read bandwidth measured in the
same run:

  llmir bench smollm2/ --profile --top 20

--vs KIND:PATH (repeatable) runs peers on the same weights beside llmir: the same prompt token
ids, greedy decoding, the same threads, each run a fresh process, interleaved round by round
(`ort-genai:DIR` onnxruntime-genai, `transformers:DIR` torch, `llama.cpp:FILE.gguf`
llama-cpp-python; install them with `pip install 'llmir[bench]'`). The table gives prefill ms,
time to first token, decode tok/s, peak RSS (VmHWM), load time, each as a ratio to llmir, and
whether the first 16 greedy tokens agree:

  llmir bench smollm2/ --vs transformers:./SmolLM2-135M --vs llama.cpp:smollm2.f32.gguf --runs 5
"""


@command
def bench_cmd(
    ctx: Ctx,
    artifact: Annotated[
        Path, typer.Argument(help="An artifact folder built from an LLM.", show_default=False)
    ],
    prompt_len: Annotated[
        int, typer.Option("--prompt-len", help="Prompt tokens per sequence.")
    ] = 128,
    gen_len: Annotated[int, typer.Option("--gen-len", help="Tokens generated per sequence.")] = 128,
    batch: Annotated[int, typer.Option("--batch", help="Sequences decoded together.")] = 1,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            help="onnxruntime intra-op threads (default: "
            "one per core other processes leave free; 0 = onnxruntime's).",
        ),
    ] = None,
    runs: Annotated[int, typer.Option("--runs", help="Measured runs.")] = 3,
    warmup: Annotated[int, typer.Option("--warmup", help="Unmeasured runs first.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random prompt ids.")] = 0,
    verify_artifact: Annotated[
        bool,
        typer.Option(
            "--verify-artifact",
            help="Hash every artifact file against manifest.json (by default only when they changed since the last check).",
        ),
    ] = False,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Per-op time of a prefill and a decode step, mapped to the .llmir ops.",
        ),
    ] = False,
    profile_steps: Annotated[
        int, typer.Option("--profile-steps", help="Decode steps averaged by --profile.")
    ] = 16,
    top: Annotated[
        int, typer.Option("--top", help="Ops listed by --profile (JSON lists all).")
    ] = 15,
    vs: Annotated[
        list[str] | None,
        typer.Option(
            "--vs",
            help="A peer to compare with: ort-genai:DIR, transformers:DIR or llama.cpp:FILE.gguf (repeatable).",
        ),
    ] = None,
) -> None:
    # long: typer reads the command's options from this signature; the body is short
    if profile and vs:
        raise InputError("give either --profile or --vs, not both")
    with full_checks(verify_artifact):
        from llmir_core.runtime.textgen import busy_warning

        busy = busy_warning()
        if busy:
            ctx.log(f"warning: {busy}")
        if profile:
            from ._bench_perf import run_profile

            return run_profile(
                ctx,
                artifact,
                prompt_len=prompt_len,
                steps=profile_steps,
                threads=threads,
                seed=seed,
                top=top,
            )
        if vs:
            from ._bench_perf import run_vs

            return run_vs(
                ctx,
                artifact,
                vs,
                prompt_len=prompt_len,
                gen_len=gen_len,
                runs=runs,
                threads=threads,
                seed=seed,
            )
        _bench(
            ctx,
            artifact,
            prompt_len=prompt_len,
            gen_len=gen_len,
            batch=batch,
            threads=threads,
            runs=runs,
            warmup=warmup,
            seed=seed,
        )


def _bench(ctx: Ctx, artifact: Path, **settings: Any) -> None:
    """`bench_artifact` with the command's settings (prompt_len, gen_len, batch, ...)."""
    from llmir_core.runtime.textgen import bench_artifact

    def progress(i: int, n: int) -> None:
        ctx.detail(f"run {i}/{n} done")

    res = bench_artifact(str(artifact), progress=progress, **settings)
    data = res.to_json()
    if ctx.json:
        ctx.emit_json("bench", data)
    else:
        _table(ctx, data)


def _table(ctx: Ctx, data: dict[str, Any]) -> None:
    from rich.table import Table

    r, c, fp = data["results"], data["config"], data["fingerprint"]
    title = (
        f"{fp.get('artifact')}: prompt {c['prompt_len']}, generate {c['gen_len']}, batch {c['batch']}, "
        f"threads {c['threads']}, {c['runs']} runs"
    )
    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")

    def pm(key: str, unit: str, digits: int = 1) -> str:
        m = r[key]
        return f"{m['mean']:.{digits}f} ± {m['stddev']:.{digits}f} {unit}"

    t.add_row("prefill", pm("prefill_ms", "ms"))
    t.add_row("prefill speed", pm("prefill_tokens_per_s", "tok/s"))
    t.add_row("time to first token", pm("ttft_ms", "ms"))
    t.add_row("decode speed, whole batch", pm("decode_tokens_per_s_aggregate", "tok/s"))
    t.add_row("decode speed, per sequence", pm("decode_tokens_per_s_per_sequence", "tok/s"))
    itl = r["itl_ms"]
    t.add_row(
        "inter-token latency P50 / P90 / P99",
        f"{itl['p50']:.2f} / {itl['p90']:.2f} / {itl['p99']:.2f} ms",
    )
    t.add_row("peak RSS", f"{r['peak_rss_mb']:.0f} MB")
    ctx.out.print(t)
    ctx.out.print(
        f"{fp.get('cpu')} ({fp.get('cores')} cores; {' '.join(fp.get('cpu_flags') or [])}), "
        f"llmir {fp.get('llmir')}, onnxruntime {fp.get('onnxruntime')}, model "
        f"{str(fp.get('model_sha256'))[:12]}",
        markup=False,
        highlight=False,
    )
    kernels = data.get("kernels") or {}
    if kernels:
        ctx.out.print(
            "kernel variants: " + ", ".join(f"{op}={v}" for op, v in sorted(kernels.items())),
            markup=False,
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    app.command("bench", help=HELP)(bench_cmd)
