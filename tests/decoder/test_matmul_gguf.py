"""GGUF tensors run as stored (`ort.matmul_gguf` -> ai.llmir MatMulGGUF): a decoder whose
projections are GGUF tensors in every block format outside q4_0/q8_0 builds with one
MatMulGGUF per tensor over the file's own bytes, its logits match the reference interpreter of
the unlowered module, the optimize report says "kept exactly", translation validation finds the
lowering equivalent, and requantization happens only when asked (`--gguf-kernels requant`,
`--quant`). The kernel itself against numpy: tests/kernels/test_gguf_kernel.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.frontends.hf import import_hf
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.targets import build, lower
from llmir_core.targets.onnxruntime.native import unavailable_reason
from llmir_core.targets.onnxruntime.runner import open_decoder
from llmir_core.verifier import verify
from tests.conftest import requires, run_cli

from .helpers import quantize_weights, ref_decoder, rel
from .tiny import LlamaShape, make_llama_folder

WHY = unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")
# weight name part -> GGUF format (first match): every format MatMulGGUF reads by default
SCHEMES = (
    ("layers.1.mlp.up_proj", "q5_1"),
    ("q_proj", "q4_k"),
    ("k_proj", "q5_k"),
    ("v_proj", "q6_k"),
    ("o_proj", "q2_k"),
    ("gate_proj", "q3_k"),
    ("up_proj", "q4_1"),
    ("down_proj", "iq4_xs"),
    ("lm_head", "iq4_nl"),
)
PROMPT = np.random.default_rng(4).integers(3, 100, (1, 11))


def _pick(name: str) -> str | None:
    return next((s for k, s in SCHEMES if k in name), None)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer llama (rows of 256: k-quant super-blocks) with GGUF-quantized projections,
    printed to a .llmir file beside its weights."""
    root = tmp_path_factory.mktemp("gguf")
    shape = LlamaShape(hidden=256, intermediate=256, heads=4, kv_heads=2, layers=2)
    module = import_hf(
        make_llama_folder(root / "m", shape, tokenizer=False), require_tokenizer=False
    )
    quantize_weights(module, root / "blob.bin", _pick, seed=3)
    path = Path(module.source).parent / "gguf.llmir" if module.source else root / "gguf.llmir"
    path.write_text(print_module(module))
    return path


def _module(path: Path) -> Any:
    return parse_module(path.read_text(), str(path))


def test_the_verifier_names_a_weight_of_another_format(gguf_file: Path) -> None:
    text = gguf_file.read_text()
    lowered = print_module(lower(_module(gguf_file), options={"nbits_kernel": "llmir"}))
    assert (
        'ort.matmul_gguf %v, %model.layers.0.self_attn.q_proj.weight {format = "q4_k"}' in lowered
    )
    bad = lowered.replace(
        '%model.layers.0.self_attn.q_proj.weight {format = "q4_k"}',
        '%model.layers.0.self_attn.q_proj.weight {format = "q6_k"}',
    )
    assert bad != lowered and text
    diags = verify(parse_module(bad, str(gguf_file)))
    assert [d.message for d in diags] == [
        'ort.matmul_gguf {format = "q6_k"}: weight %model.layers.0.self_attn.q_proj.weight must '
        "be the llm.dequantize of a !quant.q6_k tensor, got llm.dequantize of !quant.q4_k"
    ]


@needs_kernel
def test_every_format_runs_as_stored(gguf_file: Path, tmp_path: Path) -> None:
    module = _module(gguf_file)
    lowered = lower(module)
    fmts = [op.attrs["format"] for op in lowered.main.ops if op.name == "ort.matmul_gguf"]
    assert sorted(set(fmts)) == sorted({s for _, s in SCHEMES}) and len(fmts) == 15
    assert not [op for op in lowered.main.ops if op.name == "ort.matmul_nbits"]
    man = build(module, str(tmp_path / "a"), "onnxruntime")
    q = man["decoder"]["quant"]
    assert not q["gguf_requantized"] and not q["gguf_lossless"]
    assert sum(q["gguf_exact"].values()) == 15 and q["gguf_exact"]["q4_k"] == 2
    _same_bytes_as_the_file(tmp_path / "a", gguf_file)
    ref, dec = ref_decoder(module), open_decoder(str(tmp_path / "a"))
    ref.reset(1)
    dec.reset(1)
    # more than 4 rows a call (prefill): activations rounded to int8 per 32 columns as at decode
    # (measured 0.039, 0.157, 0.030 over these random-bit blocks)
    for chunk in (PROMPT, PROMPT[:, :5] + 7, PROMPT[:, 3:9]):
        a, b = ref.forward(chunk), dec.forward(chunk)
        assert rel(b, a[:, -1:]) <= 0.3
    # one row (decode): activations rounded to int8 per 32 columns (accuracy_level 4's
    # numerics, checked op by op against numpy in tests/kernels/test_gguf_kernel.py); over these
    # random-bit blocks that moves the logits by up to ~4% per format, ~10% over all of them
    for _ in range(3):
        tok = a[:, -1].argmax(-1)[:, None]
        a, b = ref.forward(tok), dec.forward(tok)
        assert rel(b, a) <= 0.2
    # prefill and decode round the same rows the same way: a prompt prefilled at once and fed one
    # token at a time give the same logits up to f32 summation order (measured 1.4e-07)
    dec.reset(1)
    once = dec.forward(PROMPT)
    dec.reset(1)
    for i in range(PROMPT.shape[1]):
        step = dec.forward(PROMPT[:, i : i + 1])
    assert rel(step, once) <= 1e-5


