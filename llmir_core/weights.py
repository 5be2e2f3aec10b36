"""External weights: `core.weight` ops reference bytes in a file by offset; nothing is copied.

A weight reference has attributes `file` (relative to the `.llmir` file's folder, or absolute),
`name` (the tensor's name in its source), `offset` and `nbytes`, and optionally `sha256` of those
bytes. Its result type gives dtype and shape. Loading maps the bytes (numpy memmap), so only the
pages an op touches are read.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.ir.types import DType, QuantType, TensorType, Type, numpy_dtype


class WeightRefError(ValueError):
    """A weight reference that is inconsistent or points at missing bytes."""


@dataclass
class PackedArray:
    """Block-quantized data as stored (raw bytes) plus its logical shape and format."""

    data: np.ndarray  # uint8, the packed blocks
    qtype: QuantType
    shape: tuple[int, ...]

    @property
    def dtype(self) -> QuantType:
        return self.qtype


def expected_nbytes(t: TensorType) -> int | None:
    shape = t.static_shape()
    if shape is None:
        return None
    numel = int(np.prod(shape)) if shape else 1
    if isinstance(t.dtype, QuantType):
        q = t.dtype
        group = q.super_block or q.block
        if q.scheme in ("nbits", "gptq", "gptq_v2", "awq", "ctpack"):
            return (numel * q.bits + 7) // 8
        if numel % group:
            return -1
        return numel // group * q.block_bytes
    return (numel * t.dtype.bits + 7) // 8


def resolve_path(file: str, base_dir: str) -> str:
    return file if os.path.isabs(file) else os.path.normpath(os.path.join(base_dir, file))


# (realpath, size, mtime_ns, offset, nbytes) -> sha256: a weight is hashed once per process even
# when verify, build and the interpreter each check it
_RANGE_SHA: dict[tuple[str, int, int, int, int], str] = {}


def range_sha256(path: str, offset: int, nbytes: int) -> str:
    """sha256 of `nbytes` bytes at `offset` in `path`, read in chunks (memoized per file state)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, offset, nbytes)
    if key not in _RANGE_SHA:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            fh.seek(offset)
            left = nbytes
            while left > 0:
                chunk = fh.read(min(left, 8 << 20))
                if not chunk:
                    break
                h.update(chunk)
                left -= len(chunk)
        _RANGE_SHA[key] = h.hexdigest()
    return _RANGE_SHA[key]


def check_weight_ref(attrs: dict[str, Any], t: Type, base_dir: str, check_files: bool) -> None:
    """Check a weight reference; with `check_files`, its bytes lie in the file and match a pinned
    sha256 (a mismatch is a failed check, exit 1, as the README promises)."""
    if not isinstance(t, TensorType):
        raise WeightRefError(f"result must be a tensor, got {t}")
    offset, nbytes = attrs.get("offset", 0), attrs.get("nbytes")
    if offset < 0:
        raise WeightRefError(f"offset {offset} is negative")
    want = expected_nbytes(t)
    if want == -1:
        raise WeightRefError(f"{t} does not split into whole quantization blocks")
    if want is not None and nbytes is not None and nbytes != want:
        raise WeightRefError(f"nbytes = {nbytes}, but {t} needs {want} bytes")
    sha = attrs.get("sha256")
    if sha is not None and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
        raise WeightRefError("sha256 must be 64 lowercase hex digits")
    if check_files:
        path = resolve_path(attrs["file"], base_dir)
        if os.path.isdir(path):
            raise WeightRefError(
                f"weight file {attrs['file']} is a folder, not a file (looked in {path})"
            )
        if not os.path.isfile(path):
            raise WeightRefError(f"weight file {attrs['file']} not found (looked in {path})")
        size = os.path.getsize(path)
        end = offset + (nbytes if nbytes is not None else (want or 0))
        if end > size:
            raise WeightRefError(
                f"tensor '{attrs.get('name', '?')}' needs bytes {offset}..{end} "
                f"but {attrs['file']} has only {size} bytes"
            )
        if sha is not None:
            try:
                digest = range_sha256(path, offset, end - offset)
            except OSError as exc:
                raise WeightRefError(
                    f"weight file {attrs['file']} cannot be read: {exc.strerror}"
                ) from None
            if digest != sha:
                raise WeightRefError(
                    f"tensor '{attrs.get('name', '?')}': sha256 of its bytes in "
                    f"{attrs['file']} is {digest}, but the reference pins {sha}"
                )


def load_weight(attrs: dict[str, Any], t: TensorType, base_dir: str) -> Any:
    """Map a weight's bytes as a read-only numpy array (or PackedArray for quantized types),
    after checking the reference (bytes inside the file, a pinned sha256 matches)."""
    path = resolve_path(attrs["file"], base_dir)
    shape = t.static_shape()
    if shape is None:
        raise WeightRefError(f"weight '{attrs.get('name')}' needs a static shape, has {t}")
    check_weight_ref(attrs, t, base_dir, True)
    nbytes = attrs.get("nbytes") or expected_nbytes(t) or 0
    offset = int(attrs.get("offset", 0))
    raw = (
        np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(nbytes,))
        if nbytes
        else np.zeros(0, np.uint8)
    )
    if isinstance(t.dtype, QuantType):
        return PackedArray(np.asarray(raw), t.dtype, shape)
    assert isinstance(t.dtype, DType)
    return np.asarray(raw).view(numpy_dtype(t.dtype)).reshape(shape)


def rebase_weight_paths(module: Any, new_dir: str) -> int:
    """Rewrite relative `core.weight` paths so they resolve from `new_dir` (where the module is
    about to be written) to the same files they resolved to from the module's source folder.
    Returns how many references changed."""
    old_dir = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
    new_dir = os.path.abspath(new_dir)
    if old_dir == new_dir:
        return 0
    changed = 0
    for fn in module.functions:
        for op in fn.ops:
            f = op.attrs.get("file") if op.name == "core.weight" else None
            if not isinstance(f, str) or os.path.isabs(f):
                continue
            target = os.path.normpath(os.path.join(old_dir, f))
            op.attrs["file"] = os.path.relpath(target, new_dir)
            changed += 1
    return changed
