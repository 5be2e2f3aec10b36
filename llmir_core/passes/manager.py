"""The pass manager: verify, run each pass, verify again (naming the pass that broke it), dump,
time, and optionally translation-validate each pass: a pass `not equivalent` stops the
pipeline; one `inconclusive` is recorded (`PipelineResult.inconclusive`) and the pipeline goes
on, so the command can write its output and exit 3; `within bound` passes.

`run_pipeline` returns a `PipelineResult` holding the module, one `PassRun` per pass (time,
op counts, validation verdict), the rewrites and rejections, and before/after metrics. A
pipeline that leaves the module lowered for a target records its passes on it
(`llmir.pipeline`, see `record_pipeline`); functions keep their output names
(`keep_output_names`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llmir_core import tracing
from llmir_core.errors import CheckFailed, InputError
from llmir_core.ir.core import Module
from llmir_core.ir.printer import print_module
from llmir_core.smt.verdicts import EQUIVALENT, INCONCLUSIVE, NOT_EQUIVALENT, WITHIN_BOUND
from llmir_core.verifier import verify

from .base import PassContext, clone_module
from .metrics import Metrics, measure
from .pipeline import spec_of


@dataclass
class PassRun:
    index: int
    name: str
    spec: str
    changed: bool
    seconds: float
    ops_before: int
    ops_after: int
    rewrites: int
    validation: dict[str, Any] | None = None
    dump: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "pass": self.name,
            "spec": self.spec,
            "changed": self.changed,
            "seconds": round(self.seconds, 6),
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "rewrites": self.rewrites,
            "validation": self.validation,
            "dump": self.dump,
        }


@dataclass
class PipelineResult:
    module: Module
    runs: list[PassRun]
    ctx: PassContext
    before: Metrics
    after: Metrics
    validation_seconds: float = 0.0
    failed_validation: dict[str, Any] | None = None  # the first pass `not equivalent`: stops
    extra: dict[str, Any] = field(default_factory=dict)
    inconclusive: list[dict[str, Any]] = field(default_factory=list)  # passes that ran on

    @property
    def verdict(self) -> str | None:
        """The pipeline's verdict, the weakest of its passes' (None: not validated): not
        equivalent < inconclusive < within bound < equivalent."""
        vs = [r.validation.get("verdict") for r in self.runs if r.validation is not None]
        if not vs:
            return None
        for v in (NOT_EQUIVALENT, INCONCLUSIVE, WITHIN_BOUND):
            if v in vs:
                return v
        return EQUIVALENT

    def to_json(self) -> dict[str, Any]:
        return {
            "passes": [r.to_json() for r in self.runs],
            "rewrites": [vars(r) for r in self.ctx.rewrites],
            "rejections": [vars(r) for r in self.ctx.rejections],
            "before": self.before.to_json(),
            "after": self.after.to_json(),
            "validation_seconds": round(self.validation_seconds, 6),
            "verdict": self.verdict,
        }


Validator = Callable[[Module, Module, list[Any], str], dict[str, Any]]


def _check(module: Module, after: str | None) -> None:
    errors = [d for d in verify(module, check_files=False) if d.severity == "error"]
    if not errors:
        return
    if after is None:
        raise InputError(
            "the input module does not verify: " + errors[0].header(),
            diagnostics=errors,
            hint="run `llmir verify` on the input and fix it first",
        )
    raise CheckFailed(
        f"pass '{after}' left the module invalid: {errors[0].message}",
        diagnostics=errors,
        hint=f"this is a bug in pass '{after}'; rerun with --print-after={after} "
        "to see its output, and --passes without it to work around it",
    )


def run_pipeline(
    module: Module,
    passes: list[Any],
    *,
    allow_unproved: bool = False,
    validator: Validator | None = None,
    dump_dir: str | None = None,
    print_after: set[str] | None = None,
    print_after_all: bool = False,
    command: str = "llmir optimize",
    dims: dict[str, int] | None = None,
    span_name: str = "optimize",
) -> PipelineResult:
    """Run `passes` over module in order (one trace span `span_name`, a child `pass NAME` each;
    `build` names its lowering pipeline's span `lower`)."""
    with tracing.span(
        span_name,
        {
            "llmir.module": module.name,
            "llmir.passes": [p.name for p in passes],
            "llmir.ops": module.op_count(),
        },
    ) as sp:
        res = _run_pipeline(
            module,
            passes,
            allow_unproved,
            validator,
            dump_dir,
            print_after,
            print_after_all,
            command,
            dims,
        )
        sp.set({"llmir.ops.after": res.module.op_count(), "llmir.rewrites": len(res.ctx.rewrites)})
        return res


def _output_names(fn: Any) -> list[str]:
    return [str(n) for n in fn.attrs.get("output_names") or [v.name for v in fn.outputs]]


def keep_output_names(module: Module, before: list[list[str]]) -> None:
    """A function's outputs keep the names they had before the pipeline (what an artifact calls
    them): a pass that returns another value (canonicalize folding an identity) changes the
    returned value's name, so the old names are pinned in the function's `output_names`."""
    for fn, names in zip(module.functions, before):
        if _output_names(fn) != names and len(names) == len(fn.outputs):
            fn.attrs["output_names"] = tuple(names)


def record_pipeline(module: Module, prior: Any, specs: list[str]) -> None:
    """A module a pipeline leaves lowered for a target (its `target` attribute set) records the
    passes that ran as `llmir.pipeline` (their `--passes` specs; the artifact's manifest copies
    it): appended to the record it had when it was lowered already, replacing it otherwise."""
    if module.attrs.get("target") is None or not specs:
        return
    before = [str(s) for s in prior] if isinstance(prior, (list, tuple)) else []
    module.attrs["llmir.pipeline"] = before + specs


def _run_pipeline(
    module: Module,
    passes: list[Any],
    allow_unproved: bool,
    validator: Validator | None,
    dump_dir: str | None,
    print_after: set[str] | None,
    print_after_all: bool,
    command: str,
    dims: dict[str, int] | None,
) -> PipelineResult:
    _check(module, None)
    prior = module.attrs.get("llmir.pipeline") if module.attrs.get("target") is not None else None
    interface = [_output_names(fn) for fn in module.functions]
    ctx = PassContext(allow_unproved=allow_unproved)
    before = measure(module, dims)
    runs: list[PassRun] = []
    tv_seconds = 0.0
    failed = None
    unproved: list[dict[str, Any]] = []
    specs: list[str] = []
    for i, p in enumerate(passes, 1):
        ctx.current = p.name
        ctx.instances = []
        snapshot = clone_module(module) if validator is not None else None
        n_before = module.op_count()
        n_rw = len(ctx.rewrites)
        with tracing.span(f"pass {p.name}", {"llmir.pass": p.name, "llmir.pass.index": i}) as sp:
            t0 = time.perf_counter()
            changed = bool(p.run(module, ctx))
            dt = time.perf_counter() - t0
            _check(module, p.name)
            specs.append(spec_of(p))
            run = PassRun(
                i,
                p.name,
                specs[-1],
                changed,
                dt,
                n_before,
                module.op_count(),
                len(ctx.rewrites) - n_rw,
            )
            sp.set(
                {
                    "llmir.pass.spec": run.spec,
                    "llmir.pass.changed": changed,
                    "llmir.ops.before": n_before,
                    "llmir.ops.after": run.ops_after,
                    "llmir.rewrites": run.rewrites,
                }
            )
        if validator is not None and snapshot is not None:
            t1 = time.perf_counter()
            run.validation = (
                validator(snapshot, module, list(ctx.instances), p.name)
                if changed
                else {"verdict": EQUIVALENT, "method": "unchanged", "seconds": 0.0}
            )
            tv_seconds += time.perf_counter() - t1
            verdict = run.validation.get("verdict")
            if verdict == NOT_EQUIVALENT and failed is None:
                failed = {"pass": p.name, **run.validation}
            elif verdict not in (EQUIVALENT, WITHIN_BOUND):
                unproved.append({"pass": p.name, **run.validation})
        if dump_dir is not None and (print_after_all or (print_after and p.name in print_after)):
            run.dump = _dump(module, dump_dir, i, p.name, command, specs)
        runs.append(run)
        if failed is not None:
            break
    if failed is None:
        keep_output_names(module, interface)
        record_pipeline(module, prior, specs)
    res = PipelineResult(module, runs, ctx, before, measure(module, dims), tv_seconds, failed)
    res.inconclusive = unproved
    return res


def _dump(module: Module, dump_dir: str, i: int, name: str, command: str, specs: list[str]) -> str:
    from llmir_core.fileio import write_text_atomic

    os.makedirs(dump_dir, exist_ok=True)
    path = os.path.join(dump_dir, f"{i:02d}-{name}.llmir")
    header = (
        f"// after pass {i} ({name}); reproduce with:\n//   {command} --passes {','.join(specs)}\n"
    )
    write_text_atomic(path, header + print_module(module))
    return path
