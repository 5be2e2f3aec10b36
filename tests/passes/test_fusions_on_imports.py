"""-O2 on fresh imports: the fusions fire on every supported architecture, each pass validates,
and the optimized module generates what the import generates.

The importers define each weight next to its first use, so the k and v weights come after the q
projection and the norm weight after the residual add: the engine hoists them (merge-qkv used to
reject every import for that). Models are the numpy-made folders of tests/decoder/tiny.py (no
torch needed), one with llama 3 rope scaling, and GGUF files written from them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.frontends.gguf import import_gguf
from llmir_core.frontends.hf import import_hf
from llmir_core.ir.core import Module
from llmir_core.passes.base import clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.passes.pipeline import preset
from llmir_core.smt.tv import validate_pass
from tests.decoder.tiny import ARCH_SHAPES, make_llama_folder
from tests.llm.tiny import ir_greedy

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# per layer: merge-qkv logs q, k, v; fuse-add-rms-norm logs the norm and the sum
PER_LAYER = {
    ("merge-qkv", "merge-qkv-q"): 1,
    ("merge-qkv", "merge-qkv-k"): 1,
    ("merge-qkv", "merge-qkv-v"): 1,
    ("fuse-add-rms-norm", "fuse-add-rms-norm"): 2,
    ("fuse-add-rms-norm", "fuse-add-rms-norm-sum"): 2,
}


def _folder(root: Path, arch: str) -> Path:
    if arch == "llama3-rope":
        folder = make_llama_folder(root / arch, ARCH_SHAPES["llama"], tokenizer=False)
        cfg = json.loads((folder / "config.json").read_text())
        cfg["rope_scaling"] = LLAMA3_ROPE
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder
    return make_llama_folder(root / arch, ARCH_SHAPES[arch], tokenizer=False)


def _gguf(root: Path, policy: str) -> Module:
    pytest.importorskip("gguf", reason="the gguf package writes the test file")
    from safetensors.numpy import load_file

    from tests.llm.gguf_convert import write_gguf

    folder = _folder(root, "llama")
    out = root / f"llama.{policy}.gguf"
    write_gguf(folder, load_file(str(folder / "model.safetensors")), out, policy, tokenizer=False)
    return import_gguf(out, require_tokenizer=False)


def _optimize(module: Module) -> tuple[Module, Any]:
    res = run_pipeline(clone_module(module), preset(2), validator=validate_pass)
    assert res.failed_validation is None, res.failed_validation
    for run in res.runs:
        assert run.validation is not None and run.validation["verdict"] == "equivalent", (
            run.name,
            run.validation,
        )
    return res.module, res


def _same_generation(before: Module, after: Module) -> None:
    prompt = np.random.default_rng(3).integers(3, 128, (1, 7))
    la, ta = ir_greedy(before, prompt, 4)
    lb, tb = ir_greedy(after, prompt, 4)
    np.testing.assert_array_equal(ta, tb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-4 * float(np.abs(x).max()))


@pytest.mark.parametrize(
    "arch", ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "gemma2"]
)
def test_o2_fuses_hf_imports(arch: str, tmp_path: Path) -> None:
    module = import_hf(_folder(tmp_path, arch), require_tokenizer=False)
    layers = int(module.attrs["llm.num_layers"])
    after, res = _optimize(module)
    got = Counter(
        (r.pass_name, r.rule)
        for r in res.ctx.rewrites
        if r.pass_name in ("merge-qkv", "fuse-add-rms-norm")
    )
    assert got == Counter({k: n * layers for k, n in PER_LAYER.items()})
    assert not [r for r in res.ctx.rejections if r.pass_name in ("merge-qkv", "fuse-add-rms-norm")]
    ops = Counter(op.name for op in after.main.ops)
    assert ops["core.split"] == layers and ops["llm.add_rms_norm"] == 2 * layers
    _same_generation(module, after)


def test_o2_fuses_f32_gguf(tmp_path: Path) -> None:
    module = _gguf(tmp_path, "F32")
    after, res = _optimize(module)
    got = Counter(r.pass_name for r in res.ctx.rewrites)
    assert got["merge-qkv"] == 3 * 2 and got["fuse-add-rms-norm"] == 2 * 2 * 2
    _same_generation(module, after)


def test_o2_keeps_quantized_gguf_projections_apart(tmp_path: Path) -> None:
    """Concatenating Q8_0 weights would store the merged weight in f32: merge-qkv says so."""
    module = _gguf(tmp_path, "Q8_0")
    after, res = _optimize(module)
    reasons = [r.reason for r in res.ctx.rejections if r.pass_name == "merge-qkv"]
    assert len(reasons) == 2 and all("is stored as !quant.q8_0" in r for r in reasons)
    assert Counter(r.pass_name for r in res.ctx.rewrites)["fuse-add-rms-norm"] == 8
    _same_generation(module, after)


_CYCLIC = """module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {
  func.func @main(%x: tensor<2x8xf32>, %wq: tensor<8x8xf32>, %wv: tensor<4x8xf32>) -> (tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>) {
    %q = core.matmul %x, %wq {transpose_b = true} : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32>
    %wk = core.concat %q, %q {axis = 0} : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<4x8xf32>
    %k = core.matmul %x, %wk {transpose_b = true} : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
    %v = core.matmul %x, %wv {transpose_b = true} : (tensor<2x8xf32>, tensor<4x8xf32>) -> tensor<2x4xf32>
    return %q, %k, %v : tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>
  }
}
"""


def test_a_weight_computed_from_a_replaced_value_is_not_hoisted() -> None:
    from llmir_core.ir.parser import parse_module
    from llmir_core.ir.printer import print_module
    from llmir_core.passes.pipeline import parse_pipeline

    m = parse_module(_CYCLIC, "cyclic.llmir")
    before = print_module(m)
    res = run_pipeline(m, parse_pipeline("merge-qkv"))
    assert not res.ctx.rewrites and print_module(m) == before
    assert [r.reason for r in res.ctx.rejections] == ["%wk is computed from the replaced value %q"]
