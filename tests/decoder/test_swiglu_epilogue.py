"""The SwiGLU epilogue of llmir's matmuls (`epilogue = "swiglu"` on
`ort.matmul_nbits {kernel = "llmir"}` / `ort.matmul_s8` / `ort.matmul_f32` / `ort.matmul16`:
ai.llmir MatMulNBitsQ4/Q8, MatMulS8, MatMulF32 and MatMulF16/Bf16 with the node attribute
`epilogue`): one op over the row-concatenated weight [W_gate; W_up] gives
silu(x W_gate^T) * (x W_up^T). The kernels against the same op without the epilogue followed by
numpy's silu * up (decode M = 1/3, prefill M = 128, batch dims, odd sizes), the op's reference,
the lowering that emits it (FileCheck in tests/filecheck/lower_ort_swiglu.llmir), a build with it
generating the greedy tokens of the unfused build, and the importer reading it back. Kernel tests
are skipped where the library cannot be built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.dialects.registry import get_op
from llmir_core.ir.printer import print_module
from llmir_core.quant import nbits, s8
from llmir_core.targets import build, lower
from llmir_core.targets.onnxruntime.native import DOMAIN, NBITS_OP_NAMES, unavailable_reason
from llmir_core.targets.onnxruntime.panels import to_panels
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import greedy, llmir_session, rel

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
F32 = np.float32
PROMPT = np.random.default_rng(2).integers(3, 100, (1, 9))


def _model(
    op: str,
    inputs: list[Any],
    init: list[Any],
    epilogue: str | None,
    threads: int = 2,
    **attrs: Any,
) -> Any:
    from onnx import TensorProto, helper

    names = ["x"] + [t.name for t in init]
    extra = {} if epilogue is None else {"epilogue": epilogue}
    node = helper.make_node(op, names, ["y"], domain=DOMAIN, **extra, **attrs)
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        [node], "m", [vi("x", TensorProto.FLOAT, None)], [vi("y", TensorProto.FLOAT, None)], init
    )
    return llmir_session(g, threads)


def _nbits_sessions(bits: int, n: int, k: int, f16: bool, seed: int) -> tuple[Any, Any]:
    from onnx import numpy_helper

    w = np.random.default_rng(seed).standard_normal((n, k)).astype(F32)
    codes, sc, _ = nbits.quantize(w, bits, 32, True, np.dtype(np.float16 if f16 else F32))
    init = [
        numpy_helper.from_array(codes.reshape(n, k // 32, -1), "b"),
        numpy_helper.from_array(sc.reshape(-1), "s"),
    ]
    op = NBITS_OP_NAMES[bits]
    return _model(op, [], init, "swiglu"), _model(op, [], init, None)


def _s8_sessions(n: int, k: int, seed: int) -> tuple[Any, Any]:
    from onnx import numpy_helper

    w = np.random.default_rng(seed).standard_normal((n, k)).astype(F32)
    codes, scales = s8.quantize_rows(w)
    init = [
        numpy_helper.from_array(s8.interleave(codes), "w"),
        numpy_helper.from_array(scales, "s"),
    ]
    return _model("MatMulS8", [], init, "swiglu"), _model("MatMulS8", [], init, None)


def _float_sessions(op: str, n: int, k: int, seed: int, threads: int = 2) -> tuple[Any, Any]:
    """MatMulF32 in panels ("MatMulF32"), as rows ("MatMulF32/rows"), MatMulF16, MatMulBf16
    over a random [n, k] weight: (with the epilogue, without)."""
    import ml_dtypes
    from onnx import numpy_helper

    w = np.random.default_rng(seed).standard_normal((n, k)).astype(F32)
    attrs: dict[str, Any] = {}
    if op == "MatMulF32":
        arr, attrs = to_panels(w), {"N": n}
    elif op == "MatMulF16":
        arr = w.astype(np.float16)
    elif op == "MatMulBf16":
        arr = w.astype(ml_dtypes.bfloat16)
    else:
        arr = w
    t = numpy_helper.from_array(arr, "w")
    name = op.split("/")[0]
    return (
        _model(name, [], [t], "swiglu", threads, **attrs),
        _model(name, [], [t], None, threads, **attrs),
    )


def _swiglu(full: np.ndarray) -> np.ndarray:
    h = full.shape[-1] // 2
    g, u = full[..., :h].astype(np.float64), full[..., h:].astype(np.float64)
    return g / (1.0 + np.exp(-g)) * u


def _check(fused: Any, plain: Any, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for shape in ((1, k), (3, k), (128, k), (2, 3, k), (2, 70, k)):
        x = (rng.standard_normal(shape) * 3).astype(F32)
        got = fused.run(None, {"x": x})[0]
        want = _swiglu(plain.run(None, {"x": x})[0])
        assert got.shape == want.shape and got.dtype == F32
        assert np.abs(got - want).max() <= 2e-6 * max(1.0, float(np.abs(want).max())), shape


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("h,k", [(37, 96), (64, 576), (300, 64), (5, 1056)])
def test_nbits_epilogue_matches_unfused(bits: int, f16: bool, h: int, k: int) -> None:
    fused, plain = _nbits_sessions(bits, 2 * h, k, f16, h * k + bits)
    _check(fused, plain, k, h + k)


@needs_kernel
@pytest.mark.parametrize("h,k", [(37, 29), (64, 576), (130, 1000), (6, 40)])
def test_s8_epilogue_matches_unfused(h: int, k: int) -> None:
    fused, plain = _s8_sessions(2 * h, k, h * k)
    _check(fused, plain, k, h + k)


FLOAT_OPS = ["MatMulF32", "MatMulF32/rows", "MatMulF16", "MatMulBf16"]


@needs_kernel
@pytest.mark.parametrize("op", FLOAT_OPS)
@pytest.mark.parametrize("h,k", [(16, 64), (48, 576), (160, 1000), (32, 7)])
def test_float_epilogue_matches_unfused(op: str, h: int, k: int) -> None:
    """The f32 (panels and rows) and 16-bit kernels: decode (the columns of a task combined as
    they finish) and prefill (the product, then the rows) against the unfused op + numpy."""
    fused, plain = _float_sessions(op, 2 * h, k, h * k)
    _check(fused, plain, k, h + k)


@needs_kernel
@pytest.mark.parametrize("op", FLOAT_OPS)
def test_float_epilogue_same_bits_at_any_thread_count(op: str) -> None:
    one, _ = _float_sessions(op, 2 * 96, 320, 3, threads=1)
    two, _ = _float_sessions(op, 2 * 96, 320, 3, threads=2)
    rng = np.random.default_rng(4)
    for m in (1, 3, 8, 40):
        x = rng.standard_normal((m, 320)).astype(F32)
        assert np.array_equal(one.run(None, {"x": x})[0], two.run(None, {"x": x})[0]), m


@needs_kernel
def test_float_epilogue_errors() -> None:
    from onnx import numpy_helper

    x = np.zeros((1, 8), F32)
    panels = numpy_helper.from_array(to_panels(np.ones((40, 8), F32)), "w")
    with pytest.raises(Exception, match="in panels needs N = 2H with H a multiple of 16"):
        _model("MatMulF32", [], [panels], "swiglu", N=40).run(None, {"x": x})
    odd = numpy_helper.from_array(np.ones((7, 8), F32), "w")
    with pytest.raises(Exception, match='MatMulF32: epilogue "swiglu" needs an even N'):
        _model("MatMulF32", [], [odd], "swiglu").run(None, {"x": x})
    odd16 = numpy_helper.from_array(np.ones((7, 8), np.float16), "w")
    with pytest.raises(Exception, match='matmul: epilogue "swiglu" needs an even N'):
        _model("MatMulF16", [], [odd16], "swiglu").run(None, {"x": x})
    for op, t in (("MatMulF32", odd), ("MatMulF16", odd16)):
        with pytest.raises(Exception, match="unknown epilogue"):
            _model(op, [], [t], "gelu").run(None, {"x": x})


@needs_kernel
def test_epilogue_errors() -> None:
    fused, _ = _nbits_sessions(4, 14, 64, False, 0)
    with pytest.raises(Exception, match="X \\[\\.\\.\\., K\\]"):
        fused.run(None, {"x": np.zeros((1, 32), F32)})
    odd, _ = _nbits_sessions(4, 15, 64, False, 0)
    with pytest.raises(Exception, match='epilogue "swiglu" needs an even N'):
        odd.run(None, {"x": np.zeros((1, 64), F32)})
    from onnx import numpy_helper

    codes, sc, _ = nbits.quantize(np.ones((4, 64), F32), 4, 32, True, np.dtype(F32))
    init = [
        numpy_helper.from_array(codes.reshape(4, 2, 16), "b"),
        numpy_helper.from_array(sc.reshape(-1), "s"),
    ]
    bad = _model("MatMulNBitsQ4", [], init, "gelu")
    with pytest.raises(Exception, match="unknown epilogue"):
        bad.run(None, {"x": np.zeros((1, 64), F32)})
    odd8, _ = _s8_sessions(7, 32, 0)
    with pytest.raises(Exception, match='epilogue "swiglu" needs an even N'):
        odd8.run(None, {"x": np.zeros((1, 32), F32)})


def test_reference_and_verifier() -> None:
    """The op's meaning: silu of the first half of a @ b^T times the second half."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 3, 64)).astype(F32)
    w = rng.standard_normal((10, 64)).astype(F32)
    op = get_op("ort.matmul_nbits")
    assert op is not None and op.reference is not None
    at = op.with_defaults({"bits": 4, "block_size": 32, "epilogue": "swiglu"})
    got = op.reference([a, w], at)
    full = a.astype(np.float64) @ w.astype(np.float64).T
    assert got.shape == (2, 3, 5) and np.allclose(got, _swiglu(full), rtol=1e-6, atol=1e-6)
    s8op = get_op("ort.matmul_s8")
    assert s8op is not None and s8op.reference is not None
    full8 = s8op.reference([a, w], {"epilogue": ""})
    assert np.allclose(s8op.reference([a, w], {"epilogue": "swiglu"}), _swiglu(full8), atol=1e-6)
    from llmir_core.ir.parser import parse_module
    from llmir_core.verifier import verify

    def errors(n: int, out: int, extra: str) -> list[str]:
        text = (
            f"module @m {{\n  func.func @main(%x: tensor<2x64xf32>, %w: tensor<{n}x64xf32>) -> "
            f"(tensor<2x{out}xf32>) {{\n    %y = ort.matmul_nbits %x, %w {{bits = 4, "
            f'block_size = 32, epilogue = "swiglu"{extra}}} : (tensor<2x64xf32>, '
            f"tensor<{n}x64xf32>) -> tensor<2x{out}xf32>\n    return %y : tensor<2x{out}xf32>\n"
            "  }\n}\n"
        )
        return [d.message for d in verify(parse_module(text)) if d.severity == "error"]

    assert not [e for e in errors(10, 5, ', kernel = "llmir"') if "ort.matmul_nbits" not in e]
    assert any("needs an even N" in e for e in errors(9, 4, ', kernel = "llmir"'))
    assert any('epilogue "swiglu" needs kernel "llmir"' in e for e in errors(10, 5, ""))


