"""`llmir run`'s sampling options beyond temperature / top-k / top-p: a bad value is one line
with a hint and exit code 2, before any artifact is opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "args, message",
    [
        (["--min-p", "1.5"], "--min-p must be in [0, 1], got 1.5"),
        (["--presence-penalty", "3"], "--presence-penalty must be in [-2, 2], got 3.0"),
        (["--frequency-penalty", "-2.5"], "--frequency-penalty must be in [-2, 2], got -2.5"),
    ],
)
def test_bad_value_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "llmir_cli.app", "run", str(tmp_path), "--prompt", "hi", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert message in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert any(line.startswith("hint:") for line in lines), r.stderr
