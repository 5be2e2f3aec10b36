"""`--target reference`: the numpy interpreter as a target. An artifact (model.llmir +
weights.bin + manifest) built from the tiny decoder generates what the interpreter running the
.llmir itself and the onnxruntime build generate; `bench` and `run --input` work through it; the
folder is self-contained; a tampered weights.bin is refused; batches run through `open_batch`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import CheckFailed, InputError
from llmir_core.ir.parser import parse_file
from llmir_core.targets import get_target, open_artifact

from .helpers import greedy, ref_decoder, same_decoding
from .reference_fixtures import invoke, ref_artifact, tiny_llmir  # noqa: F401  (fixtures)


def _run_ids(art: Path, *args: object) -> dict[str, Any]:
    """`llmir run ART --prompt hi -n 12 --format json`: the first result."""
    code, out, err = invoke("run", art, "--prompt", "hi", "-n", 12, "--format", "json", *args)
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)["results"][0]
    return result


def test_run_prompt_equals_interpreter_and_onnxruntime(
    ref_artifact: Path,  # noqa: F811
    tiny_llmir: Path,  # noqa: F811
    tiny_artifact: Path,
) -> None:
    got = _run_ids(ref_artifact)
    assert got["token_ids"] and got["text"]
    # the .llmir itself on the interpreter (no -O2, no artifact): the same greedy tokens
    interp = ref_decoder(parse_file(str(tiny_llmir)))
    assert greedy(interp, got["prompt_token_ids"], len(got["token_ids"])) == got["token_ids"]
    # the onnxruntime build of the same model, through the same `llmir run`
    assert _run_ids(tiny_artifact)["token_ids"] == got["token_ids"]
    # logits within the fp32 tolerance of the interpreter on the unoptimized module
    same_decoding(open_artifact(str(ref_artifact)), interp, tol=1e-5)


def test_bench_json(ref_artifact: Path) -> None:  # noqa: F811
    code, out, err = invoke(
        "bench", ref_artifact, "--prompt-len", 4, "--gen-len", 3, "--runs", 1, "--warmup", 0,
        "--format", "json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["kind"] == "bench" and data["config"]["prompt_len"] == 4
    assert data["results"]["decode_tokens_per_s_aggregate"]["mean"] > 0
    assert len(data["runs"]) == 1 and len(data["runs"][0]["itl_s"]) == 2
    assert data["fingerprint"]["kv_cache"] == "concat"
    assert len(data["fingerprint"]["model_sha256"]) == 64


def test_artifact_is_self_contained(tiny_dir: Path, tmp_path: Path) -> None:
    """Weights copied into weights.bin (64-byte aligned), every path inside the folder: moved
    away from the deleted source files it generates the same tokens."""
    src = tmp_path / "src"
    shutil.copytree(tiny_dir, src / "llama")
    assert invoke("import", src / "llama", "-o", src / "m.llmir")[0] == 0
    code, _, err = invoke("build", src / "m.llmir", "--target", "reference", "-o", tmp_path / "r")
    assert code == 0, err
    want = _run_ids(tmp_path / "r")["token_ids"]
    text = (tmp_path / "r" / "model.llmir").read_text()
    assert set(re.findall(r'core.weight \{file = "([^"]*)"', text)) == {"weights.bin"}
    assert 'llm.tokenizer = {file = "tokenizer.json"' in text
    offsets = [int(o) for o in re.findall(r"core.weight \{[^}]*\boffset = (\d+)", text)]
    assert len(offsets) == 21 and all(o % 64 == 0 for o in offsets)
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert manifest["target"] == "reference" and manifest["weights"] == "weights.bin"
    assert set(manifest["files"]) == {
        "model.llmir", "weights.bin", "tokenizer.json", "chat_template.jinja"
    }  # fmt: skip
    shutil.rmtree(src)
    (tmp_path / "moved").mkdir()
    shutil.move(tmp_path / "r", tmp_path / "moved" / "r")
    assert _run_ids(tmp_path / "moved" / "r")["token_ids"] == want


def test_tampered_weights_are_refused(ref_artifact: Path, tmp_path: Path) -> None:  # noqa: F811
    art = tmp_path / "r"
    shutil.copytree(ref_artifact, art)
    with open(art / "weights.bin", "r+b") as fh:  # one byte, the size kept
        fh.seek(1000)
        b = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([b[0] ^ 0x40]))
    code, _, err = invoke("run", art, "--prompt", "hi", "-n", 2)
    assert code == 1 and "weights.bin: sha256" in err and "changed or damaged" in err
    with pytest.raises(CheckFailed, match="weights.bin"):
        open_artifact(str(art))


def test_build_of_optimize_output_is_identical(
    tiny_llmir: Path,  # noqa: F811
    ref_artifact: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """`llmir optimize --target reference` marks the module lowered: building it only
    serializes, so both ways give the same bytes."""
    lowered = tiny_llmir.parent / "lowered.llmir"  # beside the source: weight paths unchanged
    code, _, err = invoke("optimize", tiny_llmir, "--target", "reference", "-o", lowered)
    assert code == 0, err
    assert 'target = "reference"' in lowered.read_text()
    code, _, err = invoke("build", lowered, "--target", "reference", "-o", tmp_path / "r")
    assert code == 0, err
    for name in ("model.llmir", "weights.bin", "manifest.json"):
        assert (tmp_path / "r" / name).read_bytes() == (ref_artifact / name).read_bytes(), name


def test_open_batch_decodes_slots_like_single_sequences(ref_artifact: Path) -> None:  # noqa: F811
    batch = get_target("reference").open_batch(str(ref_artifact), 2, max_context=64)
    assert (batch.slots, batch.vocab, batch.max_context) == (2, 128, 64)
    assert batch.manifest["target"] == "reference"
    a, b = [1, 5, 9, 2], [7, 3]
    first = [batch.prefill(0, a, 0), batch.prefill(1, b, 0)]
    nxt = [int(x.argmax()) for x in first]
    step = batch.decode([0, 1], nxt, [len(a), len(b)])
    for prompt, logits0, tok, logits1 in zip((a, b), first, nxt, step):
        single = open_artifact(str(ref_artifact))
        single.reset(1)
        np.testing.assert_array_equal(single.forward(np.asarray([prompt]))[0, -1], logits0)
        np.testing.assert_array_equal(single.forward(np.asarray([[tok]]))[0, -1], logits1)
    with pytest.raises(InputError, match="exceed the model's context of 64"):
        batch.prefill(0, list(range(65)), 0)


def test_tensor_module_builds_and_runs(tmp_path: Path) -> None:
    """A plain tensor module: `llmir run ARTIFACT --input` equals the interpreter on the .llmir;
    two weights on the same bytes are stored once; each weight starts at a multiple of 64."""
    w = np.linspace(-1, 1, 16, dtype=np.float32)
    w.tofile(tmp_path / "w.bin")
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    np.save(tmp_path / "x.npy", x)
    t = "tensor<?n x 4 x f32>"
    (tmp_path / "m.llmir").write_text(
        'module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {\n'
        f"  func.func @main(%x: {t}) -> {t} {{\n"
        '    %b = core.weight {file = "w.bin", name = "b", nbytes = 16, offset = 4} : () -> tensor<4xf32>\n'
        '    %w = core.weight {file = "w.bin", name = "w", nbytes = 64, offset = 0} : () -> tensor<4x4xf32>\n'
        '    %v = core.weight {file = "w.bin", name = "v", nbytes = 64, offset = 0} : () -> tensor<4x4xf32>\n'
        f"    %y = core.matmul %x, %w : ({t}, tensor<4x4xf32>) -> {t}\n"
        f"    %u = core.matmul %y, %v {{transpose_b = true}} : ({t}, tensor<4x4xf32>) -> {t}\n"
        f"    %s = core.add %u, %b : ({t}, tensor<4xf32>) -> {t}\n"
        f"    %z = core.sigmoid %s : ({t}) -> {t}\n"
        f"    return %z : {t}\n  }}\n}}\n"
    )
    code, _, err = invoke(
        "build", tmp_path / "m.llmir", "--target", "reference", "-o", tmp_path / "r"
    )
    assert code == 0, err
    # b's 16 bytes at 0, then w (= v: stored once) at the next multiple of 64
    assert (tmp_path / "r" / "weights.bin").stat().st_size == 128
    manifest = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert "decoder" not in manifest and manifest["builder"] == "tensors"
    assert manifest["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["?n", 4]}]
    code, out, err = invoke("run", tmp_path / "r", "--input", f"x={tmp_path / 'x.npy'}",
                            "-o", tmp_path / "out")  # fmt: skip
    assert code == 0, err
    got = np.load(tmp_path / "out" / "z.npy")
    w4 = w.reshape(4, 4)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-(x @ w4 @ w4.T + w[1:5]))), rtol=1e-6)
    code, _, err = invoke("run", tmp_path / "m.llmir", "--input", f"x={tmp_path / 'x.npy'}",
                          "-o", tmp_path / "out_interp")  # fmt: skip
    assert code == 0, err
    np.testing.assert_array_equal(got, np.load(tmp_path / "out_interp" / "z.npy"))
    runner = open_artifact(str(tmp_path / "r"))
    assert runner.input_names == ["x"] and runner.output_names == ["z"]
    with pytest.raises(InputError, match="not a decoder artifact"):
        get_target("reference").open_batch(str(tmp_path / "r"), 1)


def test_op_the_target_cannot_run_is_refused_with_its_location(tmp_path: Path) -> None:
    t = "tensor<4xf32>"
    (tmp_path / "m.llmir").write_text(
        'module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {\n'
        f'  func.func @main(%x: {t}) -> tensor<4xf32, device="cuda"> {{\n'
        f'    %y = llm.to_device %x {{device = "cuda"}} : ({t}) -> tensor<4xf32, device="cuda">\n'
        '    return %y : tensor<4xf32, device="cuda">\n  }\n}\n'
    )
    code, _, err = invoke(
        "build", tmp_path / "m.llmir", "--target", "reference", "-o", tmp_path / "r"
    )
    assert code == 1
    assert "m.llmir:3:" in err and "device 'cuda' (target devices: cpu)" in err
    assert not (tmp_path / "r").exists()
    with pytest.raises(InputError, match="takes no build options"):
        get_target("reference").lowering({"quant": "int4"})


def test_manifest_validates_and_needs_its_signature(ref_artifact: Path, tmp_path: Path) -> None:  # noqa: F811
    """The schema knows the reference target: its manifest validates, and one without the
    signature the tensor runner reads is refused before any field is used."""
    from llmir_core.artifact_check import manifest_schema, read_manifest
    from llmir_core.json_schema import validate

    manifest = json.loads((ref_artifact / "manifest.json").read_text())
    assert validate(manifest, manifest_schema()) == []
    art = tmp_path / "r"
    shutil.copytree(ref_artifact, art)
    del manifest["inputs"]
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="inputs"):
        read_manifest(str(art))


def test_running_needs_no_runtime_library(ref_artifact: Path, tmp_path: Path) -> None:  # noqa: F811
    """`llmir run` of a reference artifact imports neither onnxruntime nor a builder library
    (onnx, gguf, torch, transformers, z3): numpy is its runtime."""
    from .test_open_imports import _run

    out = _run(
        f"""
from typer.testing import CliRunner
from llmir_cli.app import app
r = CliRunner().invoke(app, ["run", {str(ref_artifact)!r}, "--prompt", "ab", "-n", "3"])
print(json.dumps({{"libs": builder_libs(), "code": r.exit_code, "out": r.output[-500:],
                  "onnxruntime": "onnxruntime" in sys.modules}}))
""",
        tmp_path,
    )
    assert out["code"] == 0, out["out"]
    assert out["libs"] == [] and out["onnxruntime"] is False
