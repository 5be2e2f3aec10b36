"""GGUF import: files written like llama.cpp's converter, parity with transformers, bad files.

The transformers reference holds the values the GGUF file encodes (dequantized, un-permuted), so
quantized files are compared with their own dequantized weights: the same 1e-4 tolerance holds.
"""

from __future__ import annotations

import copy
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.gguf import import_gguf
from llmir_core.interp import Interpreter
from llmir_core.ir.types import QuantType
from llmir_core.verifier import verify

from .tiny import VOCAB, check_against_full_forward, ir_greedy

gguf = pytest.importorskip("gguf", reason="the gguf package is needed to write test files")
TOL = 1e-4


def convert(
    tiny_model: Any,
    arch: str,
    out: Path,
    policy: Any = "F32",
    raw: Any = None,
    tokenizer: Any = None,
) -> Any:
    """Write the tiny model as GGUF; return a torch copy holding exactly the file's values."""
    from .gguf_convert import load_reference, model_state, write_gguf

    folder, model = tiny_model(arch)
    ref = write_gguf(folder, model_state(model), out, policy, tokenizer=tokenizer, raw=raw)
    twin = copy.deepcopy(model)
    load_reference(twin, ref)
    return twin


def check_parity(module: Any, model: Any, steps: int = 16) -> None:
    p = np.random.default_rng(2).integers(3, VOCAB, (2, 9))
    logits, tokens = ir_greedy(module, p, steps)
    diffs = check_against_full_forward(model, p, logits, tokens)
    assert max(diffs) <= TOL, f"max relative logit difference {max(diffs):.2e}"


@pytest.mark.parametrize(
    "arch", ["llama", "llama3-rope", "llama-linear", "qwen2", "qwen3", "phi3", "gemma2", "gemma3"]
)
def test_f32_parity(arch: str, tiny_model: Any, tmp_path: Path) -> None:
    ref = convert(tiny_model, arch, tmp_path / "m.gguf")
    module = import_gguf(tmp_path / "m.gguf")
    assert verify(module) == []
    check_parity(module, ref)


@pytest.mark.parametrize(
    "arch, policy",
    [("llama", "Q8_0"), ("llama", "Q4_0"), ("phi3", "Q4_0"), ("gemma2", "Q8_0"), ("qwen3", "Q4_0")],
)
def test_quantized_parity(arch: str, policy: str, tiny_model: Any, tmp_path: Path) -> None:
    ref = convert(tiny_model, arch, tmp_path / "m.gguf", policy)
    module = import_gguf(tmp_path / "m.gguf")
    assert verify(module) == []
    packed = {
        op.results[0].type.dtype
        for op in module.main.ops
        if op.name == "core.weight" and isinstance(op.results[0].type.dtype, QuantType)
    }
    assert {str(q) for q in packed} >= {f"!quant.{policy.lower()}"}
    check_parity(module, ref, steps=4)


