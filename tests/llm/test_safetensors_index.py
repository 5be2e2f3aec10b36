"""The safetensors index: offsets without reading data, and one clear line for each bad file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.safetensors_index import open_index
from llmir_core.ir.types import DType


def write_st(
    path: Path, tensors: dict[str, np.ndarray], header_edit: dict | None = None, cut: int = 0
) -> None:
    """A safetensors file written by hand, so the header can be damaged on purpose."""
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64"}
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs, pos = [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {
            "dtype": names[arr.dtype],
            "shape": list(arr.shape),
            "data_offsets": [pos, pos + len(raw)],
        }
        blobs.append(raw)
        pos += len(raw)
    for k, v in (header_edit or {}).items():
        header[k] = v
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = struct.pack("<Q", len(text)) + text + b"".join(blobs)
    path.write_bytes(data[: len(data) - cut] if cut else data)


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "a.weight": rng.standard_normal((4, 8)).astype(np.float32),
        "b.bias": rng.standard_normal(3).astype(np.float16),
        "c": np.arange(5, dtype=np.int64),
    }


def test_single_file_offsets_point_at_the_data(tmp_path: Path) -> None:
    src = tensors()
    write_st(tmp_path / "model.safetensors", src)
    idx = open_index(tmp_path)
    assert set(idx.tensors) == set(src)
    e = idx.get("a.weight")
    assert (e.dtype, e.shape, e.nbytes) == (DType.f32, (4, 8), 128)
    for name, arr in src.items():
        e = idx.get(name)
        got = np.fromfile(e.file, dtype=arr.dtype, count=arr.size, offset=e.offset).reshape(
            arr.shape
        )
        np.testing.assert_array_equal(got, arr)
    assert idx.metadata == {"format": "pt"}


def test_sharded_index(tmp_path: Path) -> None:
    src = tensors()
    write_st(tmp_path / "model-00001-of-00002.safetensors", {"a.weight": src["a.weight"]})
    write_st(
        tmp_path / "model-00002-of-00002.safetensors", {"b.bias": src["b.bias"], "c": src["c"]}
    )
    wmap = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.bias": "model-00002-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors",
    }
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": wmap})
    )
    idx = open_index(tmp_path)
    assert Path(idx.get("c").file).name == "model-00002-of-00002.safetensors"
    assert len(idx.files) == 2


def test_missing_shard_names_index_and_shard(tmp_path: Path) -> None:
    write_st(tmp_path / "model-00001-of-00002.safetensors", {"a.weight": tensors()["a.weight"]})
    wmap = {"a.weight": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    with pytest.raises(
        InputError,
        match=r"model\.safetensors\.index\.json: weight_map names shard "
        r"'model-00002-of-00002\.safetensors', which is missing",
    ):
        open_index(tmp_path)


def test_truncated_data_is_caught_from_the_header(tmp_path: Path) -> None:
    write_st(tmp_path / "model.safetensors", tensors(), cut=10)
    with pytest.raises(
        InputError,
        match=r"model\.safetensors: tensor 'c': data_offsets end \d+ is past the "
        r"end of the file",
    ):
        open_index(tmp_path)


@pytest.mark.parametrize("size", [0, 5])
def test_file_shorter_than_the_length_prefix(tmp_path: Path, size: int) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x10" * size)
    with pytest.raises(
        InputError,
        match=r"truncated safetensors file \(\d+ bytes, the 8-byte header length is missing\)",
    ):
        open_index(tmp_path)


def test_truncated_header(tmp_path: Path) -> None:
    write_st(tmp_path / "model.safetensors", tensors())
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:40])
    with pytest.raises(
        InputError, match=r"truncated safetensors file: the header needs \d+ bytes, the file has 40"
    ):
        open_index(tmp_path)


def test_offsets_past_end_of_file(tmp_path: Path) -> None:
    bad = {"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}
    write_st(tmp_path / "model.safetensors", {}, header_edit={"huge": bad})
    with pytest.raises(
        InputError,
        match=r"tensor 'huge': data_offsets end 4096 is past the end of the file "
        r"\(the data section has 0 bytes\)",
    ):
        open_index(tmp_path / "model.safetensors")


def test_overlapping_ranges(tmp_path: Path) -> None:
    src = tensors()
    edit = {"b.bias": {"dtype": "F16", "shape": [3], "data_offsets": [100, 106]}}
    write_st(tmp_path / "model.safetensors", src, header_edit=edit)
    with pytest.raises(
        InputError, match=r"tensor 'b.bias' \(data_offsets begin 100\) overlaps tensor 'a.weight'"
    ):
        open_index(tmp_path)


def test_size_disagrees_with_shape_and_dtype(tmp_path: Path) -> None:
    edit = {"a.weight": {"dtype": "F32", "shape": [4, 9], "data_offsets": [0, 128]}}
    write_st(tmp_path / "model.safetensors", tensors(), header_edit=edit)
    with pytest.raises(
        InputError,
        match=r"tensor 'a.weight': data_offsets span 128 bytes, but F32 \[4, 9\] needs 144",
    ):
        open_index(tmp_path)


def test_unknown_dtype_and_bad_json(tmp_path: Path) -> None:
    edit = {"a.weight": {"dtype": "C64", "shape": [4, 8], "data_offsets": [0, 128]}}
    write_st(tmp_path / "x.safetensors", tensors(), header_edit=edit)
    with pytest.raises(InputError, match=r"tensor 'a.weight': dtype 'C64' is not supported"):
        open_index(tmp_path / "x.safetensors")
    (tmp_path / "y.safetensors").write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(
        InputError, match=r"y\.safetensors: the safetensors header is not valid JSON"
    ):
        open_index(tmp_path / "y.safetensors")


def test_folder_without_weights(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no \.safetensors files"):
        open_index(tmp_path)


def test_missing_tensor_names_the_files(tmp_path: Path) -> None:
    write_st(tmp_path / "model.safetensors", tensors())
    with pytest.raises(InputError, match=r"tensor 'lm_head.weight' is not in .*model\.safetensors"):
        open_index(tmp_path).get("lm_head.weight")
