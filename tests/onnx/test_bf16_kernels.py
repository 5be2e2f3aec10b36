"""16-bit ONNX models on onnxruntime's CPU provider: a bf16 Attention (opset 23), which
onnxruntime cannot load as is, builds and runs through the capability decision (computed in f32
between casts, visible in the lowered file); the capability table matches the installed
onnxruntime."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from llmir_core.frontends.onnx import import_onnx
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import DType
from llmir_core.passes.base import PassContext, clone_module
from llmir_core.targets import build, get_target
from llmir_core.targets.onnxruntime.lower_precision import LowerOrtPrecision
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
B, H, KVH, S, D = 1, 4, 2, 5, 8


def _attention_model(dtype: int = T.BFLOAT16) -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)],
        "attn",
        [
            h.make_tensor_value_info("q", dtype, [B, H, S, D]),
            h.make_tensor_value_info("k", dtype, [B, KVH, S, D]),
            h.make_tensor_value_info("v", dtype, [B, KVH, S, D]),
        ],
        [h.make_tensor_value_info("y", dtype, [B, H, S, D])],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 23)])


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    rep = H // KVH
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"q": (B, H, S, D), "k": (B, KVH, S, D), "v": (B, KVH, S, D)}
    return {n: rng.standard_normal(s).astype(ml_dtypes.bfloat16) for n, s in shapes.items()}


def test_onnxruntime_has_no_bf16_attention_kernel() -> None:
    import onnxruntime as ort

    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        ort.InferenceSession(
            _attention_model().SerializeToString(), providers=["CPUExecutionProvider"]
        )


def test_bf16_attention_builds_and_runs(tmp_path: Path) -> None:
    from llmir_core.targets import open_artifact

    module, _ = import_onnx(_attention_model())
    lowered = clone_module(module)
    assert LowerOrtPrecision().run(lowered, PassContext())
    text = print_module(lowered)
    assert "llm.scaled_dot_product_attention %" in text and "xf32> loc" in text
    assert text.count("core.cast") == 4  # q, k, v in; y out
    build(module, str(tmp_path / "art"), "onnxruntime")
    feeds = _inputs()
    got = open_artifact(str(tmp_path / "art")).run(feeds)["y"]
    assert got.dtype == ml_dtypes.bfloat16
    want = _reference(*(feeds[n].astype(np.float32) for n in "qkv"))
    np.testing.assert_allclose(got.astype(np.float32), want, atol=2e-2, rtol=2e-2)


def test_bf16_attention_cli(tmp_path: Path) -> None:
    onnx.save(_attention_model(), str(tmp_path / "a.onnx"))
    for n, a in _inputs().items():
        (tmp_path / f"{n}.pb").write_bytes(onnx.numpy_helper.from_array(a, n).SerializeToString())
    assert run_cli("import", "a.onnx", "-o", "a.llmir", "-q", cwd=tmp_path).returncode == 0
    r = run_cli(
        "optimize", "a.llmir", "--target", "onnxruntime", "--report", "-o", "l.llmir",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "llm.scaled_dot_product_attention computes in f32 between bf16 casts" in r.stdout
    assert run_cli("build", "l.llmir", "-o", "art", "-q", cwd=tmp_path).returncode == 0
    r = run_cli(
        "run", "art", "--input", "q=q.pb", "--input", "k=k.pb", "--input", "v=v.pb",
        "--output-dir", "out", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "bfloat16[1, 4, 5, 8]" in r.stdout


def test_capability_table() -> None:
    caps = get_target("onnxruntime").capabilities
    assert caps.kernel("ort.fused_matmul", DType.bf16) is None
    assert caps.kernel("ort.fused_matmul", DType.f16) == "cast"
    assert caps.kernel("ort.group_query_attention", DType.f16) == "native"
    assert caps.kernel("core.transpose", DType.bf16) == "native"
    assert caps.kernel("llm.scaled_dot_product_attention", DType.bf16) is None
    assert caps.kernel("core.matmul", DType.f32) == "native"


def _probe_script() -> object:
    spec = importlib.util.spec_from_file_location("probe", ROOT / "scripts/probe_ort_kernels.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "op,dtype", [("core.transpose", "bf16"), ("core.add", "bf16"), ("core.add", "f16")]
)
def test_table_matches_the_installed_onnxruntime(op: str, dtype: str) -> None:
    from llmir_core.dialects.registry import get_op
    from llmir_core.ir.snippet import module_text, op_function
    from llmir_core.targets.onnxruntime.kernel_table import PROBED

    probe = _probe_script()
    od = get_op(op)
    assert od is not None
    text = module_text([op_function(probe._F32.sub(dtype, od.example), "main")])  # type: ignore[attr-defined]
    assert probe._probe_one(text) == PROBED[op].get(dtype)  # type: ignore[attr-defined]
