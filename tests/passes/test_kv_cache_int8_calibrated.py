"""kv-cache-int8{scales=calibrated}: options, their errors, per-tensor scales, and the reference
interpreter running the calibrated and lowered modules alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmir_core.errors import InputError
from llmir_core.interp import Interpreter
from llmir_core.ir.parser import parse_file
from llmir_core.passes.manager import run_pipeline
from llmir_core.passes.pipeline import parse_pipeline
from tests.conftest import run_cli

SMALL = Path(__file__).parent.parent / "filecheck" / "passes" / "kv-cache-int8.calibrated.llmir"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("kv-cache-int8{scales=static}", "kv-cache-int8{scales}: expected one of per-position"),
        (
            "kv-cache-int8{scales=calibrated,granularity=row}",
            "kv-cache-int8{granularity}: expected one of channel, tensor, got 'row'",
        ),
        (
            "kv-cache-int8{calibration=p.txt}",
            "calibration, granularity and margin apply to scales=calibrated only",
        ),
        (
            "kv-cache-int8{scales=calibrated,interface=true}",
            "scales=calibrated always makes the cache int8 in the signature",
        ),
        ("kv-cache-int8{scales=calibrated,margin=0}", "kv-cache-int8{margin}: expected a number"),
    ],
)
def test_bad_options_are_one_line_errors(spec: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=message.replace("{", r"\{").replace("}", r"\}")):
        parse_pipeline(spec)
    r = run_cli("optimize", str(SMALL), "--passes", spec, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_missing_or_empty_calibration_file(tmp_path: Path) -> None:
    r = run_cli(
        "optimize",
        str(SMALL),
        "--passes",
        "kv-cache-int8{scales=calibrated,calibration=nope.txt}",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "nope.txt: calibration file not found" in r.stderr
    (tmp_path / "empty.txt").write_text("\n  \n")
    r = run_cli(
        "optimize",
        str(SMALL),
        "--passes",
        "kv-cache-int8{scales=calibrated,calibration=empty.txt}",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "empty.txt: the calibration file holds no prompt" in r.stderr


def test_prompts_need_a_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("hello there\n")
    r = run_cli(
        "optimize",
        str(SMALL),
        "--passes",
        "kv-cache-int8{scales=calibrated,calibration=p.txt}",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "names no tokenizer, so the prompts of p.txt" in r.stderr


def test_per_tensor_scale_and_the_interpreter_runs_it() -> None:
    m = parse_file(str(SMALL))
    run_pipeline(m, parse_pipeline("kv-cache-int8{scales=calibrated,granularity=tensor}"))
    info = m.attrs["llm.kv_cache_int8"]
    assert info["granularity"] == "tensor" and info["scales"] == "calibrated"
    scale = next(op for op in m.main.ops if op.results[0].name == "kv_scale.0.key")
    np.testing.assert_allclose(scale.attrs["value"].array, [2.0 / 127], rtol=1e-6)
    ids = np.asarray([[0, 1, 1]], np.int64)
    logits, present = Interpreter(m).run(
        {
            "input_ids": ids,
            "positions": np.arange(3, dtype=np.int64)[None],
            "past_key_values.0.key": np.zeros((1, 1, 0, 2), np.int8),
        }
    )
    assert present.dtype == np.int8
    # rows (1.0, -0.5), (0.25, 2.0), (0.25, 2.0) against s = 2/127: codes round(x * 63.5)
    np.testing.assert_array_equal(present[0, 0], [[64, -32], [16, 127], [16, 127]])


def test_not_a_decoder_is_rejected_with_a_reason() -> None:
    m = parse_file(
        str(Path(__file__).parent.parent / "filecheck" / "passes" / "kv-cache-int8.llmir")
    )
    res = run_pipeline(m, parse_pipeline("kv-cache-int8{scales=calibrated}"))
    assert not res.runs[0].changed
    assert any("calibration needs a decoder" in r.reason for r in res.ctx.rejections)
