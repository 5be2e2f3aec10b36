"""The prologue every command shares, written once: `@command` gives a command body
`fn(ctx, ...)` the output options (--format, --quiet, --verbose, --debug), builds its `Ctx` and
runs it inside `handle_errors` (one clear line and the documented exit code on an error);
`@command(lowering=True)` adds the target's build options too (`--target-opt KEY=VALUE` and
the onnxruntime alias flags), passed to the body as one `LoweringFlags` (`lowering=`).

Typer reads a command's parameters from its signature: the decorator appends the shared ones to
the body's own (its `ctx` parameter removed), so `--help` lists them as before.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any

import typer

from .._options import (
    AccuracyLevelOpt,
    AttentionKernelOpt,
    DebugOpt,
    F32MatmulOpt,
    FormatOpt,
    GenericOpt,
    GgufKernelsOpt,
    Int8MatmulOpt,
    LogitsOpt,
    MaxLenOpt,
    OutputFormat,
    PrepackOpt,
    QuantOpt,
    QuietOpt,
    VerboseOpt,
    WeightDTypeOpt,
)
from .._render import handle_errors, make_ctx

TargetOptOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--target-opt",
        help="A build option of the target, KEY=VALUE (repeatable); "
        "`llmir build --target T --list-options` lists them.",
        show_default=False,
    ),
]
ListOptionsFlag = Annotated[
    bool, typer.Option("--list-options", help="List the target's build options and exit.")
]
QuantBlockFlag = Annotated[
    int | None,
    typer.Option(
        "--quant-block", help="Decoders: block size for --quant [default: 32].", show_default=False
    ),
]


@dataclass(frozen=True)
class LoweringFlags:
    """The lowering options of one `llmir build` / `llmir optimize --target` call."""

    target_opt: list[str] | None = None
    quant: str | None = None
    quant_block: int | None = None
    max_len: int | None = None
    accuracy_level: int | None = None
    logits: str | None = None
    dtype: str | None = None
    prepack: str | None = None
    int8_matmul: str | None = None
    f32_matmul: str | None = None
    attention_kernel: str | None = None
    gguf_kernels: str | None = None
    generic: bool = False

    def aliases(self) -> dict[str, Any]:
        """The alias flags as `build_options` keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "target_opt"}

    def given(self) -> list[str]:
        """The flags given, as spelled ("--quant", "--target-opt")."""
        return [
            "--" + f.name.replace("_", "-")
            for f in fields(self)
            if getattr(self, f.name) not in (None, False, [])
        ]

    def options(self, module: Any, target: str) -> dict[str, Any]:
        """The lowering options for `target`, checked (llmir_core.targets.build_options)."""
        from llmir_core.targets import build_options

        return build_options(module, target, target_opts=self.target_opt or (), **self.aliases())


_OUTPUT = (
    ("fmt", FormatOpt, OutputFormat.human),
    ("quiet", QuietOpt, False),
    ("verbose", VerboseOpt, False),
    ("debug", DebugOpt, False),
)
_LOWERING = (
    ("target_opt", TargetOptOpt, None),
    ("quant", QuantOpt, None),
    ("quant_block", QuantBlockFlag, None),
    ("max_len", MaxLenOpt, None),
    ("accuracy_level", AccuracyLevelOpt, None),
    ("logits", LogitsOpt, None),
    ("dtype", WeightDTypeOpt, None),
    ("prepack", PrepackOpt, None),
    ("int8_matmul", Int8MatmulOpt, None),
    ("f32_matmul", F32MatmulOpt, None),
    ("attention_kernel", AttentionKernelOpt, None),
    ("gguf_kernels", GgufKernelsOpt, None),
    ("generic", GenericOpt, False),
)


def _params(table: tuple[tuple[str, Any, Any], ...]) -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [inspect.Parameter(n, kw, default=d, annotation=a) for n, a, d in table]


def command(
    fn: Callable[..., None] | None = None, *, lowering: bool = False, formats: bool = True
) -> Any:
    """`@command` / `@command(lowering=True)`: see the module docstring. formats=False: no
    --format (a command whose output is not a result, such as `llmir serve`)."""
    if fn is None:
        return functools.partial(command, lowering=lowering, formats=formats)
    body = fn
    sig = inspect.signature(body, eval_str=True)
    own = [p for n, p in sig.parameters.items() if n not in ("ctx", "lowering")]
    output = tuple(o for o in _OUTPUT if formats or o[0] != "fmt")
    shared = _params(_LOWERING if lowering else ()) + _params(output)
    lowering_names = [n for n, _, _ in _LOWERING] if lowering else []

    @functools.wraps(body)
    def run(**kwargs: Any) -> None:
        out = {n: kwargs.pop(n) for n, _, _ in output}
        ctx = make_ctx(**out)
        if lowering:
            kwargs["lowering"] = LoweringFlags(**{n: kwargs.pop(n) for n in lowering_names})
        with handle_errors(ctx):
            body(ctx, **kwargs)

    params = [*own, *shared]
    run.__signature__ = sig.replace(parameters=params, return_annotation=None)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run


__all__ = ["ListOptionsFlag", "LoweringFlags", "TargetOptOpt", "command"]
