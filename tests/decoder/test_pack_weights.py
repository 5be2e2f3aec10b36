"""pack-ort-weights: each packed weight's format is an `ort.pack` in the lowered module, and the
serializer writes packs 1:1 (it refuses a reader whose weight has no pack: it decides nothing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llmir_core.ir.core import Module
from llmir_core.passes.base import PassContext
from llmir_core.passes.static_eval import static_value
from llmir_core.targets import lower
from llmir_core.targets.onnxruntime.graph import BuildError
from llmir_core.targets.onnxruntime.serialize_decoder import serialize_decoder

INT4 = {"quant": "int4", "accuracy_level": 1}


def _packs(m: Module) -> list[Any]:
    return [op for op in m.main.ops if op.name == "ort.pack"]


def test_every_nbits_reader_reads_a_pack(tiny_module: Any) -> None:
    low = lower(tiny_module, options=INT4)
    readers = [op for op in low.main.ops if op.name == "ort.matmul_nbits"]
    assert readers and all(op.operands[1].owner.name == "ort.pack" for op in readers)
    assert all(op.attrs["quantize"] == "none" for op in readers)  # the rounding is the pack's
    assert {p.attrs["quantize"] for p in _packs(low)} == {"sym"}


def test_pack_value_is_the_rounded_weight(tiny_module: Any) -> None:
    """A requantizing pack's value (its reference) is its weight rounded to int4 blocks: within
    a step of the weight and not equal to it; a panel16 pack's is its weight."""
    low = lower(tiny_module, options=INT4)
    pack = _packs(low)[0]
    w, p = static_value(low, pack.operands[0]), static_value(low, pack.results[0])
    assert w is not None and p is not None and p.shape == w.shape
    assert not np.array_equal(p, w) and np.abs(p - w).max() <= np.abs(w).max() / 7


def test_serializer_refuses_an_unpacked_reader(tiny_module: Any, tmp_path: Path) -> None:
    """Lowered without pack-ort-weights, a MatMulNBits reader of a float weight has no format
    for the serializer to write: one clear error naming the pass."""
    m = lower(tiny_module, options=INT4)
    for op in list(m.main.ops):  # undo the packs: readers back on their weights
        if op.name == "ort.pack":
            for u in m.main.ops:
                u.operands = [op.operands[0] if v is op.results[0] else v for v in u.operands]
    m.main.ops = [op for op in m.main.ops if op.name != "ort.pack"]
    assert not _packs(m)
    with pytest.raises(BuildError, match="pack-ort-weights"):
        serialize_decoder(m, str(tmp_path / "a"))


def test_pass_is_idempotent(tiny_module: Any) -> None:
    from llmir_core.targets.onnxruntime.pack_weights import PackOrtWeights

    low = lower(tiny_module, options=INT4)
    n = len(_packs(low))
    assert n and not PackOrtWeights().run(low, PassContext())
    assert len(_packs(low)) == n
