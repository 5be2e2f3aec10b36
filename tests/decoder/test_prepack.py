"""`--prepack`: whether onnxruntime repacks the matmul weights when a decoder artifact opens.

The choice is a lowering option (lower-ort-module records it in `ort.options`, so the lowered
module shows it), the manifest copies it (`decoder.prepack`) and the runtime follows it. Timing is
measured in benchmarks/artifact_load.py, never here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.ir.printer import print_module
from llmir_core.targets import build
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import run_cli

PROMPT = np.random.default_rng(2).integers(3, 100, (1, 9))


@pytest.fixture(scope="module")
def mmap_artifact(tiny_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepack") / "none"
    build(tiny_module, str(out), "onnxruntime", options={"prepack": "none"})
    return out


def _logits(art: Path) -> np.ndarray:
    dec = open_decoder(str(art), threads=1)
    dec.reset(1)
    first = dec.forward(PROMPT)[0, -1]
    nxt = dec.forward(np.array([[int(first.argmax())]], np.int64))[0, -1]
    return np.stack([first, nxt])


def test_unpacked_weights_give_the_same_logits(tiny_artifact: Path, mmap_artifact: Path) -> None:
    # the kernels differ (packed panels vs the unpacked path): equal up to summation order
    a, b = _logits(tiny_artifact), _logits(mmap_artifact)
    assert np.abs(a - b).max() <= 1e-4 * max(1.0, float(np.abs(a).max()))
    assert (a.argmax(-1) == b.argmax(-1)).all()


def test_the_choice_is_in_the_lowered_module_the_manifest_and_the_session(
    tiny_artifact: Path, mmap_artifact: Path
) -> None:
    for art, mode, entry in ((tiny_artifact, "session", None), (mmap_artifact, "none", "1")):
        lowered = (art / "model.lowered.llmir").read_text()
        assert f'prepack = "{mode}"' in lowered.split("\n", 1)[0]
        assert json.loads((art / "manifest.json").read_text())["decoder"]["prepack"] == mode
        assert _disable_prepacking(art) == entry


def _disable_prepacking(art: Path) -> str | None:
    """The session's `session.disable_prepacking` entry (None when not set)."""
    so = open_decoder(str(art), threads=1).sess.get_session_options()
    try:
        return str(so.get_session_config_entry("session.disable_prepacking"))
    except RuntimeError:  # onnxruntime: "does not have configuration with key"
        return None


def _with_manifest(src: Path, dst: Path, **decoder: Any) -> Path:
    shutil.copytree(src, dst)
    path = dst / "manifest.json"
    man = json.loads(path.read_text())
    for k, v in decoder.items():
        if v is None:
            man["decoder"].pop(k, None)
        else:
            man["decoder"][k] = v
    path.write_text(json.dumps(man))
    return dst


def test_a_manifest_without_the_field_prepacks(tiny_artifact: Path, tmp_path: Path) -> None:
    art = _with_manifest(tiny_artifact, tmp_path / "old", prepack=None)
    assert _disable_prepacking(art) is None


def test_a_bad_manifest_value_is_one_line(tiny_artifact: Path, tmp_path: Path) -> None:
    art = _with_manifest(tiny_artifact, tmp_path / "bad", prepack="disk")
    with pytest.raises(
        InputError, match=r"field 'decoder.prepack': 'disk' is not one of 'session', 'none'"
    ):
        open_decoder(str(art), threads=1)


def test_cli_reports_the_mode_and_refuses_bad_combinations(
    tiny_module: Any, tmp_path: Path
) -> None:
    mod = tmp_path / "m.llmir"
    mod.write_text(print_module(tiny_module))
    r = run_cli("build", str(mod), "-o", str(tmp_path / "a"), "--prepack", "none")
    assert r.returncode == 0, r.stderr
    assert "prepack: none (onnxruntime's repacking is off: weights stay memory-mapped" in r.stdout
    r = run_cli("build", str(mod), "-o", str(tmp_path / "b"), "--prepack", "disk")
    assert r.returncode == 2 and "--prepack must be one of session, none, got 'disk'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "b").exists()
    r = run_cli(  # onnxruntime's MatMulNBits at accuracy level 1 (llmir's kernel, at level 4,
        # reads the blocks as stored)
        "build",
        str(mod),
        "-o",
        str(tmp_path / "c"),
        "--prepack",
        "none",
        "--quant",
        "int4",
        "--accuracy-level",
        "1",
    )
    assert r.returncode == 2 and "ort.matmul_nbits op(s)" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "c").exists()
    r = run_cli("optimize", str(mod), "--prepack", "none")
    assert r.returncode == 2 and "--prepack: lowering options need --target" in r.stderr


@pytest.mark.parametrize("quant", ["", "int4"])
def test_a_tied_table_is_read_through_its_own_name(
    quant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepack=session: the embedding's Gather reads the tied table through an alias over the
    same bytes, and the lm_head (which prepacks it) is listed first (ort_load_layout); the
    logits are those of the same build without that layout."""
    import onnx

    from llmir_core.frontends.hf import import_hf
    from llmir_core.targets.onnxruntime import load_layout as ort_load_layout

    from .tiny import LlamaShape, make_llama_folder

    module = import_hf(
        make_llama_folder(tmp_path / "tied", LlamaShape(tie=True), tokenizer=False),
        require_tokenizer=False,
    )
    # int4: onnxruntime's MatMulNBits, which prepacks (llmir's kernel reads the blocks in place)
    # f32: onnxruntime's FusedMatMul (llmir's MatMulF32, the default, reads the table in place)
    opts = {"quant": quant, "nbits_kernel": "mlas"} if quant else {"f32_matmul": "ort"}
    art = tmp_path / "art"
    layout = build(module, str(art), "onnxruntime", options=opts)["decoder"]["load_layout"]
    model = onnx.load(str(art / "model.onnx"), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    assert layout["aliases"]
    for alias, weight in layout["aliases"].items():
        place = [(e.key, e.value) for e in inits[alias].external_data]
        assert place == [(e.key, e.value) for e in inits[weight].external_data]
        readers = {n.op_type for n in model.graph.node if alias in n.input}
        assert readers and not set(ort_load_layout.PREPACKED_INPUTS) & readers
    assert [n.name for n in model.graph.node[: len(layout["first"])]] == layout["first"]
    assert model.graph.node[0].op_type in ("FusedMatMul", "MatMulNBits")

    monkeypatch.setattr(ort_load_layout, "alias_and_order", lambda m: {"aliases": {}, "first": []})
    plain = tmp_path / "plain"
    assert "load_layout" not in build(module, str(plain), "onnxruntime", options=opts)["decoder"]
    a, b = _logits(art), _logits(plain)
    assert np.abs(a - b).max() <= 1e-5 * max(1.0, float(np.abs(a).max()))
