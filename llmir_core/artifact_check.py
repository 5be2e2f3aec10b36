"""An artifact folder checked against its manifest before `run` or `bench` loads it.

`llmir build` records every file's size and sha256 in `manifest.json`. Before a session opens,
`check_artifact(art_dir)`:

- reads the manifest and validates it against its versioned JSON schema
  (`llmir_core/runtime/manifest.schema.json`) before any field is used, then checks what a
  schema cannot state (file names stay inside the folder, the model file is listed, max_len
  within context_length): any violation is one line naming the field, exit 2;
- always stats every listed file: it exists, is a file, and has the recorded size (cheap);
- hashes every listed file and compares with the recorded sha256 when the files or the manifest
  changed since the last successful check, or when asked (`--verify-artifact`); a mismatch is a
  failed check (exit 1) naming the file;
- for a decoder, checks the context fields (`max_len`, `context_length`) against the rotary
  tables in `model.onnx`, so an edited manifest gets a line naming its field instead of an
  onnxruntime error mid-generation.

A successful hash is recorded in `$LLMIR_HOME/artifact-checks.json` (keyed by the folder's real
path, with the manifest's sha256 and each file's size, mtime and inode), never in the artifact
folder itself, so a check never changes what it checks. What the record cannot see: an edit
that keeps a file's size, mtime and inode (bytes rewritten in place, the mtime set back), or a
file changed after the check while a session runs. `llmir run` accepts that for speed
(`--verify-artifact` hashes anyway); `llmir serve` hashes every file at each start
(`full_checks`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from llmir_core.errors import CheckFailed, InputError
from llmir_core.fileio import read_json, sha256_file

MANIFEST = "manifest.json"
STATE_FILE = "artifact-checks.json"
_REBUILD = "rebuild the artifact with `llmir build`"
_MAX_STATE = 256  # artifacts remembered
_FULL: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "llmir_full_artifact_check", default=False
)


@contextlib.contextmanager
def full_checks(on: bool = True) -> Iterator[None]:
    """Within the block, every artifact opened is hashed in full (`--verify-artifact`)."""
    token = _FULL.set(on)
    try:
        yield
    finally:
        _FULL.reset(token)


@dataclass
class CheckReport:
    """What `check_artifact` did: the files it stat'ed and hashed."""

    files: list[str] = field(default_factory=list)
    hashed: list[str] = field(default_factory=list)


def _fail(path: str, key: str, message: str) -> InputError:
    return InputError(f"{path}: field '{key}' {message}", hint=_REBUILD)


def read_manifest(art_dir: str) -> dict[str, Any]:
    """The manifest as a dict, with the fields a runtime reads checked for type."""
    path = os.path.join(art_dir, MANIFEST)
    if not os.path.isdir(art_dir):
        raise InputError(
            f"{art_dir}: not a folder", hint="pass an artifact folder built by `llmir build`"
        )
    if not os.path.exists(path):
        raise InputError(
            f"{art_dir}: no {MANIFEST} (not an llmir artifact folder)",
            hint="build one with `llmir build MODEL.llmir --target onnxruntime -o DIR`",
        )
    data = read_json(path, hint=_REBUILD)
    if not isinstance(data, dict):
        raise InputError(f"{path}: must be a JSON object, got {type(data).__name__}", hint=_REBUILD)
    _check_shape(path, data)
    return data


SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "runtime", "manifest.schema.json")


@functools.cache
def manifest_schema() -> dict[str, Any]:
    """The manifest's JSON schema (llmir_core/runtime/manifest.schema.json, shipped in the package)."""
    with open(SCHEMA_FILE, encoding="utf-8") as fh:
        schema: dict[str, Any] = json.load(fh)
    return schema


