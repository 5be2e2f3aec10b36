"""Rope types (yarn, longrope, dynamic, llama3, linear) and Gemma 3: greedy parity with
transformers over 32 tokens through the reference interpreter and the onnxruntime build."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.hf import import_hf

from .tiny import VOCAB, hf_greedy, ir_greedy, rel_diff, to_legacy_config

TOL = 1e-4
STEPS = 32


def _prompt() -> np.ndarray:
    return np.random.default_rng(5).integers(3, VOCAB, (1, 10))


def _same(
    got: tuple[list[np.ndarray], np.ndarray], want: tuple[list[np.ndarray], np.ndarray]
) -> None:
    np.testing.assert_array_equal(
        got[1], want[1], err_msg="greedy tokens differ from transformers'"
    )
    worst = max(rel_diff(a, b) for a, b in zip(got[0], want[0]))
    assert worst <= TOL, f"max relative logit difference {worst:.2e}"


def ort_greedy(
    module: Any, art: Path, prompt: np.ndarray, steps: int, **build_opts: Any
) -> tuple[list[np.ndarray], np.ndarray]:
    from llmir_core.targets.onnxruntime.runner import open_decoder
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    # every prompt position is compared
    build_decoder(module, str(art), **{"last_logits": False, **build_opts})
    dec = open_decoder(str(art))
    dec.reset(prompt.shape[0])
    logits = dec.forward(prompt)
    out, toks = [logits], []
    for _ in range(steps):
        nxt = logits[:, -1].argmax(-1)[:, None]
        toks.append(nxt)
        logits = dec.forward(nxt)
        out.append(logits)
    return out, np.concatenate(toks, axis=1) if toks else np.zeros((len(prompt), 0), np.int64)


def test_longrope_switches_factors_per_position(tiny_model: Any) -> None:
    """Phi-3.5 style: short factors up to original_max_position_embeddings (24), long ones after;
    10 + 32 tokens cross the boundary. transformers' own cached decoding is the reference."""
    folder, model = tiny_model("phi3-longrope")
    module = import_hf(folder, require_tokenizer=False)
    specs = {
        op.attrs.get("rotary_dim") for op in module.main.ops if op.name == "llm.rotary_embedding"
    }
    assert specs == {0}
    _same(ir_greedy(module, _prompt(), STEPS), hf_greedy(model, _prompt(), STEPS))


@pytest.mark.parametrize(
    "arch", ["qwen2-yarn", "llama-yarn-mscale", "phi3-longrope", "gemma3", "llama-dynamic"]
)
def test_onnxruntime_build_parity(arch: str, tiny_model: Any, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="onnxruntime builds are checked when it is installed")
    folder, model = tiny_model(arch)
    module = import_hf(folder, require_tokenizer=False)
    _same(
        ort_greedy(module, tmp_path / "art", _prompt(), STEPS), hf_greedy(model, _prompt(), STEPS)
    )


def test_yarn_from_transformers_4_fields(tiny_model: Any, tmp_path: Path) -> None:
    folder, model = tiny_model("qwen2-yarn")
    d = tmp_path / "legacy"
    shutil.copytree(folder, d)
    to_legacy_config(d / "config.json")
    assert json.loads((d / "config.json").read_text())["rope_scaling"]["rope_type"] == "yarn"
    _same(
        ir_greedy(import_hf(d, require_tokenizer=False), _prompt(), 8),
        hf_greedy(model, _prompt(), 8),
    )


def test_gemma3_from_transformers_4_fields(tiny_model: Any, tmp_path: Path) -> None:
    """4.x Gemma 3: rope_theta + rope_scaling for global layers, rope_local_base_freq for local ones,
    the layer pattern from sliding_window_pattern."""
    folder, model = tiny_model("gemma3")
    d = tmp_path / "legacy"
    shutil.copytree(folder, d)
    cfg = json.loads((d / "config.json").read_text())
    rp = cfg.pop("rope_parameters")
    cfg.pop("layer_types")
    cfg.update(
        rope_theta=rp["full_attention"]["rope_theta"],
        rope_local_base_freq=rp["sliding_attention"]["rope_theta"],
        rope_scaling={"rope_type": "linear", "factor": rp["full_attention"]["factor"]},
        sliding_window_pattern=2,
    )
    (d / "config.json").write_text(json.dumps(cfg))
    module = import_hf(d, require_tokenizer=False)
    windows = [
        op.attrs.get("sliding_window")
        for op in module.main.ops
        if op.name == "llm.scaled_dot_product_attention"
    ]
    assert windows == [8, None, 8]
    _same(ir_greedy(module, _prompt(), 8), hf_greedy(model, _prompt(), 8))


def _edited(folder: Path, tmp_path: Path, **changes: Any) -> Path:
    d = tmp_path / "edited"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(folder, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_rope_errors(tiny_model: Any, tmp_path: Path) -> None:
    folder, _ = tiny_model("phi3-longrope")
    rp = json.loads((folder / "config.json").read_text())["rope_parameters"]
    bad = _edited(folder, tmp_path, rope_parameters={**rp, "long_factor": [1.0, 2.0]})
    with pytest.raises(
        InputError, match=r"field 'rope_parameters\.long_factor' must list 8 numbers"
    ):
        import_hf(bad, require_tokenizer=False)
    bad = _edited(folder, tmp_path, rope_parameters={**rp, "rope_type": "su"})
    with pytest.raises(
        InputError, match=r"'rope_parameters\.rope_type' is 'su', which is not supported"
    ):
        import_hf(bad, require_tokenizer=False)
    folder, _ = tiny_model("qwen2-yarn")
    bad = _edited(
        folder,
        tmp_path,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": "4"},
    )
    with pytest.raises(
        InputError, match=r"config\.json: field 'rope_parameters\.factor' must be a number, got '4'"
    ):
        import_hf(bad, require_tokenizer=False)
    folder, _ = tiny_model("gemma3")
    bad = _edited(
        folder,
        tmp_path,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    )
    with pytest.raises(
        InputError, match=r"gives no rope parameters for layer type 'full_attention'"
    ):
        import_hf(bad, require_tokenizer=False)
