"""`ort.moe` / `ort.qmoe` (com.microsoft MoE / QMoE) and the lower-ort-moe lowering: the ops'
references against their decompositions, verifier errors, exact widening of expert blocks, and
GGUF MoE files with quantized experts built for onnxruntime (the experts stay quantized) against
the reference interpreter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.builder import Builder
from llmir_core.dialects import get_op
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Function, Module
from llmir_core.ir.types import DType, TensorType
from llmir_core.verifier import verify

from .tiny import VOCAB, ir_greedy, rel_diff

E, H, INTER, T = 4, 32, 16, 5


def _op_module(name: str, n: int, attrs: dict[str, Any], decomposed: bool) -> Module:
    shapes = [(1, T, H), (1, T, E), (E, INTER, H), (E, INTER, H), (E, H, INTER), (1, T, E)]
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", TensorType(s, DType.f32)) for i, s in enumerate(shapes[:n])]
    if decomposed:
        opdef = get_op(name)
        assert opdef is not None and opdef.decompose is not None
        outs = opdef.decompose(b, args, opdef.with_defaults(attrs))
    else:
        outs = [b.create(name, args, attrs).result]
    b.ret(*outs)
    return Module("m", [fn], {"llmir.dialects": ("core", "llm", "ort")})


def _feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(1, T, H), (1, T, E), (E, INTER, H), (E, INTER, H), (E, H, INTER), (1, T, E)]
    feeds = {f"a{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes[:n])}
    for i in (2, 3, 4):
        feeds[f"a{i}"] /= np.sqrt(shapes[i][-1])  # O(1) activations
    if n == 6:
        feeds["a5"] = np.abs(feeds["a5"])  # mixing weights (sigmoid scores) are positive
    return feeds


@pytest.mark.parametrize(
    "name, n, attrs",
    [
        ("ort.moe", 5, {"k": 2}),
        ("ort.moe", 5, {"k": 3, "normalize": False}),
        ("ort.qmoe", 5, {"k": 1, "bits": 4, "block_size": 16}),
        ("ort.qmoe", 6, {"k": 2, "bits": 8, "block_size": 16, "normalize": False}),
    ],
)
def test_reference_matches_decomposition(name: str, n: int, attrs: dict[str, Any]) -> None:
    ref, dec = _op_module(name, n, attrs, False), _op_module(name, n, attrs, True)
    assert verify(ref) == [] and verify(dec) == []
    feeds = _feeds(n)
    a, b = Interpreter(ref).run(feeds)[0], Interpreter(dec).run(feeds)[0]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_qmoe_reference_rounds_requantized_weights() -> None:
    """quantize = sym for the down weight: the reference is the exact op on the rounded weight."""
    from llmir_core.targets.onnxruntime.dialect import fake_quant

    attrs = {"k": 2, "bits": 4, "block_size": 16, "quantize": ("none", "none", "sym")}
    feeds = _feeds(5, seed=1)
    got = Interpreter(_op_module("ort.qmoe", 5, attrs, False)).run(feeds)[0]
    wd = feeds["a4"]
    feeds["a4"] = fake_quant(wd.reshape(-1, INTER), 4, 16, "sym").reshape(wd.shape)
    exact = {"k": 2, "bits": 4, "block_size": 16}
    want = Interpreter(_op_module("ort.qmoe", 5, exact, True)).run(feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (
        np.abs(
            got - Interpreter(_op_module("ort.qmoe", 5, exact, False)).run(_feeds(5, 1))[0]
        ).max()
        > 0
    )
    with pytest.raises(Exception, match="requantizing ort.qmoe has no exact decomposition"):
        _op_module("ort.qmoe", 5, attrs, True)


@pytest.mark.parametrize(
    "name, n, attrs, message",
    [
        ("ort.qmoe", 5, {"k": 2, "bits": 3, "block_size": 16}, r"bits must be 4 or 8, got 3"),
        ("ort.qmoe", 5, {"k": 2, "bits": 4, "block_size": 24}, r"power of two >= 16, got 24"),
        ("ort.qmoe", 5, {"k": 2, "bits": 4, "block_size": 64}, r"hidden size 32 is not a multiple"),
        (
            "ort.qmoe",
            5,
            {"k": 2, "bits": 4, "block_size": 16, "quantize": ("none",)},
            r"quantize must list",
        ),
        ("ort.moe", 6, {"k": 2}, r"takes 5 operands"),
        ("ort.moe", 5, {"k": 5}, r"k must be in 1\.\.4, got 5"),
    ],
)
def test_verifier_errors(name: str, n: int, attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message):
        _op_module(name, n, attrs, False)


def test_widen_is_exact() -> None:
    """4-bit blocks of 32 with zero points, re-expressed as 8-bit blocks of 16: same values."""
    from llmir_core.quant import nbits
    from llmir_core.targets.onnxruntime.serialize_moe import widen

    w = np.random.default_rng(0).standard_normal((6, 64)).astype(np.float32)
    codes, sc, zp = nbits.quantize(w, 4, 32, False, np.dtype(np.float32))
    want = nbits.dequantize(codes, sc, zp, 4, 32, w.shape)
    q, sc2, z2 = widen(codes, sc, zp, 6, 64, 8, 16)
    got = (q.astype(np.float32) - np.repeat(z2, 16, axis=1)) * np.repeat(sc2, 16, axis=1)
    np.testing.assert_array_equal(got, want)


# -- GGUF MoE builds ------------------------------------------------------------------------------

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to write test files")


def _ort_greedy(module: Any, art: Path, prompt: np.ndarray, steps: int, **opts: Any) -> Any:
    pytest.importorskip("onnxruntime", reason="onnxruntime builds are checked when it is installed")
    from .test_rope_types import ort_greedy

    return ort_greedy(module, art, prompt, steps, **opts)


def _nodes(art: Path) -> tuple[dict[str, Any], dict[str, int]]:
    import onnx

    m = onnx.load(str(art / "model.onnx"), load_external_data=False)
    inits = {t.name: t for t in m.graph.initializer}
    counts: dict[str, int] = {}
    for nd in m.graph.node:
        counts[nd.op_type] = counts.get(nd.op_type, 0) + 1
    rank = {"MoE": 0, "QMoE": 0, "MatMulNBits": 1}
    moe = min((nd for nd in m.graph.node if nd.op_type in rank), key=lambda nd: rank[nd.op_type])
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in moe.attribute}
    attrs["fc1_dtype"] = inits[moe.input[2 if moe.op_type != "MatMulNBits" else 1]].data_type
    return attrs, counts


def _write(tiny_model: Any, arch: str, path: Path, policy: Any, raw: Any = None) -> Any:
    from safetensors.numpy import load_file

    from llmir_core.frontends.gguf import import_gguf

    from .gguf_convert import write_gguf

    folder, _ = tiny_model(arch)
    write_gguf(folder, load_file(str(folder / "model.safetensors")), path, policy, raw=raw)
    return import_gguf(path)


@pytest.mark.parametrize(
    "experts, level, node",
    [
        ("F32", 1, "MoE"),
        ("Q4_0", 1, "QMoE"),
        ("Q8_0", 1, "MatMulNBits"),  # 8-bit QMoE has no f32 activations: one matmul per weight
        ("Q8_0", 4, "QMoE"),
        ("Q8_0+Q4_0", 4, "QMoE"),  # gate/up q8_0, down q4_0: widened to one width
    ],
)
def test_gguf_experts_build(
    experts: str, level: int, node: str, tiny_model: Any, tmp_path: Path
) -> None:
    """Greedy tokens over 32 steps identical to the reference interpreter's and logits within
    1e-4 at accuracy_level 1 (f32 activations); at level 4 (int8 activations) one forward within
    int8 error. The expert weights stay in their blocks (uint8 codes)."""
    first, _, down = experts.partition("+")
    policy = {"ffn_gate_exps": first, "ffn_up_exps": first, "ffn_down_exps": down or first}
    module = _write(tiny_model, "qwen3-moe-q", tmp_path / "m.gguf", {**policy, "*": "F32"})
    p = np.random.default_rng(3).integers(3, VOCAB, (2, 8))
    steps = 32 if level == 1 else 0
    got = _ort_greedy(module, tmp_path / "art", p, steps, accuracy_level=level)
    want = ir_greedy(module, p, steps)
    attrs, counts = _nodes(tmp_path / "art")
    assert counts.get(node) == (2 if node != "MatMulNBits" else 2 * 4 * 3)
    if node == "QMoE":
        assert attrs["expert_weight_bits"] == (4 if experts == "Q4_0" else 8)
    if node != "MoE":
        assert attrs["fc1_dtype"] == 2  # uint8 codes
    np.testing.assert_array_equal(got[1], want[1])
    worst = max(rel_diff(a, b) for a, b in zip(got[0], want[0]))
    assert worst <= (1e-4 if level == 1 else 5e-2), f"max relative logit difference {worst:.2e}"


def test_gguf_kquant_experts(tiny_model: Any, tmp_path: Path) -> None:
    """q3_k experts repack losslessly to 4-bit blocks of 16 (exact); q4_k gate/up with q6_k down
    (llama.cpp's Q4_K_M mix) become 8-bit blocks of 16 at accuracy_level 4, q4_k requantized with
    zero points (the manifest lists them with their error)."""
    from .test_gguf_import import kquant_blocks

    rng = np.random.default_rng(0)
    p = np.random.default_rng(3).integers(3, VOCAB, (1, 6))
    for case, types in (("q3k", ("Q3_K", "Q3_K", "Q3_K")), ("q4km", ("Q4_K", "Q4_K", "Q6_K"))):
        raw = {}
        for layer in range(2):
            for part, q in zip(("gate", "up", "down"), types):
                blocks = kquant_blocks(4 * 256, 256, q, rng)
                raw[f"blk.{layer}.ffn_{part}_exps.weight"] = (blocks.reshape(4, 256, -1), q)
        module = _write(tiny_model, "qwen3-moe-k", tmp_path / f"{case}.gguf", "F32", raw)
        art = tmp_path / case
        level = 1 if case == "q3k" else 4
        got = _ort_greedy(module, art, p, 0, accuracy_level=level)[0][0]
        want = ir_greedy(module, p, 0)[0][0]
        attrs, _ = _nodes(art)
        assert (attrs["expert_weight_bits"], attrs["block_size"]) == (
            (4, 16) if case == "q3k" else (8, 16)
        )
        manifest = json.loads((art / "manifest.json").read_text())
        requant = json.dumps(manifest)
        if case == "q3k":
            assert rel_diff(got, want) <= 1e-4
            assert "q4_k" not in requant
        else:
            assert rel_diff(got, want) <= 5e-2
            assert '"from": "q4_k"' in requant


def test_f32_experts_quantized_on_request(tiny_model: Any, tmp_path: Path) -> None:
    """`--quant int4` quantizes f32 experts into QMoE (sym), within 4-bit rounding error."""
    module = _write(tiny_model, "qwen3-moe-q", tmp_path / "m.gguf", "F32")
    p = np.random.default_rng(3).integers(3, VOCAB, (1, 6))
    got = _ort_greedy(module, tmp_path / "art", p, 0, quant="int4", accuracy_level=1)[0][0]
    attrs, _ = _nodes(tmp_path / "art")
    assert attrs["expert_weight_bits"] == 4 and attrs["block_size"] == 32
    assert rel_diff(got, ir_greedy(module, p, 0)[0][0]) <= 0.2


def test_hf_shared_expert_gate_builds_with_moe(tiny_model: Any, tmp_path: Path) -> None:
    """Qwen2-MoE (per-expert HF tensors, a gated shared expert): MoE for the routed experts, the
    shared expert as its own matmuls; the logits match the interpreter."""
    from llmir_core.frontends.hf import import_hf

    folder, _ = tiny_model("qwen2-moe")
    module = import_hf(folder, require_tokenizer=False)
    p = np.random.default_rng(3).integers(3, VOCAB, (1, 6))
    got = _ort_greedy(module, tmp_path / "art", p, 0, accuracy_level=1)[0][0]
    _, counts = _nodes(tmp_path / "art")
    assert counts.get("MoE") == 2
    assert rel_diff(got, ir_greedy(module, p, 0)[0][0]) <= 1e-4
