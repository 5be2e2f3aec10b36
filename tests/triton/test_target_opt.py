"""`llmir build --target triton --target-opt arch=... max_len=... kv_cache=...` from the command
line (issue 23): the options reach the AOT compiler, the lowering and the manifest. The AOT
compile itself is test_aot's (slow); here it is recorded, not run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.conftest import import_or_skip

import_or_skip("torch", "the triton target needs torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton target needs triton (pip install 'llmir[gpu]')")

from llmir_cli.app import app  # noqa: E402
from llmir_core.ir.printer import print_module  # noqa: E402
from llmir_core.targets.triton import aot  # noqa: E402

from ..decoder.tiny import TINY, make_llama_folder  # noqa: E402


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The architectures each build asks the AOT compiler for (nothing is compiled)."""
    calls: list[list[int]] = []

    def record(dtype: str, archs: list[int], out_dir: str, *a: Any, **k: Any) -> list[Any]:
        calls.append(list(archs))
        return []

    monkeypatch.setattr(aot, "compile_in_subprocess", record)
    return calls


def test_arch_max_len_kv_cache_from_the_cli(tmp_path: Path, compiled: list[list[int]]) -> None:
    from llmir_core.frontends.hf import import_hf

    module = import_hf(make_llama_folder(tmp_path / "hf", TINY), str(tmp_path / "m.llmir"))
    (tmp_path / "m.llmir").write_text(print_module(module))
    opts = ["arch=sm_80", "max_len=24", "kv_cache=int8"]
    argv = ["build", str(tmp_path / "m.llmir"), "--target", "triton", "-o", str(tmp_path / "t")]
    r = CliRunner().invoke(app, [*argv, *[x for o in opts for x in ("--target-opt", o)]])
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert compiled == [[80]] and m["archs"] == ["sm_80"]
    assert m["decoder"]["max_len"] == 24 and m["decoder"]["kv_cache"] == "int8"
    assert m["target_options"] == {"arch": "sm_80", "kv_cache": "int8", "max_len": 24, "split_k": 0}
    r = CliRunner().invoke(
        app,
        [
            "build",
            str(tmp_path / "m.llmir"),
            "--target",
            "triton",
            "--target-opt",
            "arch=none",
            "-o",
            str(tmp_path / "n"),
        ],
    )
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "n" / "manifest.json").read_text())
    assert compiled == [[80]] and m["archs"] == [] and m["target_options"]["arch"] == "none"
