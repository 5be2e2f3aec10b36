"""A small decoder block exported with torch.onnx.export round-trips through llmir.

torch is a test-only extra (`pip install torch`); without it this test is skipped.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from llmir_core.frontends import import_model
from llmir_core.runtime.tensors import run_module
from llmir_core.targets.onnxruntime.graph import build
from llmir_core.targets.onnxruntime.session import runner_for_artifact

torch = pytest.importorskip("torch", reason="torch is a test-only extra: pip install torch")


def _block() -> torch.nn.Module:
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, d: int = 32, h: int = 4, kv: int = 2) -> None:
            super().__init__()
            self.h, self.kv, self.hd = h, kv, d // h
            self.q = nn.Linear(d, d, bias=False)
            self.k = nn.Linear(d, kv * self.hd, bias=False)
            self.v = nn.Linear(d, kv * self.hd, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.w1, self.w2 = nn.Parameter(torch.rand(d)), nn.Parameter(torch.rand(d))
            self.g, self.u = nn.Linear(d, 64, bias=False), nn.Linear(d, 64, bias=False)
            self.dn = nn.Linear(64, d, bias=False)

        @staticmethod
        def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            y = self.norm(x, self.w1)
            q = self.q(y).view(b, t, self.h, self.hd).transpose(1, 2)
            k = self.k(y).view(b, t, self.kv, self.hd).transpose(1, 2)
            v = self.v(y).view(b, t, self.kv, self.hd).transpose(1, 2)
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            y = self.norm(x, self.w2)
            return x + self.dn(F.silu(self.g(y)) * self.u(y))

    torch.manual_seed(0)
    return Block().eval()


def test_torch_decoder_block(tmp_path: Path) -> None:
    src = tmp_path / "block.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _block(),
            (torch.randn(2, 5, 32),),
            str(src),
            input_names=["x"],
            output_names=["y"],
            dynamo=False,
            opset_version=18,
            dynamic_axes={"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}},
        )
    x = np.random.default_rng(5).standard_normal((3, 7, 32)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    module = import_model(src, out_path=tmp_path / "block.llmir")
    text = (tmp_path / "block.llmir").read_text()
    # the exporter's run-time shape arithmetic folds into symbolic reshapes
    assert "shape = [?batch, ?seq, 4, 8]" in text and "core.reshape_dyn" not in text
    np.testing.assert_allclose(run_module(module, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)
    build(module, str(tmp_path / "art"))
    got = runner_for_artifact(str(tmp_path / "art")).run({"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
