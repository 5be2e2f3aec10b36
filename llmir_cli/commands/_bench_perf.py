"""`llmir bench --profile` and `llmir bench --vs PEER`: the perf helpers of the bench command."""

from __future__ import annotations

from pathlib import Path

from .._render import Ctx


def run_profile(
    ctx: Ctx,
    artifact: Path,
    *,
    prompt_len: int,
    steps: int,
    threads: int | None,
    seed: int,
    top: int,
) -> None:
    """Profile a prefill and decode steps; print the top ops (text) or everything (JSON)."""
    from llmir_core.errors import InputError
    from llmir_core.runtime.profile import format_profile, profile_artifact

    if top < 1:
        raise InputError(f"--top must be >= 1, got {top}")
    res = profile_artifact(
        str(artifact),
        prompt_len=prompt_len,
        decode_steps=steps,
        threads=threads,
        seed=seed,
        progress=ctx.detail,
    )
    if ctx.json:
        ctx.emit_json("bench-profile", res.to_json())
    else:
        ctx.result(format_profile(res, top))


def run_vs(
    ctx: Ctx,
    artifact: Path,
    peers: list[str],
    *,
    prompt_len: int,
    gen_len: int,
    runs: int,
    threads: int | None,
    seed: int,
) -> None:
    """llmir and each peer, interleaved in fresh processes; a table (text) or everything (JSON)."""
    from llmir_core.runtime.peers import compare, format_table, parse_peer

    parsed = [parse_peer(p) for p in peers]
    res = compare(
        str(artifact),
        parsed,
        prompt_len=prompt_len,
        gen_len=gen_len,
        runs=runs,
        threads=threads,
        seed=seed,
        progress=ctx.detail,
    )
    busy = sum(1 for r in res.runs if r["busy"])
    if busy:
        ctx.log(
            f"warning: {busy} of {len(res.runs)} runs had other processes busy on the CPUs "
            "(left out of the medians where clean runs exist)"
        )
    if ctx.json:
        ctx.emit_json("bench-vs", res.to_json())
    else:
        ctx.result(format_table(res))
