"""Text forms of the pass list, the optimization report and pass timings."""

from __future__ import annotations

from typing import Any

from llmir_core.smt.verdicts import bound_line, instance_lines, summary

from .manager import PipelineResult


def format_list(items: list[dict[str, Any]], presets: dict[str, list[str]]) -> str:
    width = max(len(i["name"]) for i in items)
    lines = ["passes:"]
    for i in items:
        opts = ", ".join(f"{k}={v}" for k, v in i["options"].items())
        lines.append(f"  {i['name']:<{width}}  {i['summary']}" + (f"  [{opts}]" if opts else ""))
    lines.append("presets:")
    for k, v in presets.items():
        lines.append(f"  -{k}: {','.join(v) if v else '(verify only)'}")
    return "\n".join(lines) + "\n"


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}P"


def format_report(res: PipelineResult) -> str:
    b, a = res.before, res.after
    lines = [
        "== optimization report ==",
        f"pipeline:              {','.join(r.spec for r in res.runs) or '(no passes)'}",
        f"ops:                   {b.ops} -> {a.ops}",
        f"parameter bytes:       {_human(b.param_bytes)}B -> {_human(a.param_bytes)}B",
        f"FLOPs per token:       {_human(b.flops_per_token)} -> {_human(a.flops_per_token)}",
        f"memory traffic/token:  {_human(b.bytes_per_token)}B -> {_human(a.bytes_per_token)}B",
        "op counts (before -> after):",
    ]
    for name in sorted(set(b.op_counts) | set(a.op_counts)):
        x, y = b.op_counts.get(name, 0), a.op_counts.get(name, 0)
        if x != y:
            lines.append(f"  {name:<36} {x:>5} -> {y}")
    lines.append(f"rewrites applied ({len(res.ctx.rewrites)}):")
    for r in res.ctx.rewrites:
        lines.append(
            f"  [{r.pass_name}] {r.rule} at {r.location}" + (f": {r.detail}" if r.detail else "")
        )
    validated = [r for r in res.runs if r.validation is not None and r.changed]
    if validated:  # how each changing pass was validated: SMT (rule instances) or differential
        lines.append("validation of the passes that changed the module:")
        for run in validated:
            v = run.validation or {}
            lines.append(f"  [{run.name}] {summary(v)}")
            bl = bound_line(v)
            if bl:
                lines.append(f"    {bl}")
            lines += [f"    {line}" for line in instance_lines(v)]
            for row in v.get("ops", []):  # the ops not shown equal to the input's terms
                if row["validated_by"] == "differential":
                    lines.append(f"    differential: {row['op']} x{row['count']}: {row['how']}")
    lines.append(f"candidates rejected ({len(res.ctx.rejections)}):")
    for rj in res.ctx.rejections:
        lines.append(f"  [{rj.pass_name}] {rj.rule} at {rj.location}: {rj.reason}")
    return "\n".join(lines) + "\n"


def format_times(res: PipelineResult) -> str:
    lines = ["== pass timings ==", f"  {'#':>2} {'pass':<24} {'ms':>9} {'ops':>11}  validation"]
    total = 0.0
    for r in res.runs:
        total += r.seconds
        v = ""
        if r.validation is not None:
            v = summary(r.validation)[:-1] + (
                f", {1000 * float(r.validation.get('seconds', 0.0)):.1f} ms)"
            )
        lines.append(
            f"  {r.index:>2} {r.name:<24} {1000 * r.seconds:>9.2f} {r.ops_before:>5}->{r.ops_after:<5}  {v}"
        )
    lines.append(
        f"  total passes {1000 * total:.1f} ms; validation {1000 * res.validation_seconds:.1f} ms"
    )
    return "\n".join(lines) + "\n"
