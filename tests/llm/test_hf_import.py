"""Hugging Face import: parity with transformers through the reference interpreter, and errors.

Every architecture: logits of the prefill and of 32 greedy decode steps (with the module's own KV
cache) equal transformers' to 1e-4 x max |logit|, and the 32 greedy tokens are identical.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.hf import import_hf
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.verifier import verify

from .tiny import (
    ARCHS,
    STEPWISE,
    VOCAB,
    check_against_full_forward,
    hf_greedy,
    hf_step,
    ir_greedy,
    rel_diff,
    to_legacy_config,
)

TOL = 1e-4


def prompt(batch: int = 2, seq: int = 10, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, VOCAB, (batch, seq))


def check_parity(module: Any, model: Any, steps: int = 32) -> None:
    """Greedy decoding through the interpreter (prefill, then one token per step with the module's
    own cache) against transformers' forward over the same tokens."""
    p = prompt()
    ir_logits, ir_tokens = ir_greedy(module, p, steps)
    diffs = check_against_full_forward(model, p, ir_logits, ir_tokens)
    assert max(diffs) <= TOL, f"max relative logit difference {max(diffs):.2e} (per step: {diffs})"


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "llama-wide" and a not in STEPWISE])
def test_parity_with_transformers(arch: str, tiny_model: Any) -> None:
    folder, model = tiny_model(arch)
    module = import_hf(folder, require_tokenizer=False)
    assert verify(module) == []
    check_parity(module, model)


def test_parity_with_transformers_own_cache(tiny_model: Any) -> None:
    """Step by step against transformers' cached decoding too (mistral: the sliding window
    matters once the cache is longer than it)."""
    folder, model = tiny_model("mistral")
    module = import_hf(folder, require_tokenizer=False)
    p = prompt()
    hf_logits, hf_tokens = hf_greedy(model, p, 16)
    ir_logits, ir_tokens = ir_greedy(module, p, 16)
    np.testing.assert_array_equal(ir_tokens, hf_tokens)
    assert max(rel_diff(a, b) for a, b in zip(ir_logits, hf_logits)) <= TOL


def test_transformers_4_config_fields(tiny_model: Any, tmp_path: Path) -> None:
    """rope_theta / rope_scaling (transformers 4.x) read like 5.x's rope_parameters."""
    folder, model = tiny_model("llama3-rope")
    legacy = tmp_path / "legacy"
    shutil.copytree(folder, legacy)
    to_legacy_config(legacy / "config.json")
    cfg = json.loads((legacy / "config.json").read_text())
    assert "rope_parameters" not in cfg and cfg["rope_scaling"]["rope_type"] == "llama3"
    module = import_hf(legacy, require_tokenizer=False)
    check_parity(module, model, steps=4)


def test_module_text_origins_and_relative_weights(tiny_model: Any, tmp_path: Path) -> None:
    folder, _ = tiny_model("qwen2")
    out = folder.parent / "out" / "model.llmir"
    out.parent.mkdir(exist_ok=True)
    module = import_hf(folder, out_path=out, require_tokenizer=False)
    text = print_module(module)
    assert 'loc("hf:model.layers.1.self_attn.q_proj")' in text
    assert 'file = "../qwen2/model.safetensors"' in text
    assert "%past_key_values.2.value: tensor<?batch x 2 x ?past x 16 x f32>" in text
    assert "tensor<?batch x 2 x ?past+?seq x 16 x f32>" in text
    out.write_text(text)
    again = parse_module(text, str(out))
    assert again == module
    again.source = str(out)
    assert verify(again) == []
    kinds = {op.name for op in module.main.ops}
    assert {
        "llm.embedding",
        "llm.rms_norm",
        "llm.rotary_embedding",
        "llm.scaled_dot_product_attention",
        "llm.gated_mlp",
    } <= kinds


def test_phi3_fused_weights_are_row_blocks(tiny_model: Any) -> None:
    folder, _ = tiny_model("phi3")
    module = import_hf(folder, require_tokenizer=False)
    names = [op.attrs["name"] for op in module.main.ops if op.name == "core.weight"]
    assert "model.layers.0.self_attn.qkv_proj.weight[0:64]" in names
    assert "model.layers.0.mlp.gate_up_proj.weight[96:192]" in names


