"""What the Playground page shows besides the chat: the artifact's IR, the optimization report,
per-pass diffs and bench results, gathered once when the server starts.

- `source`: the `.llmir` the artifact was built from (`--ir`, else the file the manifest names,
  looked for in the artifact folder and in the folder that holds it); `lowered`: `--lowered`, else another
  `.llmir` in the artifact folder;
- `report`: a text file (`llmir optimize --report` output);
- `passes`: from a `--print-after-all --dump-dir` folder (`NN-pass.llmir` files): each pass's
  unified diff against the module before it (the first against `source` when given);
- `bench`: `llmir bench --format json` output, as parsed JSON.

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


def pass_diffs(dump_dir: str, before: str | None) -> list[dict[str, Any]]:
    """One entry per `NN-pass.llmir` dump: name, file, unified diff against the previous module."""
    if not os.path.isdir(dump_dir):
        raise InputError(
            f"{dump_dir}: no such folder",
            hint="--dump-dir takes the folder of `llmir optimize --print-after-all --dump-dir DIR`",
        )
    dumps = sorted(f for f in os.listdir(dump_dir) if re.match(r"^\d+-.+\.llmir$", f))
    out = []
    prev, prev_name = before, "source"
    for f in dumps:
        text = _read(os.path.join(dump_dir, f), "pass dump")
        body = "\n".join(line for line in text.splitlines() if not line.startswith("//"))
        name = re.sub(r"^\d+-|\.llmir$", "", f)
        diff = (
            ""
            if prev is None
            else "\n".join(
                difflib.unified_diff(
                    prev.splitlines(), body.splitlines(), prev_name, f, lineterm="", n=2
                )
            )
        )
        out.append({"pass": name, "file": f, "diff": diff, "changed": bool(diff)})
        prev, prev_name = body, f
    return out


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
    if lowered is None:
        others = sorted(
            f
            for f in os.listdir(art_dir)
            if f.endswith(".llmir") and (src_path is None or os.path.join(art_dir, f) != src_path)
        )
        lowered = os.path.join(art_dir, others[0]) if others else None
    data: dict[str, Any] = {
        "source": {"file": os.path.basename(src_path), "text": source}
        if src_path and source is not None
        else None,
        "lowered": {"file": os.path.basename(lowered), "text": _read(lowered, "lowered IR")}
        if lowered
        else None,
        "report": _read(report, "report") if report else None,
        "passes": pass_diffs(dump_dir, _strip_comments(source)) if dump_dir else [],
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


def _strip_comments(text: str | None) -> str | None:
    return (
        None if text is None else "\n".join(x for x in text.splitlines() if not x.startswith("//"))
    )


__all__ = ["collect", "pass_diffs"]
