"""`llmir import` of an onnxruntime-genai model: its model builder (PyPI `onnxruntime-genai`, which
needs torch, transformers and onnx-ir) turns a tiny llama folder into a GroupQueryAttention /
SkipSimplifiedLayerNormalization decoder; the import gives onnxruntime's outputs on the original.
About 30 s (the builder loads torch): marked slow, skipped where the builder is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from llmir_core.frontends.onnx import import_onnx
from llmir_core.runtime.tensors import run_module
from tests.decoder.tiny import TINY, make_llama_folder

pytestmark = pytest.mark.slow


def test_onnxruntime_genai_model_imports_with_the_same_outputs(tmp_path: Path) -> None:
    for mod in ("onnxruntime_genai", "torch", "transformers", "onnx_ir"):
        pytest.importorskip(mod)
    import onnxruntime as ort

    src = make_llama_folder(tmp_path / "llama", TINY)
    out = tmp_path / "genai"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-m",
            str(src),
            "-i",
            str(src),
            "-o",
            str(out),
            "-p",
            "fp32",
            "-e",
            "cpu",
            "-c",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    path = str(out / "model.onnx")
    proto = onnx.load(path, load_external_data=False)
    ops = {n.op_type for n in proto.graph.node}
    assert {"GroupQueryAttention", "SkipSimplifiedLayerNormalization"} <= ops
    module, _ = import_onnx(path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    hd = TINY.hidden // TINY.heads
    rng = np.random.default_rng(0)
    for b, s, past in [(2, 5, 0), (2, 1, 4), (1, 3, 4)]:  # prompt, decode, continued prefill
        feeds: dict[str, np.ndarray] = {}
        for i in proto.graph.input:
            if i.name == "input_ids":
                feeds[i.name] = rng.integers(0, 100, (b, s)).astype(np.int64)
            elif i.name == "attention_mask":
                feeds[i.name] = np.ones((b, past + s), np.int64)
            else:  # past_key_values.N.key/value: [batch, kv_heads, past, head_dim]
                kv = i.type.tensor_type.shape.dim[1].dim_value
                feeds[i.name] = rng.standard_normal((b, kv, past, hd)).astype(np.float32)
        want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        got = run_module(module, feeds)
        assert set(got) == set(want)
        for name, w in want.items():
            np.testing.assert_allclose(
                got[name], w, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {(b, s, past)}"
            )
