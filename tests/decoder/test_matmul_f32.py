"""llmir's f32 matmul in the panel layout (`ort.matmul_f32 {layout = "panel16"}`, ai.llmir
MatMulF32 in llmir_core/targets/onnxruntime/native/matmul_f32.c, llmir_core/targets/onnxruntime/panels.py): the kernel
against numpy over decode and prefill M, odd N and K, batch dims and thread counts; the layout
decided by the lowering (panels, rows for a table tied to the embedding); an artifact built so
generates what the MLAS build and the module generate; `llmir import` reads the panels back.
Kernel tests are skipped where the library cannot be built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.ir.printer import print_module
from llmir_core.passes.base import clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.targets import build, get_target
from llmir_core.targets.onnxruntime.native import DOMAIN, register, unavailable_reason
from llmir_core.targets.onnxruntime.panels import from_panels, panel_shape, to_panels
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import assert_dot_close, edge_rows, greedy, llmir_session, parity, rel
from .tiny import LlamaShape, make_llama_folder

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")


def _session(w_shape: list[int], n: int | None, threads: int = 2) -> Any:
    from onnx import TensorProto, helper

    attrs = {} if n is None else {"N": n}
    node = helper.make_node("MatMulF32", ["x", "w"], ["y"], domain=DOMAIN, **attrs)
    g = helper.make_graph(
        [node],
        "p16",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, w_shape),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return llmir_session(g, threads)


def test_panel_layout_round_trips() -> None:
    w = np.random.default_rng(0).standard_normal((37, 29)).astype(np.float32)
    p = to_panels(w)
    assert p.shape == panel_shape(37, 29) == (3, 29, 16)
    assert p[1, 4, 3] == w[19, 4] and not p[2, :, 5:].any()  # rows past N are zero
    assert np.array_equal(from_panels(p, 37), w)


@needs_kernel
@pytest.mark.parametrize("n,k", [(37, 29), (131, 1000), (33, 200), (200, 7), (64, 96)])
def test_panel_kernel_matches_numpy(n: int, k: int) -> None:
    rng = np.random.default_rng(n * k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    wp = to_panels(w)
    sess = _session(list(wp.shape), n)
    # decode (M <= 8: one streamed row, 2..8 rows through the micro-kernel), the GEMM from M = 9,
    # ragged 6-row blocks and more rows than one X block (MC_P16 = 96)
    for m in (1, 2, 3, 5, 8, 9, 13, 128, 200):
        x = edge_rows(rng.standard_normal((m, k)).astype(np.float32))  # zero, tiny, huge rows
        got = sess.run(None, {"x": x, "w": wp})[0]
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        assert got.shape == (m, n) and got.dtype == np.float32
        assert_dot_close(got, x64 @ w64.T, np.abs(x64) @ np.abs(w64).T, 5e-7 * np.sqrt(k))


@needs_kernel
def test_panel_kernel_takes_batch_dims_and_any_thread_count() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((70, 300)).astype(np.float32)
    wp = to_panels(w)
    for shape in ((2, 9, 300), (1, 1, 300), (3, 1, 300)):
        x = rng.standard_normal(shape).astype(np.float32)
        one = _session(list(wp.shape), 70, 1).run(None, {"x": x, "w": wp})[0]
        two = _session(list(wp.shape), 70, 2).run(None, {"x": x, "w": wp})[0]
        assert one.shape == (*shape[:-1], 70)
        # each output summed by one thread in a fixed order: the same bits at any thread count
        assert np.array_equal(one, two)
        assert rel(one, x.astype(np.float64) @ w.astype(np.float64).T) <= 1e-5


@needs_kernel
def test_panel_weight_without_n_is_refused() -> None:
    wp = to_panels(np.ones((20, 8), np.float32))
    x = np.ones((1, 8), np.float32)
    for n in (None, 40):  # no N, or an N that does not fit ceil(N/16) panels
        with pytest.raises(Exception, match="neither \\[N, K\\] nor \\[ceil\\(N/16\\), K, 16\\]"):
            _session(list(wp.shape), n).run(None, {"x": x, "w": wp})


def _f32_lowering(**kw: Any) -> list[Any]:
    from llmir_core.targets.onnxruntime.lower_weight_dtype import LowerOrtWeightDtype

    lowering = get_target("onnxruntime").lowering({})
    i = next(i for i, p in enumerate(lowering) if p.name == "lower-ort-weight-dtype")
    lowering[i] = LowerOrtWeightDtype("", **kw)
    return lowering


def _text(module: Any, **kw: Any) -> str:
    return print_module(run_pipeline(clone_module(module), _f32_lowering(**kw)).module)


@pytest.fixture(scope="module")
def tied_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from llmir_core.frontends.hf import import_hf

    # tied embedding; N = 40 (gate, up) ends mid-panel; packed QKV 64 + 8 + 8 rows: k's rows
    # end mid-panel (the serializer carries them into the next source's)
    shape = LlamaShape(tie=True, intermediate=40, heads=8, kv_heads=1)
    return import_hf(make_llama_folder(tmp_path_factory.mktemp("tied") / "m", shape))


def test_layout_shows_in_the_lowered_module(tiny_module: Any, tied_module: Any) -> None:
    text = _text(tiny_module, f32_kernel="custom")
    assert "ort.fused_matmul" not in text
    # untied: every weight (the lm_head too) is stored in panels
    assert text.count('layout = "panel16"') == text.count("ort.matmul_f32 ") > 0
    tied = _text(tied_module, f32_kernel="custom")
    lines = [ln for ln in tied.splitlines() if "ort.matmul_f32 " in ln]
    rows = [ln for ln in lines if 'layout = "panel16"' not in ln]
    # the table the embedding gathers from stays rows (one copy); every other weight is panels
    assert len(rows) == 1 and "embed_tokens" in rows[0] and "%logits" in rows[0]
    assert 'layout = "panel16"' not in _text(tiny_module, f32_kernel="custom", f32_layout="rows")


def test_bad_f32_layout_is_a_usage_error(tiny_module: Any) -> None:
    with pytest.raises(InputError, match="unknown f32_layout 'cols'"):
        run_pipeline(
            clone_module(tiny_module), _f32_lowering(f32_kernel="custom", f32_layout="cols")
        )


@needs_kernel
@pytest.mark.parametrize("which", ["tiny", "tied"])
def test_panel_artifact_generates_what_mlas_does(
    which: str, tiny_module: Any, tied_module: Any, tmp_path: Path
) -> None:
    module = tiny_module if which == "tiny" else tied_module
    build(module, str(tmp_path / "panel"), "onnxruntime", options={"f32_matmul": "custom"})
    build(module, str(tmp_path / "mlas"), "onnxruntime", options={"f32_matmul": "ort"})
    lowered = (tmp_path / "panel" / "model.lowered.llmir").read_text()
    assert 'layout = "panel16"' in lowered
    a, b = open_decoder(str(tmp_path / "panel")), open_decoder(str(tmp_path / "mlas"))
    prompt = np.array([[1, 5, 9, 2, 7, 3, 11, 4, 8, 6]])
    a.reset(1)
    b.reset(1)
    assert rel(a.forward(prompt), b.forward(prompt)) <= 1e-5  # only the summation order differs
    assert greedy(a, [1, 5, 9], 24) == greedy(b, [1, 5, 9], 24)
    assert parity(module, a, prompt, steps=4) <= 1e-4  # and the module's own reference


@needs_kernel
def test_reimported_panel_artifact(tied_module: Any, tmp_path: Path) -> None:
    """`llmir import` of an artifact with MatMulF32 nodes in both layouts: the panels unpacked
    exactly, so the imported module computes what onnxruntime does."""
    import onnx
    import onnxruntime as ort

    from llmir_core.frontends.onnx import import_onnx
    from llmir_core.runtime.tensors import run_module

    build(tied_module, str(tmp_path / "a"), "onnxruntime", options={"f32_matmul": "custom"})
    path = str(tmp_path / "a" / "model.onnx")
    proto = onnx.load(path, load_external_data=False)
    ranks = {
        len(i.dims)
        for n in proto.graph.node
        if n.op_type == "MatMulF32"
        for i in proto.graph.initializer
        if i.name == n.input[1]
    }
    assert ranks == {2, 3}  # the tied table as rows, the rest as panels
    again, _ = import_onnx(path)
    so = ort.SessionOptions()
    register(so, ["llmir_ops"])
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for s in (6, 1):
        feeds = {
            "input_ids": rng.integers(0, 100, (1, s)).astype(np.int64),
            "positions": np.arange(s)[None].astype(np.int64),
        }
        for i in proto.graph.input:
            if i.name.startswith("past_key_values."):
                d = [x.dim_value for x in i.type.tensor_type.shape.dim]
                feeds[i.name] = np.zeros((1, d[1], 0, d[3]), np.float32)
        want = sess.run(["logits"], feeds)[0]
        got = run_module(again, feeds)["logits"]
        assert rel(got, want) <= 1e-5, s


def test_f32_matmul_flag(tiny_module: Any, tmp_path: Path) -> None:
    """`--f32-matmul mlas` keeps onnxruntime's FusedMatMul (shown in the lowered module); a bad
    value is one usage error line, exit 2."""
    from tests.conftest import run_cli

    (tmp_path / "m.llmir").write_text(print_module(tiny_module))
    r = run_cli(
        "optimize", "m.llmir", "--target", "onnxruntime", "--f32-matmul", "mlas", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert "ort.fused_matmul" in r.stdout and "lower-ort-weight-dtype{f32_kernel=ort}" in r.stdout
    r = run_cli("build", "m.llmir", "-o", "a", "--f32-matmul", "blas", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "a").exists()
    assert "--f32-matmul must be 'llmir' or 'mlas', got 'blas'" in r.stderr
    assert "Traceback" not in r.stderr