def _same_bytes_as_the_file(art: Path, src: Path) -> None:
    """Each MatMulGGUF's W initializer holds one tensor's bytes as the GGUF file stores them."""
    import onnx

    stored = {}
    for op in _module(src).main.ops:
        if op.name == "core.weight" and "!quant" in str(op.results[0].type):
            with open(op.attrs["file"], "rb") as fh:
                fh.seek(int(op.attrs["offset"]))
                stored[fh.read(int(op.attrs["nbytes"]))] = op.attrs["name"]
    model = onnx.load(str(art / "model.onnx"), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    data = (art / "model.onnx.data").read_bytes()
    seen = set()
    for node in model.graph.node:
        if node.op_type == "MatMulGGUF":
            t = inits[node.input[1]]
            ext = {e.key: e.value for e in t.external_data}
            got = data[int(ext["offset"]) : int(ext["offset"]) + int(ext["length"])]
            assert t.data_type == onnx.TensorProto.UINT8 and len(t.dims) == 2
            assert got in stored, node.input[1]
            seen.add(stored[got])
    assert len(seen) == 15


@needs_kernel
def test_report_says_kept_exactly_and_requantizes_only_when_asked(
    gguf_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "opt.llmir"
    r = run_cli("optimize", str(gguf_file), "--target", "onnxruntime", "--report", "-o", str(out))
    assert r.returncode == 0, r.stderr
    kept = [ln for ln in r.stdout.splitlines() if "matmul-gguf" in ln]
    assert len(kept) == 15 and "requantized" not in r.stdout
    assert (
        "model.layers.0.self_attn.q_proj.weight: q4_k kept exactly (GGUF blocks read in place "
        "by llmir's kernel)" in r.stdout
    )
    v = run_cli("verify", str(out), "--against", str(gguf_file))
    assert v.returncode == 0 and ": equivalent to" in v.stdout, v.stdout + v.stderr
    assert "ort.matmul_gguf x15: smt, expanded through its decomposition" in v.stdout
    for flags in (["--gguf-kernels", "requant"], ["--quant", "int4"]):
        args = ("optimize", str(gguf_file), "--target", "onnxruntime", "--report", "-o", str(out))
        r = run_cli(*args, *flags)
        assert r.returncode == 0, r.stderr
        assert "matmul-gguf" not in r.stdout
        assert (
            "model.layers.0.self_attn.q_proj.weight: q4_k requantized to int4 block 32 with "
            "zero points, max abs error" in r.stdout
        )
    bad = run_cli("optimize", str(gguf_file), "--target", "onnxruntime", "--gguf-kernels", "fast")
    assert (
        bad.returncode == 2
        and "--gguf-kernels must be one of exact, requant, got 'fast'" in bad.stderr
    ), bad.stderr


@needs_kernel
def test_requant_option_builds_the_requantized_form(gguf_file: Path, tmp_path: Path) -> None:
    module = _module(gguf_file)
    man = build(module, str(tmp_path / "r"), "onnxruntime", options={"gguf_kernels": "requant"})
    q = man["decoder"]["quant"]
    assert not q["gguf_exact"] and q["gguf_lossless"] == {"q3_k": 2, "q6_k": 2}
    assert {r["from"] for r in q["gguf_requantized"]} == {
        "q4_k",
        "q5_k",
        "q2_k",
        "q4_1",
        "q5_1",
        "iq4_xs",
        "iq4_nl",
    }
    assert all(0 < r["max_rel_error"] < 0.3 for r in q["gguf_requantized"])
    ref, dec = ref_decoder(module), open_decoder(str(tmp_path / "r"))
    ref.reset(1)
    dec.reset(1)
    err = rel(dec.forward(PROMPT), ref.forward(PROMPT)[:, -1:])
    assert 1e-4 < err < 0.5  # requantized: near, not exact


@needs_kernel
def test_gated_mlp_of_one_format_takes_the_swiglu_epilogue(tmp_path: Path) -> None:
    """Gate and up both q4_k: one MatMulGGUF over [gate; up] with the SwiGLU epilogue (the
    node attribute), close to the reference on prefill rows, validated equivalent to the unlowered module."""
    shape = LlamaShape(hidden=256, intermediate=256, heads=4, kv_heads=2, layers=1)
    module = import_hf(
        make_llama_folder(tmp_path / "m", shape, tokenizer=False), require_tokenizer=False
    )
    pick = {
        "q_proj": "q4_k",
        "k_proj": "q5_k",
        "v_proj": "q6_k",  # three formats: q, k and v are not packed
        "gate_proj": "q4_k",
        "up_proj": "q4_k",
        "down_proj": "q6_k",
    }
    quantize_weights(
        module, tmp_path / "b.bin", lambda n: next((s for k, s in pick.items() if k in n), None)
    )
    src = Path(module.source).parent / "m.llmir" if module.source else tmp_path / "m.llmir"
    src.write_text(print_module(module))
    module = _module(src)
    ops = [op for op in lower(module).main.ops if op.name == "ort.matmul_gguf"]
    assert [(op.attrs["format"], op.attrs.get("epilogue")) for op in ops] == [
        ("q4_k", None),
        ("q5_k", None),
        ("q6_k", None),
        ("q4_k", "swiglu"),
        ("q6_k", None),
    ]
    build(module, str(tmp_path / "a"), "onnxruntime")
    import onnx

    nodes = onnx.load(str(tmp_path / "a" / "model.onnx"), load_external_data=False).graph.node
    epi = [{a.name: a.s for a in n.attribute} for n in nodes if n.op_type == "MatMulGGUF"]
    assert sorted(e.get("epilogue", b"") for e in epi) == [b""] * 4 + [b"swiglu"]
    ref, dec = ref_decoder(module), open_decoder(str(tmp_path / "a"))
    ref.reset(1)
    dec.reset(1)
    # prefill rows rounded to int8 per 32 columns (measured 0.013)
    assert rel(dec.forward(PROMPT), ref.forward(PROMPT)[:, -1:]) <= 0.03
    out = tmp_path / "opt.llmir"
    r = run_cli("optimize", str(src), "--target", "onnxruntime", "-o", str(out))
    assert r.returncode == 0, r.stderr
    # the fused [gate; up] form has no term of the original (like the other kernels' SwiGLU
    # epilogues): validated differentially; every other MatMulGGUF through its decomposition
    v = run_cli("verify", str(out), "--against", str(src))
    assert v.returncode == 3 and ": inconclusive to" in v.stdout, v.stdout + v.stderr
    assert "3 seeded inputs agree" in v.stdout
    assert "ort.matmul_gguf x3: smt, expanded through its decomposition" in v.stdout


def test_q5_0_runs_as_stored_with_packed_qkv_and_the_epilogue(tmp_path: Path) -> None:
    """q5_0 (Gemma's attn_q/k, ffn_gate/up in Q4_K_M) is read as stored, 5.5 bits a weight, not
    repacked to int8 blocks: Q/K/V of the one format are one op over their rows, gate and up one
    op with the SwiGLU epilogue; `--gguf-kernels requant` keeps the lossless int8 repack."""
    shape = LlamaShape(hidden=256, intermediate=256, heads=4, kv_heads=2, layers=1)
    module = import_hf(
        make_llama_folder(tmp_path / "m", shape, tokenizer=False), require_tokenizer=False
    )
    quantize_weights(module, tmp_path / "b.bin", lambda n: "q5_0" if "proj" in n else None)
    src = tmp_path / "m.llmir"
    src.write_text(print_module(module))
    module = _module(src)

    def mm(options: dict[str, str]) -> list[tuple[str, Any, Any]]:
        ops = lower(module, options={"nbits_kernel": "llmir", **options}).main.ops
        return [
            (op.name, op.attrs.get("format"), op.attrs.get("epilogue"))
            for op in ops
            if op.name in ("ort.matmul_gguf", "ort.matmul_nbits")
        ]

    assert mm({}) == [
        ("ort.matmul_gguf", "q5_0", None),  # [q; k; v]
        ("ort.matmul_gguf", "q5_0", None),
        ("ort.matmul_gguf", "q5_0", "swiglu"),
        ("ort.matmul_gguf", "q5_0", None),
    ]
    assert mm({"gguf_kernels": "requant"}) == [
        ("ort.matmul_nbits", None, None),
        ("ort.matmul_nbits", None, None),
        ("ort.matmul_nbits", None, "swiglu"),
        ("ort.matmul_nbits", None, None),
    ]
