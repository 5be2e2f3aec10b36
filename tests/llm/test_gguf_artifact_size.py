"""An artifact built from a GGUF file holds the file's tensor bytes and next to nothing else: the
blocks are repacked losslessly (q4_0/q8_0 -> MatMulNBits / GatherBlockQuantized, a tied table
stored once), F16 tensors stay f16 (widened when the session loads; `--dtype f32` widens them in
the file), and the rotary cos/sin tables are computed in the graph from inv_freq (onnxruntime
folds them when the session loads) instead of being stored as [context, rotary_dim/2] floats.
The greedy tokens are those of the module's reference interpreter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx.external_data_helper import uses_external_data

from llmir_core.targets.onnxruntime.runner import open_decoder
from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder
from tests.decoder.helpers import greedy, parity, ref_decoder
from tests.decoder.tiny import LlamaShape, make_llama_folder

# a long context (the table the artifact used to store: 2048 x 8 floats, twice: 128 KiB) and a
# tied embedding (q8_0 in a q4_0 file, as llama.cpp writes it when the width is not a multiple
# of 256)
SHAPE = LlamaShape(hidden=64, intermediate=96, context=2048, tie=True)
CONSTANTS_MAX = 2048  # bytes beyond the GGUF tensors: shape vectors, inv_freq, scalars


def _initializer_bytes(model: onnx.ModelProto) -> int:
    """Bytes the initializers hold; an alias (a second name over the same span of the data file,
    docs/load.md) counts once."""
    total = 0
    spans: set[tuple[str, str, str]] = set()
    for t in model.graph.initializer:
        if uses_external_data(t):
            e = {e.key: e.value for e in t.external_data}
            span = (e["location"], e.get("offset", "0"), e["length"])
            if span not in spans:
                spans.add(span)
                total += int(e["length"])
        else:
            total += len(t.raw_data) if t.raw_data else t.ByteSize()
    return total


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_llama_folder(tmp_path_factory.mktemp("gguf_size") / "hf", SHAPE)


def _gguf(folder: Path, out: Path, qtype: str) -> tuple[Any, int]:
    import gguf
    from safetensors.numpy import load_file

    from llmir_core.frontends.gguf import import_gguf

    from .gguf_convert import write_gguf

    write_gguf(folder, load_file(str(folder / "model.safetensors")), out, qtype)
    tensors = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(out)).tensors)
    return import_gguf(out), tensors


@pytest.mark.parametrize("qtype", ["Q4_0", "Q8_0", "F16"])
def test_artifact_holds_the_gguf_tensor_bytes(folder: Path, tmp_path: Path, qtype: str) -> None:
    module, tensor_bytes = _gguf(folder, tmp_path / "m.gguf", qtype)
    man = build_decoder(module, str(tmp_path / "art"))
    assert man["decoder"]["weight_dtype"] == ("f16" if qtype == "F16" else "f32")
    assert set(man["decoder"]["rope_table_ops"]) >= {"core.cos", "core.sin"}
    model = onnx.load(str(tmp_path / "art" / "model.onnx"), load_external_data=False)
    extra = _initializer_bytes(model) - tensor_bytes
    assert 0 <= extra <= CONSTANTS_MAX, f"{extra} bytes beyond the GGUF tensors"
    ops = [n.op_type for n in model.graph.node]
    assert "Cos" in ops and "Sin" in ops  # the tables are computed, not stored
    assert not any("cos_cache" in t.name or "sin_cache" in t.name for t in model.graph.initializer)
    # the same tokens as the reference interpreter of the imported module
    prompt = [1, 5, 9, 2, 7, 3]
    dec = open_decoder(str(tmp_path / "art"))
    assert greedy(dec, prompt, 12) == greedy(ref_decoder(module), prompt, 12)


def test_max_len_cuts_the_computed_table(folder: Path, tmp_path: Path) -> None:
    """--max-len still sizes the KV buffer and the table (a Slice of the computed one); f32
    activations (accuracy_level 1), so the logits are the reference's to rounding."""
    module, _ = _gguf(folder, tmp_path / "m.gguf", "Q8_0")
    man = build_decoder(module, str(tmp_path / "art"), max_len=32, accuracy_level=1)
    assert man["decoder"]["max_len"] == 32
    dec = open_decoder(str(tmp_path / "art"))
    ref = ref_decoder(module)
    prompt = np.array([[1, 5, 9, 2, 7, 3]])
    dec.reset(1)
    ref.reset(1)
    a, b = ref.forward(prompt), dec.forward(prompt)
    np.testing.assert_allclose(b[0, -1], a[0, -1], rtol=1e-3, atol=1e-3)


