"""assign-precision: dtype and device assignment from the capability table, validated pass by
pass, with the conversion round trips folded by canonicalize."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.interp import run
from llmir_core.ir.types import DType, TensorType
from llmir_core.passes import PASSES
from llmir_core.passes.base import PassContext, clone_module
from llmir_core.passes.manager import run_pipeline
from llmir_core.passes.pipeline import parse_pipeline
from llmir_core.smt.differential import make_inputs
from llmir_core.smt.tv import validate_pass
from llmir_core.verifier import verify
from tests.passes.exported import exported_block


def _inputs(m: Any) -> dict[str, Any]:
    inputs = make_inputs(m, {"batch": 2, "seq": 5}, seed=1, scale=1.0)
    inputs["pos"] = np.tile(np.arange(5), (2, 1)).astype(np.int64)
    return inputs


def _placed(m: Any) -> None:
    """Every op reads its tensor operands on the device it runs on (llm.to_device moves)."""
    for op in m.main.ops:
        if (
            op.name == "llm.to_device"
            or not op.results
            or not isinstance(op.results[0].type, TensorType)
        ):
            continue
        dev = op.results[0].type.device
        for v in op.operands:
            if (
                isinstance(v.type, TensorType)
                and v.owner is not None
                and v.owner.name not in ("core.weight", "core.constant")
            ):
                assert v.type.device == dev, (op.name, v.name, v.type, dev)


@pytest.mark.parametrize(
    "spec,low,tol",
    [
        ("assign-precision{target=cuda}", DType.f16, 5e-3),
        ("assign-precision{target=cpu,dtype=bf16}", DType.bf16, 4e-2),
        ("assign-precision{target=cpu}", DType.f32, 1e-5),
    ],
)
def test_assign_precision_validates_and_stays_close(spec: str, low: DType, tol: float) -> None:
    m = exported_block()
    original = clone_module(m)
    res = run_pipeline(m, parse_pipeline(spec + ",canonicalize,cse,dce"), validator=validate_pass)
    assert res.failed_validation is None
    # rounding to the target type is approximate: assign-precision is `within bound B` (B
    # composed over its instances, not below the measured error), the folds after it exact
    v = res.runs[0].validation
    assert v is not None and v["verdict"] in ("within-bound", "inconclusive"), v
    if v["verdict"] == "within-bound":
        assert v["measured"] <= v["bound"] < float("inf")
    else:  # the norm's decomposition near its eps: no finite B composes; the error is measured
        assert "no finite bound" in v["method"] and "measured" in " ".join(v["details"]), v
    assert all(r.validation and r.validation["verdict"] == "equivalent" for r in res.runs[1:])
    assert not verify(m)
    _placed(m)
    mm = [op for op in m.main.ops if op.name == "core.matmul"]
    assert mm and all(op.results[0].type.dtype == low for op in mm)  # type: ignore[union-attr]
    norms = [
        op for op in m.main.ops if op.name in ("llm.rms_norm", "core.softmax", "core.reduce_mean")
    ]
    assert all(op.results[0].type.dtype == DType.f32 for op in norms)  # type: ignore[union-attr]
    assert [a.type for a in m.main.args] == [a.type for a in original.main.args]
    x = _inputs(original)
    a, b = run(original, x)[0], run(m, x)[0]
    assert np.linalg.norm(a - b) / np.linalg.norm(a) < tol


def test_cuda_narrows_once_per_value_after_canonicalize() -> None:
    m = exported_block()
    run_pipeline(m, parse_pipeline("assign-precision{target=cuda},canonicalize,cse,dce"))
    casts = [op for op in m.main.ops if op.name == "core.cast"]
    # no f16 -> f32 -> f16 round trip survives: a narrowing cast never reads a widened f16 value
    for op in casts:
        src = op.operands[0].owner
        if op.attrs["to"] == DType.f16 and src is not None and src.name == "core.cast":
            assert src.operands[0].type.dtype != DType.f16  # type: ignore[union-attr]
    moves = [op for op in m.main.ops if op.name == "llm.to_device" and op.attrs["device"] == ""]
    assert len(moves) == len(m.main.outputs)  # only the results go back to the host


def test_cpu_reorders_onnx_weights_and_cuda_keeps_them() -> None:
    """The exported block's six projection weights are [in, out] (ONNX MatMul): the cpu table
    reads kn, so they stay; cuda reads nk, so each is transposed once at load time."""
    for target, want_reorders in (("cpu", 0), ("cuda", 6)):
        m = exported_block()
        res = run_pipeline(m, parse_pipeline(f"assign-precision{{target={target}}}"))
        reordered = [r for r in res.ctx.rewrites if "reordered" in r.detail]
        assert len(reordered) == want_reorders, target
        if want_reorders:
            mm = next(
                op for op in m.main.ops if op.name == "core.matmul" and op.attrs["transpose_b"]
            )
            w = mm.operands[1]
            assert w.type.layout == "nk" and w.type.device == "cuda"  # type: ignore[union-attr]


def test_bad_targets_are_input_errors() -> None:
    with pytest.raises(InputError, match="unknown target"):
        run_pipeline(exported_block(), parse_pipeline("assign-precision{target=tpu}"))
    with pytest.raises(InputError, match="computes in f32, bf16"):
        run_pipeline(exported_block(), parse_pipeline("assign-precision{target=cpu,dtype=f16}"))


@dataclass(frozen=True)
class SwapsOperands:
    """Bug: after assigning precision, swaps the operands of every converted subtraction."""

    name: ClassVar[str] = "assign-precision"

    def run(self, module: Any, ctx: PassContext) -> bool:
        PASSES["assign-precision"](target="cuda").run(module, ctx)
        for op in module.main.ops:
            if op.name == "core.sub" and op.results[0].type.device == "cuda":
                op.operands.reverse()
        return True


def test_translation_validation_catches_a_precision_pass_bug() -> None:
    res = run_pipeline(exported_block(), [SwapsOperands()], validator=validate_pass)
    assert (
        res.failed_validation is not None and res.failed_validation["verdict"] == "not-equivalent"
    )
    assert res.failed_validation["pass"] == "assign-precision"
