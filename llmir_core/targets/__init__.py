"""Targets: an llmir module to an artifact a runtime loads, behind one contract (contract.py).

The target table. `TARGETS` maps each built-in target's name to its lazily imported object (a
missing runtime library matters only for that target); other packages add targets through the
`llmir.targets` entry-point group and op sets through `llmir.dialects`. Each target lives in its
own folder `llmir_core/targets/<name>/` and declares its dialects, passes, options, `open` and
`open_batch`; the dialect registry (`dialect_modules`) and the pass list (`pass_classes`) are
derived from this table. Code outside `targets/` imports a target only through this module
(a ruff banned-api rule). `build` = `pipeline` (the -O2 preset, then the target's
lowering; when the module is not lowered yet) + the target's serializer; `open_artifact` reads
the manifest's target and dispatches.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmir_core.errors import InputError
from llmir_core.runtime import trace_attrs
from llmir_core.tracing import traced

if TYPE_CHECKING:  # opening an artifact needs no IR (tests/decoder/test_open_imports.py)
    from llmir_core.ir.core import Module

TARGETS: dict[str, str] = {
    "onnxruntime": "llmir_core.targets.onnxruntime.target:TARGET",
    "triton": "llmir_core.targets.triton.target:TARGET",
}
TARGET_GROUP = "llmir.targets"  # entry points: name = "package.module:OBJECT"
DIALECT_GROUP = "llmir.dialects"  # entry points: name = "package.module" (registers on import)
MANIFEST = "manifest.json"


def _entry_points(group: str) -> dict[str, str]:
    """name -> "module:attr" of the installed packages' entry points in `group` (built-in names
    win: a plugin cannot replace a built-in target)."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=group)}


def target_specs() -> dict[str, str]:
    """Every known target: the built-in table, then the `llmir.targets` entry points."""
    specs = dict(TARGETS)
    for name, value in _entry_points(TARGET_GROUP).items():
        specs.setdefault(name, value)
    return specs


def dialect_modules() -> list[str]:
    """The modules that register the targets' dialects (each built-in target's `dialects`,
    then every `llmir.dialects` entry point): what the op registry imports on first use. A
    target whose runtime library is missing still declares its ops (declaring needs none)."""
    mods: list[str] = []
    for name in TARGETS:
        mods.extend(get_target(name).dialects)
    for name, value in sorted(_entry_points(TARGET_GROUP).items()):
        if name not in TARGETS:
            mods.extend(getattr(_load(name, value), "dialects", ()))
    mods.extend(v.partition(":")[0] for _, v in sorted(_entry_points(DIALECT_GROUP).items()))
    return list(dict.fromkeys(mods))


def pass_classes() -> list[type]:
    """Every target's lowering pass classes (`llmir optimize --passes` names them)."""
    out: list[type] = []
    for name in target_specs():
        for spec in getattr(get_target(name), "passes", ()):
            mod, _, attr = spec.partition(":")
            out.append(getattr(importlib.import_module(mod), attr))
    return out


def _load(name: str, spec: str) -> Any:
    mod, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(mod)
    except ModuleNotFoundError as exc:
        raise InputError(
            f"target '{name}' is not available here: {exc}",
            hint="install its runtime, or pick another --target",
        ) from None
    return getattr(module, attr) if attr else module


def get_target(name: str) -> Any:
    """The target object registered as `name`."""
    spec = TARGETS.get(name) or target_specs().get(name)
    if spec is None:
        raise InputError(
            f"unknown target '{name}' (known: {', '.join(target_specs())})",
            hint="use --target " + " or --target ".join(target_specs()),
        )
    return _load(name, spec)


DEFAULT_OPT_LEVEL = 2  # the preset `llmir build` runs before lowering (`llmir optimize`'s default)
# the flags `llmir build` and `llmir optimize --target` took before `--target-opt`, kept as
# aliases of the onnxruntime options of the same meaning: option name -> flag
ALIASES = {
    "quant": "--quant",
    "quant_block": "--quant-block",
    "max_len": "--max-len",
    "accuracy_level": "--accuracy-level",
    "last_logits": "--logits",
    "dtype": "--dtype",
    "prepack": "--prepack",
    "int8_matmul": "--int8-matmul",
    "f32_matmul": "--f32-matmul",
    "attention_kernel": "--attention-kernel",
    "gguf_kernels": "--gguf-kernels",
    "generic": "--generic",
}
F32_MATMUL = {"llmir": "auto", "mlas": "ort"}  # --f32-matmul -> lower-ort-weight-dtype f32_kernel


