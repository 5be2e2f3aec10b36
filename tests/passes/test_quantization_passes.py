"""quantize-weights and kv-cache-int8 on a random-weight llama imported from a model folder:
error bounds, the weights file, translation validation, the decoder runtime, KV memory."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.frontends.hf import import_hf
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Function, Module
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import TensorType
from llmir_core.passes.base import clone_module
from llmir_core.passes.kv_cache_int8 import kv_bytes_per_token
from llmir_core.passes.manager import run_pipeline
from llmir_core.passes.pipeline import parse_pipeline
from llmir_core.passes.quantize_weights import quantize_matrix
from llmir_core.rewrite.library import RULES
from llmir_core.runtime.decoder import FunctionDecoder, cache_specs
from llmir_core.smt.prove import prove
from llmir_core.smt.tv import validate_pass
from llmir_core.verifier import verify
from tests.decoder.tiny import TINY, make_llama_folder

PROMPT = np.array([[5, 9, 17, 33, 60]])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: Any) -> Path:
    """A tiny llama imported to model.llmir (weights referenced in the folder's safetensors)."""
    root = tmp_path_factory.mktemp("q")
    folder = make_llama_folder(root / "m", TINY, tokenizer=False)
    path = root / "model.llmir"
    path.write_text(print_module(import_hf(folder, out_path=path, require_tokenizer=False)))
    return path


def _load(path: Path) -> Module:
    return parse_module(path.read_text(), str(path))


def _decode(module: Module, steps: int = 3) -> np.ndarray:
    it = Interpreter(module)
    dec = FunctionDecoder(lambda feeds: it.run(feeds), cache_specs(module.main))
    dec.reset(1)
    out = [dec.forward(PROMPT)[:, -1]]
    for tok in range(40, 40 + steps):
        out.append(dec.forward(np.array([[tok]]))[:, -1])
    return np.concatenate(out)


@pytest.mark.parametrize("bits,symmetric", [(8, True), (4, True), (8, False), (4, False)])
def test_quantize_matrix_meets_the_proved_bound(bits: int, symmetric: bool) -> None:
    rng = np.random.default_rng(bits)
    w = (rng.standard_normal((16, 64)) * np.exp(rng.standard_normal((16, 1)))).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero block
    q = quantize_matrix(w, bits, 32, symmetric)
    max_err, ratio, rel = q.weight_error()
    assert ratio <= 1.0 + 1e-5 and max_err > 0  # |w - dq(q(w))| <= scale/2, per block
    assert np.all(q.restored[3, :32] == 0.0)
    assert rel < (0.01 if bits == 8 else 0.15)
    codes = np.unpackbits(q.codes.view(np.uint8)[:, None], axis=1, bitorder="little")
    assert codes.size == w.size * bits
    if symmetric:  # codes in [-L, L] around the midpoint: never the asymmetric extra code
        lvl = (1 << (bits - 1)) - 1
        dq = np.rint(
            q.restored.reshape(16, 2, 32) / np.where(q.scales == 0, 1, q.scales)[..., None]
        )
        assert np.abs(dq).max() <= lvl


@pytest.mark.parametrize(
    "spec", ["quantize-weights{bits=8}", "quantize-weights{bits=4,symmetric=false,block=16}"]
)
def test_quantize_weights_on_a_decoder(tiny: Path, tmp_path: Path, spec: str) -> None:
    m = _load(tiny)
    original = clone_module(m)
    out = tmp_path / "w.bin"
    res = run_pipeline(
        m, parse_pipeline(spec.replace("}", f",weights_file={out}}}")), validator=validate_pass
    )
    # quantization is approximate: never `equivalent`; B is composed over the rule instances,
    # finite, and not below the measured error
    v = res.runs[0].validation
    assert res.failed_validation is None and v is not None
    assert v["verdict"] == "within-bound", v
    assert 0 < v["measured"] <= v["bound"] < float("inf"), v
    # per layer q, k, v, o and the output head; the gated MLP's rules are unproved (issue 21:
    # no bound through the activation), so its weights stay f32 by default
    assert len(v["rule_instances"]) == 4 * TINY.layers + 1
    assert res.after.op_counts.get("llm.quantized_matmul", 0) == 4 * TINY.layers + 1
    assert res.after.op_counts.get("llm.gated_mlp", 0) == TINY.layers
    assert res.after.param_bytes < res.before.param_bytes * 0.8
    assert not verify(m) and out.exists()
    details = [r.detail for r in res.ctx.rewrites]
    assert all("of the bound scale/2" in d and "output max|err|" in d for d in details)
    # each new weight is pinned by the sha256 of its bytes in the file
    data = out.read_bytes()
    for op in m.main.ops:
        if op.name == "core.weight" and op.attrs["file"].endswith("w.bin"):
            a = op.attrs
            assert (
                hashlib.sha256(data[a["offset"] : a["offset"] + a["nbytes"]]).hexdigest()
                == a["sha256"]
            )
    a, b = _decode(original), _decode(m)
    rel = np.linalg.norm(a - b) / np.linalg.norm(a)
    assert rel < (0.03 if "bits=8" in spec else 0.4), rel


def test_quantize_weights_leaves_a_tied_table_and_explains(tmp_path: Path) -> None:
    folder = make_llama_folder(
        tmp_path / "tied", dataclasses.replace(TINY, tie=True), tokenizer=False
    )
    m = import_hf(folder, out_path=tmp_path / "t.llmir", require_tokenizer=False)
    res = run_pipeline(m, parse_pipeline(f"quantize-weights{{weights_file={tmp_path / 'w.bin'}}}"))
    reasons = [r.reason for r in res.ctx.rejections]
    assert any("has other uses" in r for r in reasons)  # the embedding table feeds the lm head too
    assert res.after.op_counts["core.matmul"] == 1


def test_quantize_weights_rejects_a_block_that_does_not_divide(tiny: Path, tmp_path: Path) -> None:
    m = _load(tiny)
    res = run_pipeline(
        m, parse_pipeline(f"quantize-weights{{block=128,weights_file={tmp_path / 'w.bin'}}}")
    )
    assert not res.ctx.rewrites and "not a multiple of block 128" in res.ctx.rejections[0].reason
    with pytest.raises(InputError, match="bits must be 4 or 8"):
        run_pipeline(_load(tiny), parse_pipeline("quantize-weights{bits=3}"))
    with pytest.raises(InputError, match="power of two"):
        run_pipeline(_load(tiny), parse_pipeline("quantize-weights{block=24}"))


def test_quantization_bounds_are_about_the_rules_own_terms() -> None:
    for name in ("quantize-weights-int4-sym-matmul", "kv-cache-int8"):
        assert prove(RULES[name], 10).verdict == "proved"
    # the gated MLP's bound through the activation is not proved: unproved, not applied
    assert prove(RULES["quantize-weights-int8-asym-gated-mlp-silu"], 10).verdict == "unproved"
    r = RULES["quantize-weights-int8-sym-matmul"]
    # a bound a quarter of a step: the premise allows half a step, so it fails
    tight = dataclasses.replace(
        r, name="mutant-bound", bound=dataclasses.replace(r.bound, rel=0.25, text="")
    )
    assert prove(tight, 10).verdict == "refuted"
    # the replacement reading the weight through the wrong layout
    swapped = dataclasses.replace(
        r, name="mutant-layout", rhs=dataclasses.replace(r.rhs, attrs={"transpose_b": False})
    )
    assert prove(swapped, 10).verdict != "proved"


# -- KV cache ----------------------------------------------------------------------------------------


def test_kv_cache_int8_validates_and_keeps_the_signature(tiny: Path) -> None:
    m = _load(tiny)
    original = clone_module(m)
    res = run_pipeline(m, parse_pipeline("kv-cache-int8"), validator=validate_pass)
    assert res.failed_validation is None
    assert [a.type for a in m.main.args] == [a.type for a in original.main.args]
    assert res.after.op_counts["core.round"] == 2 * TINY.layers
    summary = res.ctx.rewrites[-1].detail
    hd = TINY.hidden // TINY.heads
    before, after = 4 * TINY.kv_heads * hd * 4, 4 * (TINY.kv_heads * hd + 4 * TINY.kv_heads)
    assert f"{before} -> {after} bytes per token" in summary
    a, b = _decode(original), _decode(m)
    assert np.linalg.norm(a - b) / np.linalg.norm(a) < 0.02


def test_kv_cache_int8_interface_runs_in_the_unchanged_runtime(tiny: Path) -> None:
    m, roundtrip = _load(tiny), _load(tiny)
    run_pipeline(m, parse_pipeline("kv-cache-int8{interface=true}"))
    run_pipeline(roundtrip, parse_pipeline("kv-cache-int8"))
    assert not verify(m)
    names = [a.name for a in m.main.args]
    assert names[2:4] == ["past_key_values.0.key", "past_key_values.0.key_scale"]
    specs = cache_specs(m.main)
    assert [s.dtype for s in specs[:2]] == [np.dtype(np.int8), np.dtype(np.float32)] and specs[
        1
    ].head_dim == 1
    # the same numbers as the IR-level round trip: every block is quantized once, when appended
    np.testing.assert_array_equal(_decode(m), _decode(roundtrip))


def _cache_fn(layers: int, kv_heads: int, head_dim: int) -> Function:
    text = ['module @m attributes {llmir.dialects = ["core"], llmir.version = "0.1"} {']
    t_p = f"tensor<?b x {kv_heads} x ?p x {head_dim} x f32>"
    t_n = f"tensor<?b x {kv_heads} x ?s x {head_dim} x f32>"
    t_a = f"tensor<?b x {kv_heads} x ?p+?s x {head_dim} x f32>"
    args, body, outs = [], [], []
    for i in range(layers):
        for kind in ("key", "value"):
            args += [f"%past_key_values.{i}.{kind}: {t_p}", f"%n{i}{kind}: {t_n}"]
            body.append(
                f"    %p{i}{kind} = core.concat %past_key_values.{i}.{kind}, %n{i}{kind} {{axis = 2}} : ({t_p}, {t_n}) -> {t_a}"
            )
            outs.append(f"%p{i}{kind}")
    text.append(f"  func.func @main({', '.join(args)}) -> ({', '.join([t_a] * len(outs))}) {{")
    text += body + [f"    return {', '.join(outs)} : {', '.join([t_a] * len(outs))}", "  }", "}"]
    return parse_module("\n".join(text) + "\n").main


def test_kv_memory_of_a_smollm2_shaped_cache() -> None:
    fn = _cache_fn(30, 3, 64)
    f32, i8 = kv_bytes_per_token(fn, False), kv_bytes_per_token(fn, True)
    assert (f32, i8) == (
        46080,
        12240,
    )  # 30 layers x K,V x 3 heads x (64 f32 | 64 i8 + one f32 scale)
    assert round(100 * (1 - i8 / f32), 1) == 73.4  # vs an f32 cache
    assert round(100 * (1 - i8 / (f32 / 2)), 1) == 46.9  # vs an f16 cache
    assert isinstance(fn.args[0].type, TensorType)