def test_float_reference_and_verifier() -> None:
    """ort.matmul_f32 / ort.matmul16 with the epilogue: silu of the first half of a @ b^T times
    the second half; the verifier wants an even N, and in panels N = 2H with H % 16 == 0."""
    import ml_dtypes

    from llmir_core.ir.parser import parse_module
    from llmir_core.verifier import verify

    rng = np.random.default_rng(6)
    a = rng.standard_normal((2, 3, 64)).astype(F32)
    w = rng.standard_normal((10, 64)).astype(F32)
    full = a.astype(np.float64) @ w.astype(np.float64).T
    for name, wt in (("ort.matmul_f32", w), ("ort.matmul16", w.astype(ml_dtypes.bfloat16))):
        od = get_op(name)
        assert od is not None and od.reference is not None
        got = od.reference([a, wt], od.with_defaults({"epilogue": "swiglu"}))
        want = _swiglu(a.astype(np.float64) @ wt.astype(np.float64).T)
        assert got.shape == (2, 3, 5) and np.allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.allclose(
        get_op("ort.matmul_f32").reference([a, w], {"epilogue": "none"}),  # type: ignore[union-attr]
        full,
        atol=1e-5,
    )

    def errors(op: str, n: int, out: int, attrs: str, dt: str = "f32") -> list[str]:
        text = (
            'module @m attributes {llmir.dialects = ["core", "ort"]} {\n'
            f"  func.func @main(%x: tensor<2x64xf32>, %w: tensor<{n}x64x{dt}>) -> "
            f"(tensor<2x{out}xf32>) {{\n    %y = {op} %x, %w {{{attrs}}} : (tensor<2x64xf32>, "
            f"tensor<{n}x64x{dt}>) -> tensor<2x{out}xf32>\n    return %y : tensor<2x{out}xf32>\n"
            "  }\n}\n"
        )
        return [d.message for d in verify(parse_module(text)) if d.severity == "error"]

    swiglu = 'epilogue = "swiglu"'
    assert not errors("ort.matmul_f32", 10, 5, swiglu)
    assert not errors("ort.matmul_f32", 64, 32, swiglu + ', layout = "panel16"')
    assert not errors("ort.matmul16", 10, 5, swiglu, "f16")
    assert any("needs an even N" in e for e in errors("ort.matmul_f32", 9, 4, swiglu))
    assert any("needs an even N" in e for e in errors("ort.matmul16", 9, 4, swiglu, "bf16"))
    panel = errors("ort.matmul_f32", 40, 20, swiglu + ', layout = "panel16"')
    assert any("in panels needs N = 2H with H a multiple of 16, got N = 40" in e for e in panel)