def test_sharded_bf16_checkpoint(tiny_model: Any, tmp_path: Path) -> None:
    """Sharded safetensors with an index, bf16 weights cast to f32 in the graph."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, model = tiny_model("llama")
    out = tmp_path / "bf16"
    # a copy: casting the session's shared model in place would round its weights to bf16 for
    # every later test of the worker (the quantized-checkpoint parity tests among them)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(out, max_shard_size="40KB")
    assert (out / "model.safetensors.index.json").is_file()
    module = import_hf(out, require_tokenizer=False)
    assert any(op.name == "core.cast" for op in module.main.ops)
    ref = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    p = prompt()
    want, _ = hf_step(ref, p, None)
    got, _ = ir_greedy(module, p, 0)
    assert rel_diff(got[0], want) <= TOL


def test_tokenizer_chat_template_and_generation_config(tiny_model: Any, tmp_path: Path) -> None:
    folder, _ = tiny_model("llama")
    d = tmp_path / "with_tok"
    shutil.copytree(folder, d)
    from tokenizers import Tokenizer, models

    # a real (if tiny) tokenizer: an empty or malformed tokenizer.json is refused at import
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(
        str(d / "tokenizer.json")
    )
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (d / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [2, 5], "temperature": 0.6, "top_p": 0.9, "do_sample": True})
    )
    m = import_hf(d)
    assert m.attrs["llm.tokenizer"] == {
        "format": "hf",
        "file": str((d / "tokenizer.json").resolve()),
    }
    assert m.attrs["llm.chat_template"] == "{{ messages }}"
    assert m.attrs["llm.eos_token_ids"] == (2, 5)
    assert m.attrs["llm.generation"]["temperature"] == 0.6
    assert m.attrs["llm.context_length"] == 96
    (d / "chat_template.jinja").write_text("{{ jinja }}")
    assert import_hf(d).attrs["llm.chat_template"] == "{{ jinja }}"


# -- bad input -------------------------------------------------------------------------------


def edited(folder: Path, tmp_path: Path, **changes: Any) -> Path:
    d = tmp_path / "edited"
    shutil.copytree(folder, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]},
            r"config\.json: field 'model_type': model_type 'gpt_neox' \(architectures \['GPTNeoXForCausalLM'\]\) is not supported",
        ),
        (
            {
                "rope_parameters": {
                    "rope_type": "ntk-by-parts",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                }
            },
            r"config\.json: field 'rope_parameters\.rope_type' is 'ntk-by-parts', which is not supported",
        ),
        (
            {"rope_parameters": None, "rope_theta": 10000.0, "rope_scaling": {"type": "longrope"}},
            r"config\.json: field 'rope_scaling\.short_factor' must list 8 numbers",
        ),
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}},
            r"field 'rope_parameters\.low_freq_factor' is missing or not a number",
        ),
        ({"hidden_size": None}, r"config\.json: field 'hidden_size' is missing"),
        (
            {"hidden_act": "relu2"},
            r"config\.json: field 'hidden_act' is 'relu2', which is not supported",
        ),
        (
            {"quantization_config": {"quant_method": "bitsandbytes"}},
            r"field 'quantization_config\.quant_method' is 'bitsandbytes', which is not supported",
        ),
        (
            {"quantization_config": {"quant_method": "gptq"}},
            r"field 'quantization_config\.bits' must be an integer, got None",
        ),
        ({"mlp_bias": True}, r"field 'mlp_bias' is true"),
        (
            {"num_key_value_heads": 3},
            r"field 'num_key_value_heads' \(3\) does not divide num_attention_heads \(4\)",
        ),
        (
            {"intermediate_size": 100},
            r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[96, 64\], but config\.json implies \[100, 64\]",
        ),
    ],
)
def test_config_errors(
    tiny_model: Any, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    folder, _ = tiny_model("llama")
    with pytest.raises(InputError, match=message):
        import_hf(edited(folder, tmp_path, **changes), require_tokenizer=False)


def test_missing_tokenizer(tiny_model: Any, tmp_path: Path) -> None:
    folder, _ = tiny_model("llama")
    with pytest.raises(InputError, match=r"edited: tokenizer\.json is missing") as info:
        import_hf(edited(folder, tmp_path))
    assert info.value.hint and "--no-tokenizer" in info.value.hint


def test_missing_weight_and_config(tiny_model: Any, tmp_path: Path) -> None:
    folder, _ = tiny_model("llama")
    d = edited(folder, tmp_path, tie_word_embeddings=False, num_hidden_layers=3)
    with pytest.raises(
        InputError,
        match=r"field 'num_hidden_layers' is 3, but the weights in model\.safetensors cover 2 layer",
    ):
        import_hf(d, require_tokenizer=False)
    (d / "config.json").unlink()
    with pytest.raises(InputError, match=r"edited: no config\.json"):
        import_hf(d, require_tokenizer=False)


def test_dynamic_rope_is_the_default_inside_the_context(tiny_model: Any, tmp_path: Path) -> None:
    """Dynamic NTK scaling only changes frequencies past max_position_embeddings, the limit."""
    folder, _ = tiny_model("llama")
    plain = print_module(import_hf(folder, require_tokenizer=False))
    d = edited(
        folder,
        tmp_path,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    )
    dynamic = print_module(import_hf(d, require_tokenizer=False))
    assert dynamic.replace("@edited", "@llama") == plain.replace(str(folder), str(d))


def test_null_sliding_window_means_none(tiny_model: Any, tmp_path: Path) -> None:
    """Mistral v0.2+ configs say "sliding_window": null: full attention, not the class default
    (4096, which an absent field gets, as in transformers)."""
    folder, _ = tiny_model("mistral")
    d = edited(folder, tmp_path, sliding_window=None)  # removes the field
    windows = {
        op.attrs.get("sliding_window")
        for op in import_hf(d, require_tokenizer=False).main.ops
        if op.name == "llm.scaled_dot_product_attention"
    }
    assert windows == {4096}
    cfg = json.loads((d / "config.json").read_text())
    cfg["sliding_window"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    module = import_hf(d, require_tokenizer=False)
    assert all("sliding_window" not in op.attrs for op in module.main.ops)
