"""Artifact folders a user edited or a disk damaged: `run` and `bench` check manifest.json's shape
and every file's size (always) and sha256 (when the files changed since the last check, or with
--verify-artifact) before a session opens; each problem is one line naming the file or field."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.artifact_check import check_artifact, full_checks, open_checked
from llmir_core.errors import CheckFailed
from tests.inputs.helpers import invoke, rejected

RUN = ("--prompt", "ab", "-n", "1")
BENCH = ("--prompt-len", "2", "--gen-len", "1", "--runs", "1", "--warmup", "0")


@pytest.fixture
def art(llama_artifact: Path, tmp_path: Path) -> Path:
    out = tmp_path / "art"
    shutil.copytree(llama_artifact, out)
    return out


def _edit_manifest(art: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    m = json.loads((art / "manifest.json").read_text())
    new = edit(m)
    (art / "manifest.json").write_text(json.dumps(m if new is None else new))


def _flip(art: Path, name: str, at: int = 100) -> None:
    b = bytearray((art / name).read_bytes())
    b[at] ^= 0xFF
    st = os.stat(art / name)
    (art / name).write_bytes(bytes(b))
    os.utime(art / name, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime


def _zero_shas(m: dict[str, Any]) -> None:
    for f in m["files"].values():
        f["sha256"] = "0" * 64


MANIFEST_CASES: dict[str, tuple[Any, str]] = {
    "a list": (lambda m: [], "manifest.json: must be a JSON object, got list"),
    "files a list": (lambda m: m.update(files=[]), "field 'files': expected object, got array"),
    "sha256 not hex": (
        lambda m: m["files"]["model.onnx"].update(sha256="xyz"),
        "field 'files[\"model.onnx\"].sha256': 'xyz' does not match",
    ),
    "bytes a string": (
        lambda m: m["files"]["model.onnx"].update(bytes="7"),
        "field 'files[\"model.onnx\"].bytes': expected integer, got string",
    ),
    "file outside the folder": (
        lambda m: m["files"].update({"../x": m["files"]["model.onnx"]}),
        "field 'files.../x' names a file outside the artifact folder",
    ),
    "max_len a string": (
        lambda m: m["decoder"].update(max_len="x"),
        "field 'decoder.max_len': expected integer or null, got string",
    ),
    "context_length edited past the model": (
        lambda m: m["decoder"].update(context_length=100000, max_len=100000),
        "field 'decoder.max_len' is 100000, but the model's rotary tables cover 256 positions",
    ),
    "max_len past context_length": (
        lambda m: m["decoder"].update(max_len=300),
        "field 'decoder.max_len' is 300, more than decoder.context_length (256)",
    ),
}


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_bad_manifest(art: Path, case: str) -> None:
    edit, message = MANIFEST_CASES[case]
    _edit_manifest(art, edit)
    for args in (("run", str(art), *RUN), ("bench", str(art), *BENCH)):
        code, out, err = invoke(*args)
        line = rejected(code, err, expect=2, names=str(art / "manifest.json"))
        assert message in line


def test_run_tensor_inputs_check_the_manifest_too(art: Path, tmp_path: Path) -> None:
    _edit_manifest(art, lambda m: [])
    np.save(tmp_path / "ids.npy", np.zeros((1, 2), np.int64))
    code, out, err = invoke("run", str(art), "--input", f"input_ids={tmp_path / 'ids.npy'}")
    rejected(code, err, expect=2, names=str(art / "manifest.json"))


TAMPER_CASES: dict[str, tuple[Callable[[Path], None], int, str]] = {
    "flipped bytes in the data": (
        lambda a: _flip(a, "model.onnx.data"),
        1,
        "model.onnx.data: sha256 ",
    ),
    "zeroed sha256s": (
        lambda a: _edit_manifest(a, _zero_shas),
        1,
        "but " + "{art}/manifest.json records 0000",
    ),
    "truncated data": (
        lambda a: (a / "model.onnx.data").write_bytes(b"\0" * 10),
        1,
        "model.onnx.data: 10 bytes, but {art}/manifest.json records {size}",
    ),
    "missing tokenizer": (
        lambda a: (a / "tokenizer.json").unlink(),
        2,
        "tokenizer.json: missing (listed in",
    ),
}


@pytest.mark.parametrize("case", list(TAMPER_CASES))
@pytest.mark.parametrize("command", ["run", "bench"])
def test_tampered_artifact_is_refused(art: Path, case: str, command: str) -> None:
    tamper, code_want, message = TAMPER_CASES[case]
    size = (art / "model.onnx.data").stat().st_size  # as built
    tamper(art)
    args = RUN if command == "run" else BENCH
    code, out, err = invoke(command, str(art), *args)
    line = rejected(code, err, expect=code_want, names=str(art))
    assert message.format(art=art, size=size) in line
    assert out == ""


def test_hashing_happens_when_files_change_or_on_request(art: Path) -> None:
    first = check_artifact(str(art))
    assert sorted(first.hashed) == sorted(first.files)  # never checked: hash everything
    assert check_artifact(str(art)).hashed == []  # unchanged since: stat only
    assert sorted(check_artifact(str(art), full=True).hashed) == sorted(first.files)
    with full_checks():
        assert open_checked(str(art)) and check_artifact(str(art), full=True).hashed
    os.utime(art / "tokenizer.json")  # touched: hash again
    assert check_artifact(str(art)).hashed
    _flip(art, "model.onnx.data")  # same size and mtime: only a full check sees it
    assert check_artifact(str(art)).hashed == []
    with pytest.raises(CheckFailed, match="model.onnx.data: sha256"):
        check_artifact(str(art), full=True)


def test_verify_artifact_flag_catches_a_same_size_same_mtime_edit(art: Path) -> None:
    assert invoke("run", str(art), *RUN)[0] == 0
    _flip(art, "model.onnx.data")
    assert invoke("run", str(art), *RUN)[0] == 0  # the stat-only fast path cannot see it
    code, out, err = invoke("run", str(art), *RUN, "--verify-artifact")
    rejected(code, err, expect=1, names=f"{art / 'model.onnx.data'}: sha256")
    code, out, err = invoke("bench", str(art), *BENCH, "--verify-artifact")
    rejected(code, err, expect=1, names=f"{art / 'model.onnx.data'}: sha256")


def test_check_state_lives_outside_the_artifact(art: Path) -> None:
    before = sorted(os.listdir(art))
    check_artifact(str(art))
    assert sorted(os.listdir(art)) == before
    assert (Path(os.environ["LLMIR_HOME"]) / "artifact-checks.json").is_file()


def test_prompts_file_not_utf8(art: Path, tmp_path: Path) -> None:
    p = tmp_path / "p.txt"
    p.write_bytes(b"fine\nhello \xff\xfe\n")
    code, out, err = invoke("run", str(art), "--prompts-file", str(p), "-n", "1")
    rejected(code, err, expect=2, names=f"{p}:2:7: not UTF-8 text (byte 0xff)")


def test_unknown_input_is_named(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text("""module @m {
  func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
    return %x : tensor<2xf32>
  }
}
""")
    np.save(tmp_path / "x.npy", np.zeros(2, np.float32))
    code, out, err = invoke("run", str(f), "--input", f"bogus={tmp_path / 'x.npy'}")
    rejected(code, err, expect=2, names="unknown input(s): bogus (and missing: x)")


def test_short_max_len_build_still_runs(art: Path, llama_dir: Path, tmp_path: Path) -> None:
    """--max-len sizes the rotary tables below context_length: the manifest check allows it."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    out = tmp_path / "short"
    build_decoder(import_hf(llama_dir, tmp_path / "m.llmir"), str(out), max_len=12)
    code, out_text, err = invoke("run", str(out), *RUN)
    assert code == 0, err