def _check_shape(path: str, m: dict[str, Any]) -> None:
    """The manifest against its schema (one line naming the first offending field), then the
    checks a schema cannot state."""
    from llmir_core.json_schema import path_text, validate

    errors = validate(m, manifest_schema())
    if errors:
        first = errors[0]
        raise InputError(f"{path}: field '{path_text(first.path)}': {first.message}", hint=_REBUILD)
    model = m.get("model", "model.onnx")
    if not _plain_name(model):
        raise _fail(path, "model", f"must name a file in the artifact folder, got {model!r:.60}")
    for name in m["files"]:
        if not _plain_name(name):
            raise _fail(path, f"files.{name}", "names a file outside the artifact folder")
    if model not in m["files"]:
        raise _fail(path, "files", f"does not list the model file {model!r}")
    dec = m.get("decoder")
    if dec is None:
        return
    for key in ("tokenizer", "chat_template"):
        v = dec.get(key)
        name = v.get("file") if isinstance(v, dict) else v
        if isinstance(name, str) and not _plain_name(name):
            raise _fail(path, f"decoder.{key}", "must name a file in the artifact folder")
    if (
        isinstance(dec.get("max_len"), int)
        and isinstance(dec.get("context_length"), int)
        and dec["max_len"] > dec["context_length"]
    ):
        raise _fail(
            path,
            "decoder.max_len",
            f"is {dec['max_len']}, more than decoder.context_length ({dec['context_length']})",
        )


def _plain_name(name: str) -> bool:
    """A relative path that stays inside the folder."""
    if not name or os.path.isabs(name) or "\\" in name or "\0" in name:
        return False
    return ".." not in name.split("/")


# -- integrity ----------------------------------------------------------------------------------


def _state_path() -> str:
    return os.path.join(_llmir_home(), STATE_FILE)