def kquant_blocks(rows: int, cols: int, qname: str, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks with small, finite scales (the gguf package cannot encode K-quants)."""
    size = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[qname]
    raw = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    d, dmin = np.float16(2e-4).tobytes(), np.float16(1e-4).tobytes()
    fields = {
        "Q4_K": [(0, d), (2, dmin)],
        "Q5_K": [(0, d), (2, dmin)],
        "Q6_K": [(size - 2, d)],
        "Q2_K": [(size - 4, d), (size - 2, dmin)],
        "Q3_K": [(size - 2, d)],
    }[qname]
    for at, b in fields:
        raw[..., at : at + 2] = np.frombuffer(b, np.uint8)
    return raw.reshape(rows, -1)


def test_every_tensor_type(tiny_model: Any, tmp_path: Path) -> None:
    """F16, BF16, Q4_1, Q5_0, Q5_1 and the K-quants in one model; each decodes bit for bit as
    gguf.quants.dequantize does, and the logits match transformers on the decoded values."""
    rng = np.random.default_rng(0)
    raw = {
        "blk.0.attn_q.weight": (kquant_blocks(256, 256, "Q4_K", rng), "Q4_K"),
        "blk.0.attn_k.weight": (kquant_blocks(128, 256, "Q5_K", rng), "Q5_K"),
        "blk.0.attn_v.weight": (kquant_blocks(128, 256, "Q6_K", rng), "Q6_K"),
        "blk.0.ffn_gate.weight": (kquant_blocks(256, 256, "Q2_K", rng), "Q2_K"),
        "blk.0.ffn_up.weight": (kquant_blocks(256, 256, "Q3_K", rng), "Q3_K"),
    }
    policy = {
        "attn_output": "Q4_1",
        "ffn_down": "Q5_0",
        "token_embd": "Q5_1",
        "output.": "BF16",
        "*": "F16",
    }
    ref = convert(tiny_model, "llama-wide", tmp_path / "m.gguf", policy, raw=raw)
    module = import_gguf(tmp_path / "m.gguf")
    assert verify(module) == []
    interp = Interpreter(module)
    interp.trace = []
    check_parity_once(interp, module, ref)
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    by_name = {t.name: t for t in reader.tensors}
    seen = set()
    for op, outs in interp.trace:
        if op.name != "llm.dequantize":
            continue
        name = op.operands[0].owner.attrs["name"]
        t = by_name[name]
        want = gguf.quants.dequantize(t.data, t.tensor_type)
        assert outs[0].tobytes() == np.asarray(want, np.float32).tobytes(), name
        seen.add(t.tensor_type.name)
    assert seen == {"Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "Q4_1", "Q5_0", "Q5_1"}


def test_iq4_tensor_types(tiny_model: Any, tmp_path: Path) -> None:
    """IQ4_NL and IQ4_XS tensors import as !quant.iq4_nl / !quant.iq4_xs; each decodes bit for
    bit as gguf.quants.dequantize does, and the logits match transformers on the decoded values."""
    from tests.quant.blocks import random_rows

    rng = np.random.default_rng(5)
    raw = {
        "blk.0.attn_output.weight": (random_rows(rng, "iq4_nl", 256, 256), "IQ4_NL"),
        "blk.0.ffn_down.weight": (random_rows(rng, "iq4_xs", 256, 256), "IQ4_XS"),
    }
    ref = convert(tiny_model, "llama-wide", tmp_path / "m.gguf", {"*": "F16"}, raw=raw)
    module = import_gguf(tmp_path / "m.gguf")
    assert verify(module) == []
    assert {
        str(op.results[0].type.dtype)
        for op in module.main.ops
        if op.name == "core.weight" and isinstance(op.results[0].type.dtype, QuantType)
    } == {"!quant.iq4_nl", "!quant.iq4_xs"}
    interp = Interpreter(module)
    interp.trace = []
    check_parity_once(interp, module, ref)
    by_name = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    seen = set()
    for op, outs in interp.trace:
        if op.name == "llm.dequantize":
            t = by_name[op.operands[0].owner.attrs["name"]]
            want = gguf.quants.dequantize(t.data, t.tensor_type)
            assert outs[0].tobytes() == np.asarray(want, np.float32).tobytes(), t.name
            seen.add(t.tensor_type.name)
    assert seen == {"IQ4_NL", "IQ4_XS"}


def check_parity_once(interp: Interpreter, module: Any, model: Any) -> None:
    p = np.random.default_rng(3).integers(3, VOCAB, (1, 7))
    feeds = {"input_ids": p, "positions": np.arange(7, dtype=np.int64)[None]}
    feeds.update(
        {
            a.name: np.zeros((1, a.type.shape[1], 0, a.type.shape[3]), np.float32)
            for a in module.main.args[2:]
        }
    )
    logits = interp.run(feeds)[0]
    diffs = check_against_full_forward(model, p, [logits], np.zeros((1, 0), np.int64))
    assert diffs[0] <= TOL


# -- bad files --------------------------------------------------------------------------------


@pytest.fixture
def small_gguf(tiny_model: Any, tmp_path: Path) -> Path:
    convert(tiny_model, "llama", tmp_path / "m.gguf", "Q4_0")
    return tmp_path / "m.gguf"


def test_truncated_data(small_gguf: Path) -> None:
    data = small_gguf.read_bytes()
    small_gguf.write_bytes(data[:-100])
    with pytest.raises(
        InputError,
        match=r"m\.gguf: truncated GGUF file: tensor '[\w.]+' needs bytes \d+\.\.\d+, "
        rf"the file has {len(data) - 100}",
    ):
        import_gguf(small_gguf)


@pytest.mark.parametrize(
    "keep, message",
    [
        (0, r"m\.gguf: empty file, not a GGUF model"),
        (3, r"m\.gguf: not a GGUF file \(it starts with b'GGU', not b'GGUF'\)"),
        (
            200,
            r"m\.gguf: not a readable GGUF file \(200 bytes\): the header is truncated or damaged",
        ),
        (
            3000,
            r"m\.gguf: not a readable GGUF file \(3000 bytes\): the header is truncated or damaged",
        ),
    ],
)
def test_truncated_header(small_gguf: Path, keep: int, message: str) -> None:
    small_gguf.write_bytes(small_gguf.read_bytes()[:keep])
    with pytest.raises(InputError, match=message):
        import_gguf(small_gguf)


def _patch_type(path: Path, tensor: str, new_type: int) -> None:
    reader = gguf.GGUFReader(str(path))
    field = next(t.field for t in reader.tensors if t.name == tensor)
    n_dims = int(field.parts[2][0])
    at = field.offset + 8 + len(tensor.encode()) + 4 + 8 * n_dims
    del reader
    data = bytearray(path.read_bytes())
    data[at : at + 4] = struct.pack("<I", new_type)
    path.write_bytes(bytes(data))


def test_unknown_tensor_type(small_gguf: Path) -> None:
    _patch_type(small_gguf, "blk.0.attn_q.weight", 99)
    with pytest.raises(
        InputError, match=r"tensor 'blk\.0\.attn_q\.weight' has unknown tensor type 99"
    ):
        import_gguf(small_gguf)


def test_unsupported_tensor_type(small_gguf: Path) -> None:
    _patch_type(
        small_gguf, "blk.0.attn_q.weight", int(gguf.GGMLQuantizationType.MXFP4)
    )  # 17 bytes a 32-block: within the Q4_0 tensor's 18
    with pytest.raises(
        InputError,
        match=r"tensor 'blk\.0\.attn_q\.weight' has type MXFP4, which llmir does not support",
    ) as err:
        import_gguf(small_gguf)
    assert "Q4_K" in str(err.value.hint) and "IQ4_NL, IQ4_XS" in str(err.value.hint)


def _minimal(path: Path, arch: str, tokenizer: bool = True) -> None:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unsupported_architecture(tmp_path: Path) -> None:
    _minimal(tmp_path / "f.gguf", "falcon")
    with pytest.raises(
        InputError,
        match=r"f\.gguf: metadata field 'general\.architecture' is 'falcon', which is not supported",
    ):
        import_gguf(tmp_path / "f.gguf")


def test_missing_metadata(tmp_path: Path) -> None:
    _minimal(tmp_path / "f.gguf", "llama")
    with pytest.raises(InputError, match=r"metadata field 'llama\.embedding_length' is missing"):
        import_gguf(tmp_path / "f.gguf")


def test_missing_tokenizer(tiny_model: Any, tmp_path: Path) -> None:
    convert(
        tiny_model,
        "llama",
        tmp_path / "m.gguf",
        tokenizer={"model": "none", "tokens": ["a"], "token_type": [1]},
    )
    with pytest.raises(
        InputError,
        match=r"metadata field 'tokenizer\.ggml\.model' is 'none', which is not supported",
    ):
        import_gguf(tmp_path / "m.gguf")
    assert import_gguf(tmp_path / "m.gguf", require_tokenizer=False).main is not None


def test_attributes_and_relative_paths(tiny_model: Any, tmp_path: Path) -> None:
    tok = {
        "model": "gpt2",
        "pre": "qwen2",
        "tokens": [f"t{i}" for i in range(VOCAB)],
        "token_type": [1] * VOCAB,
        "merges": [],
        "bos_token_id": 1,
        "eos_token_id": 2,
        "chat_template": "{{ x }}",
    }
    convert(tiny_model, "qwen2", tmp_path / "m.gguf", tokenizer=tok)
    (tmp_path / "out").mkdir()
    m = import_gguf(tmp_path / "m.gguf", out_path=tmp_path / "out" / "m.llmir")
    assert m.attrs["llm.tokenizer"] == {"format": "gguf", "file": "../m.gguf"}
    assert m.attrs["llm.chat_template"] == "{{ x }}"
    assert m.attrs["llm.eos_token_ids"] == (2,) and m.attrs["llm.architecture"] == "qwen2"
    weights = [op for op in m.main.ops if op.name == "core.weight"]
    assert all(op.attrs["file"] == "../m.gguf" for op in weights)
    assert weights[0].origin == "gguf:token_embd"


def test_yarn_parity(tiny_model: Any, tmp_path: Path) -> None:
    """`rope.scaling.type = yarn` with factor and original_context_length (Qwen2.5 long context)."""
    ref = convert(tiny_model, "qwen2-yarn", tmp_path / "m.gguf")
    module = import_gguf(tmp_path / "m.gguf")
    check_parity(module, ref, steps=32)


def test_phi3_longrope_parity(tiny_model: Any, tmp_path: Path) -> None:
    """Phi-3.5 longrope: rope_factors_short/long tensors switch at original_context_length (24),
    crossed by 10 + 32 tokens; transformers' own cached decoding is the reference."""
    from .tiny import hf_greedy, rel_diff

    ref = convert(tiny_model, "phi3-longrope", tmp_path / "m.gguf")
    module = import_gguf(tmp_path / "m.gguf")
    p = np.random.default_rng(5).integers(3, VOCAB, (1, 10))
    logits, tokens = ir_greedy(module, p, 32)
    hf_logits, hf_tokens = hf_greedy(ref, p, 32)
    np.testing.assert_array_equal(tokens, hf_tokens)
    assert max(rel_diff(a, b) for a, b in zip(logits, hf_logits)) <= TOL
    g = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    assert "rope_factors_long.weight" in {t.name for t in g.tensors}
