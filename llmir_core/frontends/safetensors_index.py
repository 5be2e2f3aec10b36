"""Index safetensors files without reading their tensor data.

A safetensors file is an 8-byte little-endian header length N, then N bytes of JSON (tensor name ->
dtype, shape, data_offsets relative to the end of the header), then the data. `open_index` reads
only the headers (of one file, or of every shard a `model.safetensors.index.json` names) and
returns each tensor's file, dtype, shape, absolute byte offset and size, after checking that the
header is consistent with the file: every range lies inside the file, ranges do not overlap, the
byte count matches dtype and shape, and every shard the index names exists. Any problem is one
`InputError` line naming the file and the field.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmir_core.errors import InputError
from llmir_core.fileio import read_json
from llmir_core.ir.types import DType

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header

# safetensors dtype names -> llmir dtypes (the ones a model's weights use)
DTYPES: dict[str, DType] = {
    "F64": DType.f64,
    "F32": DType.f32,
    "F16": DType.f16,
    "BF16": DType.bf16,
    "F8_E4M3": DType.f8e4m3,
    "F8_E5M2": DType.f8e5m2,
    "I64": DType.i64,
    "I32": DType.i32,
    "I16": DType.i16,
    "I8": DType.i8,
    "U8": DType.u8,
    "BOOL": DType.bool,
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes are: `nbytes` bytes at absolute `offset` in `file`."""

    name: str
    file: str  # absolute path
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass
class SafetensorsIndex:
    """Every tensor of a model (one file or all shards), by name."""

    tensors: dict[str, TensorEntry]
    files: list[str]
    metadata: dict[str, str]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str) -> TensorEntry:
        entry = self.tensors.get(name)
        if entry is None:
            where = ", ".join(self.files)
            raise InputError(
                f"tensor '{name}' is not in {where}",
                hint="the checkpoint does not match its config.json (wrong architecture "
                "or an incomplete download)",
            )
        return entry


