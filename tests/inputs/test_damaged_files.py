"""Every file a command reads, damaged (tests/inputs/damage.py): cut at every eighth, bits
flipped, wrong magic, a huge declared size, a path escaping the folder, replaced by a broken,
looping or folder symlink. Each case: exit 0, 1 or 2, one `error:` line naming the file
(`file:line:col` for .llmir text), no traceback, nothing left behind.

`python scripts/fuzz_readers.py --damage --full` runs more bit-flip seeds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.inputs.damage import (
    Files,
    Target,
    artifact_targets,
    damages,
    flips,
    make_targets,
    npy_huge,
    reseal,
    run_case,
)
from tests.inputs.helpers import invoke, listing, rejected


@pytest.fixture(scope="module")
def files(
    llama_dir: Path, llama_gguf: Path, llama_split: Path, tmp_path_factory: pytest.TempPathFactory
) -> Files:
    f = Files(tmp_path_factory.mktemp("damage"), llama_dir, llama_gguf)
    f.split = llama_split
    return f


@pytest.fixture(scope="module")
def small_artifact(files: Files, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxruntime", reason="artifacts run on onnxruntime")
    out = tmp_path_factory.mktemp("small-art") / "art"
    code, _, err = invoke("build", str(files.small / "m.llmir"), "-o", str(out))
    assert code == 0, err
    return out


def _check(target: Target, work: Path) -> None:
    failures = []
    for d in damages(target):
        outcome = run_case(target, d, work)
        if outcome.problems:
            failures.append(f"{d.name}: {'; '.join(outcome.problems)}")
    assert not failures, f"{target.name}:\n" + "\n".join(failures)


FILE_TARGETS = [
    "llmir (verify)",
    "llmir (fmt -i)",
    "llmir (build)",
    "llmir (optimize -O2)",
    "weights file (build)",
    "run --input .npy",
    "run --input .pb",
    "hf config.json",
    "hf tokenizer.json",
    "hf tokenizer_config.json",
    "hf generation_config.json",
    "hf chat_template.jinja",
    "hf model.safetensors",
    "hf safetensors index",
    "gguf",
    "gguf split (first shard)",
    "gguf split (last shard)",
    "onnx",
    "registry index",
    "llmir.lock (init)",
    "tokenize tokenizer.json",
    "tokenize .llmir",
    "tokenize --jsonl",
]


@pytest.mark.parametrize("name", FILE_TARGETS)
def test_damaged_input_file(files: Files, name: str, tmp_path: Path) -> None:
    targets = make_targets(files)
    if name not in targets:
        pytest.skip(f"{name}: the package that writes its seed file is not installed")
    _check(targets[name], tmp_path / "work")


ARTIFACT_FILES = [
    "manifest.json",
    "model.onnx",
    "model.onnx (resealed)",
    "model.onnx.data (resealed)",
    "model.lowered.llmir (resealed)",
    "tokenizer.json (resealed)",
    "chat_template.jinja (resealed)",
]


@pytest.fixture
def decoder_artifact(llama_artifact: Path) -> Path:
    """The intact artifact runs (the first run also builds llmir's custom-op library into the
    session's cache, which must not count against a damaged case's time bound)."""
    code, _, err = invoke("run", str(llama_artifact), "--prompt", "ab", "-n", "1")
    assert code == 0, err
    return llama_artifact


@pytest.mark.parametrize("name", ARTIFACT_FILES)
def test_damaged_decoder_artifact_file(
    small_artifact: Path, decoder_artifact: Path, name: str, tmp_path: Path
) -> None:
    _check(artifact_targets(small_artifact, decoder_artifact)[f"decoder artifact {name}"], tmp_path)


@pytest.mark.parametrize(
    "name", ["manifest.json", "model.onnx (resealed)", "model.onnx.data (resealed)"]
)
def test_damaged_tensor_artifact_file(
    small_artifact: Path, llama_artifact: Path, name: str, tmp_path: Path
) -> None:
    _check(artifact_targets(small_artifact, llama_artifact)[f"artifact {name}"], tmp_path)


@pytest.mark.parametrize(
    "name", ["run --prompts-file", "tokenize artifact manifest.json", "bench model.onnx (resealed)"]
)
def test_damaged_file_other_artifact_commands(
    small_artifact: Path, decoder_artifact: Path, name: str, tmp_path: Path
) -> None:
    _check(artifact_targets(small_artifact, decoder_artifact)[name], tmp_path)


# -- the defects the matrix found, one test each -------------------------------------------


def test_npy_header_declaring_more_than_the_file_holds(files: Files, tmp_path: Path) -> None:
    """Was `error: out of memory` (numpy allocated the declared 70 TB), naming no file."""
    files.copy_small(tmp_path)
    x = tmp_path / "x.npy"
    x.write_bytes(npy_huge(x.read_bytes()))
    code, _, err = invoke("run", str(tmp_path / "m.llmir"), "--input", f"x={x}")
    line = rejected(code, err, expect=2, names=f"{x}: truncated .npy file")
    assert "more data than the file holds" in line


def test_npy_header_that_does_not_tokenize(files: Files, tmp_path: Path) -> None:
    """Was exit 70 (tokenize.TokenError from numpy's header parser), from
    `scripts/fuzz_readers.py --damage --full` (bit-flip seed 13)."""
    files.copy_small(tmp_path)
    x = tmp_path / "x.npy"
    x.write_bytes(flips(13)(x.read_bytes()))
    code, _, err = invoke("run", str(tmp_path / "m.llmir"), "--input", f"x={x}")
    rejected(code, err, expect=2, names=f"{x}: not a readable .npy file")


def test_pb_external_data_is_read_beside_the_pb(files: Files, tmp_path: Path) -> None:
    """Was: read from the current folder, whatever folder the .pb is in."""
    import onnx.numpy_helper

    files.copy_small(tmp_path)
    (tmp_path / "sub").mkdir()
    t = onnx.numpy_helper.from_array(np.full((2, 16), 3, np.float32), "x")
    (tmp_path / "sub" / "x.bin").write_bytes(t.raw_data)
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", "x.bin"
    (tmp_path / "sub" / "x.pb").write_bytes(t.SerializeToString())
    argv = ["run", str(tmp_path / "m.llmir"), "--input", f"x={tmp_path / 'sub' / 'x.pb'}"]
    code, out, err = invoke(*argv)  # the test's folder is not the current one
    assert code == 0, err
    assert "mean 48" in out, out


def test_safetensors_symlink_loop(files: Files, tmp_path: Path) -> None:
    """Was exit 70 (RuntimeError: Symlink loop)."""
    folder = files.copy_llama(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("model.safetensors")
    code, _, err = invoke("import", str(folder), "-o", str(tmp_path / "m.llmir"))
    rejected(code, err, expect=2, names=f"{folder / 'model.safetensors'}: cannot follow the path")


@pytest.mark.parametrize("where", ["hf folder", "artifact"])
def test_chat_template_not_utf8(
    files: Files, llama_artifact: Path, where: str, tmp_path: Path
) -> None:
    """Was exit 70 (UnicodeDecodeError) in both readers of chat_template.jinja."""
    bad = b"{% for m in messages %}\n{{ m.content }}\xff{% endfor %}"
    if where == "hf folder":
        folder = files.copy_llama(tmp_path)
        (folder / "chat_template.jinja").write_bytes(bad)
        argv = ["import", str(folder), "-o", str(tmp_path / "m.llmir")]
        f = folder / "chat_template.jinja"
    else:
        art = tmp_path / "art"
        shutil.copytree(llama_artifact, art)
        f = art / "chat_template.jinja"
        f.write_bytes(bad)
        _reseal(art, f.name)
        argv = ["run", str(art), "--prompt", "ab", "-n", "1"]
    before = listing(tmp_path)
    code, _, err = invoke(*argv)
    rejected(code, err, expect=2, names=f"{f}:2:16: not UTF-8 text (byte 0xff)")
    assert listing(tmp_path) == before


def test_gguf_field_of_the_wrong_type(files: Files, tmp_path: Path) -> None:
    """Was exit 70 (TypeError: unhashable type: 'list'), from scripts/fuzz_readers.py seed 1306."""
    from tests.inputs import gguf_edit as ge

    assert files.gguf is not None
    g = ge.read(files.gguf)
    g.set("tokenizer.ggml.pre", ge.ARRAY, (ge.U32, [1, 2]))
    f = tmp_path / "m.gguf"
    f.write_bytes(ge.encode(g))
    code, _, err = invoke("import", str(f), "-o", str(tmp_path / "m.llmir"))
    rejected(
        code, err, expect=2, names=f"{f}: metadata field 'tokenizer.ggml.pre' must be a string"
    )


def test_split_gguf_count_of_the_wrong_type(files: Files, tmp_path: Path) -> None:
    """Was exit 70 (ValueError from int('two'))."""
    from tests.inputs import gguf_edit as ge

    assert files.split is not None
    for s in sorted(files.split.glob("*.gguf")):
        shutil.copyfile(s, tmp_path / s.name)
    last = sorted(tmp_path.glob("*.gguf"))[-1]
    g = ge.read(last)
    g.set("split.count", ge.STRING, "three")
    last.write_bytes(ge.encode(g))
    first = sorted(tmp_path.glob("*.gguf"))[0]
    code, _, err = invoke("import", str(first), "-o", str(tmp_path / "m.llmir"))
    rejected(code, err, expect=2, names=f"{last}: metadata field 'split.count' must be a whole")


def test_tensor_artifact_onnxruntime_cannot_load_names_the_model(
    small_artifact: Path, tmp_path: Path
) -> None:
    """Was `error: onnxruntime cannot load the model: ...`, naming no file."""
    art = tmp_path / "art"
    shutil.copytree(small_artifact, art)
    data = art / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    _reseal(art, data.name)
    np.save(tmp_path / "x.npy", np.ones((2, 16), np.float32))
    code, _, err = invoke("run", str(art), "--input", f"x={tmp_path / 'x.npy'}")
    rejected(code, err, expect=2, names=f"{art / 'model.onnx'}: onnxruntime cannot load the model")


def _reseal(art: Path, name: str) -> None:
    reseal(art / name)


def test_reseal_keeps_the_manifest_valid(small_artifact: Path, tmp_path: Path) -> None:
    """The harness's resealing must leave an artifact that still runs (else it tests nothing)."""
    art = tmp_path / "art"
    shutil.copytree(small_artifact, art)
    _reseal(art, "model.onnx")
    np.save(tmp_path / "x.npy", np.ones((2, 16), np.float32))
    code, out, err = invoke(
        "run", str(art), "--input", f"x={tmp_path / 'x.npy'}", "--verify-artifact"
    )
    assert code == 0, err


@pytest.mark.parametrize("what", [".llmir", "--jsonl", "artifact manifest"])
def test_tokenize_reads_text_as_utf8_with_a_location(
    files: Files, llama_artifact: Path, what: str, tmp_path: Path
) -> None:
    """Was exit 70 (UnicodeDecodeError) for a .llmir or an artifact's manifest.json, and
    `cannot read ('utf-8' codec ...)` with no line:col for a --jsonl file."""
    bad = b'"hello"\n"tw\xffo"\n'
    if what == ".llmir":
        f = tmp_path / "m.llmir"
        f.write_bytes(b"module @m {\n  \xff\n}\n")
        argv, at = ["tokenize", str(f), "hello"], f"{f}:2:3"
    elif what == "--jsonl":
        f = tmp_path / "p.jsonl"
        f.write_bytes(bad)
        argv, at = ["tokenize", str(files.llama), "--jsonl", str(f)], f"{f}:2:4"
    else:
        art = tmp_path / "art"
        shutil.copytree(llama_artifact, art)
        f = art / "manifest.json"
        f.write_bytes(b'{\n "x": "\xff"}')
        argv, at = ["tokenize", str(art), "hello"], f"{f}:2:8"
    code, _, err = invoke(*argv)
    rejected(code, err, expect=2, names=f"{at}: not UTF-8 text")


@pytest.mark.parametrize(
    "what",
    ["config.json", "safetensors index", "registry index", "llmir.lock", "tokenize tokenizer.json"],
)
def test_text_that_does_not_parse_is_located(files: Files, what: str, tmp_path: Path) -> None:
    """Were `not valid JSON (Expecting ...: line 2 column 1 (char 2))`, `not valid TOML: ...
    (at line 2, column 1)`, `... 'utf-8' codec can't decode byte` and the tokenizers library's
    `EOF while parsing ... at line 2 column 1`: the file named, the position only in prose."""
    targets = make_targets(files)
    name = {
        "config.json": "hf config.json",
        "safetensors index": "hf safetensors index",
        "llmir.lock": "llmir.lock (init)",
    }.get(what, what)
    argv, f = targets[name].setup(tmp_path)
    data = f.read_bytes()
    if what == "registry index":
        f.write_bytes(b'{\n  "x\xff": 1}')  # not UTF-8 at line 2, col 5
        at = f"{f}:2:5"
    elif what == "llmir.lock":
        f.write_bytes(data + b"\n[[files]\n")  # an unclosed table header on the last line
        at = f"{f}:{len(data.splitlines()) + 2}:"
    else:
        f.write_bytes(b"{\n")  # cut: the document ends at line 2, col 1
        at = f"{f}:2:1"
    code, _, err = invoke(*argv)
    line = rejected(code, err, expect=2, names=at)
    assert "line " not in line and "(char" not in line, line