def _ops(module: Any, name: str) -> list[Any]:
    return [op for op in module.main.ops if op.name == name]


@needs_kernel
@pytest.mark.parametrize("quant,opname", [("int4", "ort.matmul_nbits"), ("int8", "ort.matmul_s8")])
def test_fused_build_generates_the_same_tokens(
    quant: str, opname: str, tiny_module: Any, tmp_path: Path
) -> None:
    """The fused build (one op per gated MLP) and the unfused one (`swiglu = false`) generate
    the same greedy tokens; the choice shows in the lowered text."""
    fused = lower(tiny_module, options={"quant": quant})
    plain = lower(tiny_module, options={"quant": quant, "swiglu": False})
    text = print_module(fused)
    assert 'epilogue = "swiglu"' in text and "ort.quick_gelu" not in text
    assert 'epilogue = "swiglu"' not in print_module(plain)
    n_layers = len(_ops(plain, "ort.quick_gelu"))
    assert n_layers > 0
    assert len([o for o in _ops(fused, opname) if o.attrs.get("epilogue") == "swiglu"]) == n_layers
    build(tiny_module, str(tmp_path / "fused"), "onnxruntime", options={"quant": quant})
    opts = {"quant": quant, "swiglu": False}
    build(tiny_module, str(tmp_path / "plain"), "onnxruntime", options=opts)
    a, b = open_decoder(str(tmp_path / "fused")), open_decoder(str(tmp_path / "plain"))
    prompt = PROMPT[0].tolist()
    assert greedy(a, prompt, 12) == greedy(b, prompt, 12)


