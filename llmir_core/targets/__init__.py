"""Targets: an llmir module to an artifact a runtime loads, behind one contract (contract.py).

The target table. `TARGETS` maps each built-in target's name to its lazily imported object (a
missing runtime library matters only for that target); other packages add targets through the
`llmir.targets` entry-point group and op sets through `llmir.dialects` (read on first use; built-in
names win; a plugin that fails to load costs one line naming it and its package, and the rest
keeps working: `plugins`, `get_target`, llmir_core.dialects.registry). Each target lives in its
own folder `llmir_core/targets/<name>/` and declares its dialects, passes, options, `open` and
`open_batch`; the dialect registry (`dialect_modules`) and the pass list (`pass_classes`) are
derived from this table. Code outside `targets/` imports a target only through this module
(a ruff banned-api rule). `build` = `pipeline` (the -O2 preset, then the target's
lowering; when the module is not lowered yet) + the target's serializer; `open_artifact` (a
runner) and `open_batch_artifact` (a server's slots) check the artifact, read the manifest's
target and dispatch to its `open` / `open_batch`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmir_core.errors import InputError
from llmir_core.runtime import trace_attrs
from llmir_core.tracing import traced

if TYPE_CHECKING:  # opening an artifact needs no IR (tests/decoder/test_open_imports.py)
    from llmir_core.ir.core import Module

TARGETS: dict[str, str] = {
    "onnxruntime": "llmir_core.targets.onnxruntime.target:TARGET",
    "triton": "llmir_core.targets.triton.target:TARGET",
    "reference": "llmir_core.targets.reference.target:TARGET",
}
TARGET_GROUP = "llmir.targets"  # entry points: name = "package.module:OBJECT"
DIALECT_GROUP = "llmir.dialects"  # entry points: name = "package.module" (registers on import)
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Plugin:
    """One entry point of an installed package: a target (`llmir.targets`, value
    "module:OBJECT") or an op set (`llmir.dialects`, value "module", registering on import)."""

    group: str
    name: str
    value: str
    package: str  # the distribution that declares it (named in every problem line)

    @property
    def label(self) -> str:
        kind = "target" if self.group == TARGET_GROUP else "op set"
        return f"plugin {kind} '{self.name}' (package '{self.package}')"


_SCANS: dict[tuple[str, tuple[str, ...]], list[Plugin]] = {}


def plugins(group: str) -> list[Plugin]:
    """The installed packages' entry points in `group`, by name (the first of a repeated name).
    Read on first use (importlib.metadata, tens of ms), never at import: `llmir --help` scans
    nothing; read again when sys.path changes."""
    from importlib.metadata import entry_points

    key = (group, tuple(sys.path))
    if key not in _SCANS:
        out: dict[str, Plugin] = {}
        for ep in entry_points(group=group):
            dist = getattr(ep, "dist", None)
            package = str(dist.name) if dist is not None else "?"
            out.setdefault(ep.name, Plugin(group, ep.name, ep.value, package))
        _SCANS[key] = [out[n] for n in sorted(out)]
    return list(_SCANS[key])


_WARNED: set[str] = set()


def plugin_warning(line: str) -> None:
    """Say once per process, in one line on stderr, why a plugin is not used; llmir goes on
    without it (the other targets and ops keep working)."""
    if line not in _WARNED:
        _WARNED.add(line)
        sys.stderr.write(f"warning: {line}\n")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _plugin_targets() -> list[Plugin]:
    """The `llmir.targets` entry points that name no built-in target (a plugin cannot replace
    one: it is refused with a warning)."""
    out = []
    for p in plugins(TARGET_GROUP):
        if p.name in TARGETS:
            plugin_warning(f"{p.label} is ignored: '{p.name}' is a built-in target")
        else:
            out.append(p)
    return out


def target_specs() -> dict[str, str]:
    """Every known target: the built-in table, then the `llmir.targets` entry points."""
    return {**TARGETS, **{p.name: p.value for p in _plugin_targets()}}


def builtin_dialect_modules() -> list[str]:
    """The modules that register the built-in targets' dialects (each target's `dialects`). A
    target whose runtime library is missing still declares its ops (declaring needs none)."""
    mods = [m for name in TARGETS for m in get_target(name).dialects]
    return list(dict.fromkeys(mods))


def plugin_dialect_modules() -> list[tuple[str, str]]:
    """(module, who declares it) for the plugins' op sets: each plugin target's `dialects`, then
    every `llmir.dialects` entry point. A plugin target that fails to load is skipped with a
    warning."""
    out: list[tuple[str, str]] = []
    for p in _plugin_targets():
        try:
            t = _load_plugin(p)
        except InputError as exc:
            plugin_warning(exc.message)
            continue
        out.extend((m, p.label) for m in getattr(t, "dialects", ()))
    out.extend((p.value.partition(":")[0], p.label) for p in plugins(DIALECT_GROUP))
    return list(dict.fromkeys(out))


def dialect_modules() -> list[str]:
    """Every module that registers a target's or a plugin's ops (what the op registry imports
    on first use: llmir_core.dialects.registry)."""
    mods = builtin_dialect_modules() + [m for m, _ in plugin_dialect_modules()]
    return list(dict.fromkeys(mods))


def pass_classes() -> list[type]:
    """Every target's lowering pass classes (`llmir optimize --passes` names them). A plugin
    pass that fails to import, or whose name another pass (of core, of a target, of an earlier
    plugin) has, is left out with a warning."""
    from llmir_core.passes import CORE_PASS_CLASSES

    out: list[type] = []
    taken = {getattr(c, "name", "") for c in CORE_PASS_CLASSES}
    for name in TARGETS:
        for spec in get_target(name).passes:
            out.append(_spec_object(spec))
    taken |= {getattr(c, "name", "") for c in out}
    for p in _plugin_targets():
        try:
            classes = [_spec_object(s) for s in getattr(_load_plugin(p), "passes", ())]
        except InputError as exc:
            plugin_warning(exc.message)
            continue
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break core
            plugin_warning(f"{p.label}: its passes are not loaded: {_first_line(exc)}")
            continue
        for c in classes:
            if getattr(c, "name", "") in taken:
                plugin_warning(f"{p.label}: pass '{c.name}' is ignored: another pass has that name")
            else:
                taken.add(c.name)
                out.append(c)
    return out


def _spec_object(spec: str) -> Any:
    mod, _, attr = spec.partition(":")
    module = importlib.import_module(mod)
    return getattr(module, attr) if attr else module


def _load(name: str, spec: str) -> Any:
    try:
        return _spec_object(spec)
    except ModuleNotFoundError as exc:
        raise InputError(
            f"target '{name}' is not available here: {exc}",
            hint="install its runtime, or pick another --target",
        ) from None


# what a target object must have (contract.py's Target)
_CONTRACT = ("name", "capabilities", "lowering", "serialize", "open")


def _load_plugin(p: Plugin) -> Any:
    """The target object of a `llmir.targets` entry point, or one InputError line naming the
    plugin and its package (an import that fails, a missing object, an object that is not a
    target): no traceback, and the other targets keep working."""
    try:
        t = _spec_object(p.value)
    except Exception as exc:  # noqa: BLE001 - any failure of foreign code is the plugin's
        raise InputError(
            f"{p.label} failed to load ({p.value}): {_first_line(exc)}",
            hint=f"fix or uninstall '{p.package}'; the other targets still work",
        ) from None
    missing = [a for a in _CONTRACT if not hasattr(t, a)]
    if missing or getattr(t, "name", None) != p.name:
        why = f"lacks {', '.join(missing)}" if missing else f"is named {t.name!r}"
        raise InputError(
            f"{p.label} is not a target: {p.value} {why}",
            hint="a target has name (its entry point's name), capabilities, lowering, "
            "serialize and open (llmir_core/targets/contract.py)",
        )
    return t


def get_target(name: str) -> Any:
    """The target object registered as `name`: a built-in one, else a plugin's."""
    if name in TARGETS:
        return _load(name, TARGETS[name])
    for p in _plugin_targets():
        if p.name == name:
            return _load_plugin(p)
    known = list(target_specs())
    raise InputError(
        f"unknown target '{name}' (known: {', '.join(known)})",
        hint="use --target " + " or --target ".join(known),
    )


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
    from llmir_core.errors import BuildError

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


def open_batch_artifact(artifact_dir: str, slots: int, **options: Any) -> Any:
    """A `BatchDecoder` (llmir_core.runtime.batch_decoder) holding `slots` sequences of an
    artifact folder, from the target its manifest names, after the same check as
    `open_artifact` (inside `full_checks()`, every file hashed: what a server does)."""
    from llmir_core.artifact_check import open_checked

    target = get_target(open_checked(artifact_dir)["target"])
    return target.open_batch(artifact_dir, slots, **options)


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
    "open_batch_artifact",
    "pass_classes",
    "plugin_dialect_modules",
    "plugins",
    "target_specs",
    "read_manifest",
    "TARGETS",
]
