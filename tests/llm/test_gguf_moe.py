"""GGUF mixture of experts: llama.cpp's stacked `ffn_{gate,up,down}_exps` tensors (Mixtral as
`llama`, `qwen2moe` with its shared expert, `qwen3moe`), imported as `llm.moe` with parity.
(llama.cpp's qwen2moe has no dense layers, so its test model has experts in every layer.)"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.gguf import import_gguf

from .tiny import VOCAB, check_against_full_forward, ir_greedy

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to write test files")


def convert_moe(
    tiny_model: Any, arch: str, tmp_path: Path, policy: Any = "F32"
) -> tuple[Path, Any]:
    """The tiny model's per-expert safetensors as GGUF; the torch model holding the file's values."""
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM

    from .gguf_convert import write_gguf

    folder, _ = tiny_model(arch)
    state = load_file(str(folder / "model.safetensors"))
    ref = write_gguf(folder, state, tmp_path / "m.gguf", policy)
    twin_dir = tmp_path / "twin"
    shutil.copytree(folder, twin_dir)
    save_file(
        {k: np.ascontiguousarray(v, np.float32) for k, v in ref.items()},
        str(twin_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    twin = AutoModelForCausalLM.from_pretrained(twin_dir, attn_implementation="eager").eval()
    return tmp_path / "m.gguf", twin


@pytest.mark.parametrize(
    "arch, policy",
    [("mixtral", "F32"), ("qwen2-moe-all", "F32"), ("qwen3-moe", "F32"), ("qwen3-moe", "Q8_0")],
)
def test_moe_parity(arch: str, policy: Any, tiny_model: Any, tmp_path: Path) -> None:
    if (
        policy == "Q8_0"
    ):  # stacked expert tensors kept quantized (rows of 64: down's rows of 40 cannot)
        policy = {"ffn_gate_exps": "Q8_0", "ffn_up_exps": "Q8_0", "*": "F32"}
    path, twin = convert_moe(tiny_model, arch, tmp_path, policy)
    module = import_gguf(path)
    moe = [op for op in module.main.ops if op.name == "llm.moe"]
    if policy != "F32":
        assert any(
            op.name == "llm.dequantize" and "exps" in op.operands[0].name for op in module.main.ops
        )
    assert moe and all(op.origin.startswith("gguf:blk.") for op in moe)
    p = np.random.default_rng(3).integers(3, VOCAB, (2, 8))
    logits, tokens = ir_greedy(module, p, 32)
    assert max(check_against_full_forward(twin, p, logits, tokens)) <= 1e-4


def test_moe_metadata_errors(tiny_model: Any, tmp_path: Path) -> None:
    from .gguf_convert import write_gguf

    folder, _ = tiny_model("qwen3-moe")
    from safetensors.numpy import load_file

    state = load_file(str(folder / "model.safetensors"))
    write_gguf(folder, state, tmp_path / "m.gguf")
    g = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert int(g.fields["qwen3moe.expert_used_count"].contents()) == 3
    # edit expert_used_count in place (same width) to more than the experts
    f = g.fields["qwen3moe.expert_used_count"]
    data = bytearray((tmp_path / "m.gguf").read_bytes())
    off = (
        f.offset + len(f.parts[0].tobytes()) + len(f.parts[1].tobytes()) + len(f.parts[2].tobytes())
    )
    data[off : off + 4] = (99).to_bytes(4, "little")
    (tmp_path / "bad.gguf").write_bytes(bytes(data))
    with pytest.raises(
        InputError,
        match=r"'qwen3moe\.expert_used_count' \(99\) must be between 1 and expert_count \(6\)",
    ):
        import_gguf(tmp_path / "bad.gguf")
