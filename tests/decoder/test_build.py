"""The onnxruntime decoder build against the reference interpreter: parity, no cache copies,
quantized weights, the artifact's files, and its errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.hf import import_hf
from llmir_core.quant import gguf_blocks, nbits
from llmir_core.targets.onnxruntime.runner import open_decoder
from llmir_core.targets.onnxruntime.serialize_decoder import (
    LOSSLESS,
    REQUANT,
    build_decoder,
    is_decoder,
    repack_gguf,
)

from .helpers import greedy, parity, quantize_weights, random_blocks, ref_decoder, rel
from .tiny import ARCH_SHAPES, make_llama_folder

PROMPT = np.random.default_rng(1).integers(3, 100, (1, 11))  # longer than the sliding windows (6)


def test_parity_prefill_and_16_decode_steps(tiny_module: Any, tiny_artifact: Path) -> None:
    assert parity(tiny_module, open_decoder(str(tiny_artifact)), PROMPT) <= 1e-4


def test_greedy_32_tokens_identical(tiny_module: Any, tiny_artifact: Path) -> None:
    prompt = [int(x) for x in PROMPT[0]]
    assert greedy(open_decoder(str(tiny_artifact)), prompt, 32) == greedy(
        ref_decoder(tiny_module), prompt, 32
    )


@pytest.mark.parametrize("arch", sorted(ARCH_SHAPES))
def test_architectures_match_the_interpreter(arch: str, tmp_path: Path) -> None:
    """Each architecture's distinguishing feature (sliding window, biases, q/k norm, partial
    rotary, softcaps, sandwich norms) survives the fused lowering."""
    module = import_hf(
        make_llama_folder(tmp_path / arch, ARCH_SHAPES[arch], tokenizer=False),
        require_tokenizer=False,
    )
    man = build_decoder(module, str(tmp_path / "art"))
    d = man["decoder"]
    assert (
        d["kv_cache"] == "shared_buffer" and d["fused_attention_layers"] == ARCH_SHAPES[arch].layers
    )
    assert parity(module, open_decoder(str(tmp_path / "art")), PROMPT) <= 1e-4


def test_interleaved_rotary(tiny_module: Any, tmp_path: Path) -> None:
    """GGUF llama files rotate (2i, 2i+1) pairs: GroupQueryAttention's rotary_interleaved."""
    from llmir_core.ir.parser import parse_module
    from llmir_core.ir.printer import print_module

    module = parse_module(print_module(tiny_module))
    for op in module.main.ops:
        if op.name == "llm.rotary_embedding":
            op.attrs["interleaved"] = True
    build_decoder(module, str(tmp_path / "a"))
    assert parity(module, open_decoder(str(tmp_path / "a")), PROMPT, steps=3) <= 1e-4


def test_kv_cache_is_written_in_place(tiny_module: Any, tiny_artifact: Path) -> None:
    """Past and present share one buffer per cache entry: the bound addresses never change and
    the buffer holds exactly the reference's present keys/values after each step."""
    dec = open_decoder(str(tiny_artifact))
    ref = ref_decoder(tiny_module)
    dec.reset(1)
    ref.reset(1)
    pointers = dec.cache_pointers()
    assert pointers == [b.ctypes.data for b in dec.buffers]
    logits = ref.forward(PROMPT)
    dec.forward(PROMPT)
    for _ in range(4):
        tok = logits[:, -1].argmax(-1)[:, None]
        logits = ref.forward(tok)
        dec.forward(tok)
        assert dec.cache_pointers() == pointers
        n = ref.length
        for buf, want in zip(dec.buffers, ref.cache):
            assert rel(buf[:, :, :n], want) <= 1e-5


def test_kv_buffers_grow_when_too_small(tiny_module: Any, tiny_artifact: Path) -> None:
    """A sequence longer than the reserved capacity doubles the buffers (rows kept)."""
    dec = open_decoder(str(tiny_artifact))
    dec.reserve(4)
    assert parity(tiny_module, dec, PROMPT, steps=6) <= 1e-4
    assert dec.capacity == 22 and dec.length == 17  # 4 -> 11 rows (the prompt) -> 22