def alias_options(**flags: Any) -> dict[str, Any]:
    """The alias flags given (None = not given; `generic` False = not given) as options:
    --logits last|all is `last_logits`, --f32-matmul llmir|mlas is `f32_matmul` auto|ort."""
    logits, f32 = flags.pop("logits", None), flags.pop("f32_matmul", None)
    if logits not in (None, "last", "all"):
        raise InputError(f"--logits must be 'last' or 'all', got {logits!r}")
    if f32 not in (None, *F32_MATMUL):
        raise InputError(
            f"--f32-matmul must be 'llmir' or 'mlas', got {f32!r}",
            hint="llmir: llmir's kernel reading 16-row panels in place (the default); mlas: "
            "onnxruntime's FusedMatMul, repacked when the artifact opens",
        )
    out = {k: v for k, v in flags.items() if v is not None and v is not False}
    if logits is not None:
        out["last_logits"] = logits == "last"
    if f32 is not None:
        out["f32_matmul"] = F32_MATMUL[f32]
    return out


def build_options(
    module: Module,
    target: str,
    *,
    target_opts: Sequence[str] = (),
    quant: str | None = None,
    quant_block: int | None = None,
    max_len: int | None = None,
    accuracy_level: int | None = None,
    logits: str | None = None,
    dtype: str | None = None,
    generic: bool = False,
    prepack: str | None = None,
    int8_matmul: str | None = None,
    f32_matmul: str | None = None,
    attention_kernel: str | None = None,
    gguf_kernels: str | None = None,
) -> dict[str, Any]:
    """The lowering options a build was given (only those given): `--target-opt KEY=VALUE`
    texts and the alias flags (--quant, --max-len, ...; ALIASES), checked against the target's
    declarations (known name, kind, choice: llmir_core.targets.options) and then by the
    target's own `check_options(module, options)` hook (onnxruntime: decoder options need a
    decoder module)."""
    from llmir_core.targets.options import check_options, parse_assignments

    t = get_target(target)
    aliased = alias_options(
        quant=quant,
        quant_block=quant_block,
        max_len=max_len,
        accuracy_level=accuracy_level,
        logits=logits,
        dtype=dtype,
        generic=generic,
        prepack=prepack,
        int8_matmul=int8_matmul,
        f32_matmul=f32_matmul,
        attention_kernel=attention_kernel,
        gguf_kernels=gguf_kernels,
    )
    options = check_options(t, aliased, ALIASES)
    extra = parse_assignments(t, target_opts)
    twice = sorted(set(options) & set(extra))
    if twice:
        raise InputError(
            f"{ALIASES[twice[0]]} and --target-opt {twice[0]} both given",
            hint="give each option once",
        )
    options.update(extra)
    hook = getattr(t, "check_options", None)
    if hook is not None:
        hook(module, options)
    return options


def pipeline(
    target: str = "onnxruntime",
    options: Mapping[str, Any] | None = None,
    opt_level: int | None = None,
) -> list[Any]:
    """The passes that lower an unlowered module for `target`: the -O`opt_level` preset (default:
    the target's `opt_level` when it declares one, else DEFAULT_OPT_LEVEL) then the target's
    lowering. What `llmir build` runs, and what `llmir optimize -O<level> --target` runs, so the
    two give the same lowered module."""
    from llmir_core.passes.pipeline import preset
    from llmir_core.targets.options import check_options

    t = get_target(target)
    level = opt_level if opt_level is not None else getattr(t, "opt_level", DEFAULT_OPT_LEVEL)
    return preset(int(level)) + list(t.lowering(check_options(t, options or {})))


def record_options(module: Module, target: str, options: Mapping[str, Any]) -> None:
    """Record on `module` (before its lowering) every option `target` declares with the value
    the build uses (`llmir.target_options`; the manifest copies it): `llmir build` and `llmir
    optimize --target` record the same, so their artifacts stay byte-identical."""
    from llmir_core.targets.options import MODULE_ATTR, effective

    module.attrs[MODULE_ATTR] = effective(get_target(target), options)


def lower(
    module: Module,
    target: str = "onnxruntime",
    options: Mapping[str, Any] | None = None,
    *,
    source_path: str | None = None,
    opt_level: int | None = None,
) -> Module:
    """The module lowered for `target` (a copy; through its printed text, so building it gives
    what building the saved `llmir optimize --target` output gives)."""
    from llmir_core.ir.parser import parse_module

    text = lower_text(module, target, options, source_path=source_path, opt_level=opt_level)
    return parse_module(text, module.source or "<lowered>")


