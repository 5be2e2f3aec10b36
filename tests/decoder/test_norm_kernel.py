"""llmir's RMS norms (`ort.simplified_layer_norm` / `ort.skip_simplified_layer_norm` with
`kernel = "llmir"`: ai.llmir SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization in
llmir_core/backends/ort_ext/norm.c): one node against onnxruntime's op on the same inputs
(decode and prefill rows, hidden sizes with and without a tail of 8 / 32, the residual sum
output present or not); decoders built with either kernel compute the same logits and greedy
tokens; the importer reads the nodes back; the choice shows in the lowered module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.backends import build, get_target
from llmir_core.backends.ort_ext import DOMAIN, register, unavailable_reason
from llmir_core.errors import InputError
from llmir_core.ir.printer import print_module
from llmir_core.passes.base import clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.runtime.ort_decoder import open_artifact

from .helpers import same_decoding

WHY = unavailable_reason()
needs_kernel = pytest.mark.skipif(WHY is not None, reason=f"llmir's custom op cannot run: {WHY}")
MS = "com.microsoft"
F32 = np.float32


def _session(domain: str, skip: bool, with_sum: bool, eps: float) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    vi, f = helper.make_tensor_value_info, TensorProto.FLOAT
    inputs = [vi("x", f, ["B", "S", "H"])]
    if skip:
        inputs.append(vi("skip", f, ["B", "S", "H"]))
        outs = ["y", "", "", "sum" if with_sum else ""]
        op, dom = "SkipSimplifiedLayerNormalization", (domain if domain == DOMAIN else MS)
    else:
        outs = ["y"]
        op, dom = "SimplifiedLayerNormalization", (domain if domain == DOMAIN else "")
    inputs.append(vi("g", f, ["H"]))
    ins = [i.name for i in inputs]
    node = helper.make_node(op, ins, outs, domain=dom, epsilon=eps)
    results = [vi("y", f, None)] + ([vi("sum", f, None)] if skip and with_sum else [])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    if domain == DOMAIN:
        opsets.append(helper.make_opsetid(DOMAIN, 1))
    model = helper.make_model(helper.make_graph([node], "n", inputs, results), opset_imports=opsets)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    if domain == DOMAIN:
        register(so, ["llmir_ops"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@needs_kernel
@pytest.mark.parametrize("skip,with_sum", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("rows,hidden", [(1, 576), (1, 896), (128, 576), (37, 100), (3, 7)])
def test_matches_onnxruntime(skip: bool, with_sum: bool, rows: int, hidden: int) -> None:
    rng = np.random.default_rng(rows * 1000 + hidden)
    feeds = {"x": rng.standard_normal((1, rows, hidden)).astype(F32) * 3}
    if skip:
        feeds["skip"] = rng.standard_normal((1, rows, hidden)).astype(F32)
    feeds["g"] = rng.standard_normal(hidden).astype(F32)
    got = {d: _session(d, skip, with_sum, 1e-6).run(None, feeds) for d in (MS, DOMAIN)}
    assert len(got[DOMAIN]) == len(got[MS])
    for a, b in zip(got[DOMAIN], got[MS]):
        assert a.shape == b.shape
        assert float(np.abs(a - b).max()) <= 2e-5 * max(1.0, float(np.abs(b).max()))
    if skip and with_sum:  # the residual sum is exact
        assert np.array_equal(got[DOMAIN][1], feeds["x"] + feeds["skip"])


def _lowered(module: Any, **options: Any) -> str:
    lowering = get_target("onnxruntime").lowering(options)
    return print_module(run_pipeline(clone_module(module), lowering).module)


@needs_kernel
def test_decoder_matches_onnxruntime_norms(tiny_module: Any, tmp_path: Path) -> None:
    import onnx

    text = _lowered(tiny_module, norm_kernel="auto")  # llmir's kernel where the library builds
    norms = [x for x in text.splitlines() if "simplified_layer_norm" in x and " = ort." in x]
    assert norms and all('kernel = "llmir"' in x for x in norms)
    build(tiny_module, str(tmp_path / "llmir"), "onnxruntime", options={"norm_kernel": "auto"})
    build(tiny_module, str(tmp_path / "ort"), "onnxruntime")  # the default: onnxruntime's norms
    model = onnx.load(str(tmp_path / "llmir" / "model.onnx"), load_external_data=False)
    ours = [n for n in model.graph.node if "SimplifiedLayerNormalization" in n.op_type]
    assert len(ours) == len(norms) and {n.domain for n in ours} == {DOMAIN}
    same_decoding(open_artifact(str(tmp_path / "llmir")), open_artifact(str(tmp_path / "ort")))
    from llmir_core.frontends.onnx import import_onnx

    again, _ = import_onnx(str(tmp_path / "llmir" / "model.onnx"))
    assert sum(op.name == "llm.rms_norm" for op in again.main.ops) == len(norms)


def test_norm_kernel_choice(tiny_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmir_core.backends.ort_ext import DISABLE_ENV

    for opts in ({}, {"norm_kernel": "onnxruntime"}):  # the default: onnxruntime's norms
        text = _lowered(tiny_module, **opts)
        norms = [x for x in text.splitlines() if "simplified_layer_norm" in x and " = ort." in x]
        assert norms and not any("kernel =" in x for x in norms)
    text = _lowered(tiny_module, norm_kernel="llmir")  # by name: recorded for any machine
    norms = [x for x in text.splitlines() if "simplified_layer_norm" in x and " = ort." in x]
    assert norms and all('kernel = "llmir"' in x for x in norms)
    monkeypatch.setenv(DISABLE_ENV, "1")
    text = _lowered(tiny_module, norm_kernel="auto")
    assert not any(
        'kernel = "llmir"' in x for x in text.splitlines() if "simplified_layer_norm" in x
    )
    with pytest.raises(InputError, match="unknown norm_kernel 'fast'"):
        _lowered(tiny_module, norm_kernel="fast")


def test_llmir_norm_takes_f32_only_in_the_ir() -> None:
    from llmir_core.ir.parser import parse_module
    from llmir_core.verifier import verify

    t = "tensor<2x8xf16>"
    text = (
        f"module @m {{\n  func.func @main(%x: {t}, %w: tensor<8xf16>) -> ({t}) {{\n"
        f'    %y = ort.simplified_layer_norm %x, %w {{kernel = "llmir"}} : ({t}, tensor<8xf16>) -> {t}\n'
        f"    return %y : {t}\n  }}\n}}\n"
    )
    problems = [p.message for p in verify(parse_module(text))]
    assert any('kernel "llmir" takes f32 x, got f16' in m for m in problems)
