"""What the Playground page shows besides the chat: the artifact's IR, the optimization report,
per-pass diffs and bench results, gathered once when the server starts.

- `source`: the `.llmir` the artifact was built from (`--ir`, else the file the manifest names,
  looked for in the artifact folder and in the folder that holds it); `lowered`: `--lowered`, else the manifest's
  `lowered` (`model.lowered.llmir`, written by `llmir build`), else another `.llmir` in the artifact folder;
- `report`: a text file (`llmir optimize --report` output);
- `passes`: from a `--print-after-all --dump-dir` folder (`NN-pass.llmir` files; else an
  `llmir-dumps` folder in or beside the artifact whose last dump is `source`): each pass's
  unified diff against the module before it (the first against the input its reproduce line
  names, when that file exists, else `source`);
- `bench`: `llmir bench --format json` output (`--bench`, else a `bench.json` in or beside the
  artifact), as parsed JSON.

A file that is named but unreadable is an `InputError`; one that is merely absent is left out.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from typing import Any

from llmir_core.errors import InputError

MAX_TEXT = 4 << 20  # characters of one IR text sent to the page


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_TEXT + 1)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "\n// ... (cut: the file is longer than the Playground shows)\n"
    return text


def _find_source(art_dir: str, manifest: dict[str, Any]) -> str | None:
    name = (manifest.get("source") or {}).get("file")
    if not name:
        return None
    for folder in (art_dir, os.path.dirname(os.path.abspath(art_dir))):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None


def _body(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("//"))


def _dumps(dump_dir: str) -> list[str]:
    return sorted(f for f in os.listdir(dump_dir) if re.match(r"^\d+-.+\.llmir$", f))


def _dump_input(dump_dir: str, first: str) -> str | None:
    """The module `optimize` started from, named in the first dump's reproduce line, when it exists."""
    m = re.search(r"^//\s+llmir optimize (\S+)", first, re.M)
    if not m:
        return None
    for path in (m.group(1), os.path.join(os.path.dirname(os.path.abspath(dump_dir)), m.group(1))):
        if os.path.isfile(path):
            return path
    return None


def pass_diffs(dump_dir: str, before: str | None) -> list[dict[str, Any]]:
    """One entry per `NN-pass.llmir` dump: name, file, unified diff against the previous module
    (the first against the module `optimize` started from when its file exists, else `before`)."""
    if not os.path.isdir(dump_dir):
        raise InputError(
            f"{dump_dir}: no such folder",
            hint="--dump-dir takes the folder of `llmir optimize --print-after-all --dump-dir DIR`",
        )
    out = []
    prev, prev_name = before, "source"
    for i, f in enumerate(_dumps(dump_dir)):
        text = _read(os.path.join(dump_dir, f), "pass dump")
        start = _dump_input(dump_dir, text) if i == 0 else None
        if start is not None:
            prev, prev_name = _body(_read(start, "IR")), os.path.basename(start)
        body = _body(text)
        name = re.sub(r"^\d+-|\.llmir$", "", f)
        lines = difflib.unified_diff(
            (prev or "").splitlines(), body.splitlines(), prev_name, f, lineterm="", n=2
        )
        diff = "" if prev is None else "\n".join(lines)
        out.append({"pass": name, "file": f, "diff": diff, "changed": bool(diff)})
        prev, prev_name = body, f
    return out


def _find_dumps(art_dir: str, source: str | None) -> str | None:
    """An `llmir-dumps` folder (optimize's default) in or beside the artifact whose last dump is
    the module the artifact was built from."""
    if source is None:
        return None
    for folder in (art_dir, os.path.dirname(os.path.abspath(art_dir))):
        d = os.path.join(folder, "llmir-dumps")
        if os.path.isdir(d) and _dumps(d):
            last = _read(os.path.join(d, _dumps(d)[-1]), "pass dump")
            if _body(last).strip() == _body(source).strip():
                return d
    return None


def _find_bench(art_dir: str) -> str | None:
    """A `bench.json` in or beside the artifact that `llmir bench --format json` wrote."""
    for folder in (art_dir, os.path.dirname(os.path.abspath(art_dir))):
        path = os.path.join(folder, "bench.json")
        try:
            with open(path, encoding="utf-8") as fh:
                if "bench_schema" in json.load(fh):
                    return path
        except (OSError, ValueError, TypeError):
            continue
    return None


def collect(
    art_dir: str,
    manifest: dict[str, Any],
    *,
    ir: str | None = None,
    lowered: str | None = None,
    report: str | None = None,
    dump_dir: str | None = None,
    bench: str | None = None,
) -> dict[str, Any]:
    src_path = ir or _find_source(art_dir, manifest)
    source = _read(src_path, "IR") if src_path else None
    if lowered is None and isinstance(manifest.get("lowered"), str):
        named = os.path.join(art_dir, manifest["lowered"])  # the lowered module the build wrote
        lowered = named if os.path.isfile(named) else None
    if lowered is None:
        others = sorted(
            f
            for f in os.listdir(art_dir)
            if f.endswith(".llmir") and (src_path is None or os.path.join(art_dir, f) != src_path)
        )
        lowered = os.path.join(art_dir, others[0]) if others else None
    dump_dir = dump_dir or _find_dumps(art_dir, source)
    bench = bench or _find_bench(art_dir)
    data: dict[str, Any] = {
        "source": {"file": os.path.basename(src_path), "text": source}
        if src_path and source is not None
        else None,
        "lowered": {"file": os.path.basename(lowered), "text": _read(lowered, "lowered IR")}
        if lowered
        else None,
        "report": _read(report, "report") if report else None,
        "passes": pass_diffs(dump_dir, None if source is None else _body(source))
        if dump_dir
        else [],
        "bench": None,
        "decoder": {
            k: manifest.get("decoder", {}).get(k)
            for k in (
                "architecture",
                "layers",
                "heads",
                "kv_heads",
                "head_dim",
                "vocab",
                "max_len",
                "kv_cache",
                "quant",
                "fused_attention_layers",
            )
        },
    }
    if bench:
        try:
            data["bench"] = json.loads(_read(bench, "bench JSON"))
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{bench}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})",
                hint="pass the output of `llmir bench ARTIFACT --format json`",
            ) from None
    return data


__all__ = ["collect", "pass_diffs"]
