"""`llmir import` of the model.onnx llmir builds for a decoder (com.microsoft GroupQueryAttention
with packed QKV and rotary, SkipSimplifiedLayerNormalization, MatMulNBits for int4 and int8,
DynamicQuantizeMatMul for int8 through QGEMM): the
re-imported module gives onnxruntime's outputs on the original for prompt, decode and continued
prefill."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from llmir_core.frontends.hf import import_hf
from llmir_core.frontends.onnx import import_onnx
from llmir_core.runtime.tensors import run_module
from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder
from tests.decoder.tiny import TINY, make_llama_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> object:
    d = tmp_path_factory.mktemp("reimport")
    return import_hf(make_llama_folder(d / "llama", TINY)), d


def _feeds(model: onnx.ModelProto, b: int, s: int, past: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(b * 100 + s * 10 + past)
    feeds = {
        "input_ids": rng.integers(0, 100, (b, s)).astype(np.int64),
        "positions": np.tile(np.arange(past, past + s), (b, 1)).astype(np.int64),
    }
    for i in model.graph.input:
        if i.name.startswith("past_key_values."):
            dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
            feeds[i.name] = rng.standard_normal((b, dims[1], past, dims[3])).astype(np.float32)
    return feeds


@pytest.mark.parametrize("quant", [None, "int4", "int8", "int8-qgemm"], ids=str)
def test_reimported_build_matches_onnxruntime(
    tiny: tuple, tmp_path: Path, quant: str | None
) -> None:
    from llmir_core.targets import build

    module, _ = tiny
    # onnxruntime's ops (cpu=x86-64): int8 is MatMulNBits blocks where llmir's MatMulS8 is not
    # used (test_int8_llmir.py checks it), QGEMM when asked
    opts: dict[str, object] = {"accuracy_level": 1, "cpu": "x86-64"}
    if quant == "int8-qgemm":
        opts.update(quant="int8", int8_matmul="qgemm-s8pair")
    elif quant:
        opts["quant"] = quant
    build(module, str(tmp_path / "art"), "onnxruntime", options=opts)
    path = str(tmp_path / "art" / "model.onnx")
    proto = onnx.load(path, load_external_data=False)
    ops = {n.op_type for n in proto.graph.node}
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= ops
    assert ("MatMulNBits" in ops) == (quant in ("int4", "int8"))
    assert ("DynamicQuantizeMatMul" in ops) == (quant == "int8-qgemm")
    assert all(
        n.input[1] == "" for n in proto.graph.node if n.op_type == "GroupQueryAttention"
    )  # packed
    again, _ = import_onnx(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for b, s, past in [(2, 5, 0), (2, 1, 4), (1, 3, 4)]:  # prompt, decode, continued prefill
        feeds = _feeds(proto, b, s, past)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        got = run_module(again, feeds)
        assert set(got) == set(want)
        for name, w in want.items():
            np.testing.assert_allclose(
                got[name], w, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {(b, s, past)}"
            )


def test_reimported_matmul_nbits_keep_accuracy_level(tiny: tuple, tmp_path: Path) -> None:
    """An imported MatMulNBits keeps its accuracy_level through a rebuild whose default differs."""
    from llmir_core.targets import build

    module, _ = tiny
    build_decoder(module, str(tmp_path / "a"), quant="int4", accuracy_level=1)
    again, _ = import_onnx(str(tmp_path / "a" / "model.onnx"))
    qm = [op for op in again.main.ops if op.name == "llm.quantized_matmul"]
    assert qm and {op.attrs.get("accuracy_level") for op in qm} == {1}
    build(again, str(tmp_path / "b"), "onnxruntime")  # the build's default level is 4
    proto = onnx.load(str(tmp_path / "b" / "model.onnx"), load_external_data=False)
    levels = [
        next(a.i for a in n.attribute if a.name == "accuracy_level")
        for n in proto.graph.node
        if n.op_type == "MatMulNBits"
    ]
    assert len(levels) == len(qm) and set(levels) == {1}


def test_cli_reimport_keeps_accuracy_level_4(tiny: tuple, tmp_path: Path) -> None:
    """`llmir import model.onnx` + a build of the .llmir text it wrote: MatMulNBits nodes
    with accuracy_level 4 keep it, even when the build's own option says 1."""
    from tests.conftest import run_cli

    module, _ = tiny
    build_decoder(module, str(tmp_path / "a"), quant="int4", accuracy_level=4)
    r = run_cli("import", str(tmp_path / "a" / "model.onnx"), "-o", "m.llmir", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "accuracy_level = 4" in (tmp_path / "m.llmir").read_text()
    from llmir_core.ir.parser import parse_file
    from llmir_core.targets import build

    # onnxruntime's MatMulNBits (cpu=x86-64), whose accuracy_level the model.onnx shows
    opts = {"accuracy_level": 1, "cpu": "x86-64"}
    build(parse_file(str(tmp_path / "m.llmir")), str(tmp_path / "b"), options=opts)
    proto = onnx.load(str(tmp_path / "b" / "model.onnx"), load_external_data=False)
    levels = [
        next(a.i for a in n.attribute if a.name == "accuracy_level")
        for n in proto.graph.node
        if n.op_type == "MatMulNBits"
    ]
    assert levels and set(levels) == {4}