def test_artifact_files_and_manifest(tiny_artifact: Path) -> None:
    man = json.loads((tiny_artifact / "manifest.json").read_text())
    for name, info in man["files"].items():
        data = (tiny_artifact / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == info["sha256"] and len(data) == info["bytes"]
    d = man["decoder"]
    assert (d["layers"], d["kv_heads"], d["head_dim"], d["heads"], d["vocab"]) == (2, 2, 16, 4, 128)
    assert d["max_len"] == 256 and d["eos_token_ids"] == [2] and d["bos_token_id"] == 1
    assert d["tokenizer"] == {"format": "hf", "file": "tokenizer.json"}
    assert "<|im_start|>" in (tiny_artifact / d["chat_template"]).read_text()
    # the SwiGLU product; the last-position gathers (lower-ort-logits) and their index
    assert set(d["generic_ops"]) <= {"core.mul", "core.gather"}
    assert d["packed_qkv_layers"] == 2 and d["logits"] == "last"
    assert man["target"] == "onnxruntime" and man["source"]["sha256"]
    assert [i["name"] for i in man["inputs"]][:3] == [
        "input_ids",
        "positions",
        "past_key_values.0.key",
    ]
    assert [o["name"] for o in man["outputs"]][:2] == ["logits", "present.0.key"]


def test_builds_are_byte_identical(tiny_module: Any, tmp_path: Path) -> None:
    a = build_decoder(tiny_module, str(tmp_path / "a"), quant="int8")
    b = build_decoder(tiny_module, str(tmp_path / "b"), quant="int8")
    assert a["files"] == b["files"]


def test_tied_embedding_is_stored_once(tmp_path: Path) -> None:
    from .tiny import LlamaShape

    module = import_hf(
        make_llama_folder(tmp_path / "m", LlamaShape(tie=True), tokenizer=False),
        require_tokenizer=False,
    )
    build_decoder(module, str(tmp_path / "a"))
    import onnx

    m = onnx.load(str(tmp_path / "a" / "model.onnx"), load_external_data=False)
    gather = next(n for n in m.graph.node if n.op_type == "Gather" and "input_ids" in n.input)
    head = next(n for n in m.graph.node if "logits" in n.output)
    # llmir's MatMulF32 reads the tied table as rows (the Gather's bytes); onnxruntime's
    # FusedMatMul where the custom ops do not build
    assert head.op_type in ("MatMulF32", "FusedMatMul")
    # the Gather reads the same bytes (for FusedMatMul through its own name, ort_load_layout:
    # peak RSS)
    inits = {t.name: t for t in m.graph.initializer}
    table, alias = inits[head.input[1]], inits[gather.input[0]]
    assert [(e.key, e.value) for e in alias.external_data] == [
        (e.key, e.value) for e in table.external_data
    ]


@pytest.mark.parametrize("scheme", ["q4_0", "q8_0"])
def test_tied_quantized_table_is_shared(scheme: str, tmp_path: Path) -> None:
    """A GGUF-quantized tied embedding stays quantized: the lm_head's MatMulNBits blocks also
    serve the lookup (GatherBlockQuantized), exactly."""
    import onnx

    from .tiny import LlamaShape

    module = import_hf(
        make_llama_folder(tmp_path / "m", LlamaShape(tie=True), tokenizer=False),
        require_tokenizer=False,
    )
    quantize_weights(
        module, tmp_path / "blob.bin", lambda name: scheme if "embed" in name else None
    )
    build_decoder(module, str(tmp_path / "a"), accuracy_level=1)
    m = onnx.load(str(tmp_path / "a" / "model.onnx"), load_external_data=False)
    ops = [n.op_type for n in m.graph.node]
    assert "GatherBlockQuantized" in ops and "Gather" not in [
        n.op_type for n in m.graph.node if "input_ids" in n.input
    ]
    assert parity(module, open_decoder(str(tmp_path / "a")), PROMPT, steps=3) <= 1e-4


@pytest.mark.parametrize("scheme", sorted(LOSSLESS))
def test_gguf_repack_is_lossless(scheme: str) -> None:
    rng = np.random.default_rng(0)
    shape = (3, 512)
    raw = random_blocks(scheme, shape, rng).reshape(shape[0], -1)
    codes, scales, bits, block = repack_gguf(raw, scheme, shape[1])
    want = gguf_blocks.dequantize(raw, scheme, shape)
    got = nbits.dequantize(codes, scales, None, bits, block, shape)
    assert np.array_equal(got, want)
    gguf = pytest.importorskip("gguf", reason="the gguf package is an optional cross-check")
    qt = getattr(gguf.GGMLQuantizationType, scheme.upper())
    assert np.array_equal(got, gguf.quants.dequantize(raw, qt).reshape(shape))


def _wide_module(tmp_path: Path) -> Any:
    """Rows of 256 (k-quant super-blocks need them)."""
    from .tiny import LlamaShape

    shape = LlamaShape(hidden=256, intermediate=256, heads=4, kv_heads=2, layers=2)
    return import_hf(
        make_llama_folder(tmp_path / "wide", shape, tokenizer=False), require_tokenizer=False
    )


def test_quantized_weights_match_the_interpreter(tmp_path: Path) -> None:
    """q4_0, q8_0, q6_k and q3_k weights become MatMulNBits with the same values: with fp32
    activations (accuracy level 1) the logits match the reference interpreter's."""
    module = _wide_module(tmp_path)
    schemes = {
        "q_proj": "q4_0",
        "k_proj": "q6_k",
        "v_proj": "q6_k",
        "o_proj": "q3_k",
        "gate_proj": "q8_0",
        "up_proj": "q4_0",
        "down_proj": "q8_0",
        "lm_head": "q4_0",
    }
    quantize_weights(
        module,
        tmp_path / "blob.bin",
        lambda name: next((s for k, s in schemes.items() if k in name), None),
    )
    man = build_decoder(module, str(tmp_path / "a"), accuracy_level=1)
    q = man["decoder"]["quant"]
    assert (
        q["gguf_lossless"] == {"q3_k": 2, "q4_0": 5, "q6_k": 4, "q8_0": 4}
        and not q["gguf_requantized"]
    )
    assert man["decoder"]["packed_qkv_layers"] == 0  # q4_0 q with q6_k k/v: different formats
    assert parity(module, open_decoder(str(tmp_path / "a")), PROMPT, steps=4) <= 1e-4


def test_requantized_formats_report_their_error(tmp_path: Path) -> None:
    module = _wide_module(tmp_path)
    quantize_weights(
        module,
        tmp_path / "blob.bin",
        lambda name: "q4_k" if "gate_proj" in name else ("q5_1" if "up_proj" in name else None),
    )
    man = build_decoder(module, str(tmp_path / "a"), accuracy_level=1, gguf_kernels="requant")
    req = man["decoder"]["quant"]["gguf_requantized"]
    assert {(r["from"], r["to"]) for r in req} == {("q4_k", "int4"), ("q5_1", "int8")} and len(
        req
    ) == 4
    assert all(0 < r["max_rel_error"] < 0.2 for r in req)
    assert set(REQUANT) >= {r["from"] for r in req}
    assert parity(module, open_decoder(str(tmp_path / "a")), PROMPT, steps=2) < 0.2


def test_int4_quantization_of_f32_weights(
    tiny_module: Any, tiny_artifact: Path, tmp_path: Path
) -> None:
    man = build_decoder(tiny_module, str(tmp_path / "q"), quant="int4", accuracy_level=1)
    quant = man["decoder"]["quant"]
    assert quant["quantized"] == {"int4": 16}  # 2 layers x 7 projections + lm_head + embedding
    (emb,) = quant["embedding"]  # the untied table, rounded to int4 blocks: its error reported
    assert emb["weight"] == "model.embed_tokens.weight" and emb["quantize"] == "sym"
    assert not emb["shared_with_lm_head"] and 0 < emb["max_abs_error"] < 1.0
    f32 = open_decoder(str(tiny_artifact))
    q4 = open_decoder(str(tmp_path / "q"))
    f32.reset(1)
    q4.reset(1)
    a, b = f32.forward(PROMPT), q4.forward(PROMPT)
    # every matrix is int4, the embedding too (0.98 with an f32 embedding; 64-wide random rows)
    assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.97
    assert (tmp_path / "q" / "model.onnx.data").stat().st_size < (
        tiny_artifact / "model.onnx.data"
    ).stat().st_size


def test_last_logits_by_default_all_on_request(
    tiny_module: Any, tiny_artifact: Path, tmp_path: Path
) -> None:
    """The default build computes the last position's logits (lower-ort-logits); last_logits=False
    (`--logits all`) keeps every position, and both agree on the last."""
    build_decoder(tiny_module, str(tmp_path / "all"), last_logits=False)
    last, full = open_decoder(str(tiny_artifact)), open_decoder(str(tmp_path / "all"))
    assert full.decoder["logits"] == "all" and last.decoder["logits"] == "last"
    full.reset(1)
    last.reset(1)
    a, b = full.forward(PROMPT), last.forward(PROMPT)
    assert a.shape == (1, PROMPT.shape[1], 128) and b.shape == (1, 1, 128)
    assert rel(b[:, -1], a[:, -1]) <= 1e-6
    assert parity(tiny_module, open_decoder(str(tmp_path / "all")), PROMPT, steps=2) <= 1e-4


def test_unmatched_attention_falls_back_to_concat_cache(tiny_module: Any, tmp_path: Path) -> None:
    """Attention the fused op cannot express (here softmax_eps) is lowered generically; the cache
    then grows by concatenation and the runtime chains onnxruntime values between steps."""
    from llmir_core.ir.parser import parse_module
    from llmir_core.ir.printer import print_module

    module = parse_module(print_module(tiny_module))
    for op in module.main.ops:
        if op.name == "llm.scaled_dot_product_attention":
            op.attrs["softmax_eps"] = 1e-30
    man = build_decoder(module, str(tmp_path / "a"))
    d = man["decoder"]
    assert d["kv_cache"] == "concat" and d["fused_attention_layers"] == 0 and d["not_fused"]
    assert parity(module, open_decoder(str(tmp_path / "a")), PROMPT, steps=4) <= 1e-4


def test_max_len_caps_the_context(tiny_module: Any, tmp_path: Path) -> None:
    man = build_decoder(tiny_module, str(tmp_path / "a"), max_len=16)
    assert man["decoder"]["max_len"] == 16
    dec = open_decoder(str(tmp_path / "a"))
    dec.reset(1)
    dec.forward(PROMPT)
    with pytest.raises(InputError, match="exceed the model's context of 16"):
        dec.forward(np.zeros((1, 6), np.int64))
    with pytest.raises(InputError, match="--max-len 999 exceeds the 256 positions"):
        build_decoder(tiny_module, str(tmp_path / "b"), max_len=999)


def test_errors(tiny_module: Any, tmp_path: Path) -> None:
    from llmir_core.ir.parser import parse_module

    plain = parse_module(
        "module @m {\n  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "    %y = core.add %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
        "    return %y : tensor<4xf32>\n  }\n}\n"
    )
    assert is_decoder(tiny_module) and not is_decoder(plain)
    with pytest.raises(InputError, match="is not a decoder"):
        build_decoder(plain, str(tmp_path / "a"))
    with pytest.raises(InputError, match="quant must be one of none, int4, int8, got 'int3'"):
        build_decoder(tiny_module, str(tmp_path / "a"), quant="int3")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("mine")
    with pytest.raises(InputError, match="not an llmir artifact"):
        build_decoder(tiny_module, str(tmp_path / "full"))
    with pytest.raises(InputError, match="no manifest.json"):
        open_decoder(str(tmp_path / "full"))
    from llmir_core.targets.onnxruntime.graph import build

    build(plain, str(tmp_path / "generic"))
    with pytest.raises(InputError, match="not a decoder artifact"):
        open_decoder(str(tmp_path / "generic"))


@pytest.mark.parametrize("pipeline", ["O3", "quantize-weights{bits=4}"])
def test_optimized_modules_keep_the_fused_build(pipeline: str, tmp_path: Path) -> None:
    """`llmir optimize` output (-O3's add_rms_norm / linear / merged projections, or weight-only
    int4 quantized_matmuls) still becomes one GroupQueryAttention and one packed QKV per layer."""
    from llmir_core.ir.printer import print_module
    from llmir_core.passes.manager import run_pipeline
    from llmir_core.passes.pipeline import parse_pipeline, preset

    from .tiny import ARCH_SHAPES

    module = import_hf(
        make_llama_folder(tmp_path / "m", ARCH_SHAPES["qwen2"], tokenizer=False),
        str(tmp_path / "m.llmir"),
        require_tokenizer=False,
    )
    (tmp_path / "m.llmir").write_text(print_module(module))
    passes = preset(3) if pipeline == "O3" else parse_pipeline(pipeline)
    module = run_pipeline(module, passes, allow_unproved=True).module
    man = build_decoder(module, str(tmp_path / "a"), accuracy_level=1)
    d = man["decoder"]
    assert d["fused_attention_layers"] == d["packed_qkv_layers"] == 2
    # the QKV bias, the SwiGLU product and the last-position gathers
    assert set(d["generic_ops"]) <= {"core.add", "core.mul", "core.gather"}
    assert parity(module, open_decoder(str(tmp_path / "a")), PROMPT, steps=3) <= 1e-4