def read_header(path: str) -> tuple[dict[str, TensorEntry], dict[str, str]]:
    """Read and check one file's header; return its tensors and `__metadata__`."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise InputError(
                    f"{path}: truncated safetensors file ({size} bytes, the 8-byte "
                    "header length is missing)",
                    hint=_REDOWNLOAD,
                )
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER:
                raise InputError(
                    f"{path}: header length {n} is not plausible (over 100 MB); "
                    "not a safetensors file?",
                    hint=_REDOWNLOAD,
                )
            if 8 + n > size:
                raise InputError(
                    f"{path}: truncated safetensors file: the header needs {8 + n} "
                    f"bytes, the file has {size}",
                    hint=_REDOWNLOAD,
                )
            raw = fh.read(n)
    except FileNotFoundError:
        raise InputError(f"{path}: file not found", hint=_REDOWNLOAD) from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        header = json.loads(raw.decode("utf-8").rstrip(" "))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(
            f"{path}: the safetensors header is not valid JSON ({exc})", hint=_REDOWNLOAD
        ) from None
    except RecursionError:
        raise InputError(
            f"{path}: the safetensors header is JSON nested too deeply", hint=_REDOWNLOAD
        ) from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: the safetensors header must be a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise InputError(f"{path}: __metadata__ must be an object of strings")
    data_start = 8 + n
    data_size = size - data_start
    out: dict[str, TensorEntry] = {}
    for name, info in header.items():
        out[name] = _entry(path, name, info, data_start, data_size)
    _check_overlaps(path, out, data_start)
    return out, {str(k): str(v) for k, v in meta.items()}


_REDOWNLOAD = "the file is damaged or incomplete: download or save it again"


def _entry(path: str, name: str, info: Any, data_start: int, data_size: int) -> TensorEntry:
    field = f"{path}: tensor '{name}'"
    if not isinstance(info, dict):
        raise InputError(f"{field}: header entry must be an object")
    dt = info.get("dtype")
    if not isinstance(dt, str) or dt not in DTYPES:
        raise InputError(
            f"{field}: dtype {dt!r:.60} is not supported (supported: {', '.join(DTYPES)})"
        )
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise InputError(f"{field}: shape must be a list of non-negative integers, got {shape!r}")
    offs = info.get("data_offsets")
    if (
        not isinstance(offs, list)
        or len(offs) != 2
        or not all(type(o) is int for o in offs)
        or offs[0] < 0
        or offs[1] < offs[0]
    ):
        raise InputError(
            f"{field}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offs!r}"
        )
    begin, end = offs
    if end > data_size:
        raise InputError(
            f"{field}: data_offsets end {end} is past the end of the file "
            f"(the data section has {data_size} bytes)",
            hint=_REDOWNLOAD,
        )
    dtype = DTYPES[dt]
    numel = 1
    for d in shape:
        numel *= d
    want = numel * dtype.bits // 8
    if end - begin != want:
        raise InputError(
            f"{field}: data_offsets span {end - begin} bytes, but {dt} {shape} needs {want}"
        )
    return TensorEntry(name, path, dtype, tuple(shape), data_start + begin, end - begin)


def _check_overlaps(path: str, entries: dict[str, TensorEntry], data_start: int) -> None:
    spans = sorted((e.offset, e.offset + e.nbytes, e.name) for e in entries.values() if e.nbytes)
    for (_b0, e0, n0), (b1, _e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise InputError(
                f"{path}: tensor '{n1}' (data_offsets begin {b1 - data_start}) "
                f"overlaps tensor '{n0}' (ends at {e0 - data_start})",
                hint=_REDOWNLOAD,
            )


def open_index(path: str | os.PathLike[str]) -> SafetensorsIndex:
    """Index a `.safetensors` file, an index JSON, or a folder holding either."""
    p = Path(path)
    if p.is_dir():
        if (p / INDEX_NAME).is_file():
            p = p / INDEX_NAME
        elif (p / SINGLE_NAME).is_file():
            p = p / SINGLE_NAME
        else:
            found = sorted(x.name for x in p.glob("*.safetensors"))
            if len(found) == 1:
                p = p / found[0]
            else:
                what = (
                    f"{len(found)} .safetensors files and no {INDEX_NAME}"
                    if found
                    else "no .safetensors files"
                )
                raise InputError(
                    f"{p}: {what}",
                    hint="the folder must hold model.safetensors, or shards and their index",
                )
    if p.name.endswith(".index.json"):
        return _open_sharded(p)
    real = _real_path(p)
    tensors, meta = read_header(real)
    return SafetensorsIndex(tensors, [real], meta)


def _real_path(p: Path) -> str:
    """The file a path leads to (a Hugging Face cache links into blobs/); a broken link or a
    link loop is an error naming the path given."""
    try:
        real = p.resolve(strict=True)
        if real.is_dir():
            raise InputError(f"{p}: is a folder (via a symlink to {real}), expected a file")
        return str(real)
    except FileNotFoundError:
        raise InputError(f"{p}: file not found (a broken symlink?)", hint=_REDOWNLOAD) from None
    except (RuntimeError, OSError) as exc:  # RuntimeError: a loop, before Python 3.13
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "a symlink loop"
        raise InputError(f"{p}: cannot follow the path: {why}") from None


def _open_sharded(index_path: Path) -> SafetensorsIndex:
    index = read_json(index_path, hint=_REDOWNLOAD)
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
        raise InputError(f"{index_path}: weight_map must be an object of tensor name -> shard file")
    folder = index_path.parent.resolve()
    shards = list(dict.fromkeys(wmap.values()))
    for shard in shards:
        if os.path.isabs(shard) or ".." in Path(shard).parts:
            raise InputError(f"{index_path}: weight_map names shard '{shard}' outside the folder")
        if not (folder / shard).is_file():
            raise InputError(
                f"{index_path}: weight_map names shard '{shard}', which is missing",
                hint="download the missing shard (or the whole model again)",
            )
    tensors: dict[str, TensorEntry] = {}
    meta: dict[str, str] = {}
    files: list[str] = []
    for shard in shards:
        path = str(folder / shard)
        files.append(path)
        got, m = read_header(path)
        meta.update(m)
        tensors.update(got)
    for name, shard in wmap.items():
        entry = tensors.get(name)
        if entry is None or os.path.basename(entry.file) != os.path.basename(shard):
            raise InputError(
                f"{index_path}: weight_map puts tensor '{name}' in '{shard}', "
                "but that shard does not hold it",
                hint=_REDOWNLOAD,
            )
    return SafetensorsIndex(tensors, files, meta)


__all__ = ["TensorEntry", "SafetensorsIndex", "open_index", "read_header", "DTYPES"]
