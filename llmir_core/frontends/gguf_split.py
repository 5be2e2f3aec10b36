"""Split GGUF files: `NAME-00001-of-0000N.gguf` shards, as llama.cpp's gguf-split writes them.

Every shard is a GGUF file with the keys `split.no` (0-based), `split.count` and
`split.tensors.count`; the first shard holds the model's metadata, and the tensors are spread
over the shards. `shard_paths` finds the N files from the first one's name and checks each
shard's keys; the importer then references every weight by its own shard's path and offset.
"""

from __future__ import annotations

import os
import re

from llmir_core.errors import InputError

_SHARD = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS = "split.count", "split.no", "split.tensors.count"


def shard_name(stem: str, no: int, count: int) -> str:
    """llama.cpp's llama_split_path: PREFIX-%05d-of-%05d.gguf with a 1-based shard number."""
    return f"{stem}-{no + 1:05d}-of-{count:05d}.gguf"


def shard_paths(path: str, no: int, count: int) -> list[str]:
    """The paths of all `count` shards, given the first shard's path (whose split.no is `no`)."""
    name = os.path.basename(path)
    m = _SHARD.match(name)
    if m is None:
        raise InputError(
            f"{path}: metadata says shard {no + 1} of {count}, but the file name does not end "
            "in -NNNNN-of-NNNNN.gguf",
            hint="keep the names gguf-split gave the shards",
        )
    if no != 0:
        first = shard_name(m["stem"], 0, count)
        raise InputError(
            f"{path}: is shard {no + 1} of {count}; the model's metadata is in the first shard",
            hint=f"import {os.path.join(os.path.dirname(path), first)}",
        )
    if int(m["count"]) != count:
        raise InputError(
            f"{path}: metadata field '{SPLIT_COUNT}' is {count}, the file name says {int(m['count'])}"
        )
    folder = os.path.dirname(path)
    paths = [os.path.join(folder, shard_name(m["stem"], i, count)) for i in range(count)]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise InputError(
            f"{missing[0]}: shard {paths.index(missing[0]) + 1} of {count} is missing",
            hint="download every shard of the model into one folder",
        )
    return paths


def check_shard(
    path: str, want_no: int, want_count: int, got_no: object, got_count: object
) -> None:
    """A shard's own split keys must say where it belongs."""
    if got_no is None or got_count is None:
        raise InputError(
            f"{path}: metadata field '{SPLIT_NO}' or '{SPLIT_COUNT}' is missing: not a shard "
            f"of a {want_count}-file split model"
        )
    no, count = _whole(path, SPLIT_NO, got_no), _whole(path, SPLIT_COUNT, got_count)
    if count != want_count or no != want_no:
        raise InputError(
            f"{path}: says shard {no + 1} of {count}, expected shard {want_no + 1} of {want_count}",
            hint="the shards come from different models",
        )


def _whole(path: str, key: str, v: object) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise InputError(f"{path}: metadata field '{key}' must be a whole number, got {v!r:.40}")
    return v


__all__ = ["shard_paths", "shard_name", "check_shard", "SPLIT_COUNT", "SPLIT_NO", "SPLIT_TENSORS"]