@pytest.mark.parametrize("tensors", [False, True])
def test_verify_artifact_hashes_each_file_once(
    art: Path, tensors: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening through the one dispatch point checks once, even when the target reads the
    manifest again (decoder and tensor runners alike)."""
    import llmir_core.artifact_check as ac
    from llmir_core.targets import open_artifact

    hashed: list[str] = []
    real = ac.sha256_file

    def counting(path: str) -> str:
        hashed.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(ac, "sha256_file", counting)
    with full_checks():
        open_artifact(str(art), threads=1, tensors=tensors)
    files = json.loads((art / "manifest.json").read_text())["files"]
    assert sorted(hashed) == sorted([*files, "manifest.json"])


@pytest.mark.parametrize(
    "env",
    [
        {"LLMIR_HOME": "/x/home"},
        {"LLMIR_HOME": "~/h"},
        {"XDG_CACHE_HOME": "/x/cache"},
        {"XDG_CACHE_HOME": "~/c"},
        {},
    ],
)
def test_check_state_home_is_the_registry_home(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """artifact_check finds LLMIR_HOME itself (importing the registry package would cost every
    artifact open); both must agree."""
    from llmir_core.artifact_check import _llmir_home
    from llmir_core.registry.home import llmir_home

    for k in ("LLMIR_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _llmir_home() == str(llmir_home())


def test_rotary_rows_read_without_onnx(art: Path, tmp_path: Path) -> None:
    """The context check reads cos_cache's rows from model.onnx's protobuf wire format (no
    onnx import): the same number onnx reads, and None for a file that is not a model."""
    import onnx

    from llmir_core.artifact_check import _rotary_rows

    proto = onnx.load(str(art / "model.onnx"), load_external_data=False)
    stored = [int(t.dims[0]) for t in proto.graph.initializer if t.name == "cos_cache"]
    computed = [  # computed at load (docs/perf.md, "Artifact size"): its declared shape
        int(v.type.tensor_type.shape.dim[0].dim_value)
        for v in proto.graph.value_info
        if v.name == "cos_cache"
    ]
    (want,) = stored + computed
    assert _rotary_rows(str(art / "model.onnx")) == want
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
    assert _rotary_rows(str(junk)) is None
    assert _rotary_rows(str(tmp_path / "missing.onnx")) is None
