"""llmir's onnxruntime custom ops (`ort.matmul16`, `ort.matmul_f32`, llmir_core/targets/onnxruntime/native):
the compiled kernels against the ops' numpy reference for f16, bf16 and f32 weights over every
decode-shaped M (GEMV, 1..8), the GEMM cutoff and prefill M, odd K/N; a `--dtype f16` build that
uses it computes what the f32-path build computes, and so does an f32 build on MatMulF32
(`f32_kernel`, the default); a build for cpu=x86-64 keeps the f32 path, and an artifact that
needs the library is refused with one clear line where it cannot load. Tests that run the kernel
are skipped where it cannot be built (no C compiler, no AVX2/FMA/F16C, not Linux x86-64)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.dialects.registry import get_op
from llmir_core.errors import InputError
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import DType, numpy_dtype
from llmir_core.passes.base import clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.targets import build, get_target
from llmir_core.targets.onnxruntime.native import (
    DOMAIN,
    OP_NAMES,
    CustomOpError,
    library_path,
    register,
    unavailable_reason,
)
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import assert_dot_close, edge_rows, greedy, rel

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
PROMPT = np.array([[1, 5, 9, 2, 7, 3]])


def _session(dt: str, n: int, k: int, threads: int = 2) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    wt = {"f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16, "f32": TensorProto.FLOAT}[dt]
    node = helper.make_node(OP_NAMES[dt], ["x", "w"], ["y"], domain=DOMAIN)
    g = helper.make_graph(
        [node],
        "m16",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("w", wt, [n, k]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    register(so, ["matmul16"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _run(sess: Any, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    from llmir_core.targets.onnxruntime.session import run_session

    return run_session(sess, {"x": x, "w": w})[0]


@needs_kernel
@pytest.mark.parametrize("dt", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("n,k", [(37, 29), (64, 96), (131, 1000), (33, 200)])
def test_kernel_matches_reference(dt: str, n: int, k: int) -> None:
    rng = np.random.default_rng(n * k)
    sess = _session(dt, n, k)
    w = rng.standard_normal((n, k)).astype(numpy_dtype(DType(dt)))
    ref = get_op("ort.matmul_f32" if dt == "f32" else "ort.matmul16").reference  # type: ignore[union-attr]
    # decode (GEMV: M <= 8, every M: 1 row, then 4-row passes with a ragged last one), the GEMM
    # from M = 9 (ragged 6-row tiles), prefill-sized M; K with and without a 64-column step, an
    # 8-column rest and a scalar tail
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 64, 128):
        x = edge_rows(rng.standard_normal((m, k)).astype(np.float32))  # zero, tiny, huge rows
        got, want = _run(sess, x, w), ref([x, w], {})
        assert got.shape == (m, n) and got.dtype == np.float32
        # f32 accumulation of k products against the f64 reference, element by element
        size = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
        assert_dot_close(got, want, size, 5e-7 * np.sqrt(k))


@needs_kernel
def test_kernel_takes_batched_rows_and_thread_counts() -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((70, 48)).astype(np.float16)
    x = rng.standard_normal((2, 9, 48)).astype(np.float32)  # [batch, seq, K]: M = 18
    one, two = _run(_session("f16", 70, 48, 1), x, w), _run(_session("f16", 70, 48, 2), x, w)
    assert one.shape == (2, 9, 70)
    # each output is computed by one thread in a fixed order: the same bits at any thread count
    assert np.array_equal(one, two)
    assert rel(one, x.astype(np.float64) @ w.astype(np.float64).T) <= 1e-5
    # GEMV split into row ranges over the threads: the same bits too (N not a multiple of them)
    w = rng.standard_normal((1001, 130)).astype(np.float16)
    x = rng.standard_normal((1, 1, 130)).astype(np.float32)
    one, two = _run(_session("f16", 1001, 130, 1), x, w), _run(_session("f16", 1001, 130, 2), x, w)
    assert np.array_equal(one, two)
    assert rel(one, x.astype(np.float64) @ w.astype(np.float64).T) <= 1e-5


@needs_kernel
def test_library_is_compiled_once_into_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from llmir_core.targets.onnxruntime import native

    monkeypatch.delenv("LLMIR_EXT_CACHE")  # the default place: under LLMIR_HOME
    monkeypatch.setattr(native, "SHIPPED_DIR", Path(os.environ["LLMIR_HOME"]))  # none installed
    path = Path(library_path())
    assert path.is_file() and path.parent == Path(os.environ["LLMIR_HOME"]) / "ort_ext"
    assert library_path() == str(path)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_unknown_library_is_refused() -> None:
    import onnxruntime as ort

    with pytest.raises(CustomOpError, match="unknown custom-op library 'other'"):
        register(ort.SessionOptions(), ["other"])


def _lowered(module: Any, dtype: str, cpu: str = "x86-64-v3") -> str:
    lowering = get_target("onnxruntime").lowering({"dtype": dtype, "cpu": cpu})
    return print_module(run_pipeline(clone_module(module), lowering).module)


@needs_kernel
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_build_uses_the_op_and_matches_the_f32_path(
    dt: str, tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _lowered(tiny_module, dt)
    assert "ort.matmul16" in text and "ort.fused_matmul" not in text
    build(tiny_module, str(tmp_path / "custom"), "onnxruntime", options={"dtype": dt})
    # the same build without the custom op
    opts = {"dtype": dt, "cpu": "x86-64"}
    build(tiny_module, str(tmp_path / "f32path"), "onnxruntime", options=opts)
    man = json.loads((tmp_path / "custom" / "manifest.json").read_text())
    assert man["custom_ops"] == ["llmir_ops"] and man["opset"][DOMAIN] == 1
    a, b = open_decoder(str(tmp_path / "custom")), open_decoder(str(tmp_path / "f32path"))
    a.reset(1)
    b.reset(1)
    # the same rounded weights, only the summation order differs
    assert rel(a.forward(PROMPT), b.forward(PROMPT)) <= 1e-5
    assert greedy(a, [1, 5, 9], 32) == greedy(b, [1, 5, 9], 32)


def test_for_portable_x86_64_the_f32_path_is_kept(tiny_module: Any, tmp_path: Path) -> None:
    text = _lowered(tiny_module, "f16", "x86-64")
    assert "ort.matmul16" not in text
    assert "ort.cast" in text and "ort.fused_matmul" in text
    opts = {"dtype": "f16", "cpu": "x86-64"}
    build(tiny_module, str(tmp_path / "art"), "onnxruntime", options=opts)
    man = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert man["custom_ops"] == [] and DOMAIN not in man["opset"]


def test_artifact_needing_the_library_is_refused_where_it_cannot_load(
    tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(tiny_module, str(tmp_path / "art"), "onnxruntime", options={"dtype": "f16"})
    monkeypatch.setenv("LLMIR_NO_CUSTOM_OPS", "1")  # forbids loading the library
    with pytest.raises(InputError, match="built for cpu=x86-64-v3") as e:
        open_decoder(str(tmp_path / "art"))
    assert "LLMIR_NO_CUSTOM_OPS is set: rebuild with --target-opt cpu=x86-64" in str(e.value)


def test_bad_kernel_option_is_a_usage_error(tiny_module: Any) -> None:
    from llmir_core.targets.onnxruntime.lower_weight_dtype import LowerOrtWeightDtype

    lowering = get_target("onnxruntime").lowering({"dtype": "f16"})
    i = next(i for i, p in enumerate(lowering) if p.name == "lower-ort-weight-dtype")
    lowering[i] = LowerOrtWeightDtype("f16", kernel="avx512")
    with pytest.raises(InputError, match="unknown kernel 'avx512'"):
        run_pipeline(clone_module(tiny_module), lowering)


def test_verify_proves_the_rewrite(
    tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `verify --against` the same --dtype lowering on the f32 path: ort.matmul16 expands through
    # its decomposition to the terms of fused_matmul(x, ort.cast(w, f32)); no kernel needed (the
    # gated MLP op by op: tests/decoder/test_swiglu_epilogue.py checks its fused form)
    from llmir_core.targets.onnxruntime.lower_weight_dtype import LowerOrtWeightDtype
    from tests.conftest import run_cli

    for kernel in ("custom", "f32"):
        lowering = get_target("onnxruntime").lowering({"dtype": "f16", "swiglu": False})
        i = next(i for i, p in enumerate(lowering) if p.name == "lower-ort-weight-dtype")
        lowering[i] = LowerOrtWeightDtype("f16", kernel=kernel, swiglu=False)
        module = run_pipeline(clone_module(tiny_module), lowering).module
        (tmp_path / f"{kernel}.llmir").write_text(print_module(module))
    r = run_cli("verify", "custom.llmir", "--against", "f32.llmir", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "equivalent to f32.llmir (by smt" in r.stdout
    assert "ort.matmul16 x" in r.stdout and "expanded through its decomposition" in r.stdout


def test_a_compiler_that_fails_changes_no_lowering(
    tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the lowering never compiles: a failing compiler changes nothing until the library loads
    from llmir_core.targets.onnxruntime import native

    before = _lowered(tiny_module, "f16")
    monkeypatch.setenv("CC", "false")
    monkeypatch.setenv("LLMIR_EXT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "SHIPPED_DIR", tmp_path)  # no library installed
    assert _lowered(tiny_module, "f16") == before and "ort.matmul16" in before
    with pytest.raises(CustomOpError, match="no library was shipped with the package"):
        library_path()
    assert not list((tmp_path / "cache").glob("*"))  # no partial library left behind


# -- f32 weights: ai.llmir MatMulF32 (ort.matmul_f32) ----------------------------------------------


def _f32_lowering(**kw: Any) -> list[Any]:
    from llmir_core.targets.onnxruntime.lower_weight_dtype import LowerOrtWeightDtype

    lowering = get_target("onnxruntime").lowering({"cpu": kw.get("cpu", "x86-64-v3")})
    i = next(i for i, p in enumerate(lowering) if p.name == "lower-ort-weight-dtype")
    lowering[i] = LowerOrtWeightDtype("", **kw)
    return lowering


def test_f32_kernel_choice_shows_in_the_lowered_module(tiny_module: Any) -> None:
    from llmir_core.targets.onnxruntime.lower_weight_dtype import F32_KERNEL

    text = print_module(
        run_pipeline(clone_module(tiny_module), _f32_lowering(f32_kernel="custom")).module
    )
    assert "ort.matmul_f32" in text and "ort.fused_matmul" not in text
    assert "lower-ort-weight-dtype{f32_kernel=custom}" in text
    mlas = print_module(
        run_pipeline(clone_module(tiny_module), _f32_lowering(f32_kernel="ort")).module
    )
    assert "ort.matmul_f32" not in mlas and "ort.fused_matmul" in mlas
    assert "lower-ort-weight-dtype{f32_kernel=ort}" in mlas
    assert F32_KERNEL == "auto"  # the default: llmir's kernel where its library builds


@needs_kernel
def test_default_reads_f32_weights_in_place(tiny_module: Any, tmp_path: Path) -> None:
    # the default lowering (and --prepack none) takes ort.matmul_f32; --f32-matmul mlas
    # (option f32_matmul=ort) keeps onnxruntime's FusedMatMul
    for opts in ({}, {"prepack": "none"}):
        text = print_module(
            run_pipeline(clone_module(tiny_module), get_target("onnxruntime").lowering(opts)).module
        )
        assert "ort.matmul_f32" in text and "ort.fused_matmul" not in text
    build(tiny_module, str(tmp_path / "custom"), "onnxruntime", options={})
    # (onnxruntime's attention too, so that the MLAS build needs no custom-op library at all)
    mlas_opts = {"f32_matmul": "ort", "attention_kernel": "onnxruntime"}
    build(tiny_module, str(tmp_path / "mlas"), "onnxruntime", options=mlas_opts)
    man = json.loads((tmp_path / "custom" / "manifest.json").read_text())
    assert man["custom_ops"] == ["llmir_ops"] and man["opset"][DOMAIN] == 1
    mlas = json.loads((tmp_path / "mlas" / "manifest.json").read_text())
    assert mlas["custom_ops"] == [] and DOMAIN not in mlas["opset"]
    a, b = open_decoder(str(tmp_path / "custom")), open_decoder(str(tmp_path / "mlas"))
    a.reset(1)
    b.reset(1)
    # the same f32 weights, only the summation order differs
    assert rel(a.forward(PROMPT), b.forward(PROMPT)) <= 1e-5
    assert greedy(a, [1, 5, 9], 32) == greedy(b, [1, 5, 9], 32)


def test_f32_kernel_falls_back_for_portable_x86_64(tiny_module: Any, tmp_path: Path) -> None:
    text = print_module(
        run_pipeline(
            clone_module(tiny_module), _f32_lowering(f32_kernel="auto", cpu="x86-64")
        ).module
    )
    assert "ort.matmul_f32" not in text and "ort.fused_matmul" in text
    opts = {"prepack": "none", "cpu": "x86-64"}
    build(tiny_module, str(tmp_path / "art"), "onnxruntime", options=opts)
    man = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert man["custom_ops"] == [] and DOMAIN not in man["opset"]


def test_bad_f32_kernel_is_a_usage_error(tiny_module: Any) -> None:
    with pytest.raises(InputError, match="unknown f32_kernel 'mlas'"):
        run_pipeline(clone_module(tiny_module), _f32_lowering(f32_kernel="mlas"))


def test_verify_proves_the_f32_rewrite(tiny_module: Any, tmp_path: Path) -> None:
    # the gated MLP op by op (its fused form is validated differentially:
    # tests/decoder/test_swiglu_epilogue.py)
    from tests.conftest import run_cli

    for kernel in ("custom", "ort"):
        lowering = _f32_lowering(f32_kernel=kernel, swiglu=False)
        module = run_pipeline(clone_module(tiny_module), lowering).module
        (tmp_path / f"{kernel}.llmir").write_text(print_module(module))
    r = run_cli("verify", "custom.llmir", "--against", "ort.llmir", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "equivalent to ort.llmir (by smt" in r.stdout
