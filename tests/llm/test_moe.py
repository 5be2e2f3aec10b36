"""Mixture of experts: `llm.moe` (reference vs decomposition, verifier errors) and Mixtral,
Qwen2-MoE, Qwen3-MoE through the onnxruntime build (greedy parity with transformers, 32 tokens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.builder import Builder
from llmir_core.dialects import get_op
from llmir_core.frontends.hf import import_hf
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Function, Module
from llmir_core.ir.types import DType, TensorType
from llmir_core.verifier import verify

from .test_rope_types import STEPS, _prompt, _same, ort_greedy
from .tiny import hf_greedy

E, H, INTER, SI = 5, 8, 6, 7
SHAPES = [
    (2, 3, H),
    (E, H),
    (E, INTER, H),
    (E, INTER, H),
    (E, H, INTER),
    (SI, H),
    (SI, H),
    (H, SI),
    (1, H),
]


def _module(n: int, attrs: dict[str, Any], decomposed: bool) -> Module:
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", TensorType(s, DType.f32)) for i, s in enumerate(SHAPES[:n])]
    if decomposed:
        opdef = get_op("llm.moe")
        assert opdef is not None and opdef.decompose is not None
        outs = opdef.decompose(b, args, opdef.with_defaults(attrs))
    else:
        outs = [b.create("llm.moe", args, attrs).result]
    b.ret(*outs)
    return Module("m", [fn], {"llmir.dialects": ("core", "llm")})


@pytest.mark.parametrize("n", [5, 8, 9])
@pytest.mark.parametrize(
    "attrs",
    [
        {"top_k": 2},
        {"top_k": 3, "scoring": "sigmoid", "norm_topk": False},
        {"top_k": 1, "routed_scale": 2.5, "activation": "gelu_tanh"},
        {"top_k": 5, "norm_topk": False},
        {"top_k": 2, "n_group": 5, "topk_group": 2, "routed_scale": 1.5, "norm_topk": False},
        {"top_k": 1, "scoring": "sigmoid", "n_group": 5, "topk_group": 3},
    ],
)
def test_reference_matches_decomposition(n: int, attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(n)
    feeds = {f"a{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(SHAPES[:n])}
    ref, dec = _module(n, attrs, False), _module(n, attrs, True)
    assert verify(ref) == [] and verify(dec) == []
    a, b = Interpreter(ref).run(feeds)[0], Interpreter(dec).run(feeds)[0]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_routing_by_hand() -> None:
    """Two experts of four chosen by softmax, renormalised: the sum of their outputs by weight."""
    from llmir_core.dialects.llm_moe import routing

    x = np.array([[1.0, 0.0]])
    router = np.array([[2.0, 0.0], [0.0, 0.0], [3.0, 0.0], [1.0, 0.0]])
    idx, w = routing(
        x, router, {"scoring": "softmax", "top_k": 2, "norm_topk": True, "routed_scale": 1.0}
    )
    e = np.exp([2.0, 3.0])
    assert idx.tolist() == [[2, 0]] and np.allclose(w, [[e[1] / e.sum(), e[0] / e.sum()]])
    idx, w = routing(
        x, router, {"scoring": "sigmoid", "top_k": 1, "norm_topk": False, "routed_scale": 2.0}
    )
    assert idx.tolist() == [[2]] and np.allclose(w, [[2.0 / (1.0 + np.exp(-3.0))]])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"top_k": 6}, r"top_k must be in 1\.\.5, got 6"),
        ({"shape": (1, (E, H + 1))}, r"router takes 9 inputs but x has 8"),
        ({"shape": (3, (E, INTER + 1, H))}, r"w_up has 7 outputs but w_gate has 6"),
        ({"shape": (4, (E - 1, H, INTER))}, r"w_down has 4 experts but the router scores 5"),
        ({"routed_scale": 0.0}, r"routed_scale must be > 0"),
        ({"n": 6}, r"takes 5 operands, or 8 with a shared expert"),
        ({"n_group": 2}, r"n_group \(2\) must divide the 5 experts"),
        ({"n_group": 5, "topk_group": 6}, r"1 <= topk_group <= n_group, got 5, 6"),
        ({"n_group": 5, "topk_group": 1}, r"top_k \(2\) exceeds the 1 experts"),
    ],
)
def test_verifier_errors(change: dict[str, Any], message: str) -> None:
    from llmir_core.errors import LlmirError

    shapes = list(SHAPES)
    if "shape" in change:
        i, s = change["shape"]
        shapes[i] = s
    n = change.get("n", 5)
    attrs = {"top_k": change.get("top_k", 2), "routed_scale": change.get("routed_scale", 1.0)}
    attrs.update({k: change[k] for k in ("n_group", "topk_group") if k in change})
    fn = Function("main", [])
    b = Builder(fn)
    args = [b.arg(f"a{i}", TensorType(s, DType.f32)) for i, s in enumerate(shapes[:n])]
    with pytest.raises((LlmirError, Exception), match=message):
        b.create("llm.moe", args, attrs)


def test_group_limited_routing_matches_transformers() -> None:
    """DeepSeek-V2's router (group-limited greedy, routed_scaling_factor) in transformers against
    `routing` on the same scores: the same experts, the same weights."""
    torch = pytest.importorskip("torch", reason="torch is a test-only extra")
    pytest.importorskip("transformers", reason="transformers is a test-only extra")
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    from llmir_core.dialects.llm_moe import routing

    cfg = DeepseekV2Config(
        hidden_size=H,
        num_attention_heads=2,
        n_routed_experts=12,
        num_experts_per_tok=3,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
    )
    router = DeepseekV2TopkRouter(cfg)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((12, H)).astype(np.float32)
    x = rng.standard_normal((50, H)).astype(np.float32)
    with torch.no_grad():
        router.weight.copy_(torch.from_numpy(w))
        _, tw, ti = router(torch.from_numpy(x))
    attrs = {"scoring": "softmax", "top_k": 3, "norm_topk": False, "routed_scale": 2.5}
    idx, wts = routing(
        x.astype(np.float64), w.astype(np.float64), {**attrs, "n_group": 4, "topk_group": 2}
    )
    order = np.argsort(ti.numpy(), axis=-1)
    np.testing.assert_array_equal(np.sort(idx, -1), np.take_along_axis(ti.numpy(), order, -1))
    want = np.take_along_axis(tw.numpy(), order, -1)
    np.testing.assert_allclose(np.take_along_axis(wts, np.argsort(idx, -1), -1), want, rtol=1e-5)
    # the group limit matters here: ungrouped routing picks other experts for some tokens
    free, _ = routing(x.astype(np.float64), w.astype(np.float64), attrs)
    assert (np.sort(free, -1) != np.sort(idx, -1)).any()


@pytest.mark.parametrize("arch", ["deepseek-v2-lite", "deepseek-v2"])
def test_deepseek_v2_parity(arch: str, tiny_model: Any, tmp_path: Path) -> None:
    """MLA and DeepSeek-V2 routing: greedy parity with transformers over 32 tokens through the
    interpreter and the onnxruntime build (f32 experts with a group limit keep the dense MoE)."""
    pytest.importorskip("onnxruntime", reason="onnxruntime builds are checked when it is installed")
    from .tiny import ir_greedy

    folder, model = tiny_model(arch)
    module = import_hf(folder, require_tokenizer=False)
    assert verify(module) == []
    moe = [op for op in module.main.ops if op.name == "llm.moe"]
    assert len(moe) == (1 if arch == "deepseek-v2-lite" else 2)
    want = hf_greedy(model, _prompt(), STEPS)
    _same(ir_greedy(module, _prompt(), STEPS), want)
    _same(ort_greedy(module, tmp_path / "art", _prompt(), STEPS), want)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"topk_method": "noaux_tc"}, r"field 'topk_method' is 'noaux_tc', which is not supported"),
        ({"n_group": 3}, r"field 'topk_group' \(2\) and n_group \(3\) must satisfy"),
        ({"topk_group": 1, "num_experts_per_tok": 3}, r"'num_experts_per_tok' \(3\) exceeds"),
        ({"routed_scaling_factor": 0}, r"'routed_scaling_factor' must be a positive number"),
        ({"attention_bias": True}, r"'attention_bias' is true, which is not supported"),
        ({"qk_rope_head_dim": 7}, r"'qk_rope_head_dim' \(7\) must be even"),
        ({"kv_lora_rank": None}, r"'kv_lora_rank' must be a positive integer, got None"),
    ],
)
def test_deepseek_v2_config_errors(
    change: dict[str, Any], message: str, tiny_model: Any, tmp_path: Path
) -> None:
    import json
    import shutil

    from llmir_core.errors import InputError

    folder, _ = tiny_model("deepseek-v2")
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.update(change)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=message):
        import_hf(bad, require_tokenizer=False)


def test_deepseek_v2_qmoe_with_router_weights(tiny_model: Any, tmp_path: Path) -> None:
    """--quant int4: the group-limited experts become one QMoE that chooses by the group-limited
    scores and weights by the softmax scores (router_weights); the logits match the interpreter
    running the lowered module (whose ort ops round the weights as the build stores them)."""
    pytest.importorskip("onnxruntime", reason="onnxruntime builds are checked when it is installed")
    import onnx

    from llmir_core.targets.onnxruntime.runner import open_decoder
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    from .tiny import ir_greedy, rel_diff

    folder, _ = tiny_model("deepseek-v2")
    module = import_hf(folder, require_tokenizer=False)
    build_decoder(module, str(tmp_path / "art"), quant="int4", accuracy_level=1)
    graph = onnx.load(str(tmp_path / "art" / "model.onnx"), load_external_data=False).graph
    qmoe = [n for n in graph.node if n.op_type == "QMoE"]
    assert len(qmoe) == 2 and all(len(n.input) == 15 and n.input[14] for n in qmoe)
    dec = open_decoder(str(tmp_path / "art"))
    dec.reset(len(_prompt()))
    got = dec.forward(_prompt())
    from llmir_core.ir.parser import parse_file

    lowered = parse_file(str(tmp_path / "art" / "model.lowered.llmir"))
    assert rel_diff(got, ir_greedy(lowered, _prompt(), 0)[0][0]) <= 1e-4


@pytest.mark.parametrize("arch", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_onnxruntime_build_parity(arch: str, tiny_model: Any, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime builds are checked when it is installed")
    folder, model = tiny_model(arch)
    module = import_hf(folder, require_tokenizer=False)
    moe_ops = [op for op in module.main.ops if op.name == "llm.moe"]
    assert len(moe_ops) == (
        2 if arch == "qwen2-moe" else module.attrs["llm.num_layers"]
    )  # qwen2-moe: layer 1 dense
    _same(
        ort_greedy(module, tmp_path / "art", _prompt(), STEPS), hf_greedy(model, _prompt(), STEPS)
    )


def test_generic_build_of_many_decomposed_ops(tmp_path: Path) -> None:
    """Regression: ort_lower keyed decomposition values by id() and let the decomposition
    functions die, so a later op's value could take a dead one's id and its name or weight (seen
    as a Qwen2-MoE router wired to another layer's shared expert). Eight chained llm.moe ops with
    their own stored weights must match the interpreter."""
    pytest.importorskip("onnxruntime", reason="onnxruntime builds are checked when it is installed")
    from safetensors.numpy import save_file

    from llmir_core.frontends.hf import emit_weight
    from llmir_core.frontends.safetensors_index import open_index
    from llmir_core.targets.onnxruntime.graph import build
    from llmir_core.targets.onnxruntime.session import runner_for_artifact

    rng = np.random.default_rng(0)
    arrays = {
        f"w{layer}_{i}": (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
        for layer in range(8)
        for i, s in enumerate(SHAPES[1:5])
    }
    save_file(arrays, str(tmp_path / "model.safetensors"))
    index = open_index(tmp_path)
    fn = Function("main", [])
    b = Builder(fn)
    y = b.arg("x", TensorType((1, 4, H), DType.f32))
    for layer in range(8):
        ws = [emit_weight(b, index.get(f"w{layer}_{i}"), str(tmp_path)) for i in range(4)]
        y = b.create("llm.moe", [y, *ws], {"top_k": 1 + layer % 3}).result
    b.ret(y)
    module = Module("m", [fn], {"llmir.dialects": ("core", "llm")})
    module.source = str(tmp_path / "m.llmir")
    feeds = {"x": rng.standard_normal((1, 4, H)).astype(np.float32)}
    want = Interpreter(module).run(feeds)[0]
    build(module, str(tmp_path / "art"))
    got = next(iter(runner_for_artifact(str(tmp_path / "art")).run(feeds).values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