def _onnx_nodes(art: Path) -> list[str]:
    import onnx

    return [
        n.op_type for n in onnx.load(str(art / "model.onnx"), load_external_data=False).graph.node
    ]


@needs_kernel
@pytest.mark.parametrize(
    "opts,opname", [({}, "ort.matmul_f32"), ({"dtype": "f16"}, "ort.matmul16")]
)
def test_fused_float_build_matches_the_unfused_one(
    opts: dict[str, Any], opname: str, tiny_module: Any, tmp_path: Path
) -> None:
    """f32 (panels) and f16 builds: the gated MLP is one matmul over [gate; up] with the SwiGLU
    epilogue (3 onnxruntime nodes a layer fewer: gate, up, QuickGelu, Mul -> one); its logits are the unfused build's to 1e-4 and
    its greedy tokens the same; `swiglu = false` keeps the op-by-op MLP."""
    fused = lower(tiny_module, options=opts)
    plain = lower(tiny_module, options={**opts, "swiglu": False})
    text = print_module(fused)
    assert "ort.quick_gelu" not in text and 'epilogue = "swiglu"' not in print_module(plain)
    n_layers = len(_ops(plain, "ort.quick_gelu"))
    assert n_layers > 0
    assert len([o for o in _ops(fused, opname) if o.attrs.get("epilogue") == "swiglu"]) == n_layers
    build(tiny_module, str(tmp_path / "fused"), "onnxruntime", options=opts)
    build(tiny_module, str(tmp_path / "plain"), "onnxruntime", options={**opts, "swiglu": False})
    nodes_f, nodes_p = _onnx_nodes(tmp_path / "fused"), _onnx_nodes(tmp_path / "plain")
    assert len(nodes_p) - len(nodes_f) == 3 * n_layers and "QuickGelu" not in nodes_f
    a, b = open_decoder(str(tmp_path / "fused")), open_decoder(str(tmp_path / "plain"))
    a.reset(1)
    b.reset(1)
    assert rel(a.forward(PROMPT), b.forward(PROMPT)) <= 1e-4
    prompt = PROMPT[0].tolist()
    assert greedy(a, prompt, 12) == greedy(b, prompt, 12)