def _llmir_home() -> str:
    """`llmir_core.registry.home.llmir_home()`, without importing the registry package (its
    __init__ loads the index, pull and lock-file modules: ~0.1 s of CPU on every artifact
    open). tests/inputs/test_artifacts.py checks that the two agree."""
    explicit = os.environ.get("LLMIR_HOME")
    if explicit:
        return os.path.expanduser(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = os.path.expanduser(xdg) if xdg else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llmir")


def _load_state() -> dict[str, Any]:
    try:
        with open(_state_path(), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_state(state: dict[str, Any]) -> None:
    """Best effort: a read-only LLMIR_HOME only means the next run hashes again."""
    from llmir_core.fileio import atomic_write

    if len(state) > _MAX_STATE:
        for key in sorted(state, key=lambda k: state[k].get("at", 0))[: len(state) - _MAX_STATE]:
            del state[key]
    with contextlib.suppress(OSError, InputError):
        os.makedirs(os.path.dirname(_state_path()), exist_ok=True)
        with atomic_write(_state_path(), "w") as fh:
            json.dump(state, fh)


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def check_artifact(
    art_dir: str, manifest: dict[str, Any] | None = None, *, full: bool = False
) -> CheckReport:
    """Check the artifact's files against its manifest (see the module docstring); raise
    CheckFailed (exit 1) naming the first file that differs, InputError (exit 2) when one is missing."""
    m = manifest if manifest is not None else read_manifest(art_dir)
    mpath = os.path.join(art_dir, MANIFEST)
    report = CheckReport()
    stats: dict[str, list[int]] = {}
    for name, info in m["files"].items():
        p = os.path.join(art_dir, name)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise InputError(f"{p}: missing (listed in {mpath})", hint=_REBUILD) from None
        except OSError as exc:
            raise InputError(f"{p}: cannot read: {exc.strerror}", hint=_REBUILD) from None
        if not os.path.isfile(p):
            raise InputError(f"{p}: not a file (listed in {mpath})", hint=_REBUILD)
        if st.st_size != info["bytes"]:
            raise CheckFailed(
                f"{p}: {st.st_size} bytes, but {mpath} records {info['bytes']}: the "
                "artifact was changed or damaged after it was built",
                hint=_REBUILD,
            )
        stats[name] = _stat_key(st)
        report.files.append(name)
    key = os.path.realpath(art_dir)
    manifest_sha = sha256_file(mpath) if os.path.isfile(mpath) else ""
    state = _load_state()
    seen = state.get(key)
    if (
        not full
        and isinstance(seen, dict)
        and seen.get("manifest") == manifest_sha
        and seen.get("files") == stats
    ):
        return report
    for name, info in m["files"].items():
        p = os.path.join(art_dir, name)
        digest = sha256_file(p)
        report.hashed.append(name)
        if digest != info["sha256"]:
            raise CheckFailed(
                f"{p}: sha256 {digest}, but {mpath} records {info['sha256']}: the "
                "artifact was changed or damaged after it was built",
                hint=_REBUILD,
            )
    import time

    state[key] = {"manifest": manifest_sha, "files": stats, "at": time.time()}
    _save_state(state)
    return report


def check_decoder_context(art_dir: str, manifest: dict[str, Any]) -> None:
    """The positions the runtime will use (`max_len`, else `context_length`) fit the rotary
    tables baked into model.onnx."""
    dec = manifest.get("decoder")
    if not isinstance(dec, dict):
        return
    field_name = "max_len" if isinstance(dec.get("max_len"), int) else "context_length"
    want = dec.get(field_name)
    if not isinstance(want, int):
        return
    rows = _rotary_rows(os.path.join(art_dir, manifest.get("model", "model.onnx")))
    if rows is not None and want > rows:
        raise InputError(
            f"{os.path.join(art_dir, MANIFEST)}: field 'decoder.{field_name}' is {want}, "
            f"but the model's rotary tables cover {rows} positions",
            hint=_REBUILD,
        )


def _rotary_rows(model_path: str) -> int | None:
    """Rows of a built decoder's cos_cache: a stored table's initializer dims, or the declared
    shape (value_info) of a table the graph computes at load (None when there is none, or the
    file is not readable: onnxruntime names the problem when it opens it). Read straight from
    the protobuf wire format, so opening an artifact never imports onnx."""
    try:
        with open(model_path, "rb") as fh:
            data = memoryview(fh.read())
        graph = _pb_field(data, 7)  # ModelProto.graph
        if graph is None:
            return None
        for tensor in _pb_fields(graph, 5):  # GraphProto.initializer
            if bytes(_pb_field(tensor, 8) or b"") == b"cos_cache":  # TensorProto.name
                dims = _pb_ints(tensor, 1)  # TensorProto.dims
                return dims[0] if dims else None
        for info in _pb_fields(graph, 13):  # GraphProto.value_info
            if bytes(_pb_field(info, 1) or b"") != b"cos_cache":  # ValueInfoProto.name
                continue
            tensor_type = _pb_field(_pb_field(info, 2) or memoryview(b""), 1)  # .type.tensor_type
            shape = _pb_field(tensor_type, 2) if tensor_type is not None else None
            first = _pb_field(shape, 1) if shape is not None else None  # TensorShapeProto.dim
            rows = _pb_ints(first, 1) if first is not None else []  # Dimension.dim_value
            return rows[0] if rows else None
    except (OSError, ValueError):
        return None
    return None


def _pb_varint(buf: memoryview, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7


def _pb_scan(buf: memoryview) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a protobuf message: an int for varints, the bytes
    (a memoryview) for length-delimited fields, None for fixed-width ones."""
    i = 0
    while i < len(buf):
        key, i = _pb_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _pb_varint(buf, i)
            yield num, wire, v
        elif wire == 2:
            n, i = _pb_varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated field")
            yield num, wire, buf[i : i + n]
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            yield num, wire, None
        else:
            raise ValueError(f"wire type {wire}")


def _pb_fields(buf: memoryview, num: int) -> Iterator[memoryview]:
    for n, wire, v in _pb_scan(buf):
        if n == num and wire == 2:
            yield v


def _pb_field(buf: memoryview, num: int) -> memoryview | None:
    return next(_pb_fields(buf, num), None)


def _pb_ints(buf: memoryview, num: int) -> list[int]:
    """A repeated int64 field, packed or not."""
    out: list[int] = []
    for n, wire, v in _pb_scan(buf):
        if n != num:
            continue
        if wire == 0:
            out.append(v)
        elif wire == 2:
            i = 0
            while i < len(v):
                x, i = _pb_varint(v, i)
                out.append(x)
    return out


def decoder_section(art_dir: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `decoder` section (what a runtime generating text reads); one line naming
    the folder when the artifact is not a decoder."""
    dec = manifest.get("decoder")
    if not isinstance(dec, dict):
        raise InputError(
            f"{art_dir}: not a decoder artifact (its manifest has no 'decoder' section)",
            hint="build an imported LLM (HF folder or GGUF) with `llmir build MODEL.llmir`",
        )
    return dec


def open_checked(art_dir: str, *, full: bool = False) -> dict[str, Any]:
    """Read and check an artifact before a session opens it; return its manifest. Hashes in
    full with `full` or inside a `full_checks()` block."""
    m = read_manifest(art_dir)
    check_artifact(art_dir, m, full=full or _FULL.get())
    check_decoder_context(art_dir, m)
    return m


__all__ = [
    "read_manifest",
    "check_artifact",
    "check_decoder_context",
    "decoder_section",
    "open_checked",
    "full_checks",
    "CheckReport",
    "MANIFEST",
    "STATE_FILE",
]