def test_dtype_f32_widens_an_f16_gguf(folder: Path, tmp_path: Path) -> None:
    from llmir_core.targets import build

    module, tensor_bytes = _gguf(folder, tmp_path / "m.gguf", "F16")
    build(module, str(tmp_path / "art"), "onnxruntime", options={"dtype": "f32"})
    model = onnx.load(str(tmp_path / "art" / "model.onnx"), load_external_data=False)
    assert _initializer_bytes(model) > 1.8 * tensor_bytes
    assert "ort.cast" not in (tmp_path / "art" / "model.lowered.llmir").read_text()


def test_quant_int4_narrows_a_q8_0_lm_head(folder: Path, tmp_path: Path) -> None:
    """--quant int4 on a q4_0 file: the q8_0 tied embedding / lm_head (llama.cpp's choice) is
    requantized to int4 blocks, stored once for the lookup and the head, and logged; the q4_0
    tensors pass through losslessly."""
    module, tensor_bytes = _gguf(folder, tmp_path / "m.gguf", "Q4_0")
    man = build_decoder(module, str(tmp_path / "art"), quant="int4", accuracy_level=1)
    q = man["decoder"]["quant"]
    assert [(r["weight"], r["from"], r["to"]) for r in q["gguf_requantized"]] == [
        ("token_embd.weight", "q8_0", "int4")
    ]
    assert q["embedding"][0]["shared_with_lm_head"] and q["embedding"][0]["bits"] == 4
    text = (tmp_path / "art" / "model.lowered.llmir").read_text()
    assert "bits = 8" not in text and 'quantize = "sym"' in text
    model = onnx.load(str(tmp_path / "art" / "model.onnx"), load_external_data=False)
    assert _initializer_bytes(model) < tensor_bytes
    # the lowered module (with the int4 rounding of the table in it) is what the artifact runs
    from llmir_core.passes.base import clone_module
    from llmir_core.passes.manager import run_pipeline
    from llmir_core.targets import get_target

    opts = {"quant": "int4", "accuracy_level": 1}
    lowered = run_pipeline(clone_module(module), get_target("onnxruntime").lowering(opts)).module
    prompt = np.array([[1, 5, 9, 2, 7, 3]])
    assert parity(lowered, open_decoder(str(tmp_path / "art")), prompt, steps=3) <= 1e-3


def test_merge_of_unknown_token_is_an_input_error(folder: Path, tmp_path: Path) -> None:
    """A GGUF whose BPE merges name a token its vocabulary lacks: one clear error (exit 2)."""
    from safetensors.numpy import load_file

    from tests.conftest import run_cli

    from .gguf_convert import write_gguf

    tok = {
        "model": "gpt2",
        "pre": "gpt-2",
        "tokens": [f"t{i}" for i in range(SHAPE.vocab)],
        "token_type": [1] * SHAPE.vocab,
        "merges": ["t 0"],
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    write_gguf(
        folder, load_file(str(folder / "model.safetensors")), tmp_path / "m.gguf", "Q8_0", tok
    )
    r = run_cli("import", "m.gguf", "-o", "m.llmir", "-q", cwd=tmp_path)
    if r.returncode == 0:
        r = run_cli("build", "m.llmir", "-o", "art", "-q", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "tokenizer.ggml.merges[0] 't 0' names token 't', which is not in" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "art").exists()