def test_float_fusion_needs_an_unshared_weight_and_whole_panels(
    tiny_module: Any, tmp_path: Path
) -> None:
    """A gate weight that is also the up weight (tied) is never fused; neither is an f32 MLP
    whose H is not a multiple of 16 (panels), nor one under --f32-matmul mlas."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.passes.base import clone_module

    from .tiny import LlamaShape, make_llama_folder

    tied = clone_module(tiny_module)
    mlp = next(op for op in tied.main.ops if op.name == "llm.gated_mlp")
    mlp.operands[2] = mlp.operands[1]  # up = gate: one weight with two uses
    n_layers = len(_ops(tied, "llm.gated_mlp"))
    fused = [o for o in _ops(lower(tied), "ort.matmul_f32") if o.attrs.get("epilogue")]
    assert len(fused) == n_layers - 1
    odd = import_hf(make_llama_folder(tmp_path / "m", LlamaShape(intermediate=40)))
    assert "epilogue" not in print_module(lower(odd))
    assert "epilogue" in print_module(lower(odd, options={"dtype": "f16"}))  # no panels there
    assert "epilogue" not in print_module(lower(tiny_module, options={"f32_matmul": "ort"}))


@needs_kernel
def test_mlas_kernel_keeps_the_unfused_mlp(tiny_module: Any) -> None:
    text = print_module(lower(tiny_module, options={"quant": "int4", "nbits_kernel": "mlas"}))
    assert "epilogue" not in text and "ort.quick_gelu" in text


@needs_kernel
@pytest.mark.parametrize("opts", [{"quant": "int4"}, {}])
def test_reimported_fused_artifact(opts: dict[str, Any], tiny_module: Any, tmp_path: Path) -> None:
    """The importer reads `epilogue = "swiglu"` back as the gated product of the two halves of
    one matmul (int4 blocks, f32 panels): the reimported module generates the artifact's
    tokens."""
    from llmir_core.frontends.onnx import import_onnx

    from .helpers import ref_decoder

    build(tiny_module, str(tmp_path / "a"), "onnxruntime", options=opts)
    again, _ = import_onnx(str(tmp_path / "a" / "model.onnx"))
    n_layers = len(_ops(lower(tiny_module, options={**opts, "swiglu": False}), "ort.quick_gelu"))
    assert len(_ops(again, "llm.silu_mul")) == n_layers
    want = greedy(open_decoder(str(tmp_path / "a")), PROMPT[0].tolist(), 6)
    assert greedy(ref_decoder(again), PROMPT[0].tolist(), 6) == want


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_float_fusion_is_equivalent_to_the_unfused_lowering(dtype: str, tiny_module: Any) -> None:
    """`llmir verify fused.llmir --against plain.llmir` for the f32 and f16 lowerings (built
    for llmir's kernel whatever this machine has: f32_matmul / kernel "custom")."""
    from llmir_core.passes.base import clone_module
    from llmir_core.passes.manager import run_pipeline
    from llmir_core.smt.differential import compare
    from llmir_core.targets import get_target
    from llmir_core.targets.onnxruntime.lower_weight_dtype import LowerOrtWeightDtype

    def lowered(swiglu: bool) -> Any:
        passes = get_target("onnxruntime").lowering({"swiglu": swiglu})
        i = next(i for i, p in enumerate(passes) if p.name == "lower-ort-weight-dtype")
        passes[i] = LowerOrtWeightDtype(dtype, kernel="custom", f32_kernel="custom", swiglu=swiglu)
        return run_pipeline(clone_module(tiny_module), passes).module

    fused, plain = lowered(True), lowered(False)
    assert 'epilogue = "swiglu"' in print_module(fused)
    assert compare(plain, fused).get("agree")


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_fusion_is_equivalent_to_the_unfused_lowering(quant: str, tiny_module: Any) -> None:
    """What `llmir verify fused.llmir --against plain.llmir` checks: the fused module computes
    what the op-by-op one does (the blocks of [gate; up] are the blocks of each), on the
    reference interpreter."""
    from llmir_core.smt.differential import compare

    opts: dict[str, Any] = {"quant": quant, "nbits_kernel": "llmir"}
    if quant == "int8":
        opts["int8_matmul"] = "nbits"  # llmir's Q8 kernel whatever the library does here
    fused = lower(tiny_module, options=opts)
    plain = lower(tiny_module, options={**opts, "swiglu": False})
    assert 'epilogue = "swiglu"' in print_module(fused)
    assert compare(plain, fused).get("agree")
