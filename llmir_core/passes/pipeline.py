"""Pass pipelines: `-O0..-O3` presets and `--passes a,b{opt=v}` text, with errors that list the
valid names and options."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from llmir_core.errors import InputError

from . import PASSES, PRESETS


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise InputError(
            f"unbalanced braces in pipeline {text!r}",
            hint="write options as name{opt=value,opt2=value}",
        )
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _convert(raw: str, default: Any, where: str) -> Any:
    if isinstance(default, bool):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise InputError(f"{where}: expected true or false, got {raw!r}")
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise InputError(f"{where}: expected an integer, got {raw!r}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise InputError(f"{where}: expected a number, got {raw!r}") from None
    return raw


def parse_pipeline(text: str) -> list[Any]:
    """`canonicalize,constant-fold{max_elements=16}` -> pass instances."""
    out = []
    for item in _split_top(text):
        name, opts = item, ""
        if "{" in item:
            if not item.endswith("}"):
                raise InputError(f"bad pass spec {item!r}", hint="write options as name{opt=value}")
            name, opts = item[: item.index("{")].strip(), item[item.index("{") + 1 : -1]
        cls = PASSES.get(name)
        if cls is None:
            close = difflib.get_close_matches(name, list(PASSES), n=1)
            raise InputError(
                f"unknown pass {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                hint="valid passes: " + ", ".join(PASSES) + " (see `llmir optimize --list`)",
            )
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for kv in (p for p in opts.split(",") if p.strip()):
            if "=" not in kv:
                raise InputError(f"{name}: option {kv.strip()!r} needs a value (opt=value)")
            k, v = (s.strip() for s in kv.split("=", 1))
            key = k.replace("-", "_")
            if key not in fields:
                valid = ", ".join(fields) or "none"
                raise InputError(
                    f"pass {name!r} has no option {k!r}", hint=f"valid options: {valid}"
                )
            kwargs[key] = _convert(v, fields[key], f"{name}{{{k}}}")
        out.append(cls(**kwargs))
    return out


def preset(level: int) -> list[Any]:
    key = f"O{level}"
    if key not in PRESETS:
        raise InputError(f"unknown optimization level -O{level}", hint="use -O0, -O1, -O2 or -O3")
    return [PASSES[n]() for n in PRESETS[key]]


def spec_of(p: Any) -> str:
    """The `--passes` text that recreates pass instance p."""
    opts = []
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        if v != f.default:
            opts.append(f"{f.name}={str(v).lower() if isinstance(v, bool) else v}")
    return p.name + ("{" + ",".join(opts) + "}" if opts else "")


def describe_passes() -> list[dict[str, Any]]:
    return [
        {
            "name": n,
            "summary": getattr(c, "summary", ""),
            "options": {f.name: f.default for f in dataclasses.fields(c)},
            "doc": (
                c.__module__ and __import__(c.__module__, fromlist=["x"]).__doc__ or ""
            ).strip(),
        }
        for n, c in PASSES.items()
    ]
