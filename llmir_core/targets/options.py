"""Target build options: each target declares them (`Target.options`, a tuple of
`TargetOption`); this module parses `--target-opt KEY=VALUE` text, checks values against the
declarations (known name, kind, choice), fills in the defaults and describes them (for
`llmir build --target T --list-options`, the docs table and the manifest).

Every check error is one line naming the option as the user spelled it (`--target-opt max_len`
or an alias such as `--max-len`) and what it accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from llmir_core.errors import InputError
from llmir_core.targets.contract import TargetOption

KINDS = ("str", "int", "bool")
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
MODULE_ATTR = "llmir.target_options"  # the effective options, recorded on the lowered module


def declared(target: Any) -> tuple[TargetOption, ...]:
    """The options a target object declares (none for a target that declares none)."""
    return tuple(getattr(target, "options", ()))


def _by_name(target: Any) -> dict[str, TargetOption]:
    return {o.name: o for o in declared(target)}


def _unknown(target: Any, key: str, spelled: str) -> InputError:
    names = ", ".join(_by_name(target)) or "none"
    return InputError(
        f"{spelled}: unknown option {key!r} for target {target.name} (its options: {names})",
        hint=f"llmir build --target {target.name} --list-options",
    )


def allowed(opt: TargetOption) -> str:
    """What an option accepts, in words ("one of a, b", "an integer", "true or false")."""
    if opt.choices:
        return "one of " + ", ".join(opt.choices)
    return {"int": "an integer", "bool": "true or false"}.get(opt.kind, "a string")


def parse_value(opt: TargetOption, text: str, spelled: str) -> Any:
    """`text` (the VALUE of KEY=VALUE) as the option's kind, checked against its choices."""
    value: Any = text
    if opt.kind == "int":
        try:
            value = int(text)
        except ValueError:
            raise InputError(f"{spelled} must be {allowed(opt)}, got {text!r}") from None
    elif opt.kind == "bool":
        low = text.strip().lower()
        if low not in _TRUE + _FALSE:
            raise InputError(f"{spelled} must be true or false, got {text!r}")
        value = low in _TRUE
    return check_value(opt, value, spelled)


def check_value(opt: TargetOption, value: Any, spelled: str) -> Any:
    """A typed value (an alias flag's, or one given through the API) checked against the
    option's kind and choices."""
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(opt.kind, False)
    if not ok or (opt.choices and str(value) not in opt.choices):
        raise InputError(f"{spelled} must be {allowed(opt)}, got {value!r}")
    return value


def split_assignment(item: str) -> tuple[str, str]:
    """ "KEY=VALUE" -> (key, value); keys take '-' for '_' (max-len = max_len)."""
    key, eq, value = item.partition("=")
    key = key.strip().replace("-", "_")
    if not eq or not key:
        raise InputError(
            f"--target-opt takes KEY=VALUE, got {item!r}", hint="e.g. --target-opt max_len=4096"
        )
    return key, value.strip()


def parse_assignments(target: Any, items: Iterable[str]) -> dict[str, Any]:
    """`--target-opt` texts -> {name: typed value}, each checked against the declarations."""
    by_name = _by_name(target)
    out: dict[str, Any] = {}
    for item in items:
        key, text = split_assignment(item)
        spelled = f"--target-opt {key}"
        if key not in by_name:
            raise _unknown(target, key, "--target-opt")
        if key in out:
            raise InputError(f"{spelled} is given twice", hint="give each option once")
        out[key] = parse_value(by_name[key], text, spelled)
    return out


def check_options(
    target: Any, options: Mapping[str, Any], spelled: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The options checked against the target's declarations: every name declared, every value
    of its kind and among its choices. spelled: option name -> how the user wrote it (an alias
    flag), for the error line. A None value counts as not given (dropped)."""
    by_name = _by_name(target)
    spelled = spelled or {}
    out: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:  # through the API: not given
            continue
        say = spelled.get(key, f"--target-opt {key}")
        if key not in by_name:
            raise _unknown(target, key, say)
        out[key] = check_value(by_name[key], value, say)
    return out


def effective(target: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared option with the value a build uses: given, else its default (None where
    the module decides; the option's help says how)."""
    return {o.name: options.get(o.name, o.default) for o in declared(target)}


def describe(target: Any) -> list[dict[str, Any]]:
    """The declarations as JSON-ready rows (name, kind, default, choices, help)."""
    return [
        {
            "name": o.name,
            "kind": o.kind,
            "default": o.default,
            "choices": list(o.choices),
            "help": o.help,
        }
        for o in declared(target)
    ]


__all__ = [
    "KINDS",
    "MODULE_ATTR",
    "allowed",
    "check_options",
    "check_value",
    "declared",
    "describe",
    "effective",
    "parse_assignments",
    "parse_value",
    "split_assignment",
]
