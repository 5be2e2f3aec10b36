"""The SMT parts of `llmir verify`: `--rules` and `--against` (kept apart so `verify FILE` stays thin)."""

from __future__ import annotations

from pathlib import Path

import typer

from llmir_core.errors import EXIT_CHECK_FAILED, EXIT_INCONCLUSIVE, CheckFailed, InputError
from llmir_core.ir.parser import parse_file
from llmir_core.smt.verdicts import (
    NOT_EQUIVALENT,
    bound_line,
    exit_code,
    instance_lines,
    label,
    ok,
)

from .._render import Ctx, handle_errors


def verify_rules(ctx: Ctx, only: str | None, update: bool, timeout: float) -> None:
    from llmir_core.rewrite.library import RULES
    from llmir_core.smt.rules_check import check_rules, lattice, verdict_json, write_certificate
    from llmir_core.smt.verdicts import label

    with handle_errors(ctx):
        rules = [r for n, r in RULES.items() if only is None or only in n]
        if not rules:
            raise InputError(f"no rule matches {only!r}", hint="rules: " + ", ".join(RULES))
        verdicts, code = check_rules(rules, timeout)
        if update:
            write_certificate(verdicts)
        if ctx.json:
            ctx.emit_json(
                "verify-rules", {"ok": code == 0, "rules": [verdict_json(v) for v in verdicts]}
            )
        else:
            for v in verdicts:
                word = label(lattice(v)).replace("within bound ?", "within bound")
                extra = (
                    f" [{', '.join(f'{k}: {x}' for k, x in v.dtype_checks.items())}]"
                    if v.dtype_checks
                    else ""
                )
                ctx.result(f"{word:<15} {v.rule:<44} {v.tag:<14} {1000 * v.seconds:7.1f} ms{extra}")
                if v.bound and v.verdict == "proved":
                    ctx.result(f"    {v.bound}")
                if v.verdict != "proved":
                    ctx.result(f"    {v.verdict}: {v.detail}" if v.detail else f"    {v.verdict}")
                    if v.counterexample:
                        ctx.result(f"    counterexample: {v.counterexample}")
            counts: dict[str, int] = {}
            for v in verdicts:
                counts[lattice(v)] = counts.get(lattice(v), 0) + 1
            ctx.log(
                ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                + f" ({len(verdicts)} rules)"
            )
    if code:
        raise typer.Exit(code)


def verify_mutants(ctx: Ctx, only: str | None, timeout: float) -> None:
    from llmir_core.rewrite.library import RULES
    from llmir_core.smt.rules_check import check_mutants

    with handle_errors(ctx):
        rules = [r for n, r in RULES.items() if only is None or only in n]
        if not rules:
            raise InputError(f"no rule matches {only!r}", hint="rules: " + ", ".join(RULES))
        rep = check_mutants(rules, limit_s=min(timeout, 2.0))
        if ctx.json:
            ctx.emit_json("verify-mutants", {"ok": rep["survived_unexplained"] == 0, **rep})
        else:
            for row in rep["mutants"]:
                if not row["refused"]:
                    why = row["equivalent_because"] or "NOT EXPLAINED"
                    ctx.result(f"survived  {row['rule']}: {row['mutant']} ({why})")
            ctx.result(
                f"{rep['generated']} mutants of {rep['rules']} rules: {rep['refused']} refused "
                f"({rep['refuted']} refuted with a counterexample), "
                f"{rep['survived_equivalent']} equivalent (listed), "
                f"{rep['survived_unexplained']} survived unexplained"
            )
    if rep["survived_unexplained"]:
        raise typer.Exit(EXIT_CHECK_FAILED)


def verify_against(ctx: Ctx, file: Path, original: Path, timeout: float) -> None:
    from llmir_core.smt.tv import validate

    after = parse_file(str(file))
    before = parse_file(str(original))
    from llmir_core.verifier import verify

    errors = [d for d in verify(after, check_files=False) if d.severity == "error"]
    if errors:  # an ill-typed op (e.g. an edited head count) cannot be equivalent
        raise CheckFailed(
            f"{file}: does not verify ({len(errors)} error(s)), so it is not equivalent to "
            f"{original}",
            diagnostics=errors,
            hint=f"run `llmir verify {file}` for details",
        )
    res = validate(before, after, None, limit_s=timeout)
    if res.get("method") == "signature":
        raise InputError(
            f"{file} and {original} have different signatures: {res['signature']}",
            hint="--against compares two versions of the same function",
        )
    verdict = res["verdict"]
    if ctx.json:
        ctx.emit_json(
            "verify-against",
            {"ok": ok(verdict), "file": str(file), "against": str(original), **res},
        )
    else:
        ctx.result(
            f"{file}: {label(verdict, res.get('bound'))} to {original} (by {res.get('method')}, "
            f"{1000 * float(res.get('seconds', 0.0)):.1f} ms)"
        )
        line = bound_line(res)
        if line:
            ctx.result(f"  {line}")
        for line in instance_lines(res):
            ctx.result(f"    {line}")
        for line in res.get("details", []):
            ctx.result(f"  {line}")
        if res.get("input") and verdict == NOT_EQUIVALENT:
            ctx.result(f"  input: {res['input']}")
        if res.get("ops"):
            ctx.result("  how each op was validated:")
        for row in res.get("ops", []):
            ctx.result(f"    {row['op']} x{row['count']}: {row['validated_by']}, {row['how']}")
    if not ok(verdict):
        raise typer.Exit(exit_code(verdict))


def verify_ranges(ctx: Ctx, file: Path, input_range: float, timeout: float) -> None:
    from llmir_core.smt.intervals import analyze, check_invariant

    module = parse_file(str(file))
    rep = analyze(module, (-input_range, input_range))
    invs = []
    for op in module.main.ops:
        text = op.attrs.get("verify_invariant")
        if isinstance(text, str) and text:
            inv = check_invariant(text, op, rep, timeout)
            inv["location"] = str(op.pos) if op.pos else op.results[0].name
            invs.append(inv)
    bad = [i for i in invs if i["verdict"] == "violated"]
    unknown = [i for i in invs if i["verdict"] == "unknown"]
    if ctx.json:
        ctx.emit_json(
            "verify-ranges", {"ok": not bad, "file": str(file), **rep.to_json(), "invariants": invs}
        )
    else:
        for i, r in enumerate(rep.outputs):
            ctx.result(
                f"output #{i}: [{r[0]:.6g}, {r[1]:.6g}] for inputs in [-{input_range:g}, {input_range:g}]"
            )
        if rep.f16_values:
            ctx.result(
                "fp16 overflow: "
                + (
                    "excluded for all " + str(rep.f16_values) + " f16 values"
                    if not rep.f16_risks
                    else "cannot be excluded:"
                )
            )
            for line in rep.f16_risks:
                ctx.result(f"  {line}")
        for inv in invs:
            ctx.result(
                f"invariant {inv['invariant']!r} at {inv['location']}: {inv['verdict']} ({inv['method']})"
            )
    if bad:
        raise typer.Exit(EXIT_CHECK_FAILED)
    if unknown:
        raise typer.Exit(EXIT_INCONCLUSIVE)