def lower_text(
    module: Module,
    target: str = "onnxruntime",
    options: Mapping[str, Any] | None = None,
    *,
    source_path: str | None = None,
    opt_level: int | None = None,
) -> str:
    """The printed text of `module` run through `pipeline(target, options, opt_level)` (what
    `lower` parses back)."""
    from llmir_core.ir.printer import print_module
    from llmir_core.passes.base import clone_module
    from llmir_core.passes.manager import run_pipeline
    from llmir_core.targets.onnxruntime.lower_module import source_record

    passes = pipeline(target, options, opt_level)
    m = clone_module(module)
    m.attrs.setdefault("llmir.source", source_record(module, source_path))
    record_options(m, target, options or {})
    res = run_pipeline(m, passes, span_name="lower")
    return print_module(res.module)


@traced("build", trace_attrs.build_args, trace_attrs.built)
def build(
    module: Module,
    out_dir: str,
    target: str = "onnxruntime",
    *,
    source_path: str | None = None,
    options: Mapping[str, Any] | None = None,
    opt_level: int | None = None,
) -> dict[str, Any]:
    """Lower (unless the module is lowered for `target` already) and serialize; the manifest.

    An unlowered module runs `pipeline(target, options, opt_level)`: the -O2 preset by default,
    then the target's lowering, so `build` of a module and `build` of its `llmir optimize -O2
    --target` output give byte-identical artifacts. A lowered module (its `target` attribute
    set) is only serialized; options and opt_level were fixed when it was lowered. The lowered
    module is parsed back from its printed text, which goes to the serializer as
    `lowered_text` (written into the artifact, so the `llmir.line` tags of its nodes name lines
    of a real file)."""
    from llmir_core.ir.parser import parse_module
    from llmir_core.ir.printer import print_module

    t = get_target(target)
    lowered_for = module.attrs.get("target")
    if lowered_for is not None and lowered_for != t.name:
        raise InputError(
            f"module @{module.name} is lowered for '{lowered_for}', not '{t.name}'",
            hint=f"build it with --target {lowered_for}, or lower the unlowered module",
        )
    if lowered_for is None:
        lowered_text = lower_text(
            module, t.name, options, source_path=source_path, opt_level=opt_level
        )
    elif options or opt_level is not None:
        fixed = sorted(options or ()) + (["-O"] if opt_level is not None else [])
        raise InputError(
            f"module @{module.name} is already lowered for {t.name}: build options "
            f"({', '.join(fixed)}) were fixed when it was lowered",
            hint="pass them to `llmir optimize --target` instead",
        )
    else:  # printed again, so both ways give the same artifact (and lines in the same text)
        lowered_text = print_module(module)
    module = parse_module(lowered_text, module.source or "<lowered>")
    from llmir_core.targets.onnxruntime.onnx_lower import BuildError

    try:
        return dict(
            t.serialize(module, out_dir, source_path=source_path, lowered_text=lowered_text)
        )
    except BuildError as exc:
        src = source_path or module.source
        if not src or exc.message.startswith(src) or exc.diagnostics:
            raise
        raise BuildError(f"{src}: {exc.message}", hint=exc.hint) from None  # name the file built


def read_manifest(artifact_dir: str) -> dict[str, Any]:
    """The artifact's manifest with its shape checked (llmir_core.artifact_check); no hashing."""
    from llmir_core.artifact_check import read_manifest as read_checked_shape

    return read_checked_shape(artifact_dir)


@traced("load", after=trace_attrs.loaded)  # tracing
def open_artifact(artifact_dir: str, **options: Any) -> Any:
    """The runner of an artifact folder, from the target its manifest names. The one place an
    artifact is checked against its manifest (sizes; sha256 when changed or inside
    `full_checks()`) before its target opens it."""
    from llmir_core.artifact_check import open_checked

    return get_target(open_checked(artifact_dir)["target"]).open(artifact_dir, **options)


__all__ = [
    "build",
    "build_options",
    "alias_options",
    "record_options",
    "ALIASES",
    "pipeline",
    "DEFAULT_OPT_LEVEL",
    "lower",
    "lower_text",
    "dialect_modules",
    "get_target",
    "open_artifact",
    "pass_classes",
    "target_specs",
    "read_manifest",
    "TARGETS",
]
