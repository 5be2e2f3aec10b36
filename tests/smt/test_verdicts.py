"""The verdict lattice of translation validation (`--verify-each`, `verify --against`):
`equivalent` only over exact rule instances, `within bound B` over approximate ones (B composed,
never below the measured error), `not equivalent` with the instance or the input, `inconclusive`
when differential testing alone agrees."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.frontends.hf import import_hf
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Module
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.passes.base import PassContext, clone_module
from llmir_core.passes.pipeline import parse_pipeline
from llmir_core.passes.static_eval import static_value
from llmir_core.smt import error_bounds as eb
from llmir_core.smt import tv
from tests.conftest import run_cli
from tests.decoder.tiny import TINY, make_llama_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: Any) -> Path:
    root = tmp_path_factory.mktemp("v")
    folder = make_llama_folder(root / "m", TINY, tokenizer=False)
    path = root / "model.llmir"
    path.write_text(print_module(import_hf(folder, out_path=path, require_tokenizer=False)))
    return path


def _quantized(tiny: Path, tmp_path: Path, bits: int = 4) -> tuple[Module, Module, Any]:
    before = parse_module(tiny.read_text(), str(tiny))
    after = clone_module(before)
    ctx = PassContext()
    ctx.current = "quantize-weights"
    (p,) = parse_pipeline(f"quantize-weights{{bits={bits},weights_file={tmp_path / 'w.bin'}}}")
    assert p.run(after, ctx)
    return before, after, list(ctx.instances)


def test_verify_each_and_verify_against_give_one_within_bound_verdict(
    tiny: Path, tmp_path: Path
) -> None:
    q = tmp_path / "q.llmir"
    spec = "quantize-weights{bits=4}"
    r = run_cli("optimize", str(tiny), "--passes", spec, "--verify-each", "-o", str(q))
    assert r.returncode == 0, r.stderr
    assert "within bound" in r.stdout and "equivalent (" not in r.stdout, r.stdout
    each = re.search(
        r"\[quantize-weights\] B = ([0-9.e+-]+): max \|optimized - original\|", r.stderr
    )
    assert each and "verdict: within bound" in r.stderr, r.stderr
    v = run_cli("verify", str(q), "--against", str(tiny))
    assert v.returncode == 0, v.stdout + v.stderr
    assert f"within bound {float(each.group(1)):.3g} to" in v.stdout, v.stdout
    assert f"B = {each.group(1)}:" in v.stdout  # the same bound, found from the files alone
    j = run_cli("verify", str(q), "--against", str(tiny), "--format", "json")
    data = json.loads(j.stdout)
    assert data["ok"] and data["verdict"] == "within-bound"
    assert 0 < data["measured"] <= data["bound"] == pytest.approx(float(each.group(1)), rel=1e-5)
    assert all(i["rule"].startswith("quantize-weights-int4") for i in data["rule_instances"])


def test_a_bound_below_the_measured_error_is_not_equivalent(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before, after, insts = _quantized(tiny, tmp_path)
    monkeypatch.setattr(tv, "local_bound", lambda *a: (0.0, "a wrong bound"))
    res = tv.validate(before, after, insts)
    assert res["verdict"] == "not-equivalent", res
    assert "exceeds the composed bound" in res["details"][0] and res["input"]


def test_codes_outside_half_a_scale_fail_the_instance_precondition(
    tiny: Path, tmp_path: Path
) -> None:
    before, after, insts = _quantized(tiny, tmp_path)
    qmm = next(op for op in after.main.ops if op.name == "llm.quantized_matmul")
    scales = qmm.operands[2].owner
    assert scales is not None
    arr = np.asarray(static_value(after, qmm.operands[2]))
    scales.name, scales.attrs = "core.constant", {"value": DenseAttr(arr * 0.5)}
    res = tv.validate(before, after, insts)
    assert res["verdict"] == "not-equivalent", res
    assert "precondition" in res["method"]
    assert "quantize-weights-int4-sym-matmul" in res["details"][0]
    assert "q_proj" in res["details"][0] and "more than half its scale" in res["details"][0]


SMALL = """module @m attributes {{llmir.dialects = ["core"], llmir.version = "0.1"}} {{
  func.func @main(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {{
{body}    return %y : tensor<2x4xf32>
  }}
}}
"""


def test_differential_agreement_alone_is_inconclusive_never_equivalent(tmp_path: Path) -> None:
    a = SMALL.format(
        body="    %y = core.add %x, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>\n"
    )
    b = SMALL.format(
        body="    %c = core.constant {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>\n"
        "    %y = core.mul %x, %c : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32>\n"
    )
    res = tv.validate(parse_module(a), parse_module(b))
    assert res["verdict"] == "inconclusive" and res["agree"], res
    assert "no proof" in res["method"]
    (tmp_path / "a.llmir").write_text(a)
    (tmp_path / "b.llmir").write_text(b)
    r = run_cli("verify", str(tmp_path / "b.llmir"), "--against", str(tmp_path / "a.llmir"))
    assert r.returncode == 3 and "inconclusive" in r.stdout and "no proof" in r.stdout, r.stdout


NORM = """module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {
  func.func @main(%x: tensor<3x8xf32>) -> (tensor<3x8xf32>, tensor<3x8xf32>) {
    %a = core.neg %x : (tensor<3x8xf32>) -> tensor<3x8xf32>
    %w = core.constant {value = dense<[[0.5, -1.0, 0.25, 2.0, 0.0, 1.5, -0.75, 1.0], [1.0, 1.0, -1.0, 0.5, 0.5, -2.0, 0.25, 0.0], [0.0, 0.5, 1.0, -1.5, 2.0, 0.25, -0.5, 1.0], [1.5, -0.25, 0.0, 1.0, -1.0, 0.5, 2.0, -2.0], [0.25, 0.25, 0.25, 0.25, -0.25, -0.25, -0.25, -0.25], [2.0, 0.0, -2.0, 0.0, 1.0, 0.0, -1.0, 0.0], [-0.5, 1.5, -0.5, 1.5, 0.0, 0.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0]]> : tensor<8x8xf32>} : () -> tensor<8x8xf32>
    %g = core.constant {value = dense<[1.0, 0.5, 2.0, 1.0, 1.0, 0.25, 1.0, 1.5]> : tensor<8xf32>} : () -> tensor<8xf32>
    %h = core.matmul %a, %w {transpose_b = true} : (tensor<3x8xf32>, tensor<8x8xf32>) -> tensor<3x8xf32>
    %s = core.silu %h : (tensor<3x8xf32>) -> tensor<3x8xf32>
    %y = llm.rms_norm %s, %g {eps = 1e-05} : (tensor<3x8xf32>, tensor<8xf32>) -> tensor<3x8xf32>
    return %s, %y : tensor<3x8xf32>, tensor<3x8xf32>
  }
}
"""


def _run(m: Module, x: np.ndarray, delta: np.ndarray | None) -> list[np.ndarray]:
    """The module's outputs with `delta` added to %a (an approximate instance's error at its
    root)."""
    from llmir_core.interp import Interpreter

    it = Interpreter(m)
    vals: dict[int, Any] = {id(m.main.args[0]): x}
    for op in m.main.ops:
        outs = it.eval_op(op, [vals[id(v)] for v in op.operands], {})
        for r, o in zip(op.results, outs):
            vals[id(r)] = o + delta if (r.name == "a" and delta is not None) else o
    return [np.asarray(vals[id(v)], np.float64) for v in m.main.outputs]


def test_the_composed_bound_covers_every_perturbation_within_the_local_bounds() -> None:
    m = parse_module(NORM)
    r = eb.Ranges(m, (-1.0, 1.0))
    local = 0.05
    comp = eb.compose(m, r, {"a": lambda err: local})
    assert comp.blocker is None and 0 < comp.bound < math.inf
    # the matmul's range uses the concrete weight (its row sums), not K * max|x| * max|w|
    h = next(op for op in m.main.ops if op.name == "core.matmul").results[0]
    assert r.iv[id(h)][1] == pytest.approx(8.25)
    rng = np.random.default_rng(0)
    worst = [0.0, 0.0]
    for _ in range(200):
        x = rng.uniform(-1, 1, (3, 8)).astype(np.float32)
        d = rng.choice([-local, local], (3, 8)).astype(np.float32)
        for i, (p, q) in enumerate(zip(_run(m, x, d), _run(m, x, None))):
            worst[i] = max(worst[i], float(np.abs(p - q).max()))
    # per output (the silu's before the norm's range caps it): measured <= composed
    assert all(0 < w <= b for w, b in zip(worst, comp.outputs)), (worst, comp.outputs)


def test_an_op_without_an_error_rule_leaves_no_finite_bound() -> None:
    text = NORM.replace("core.silu %h", "core.cumsum %h {axis = 1}")
    m = parse_module(text)
    r = eb.Ranges(m, (-1.0, 1.0))
    cumsum = next(op for op in m.main.ops if op.name == "core.cumsum")
    e, how = eb.op_error(cumsum, [0.05], r)
    assert how == "range" and e < math.inf  # a bounded range still bounds the error
    r.iv[id(cumsum.operands[0])] = (-math.inf, math.inf)
    e, how = eb.op_error(cumsum, [0.05], r)
    assert math.isinf(e) and how == "no rule"
