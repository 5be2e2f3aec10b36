"""The onnxruntime lowering is a pure function of the module and its options (issue 23): the
`cpu` option alone decides whether llmir's kernels are used (x86-64-v3, the default) or
onnxruntime's portable ops (x86-64); `host` probes this machine, only when asked. No pass reads
/proc/cpuinfo, looks for a compiler or compiles: the same module and options give byte-identical
artifacts on a machine without AVX2, without `cc`, or with LLMIR_NO_CUSTOM_OPS=1. Whether this
machine can run an artifact is checked when it opens: one line, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmir_core.errors import InputError
from llmir_core.targets import build, lower
from llmir_core.targets.onnxruntime import native
from llmir_core.targets.onnxruntime.native import build as native_build
from llmir_core.targets.onnxruntime.native import cpu as native_cpu
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

from .helpers import greedy

WHY = native.unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom ops cannot run: {WHY}")
NO_AVX2 = {"sse2", "fma", "f16c"}  # a CPU with FMA and F16C but no AVX2
REPO = Path(__file__).resolve().parents[2]


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _another_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as a machine without AVX2, without a C compiler or any built library, with
    LLMIR_NO_CUSTOM_OPS=1: and any compile attempt fails the test."""
    monkeypatch.setattr(native_cpu, "cpu_flags", lambda path=native_cpu.CPUINFO: set(NO_AVX2))
    empty = tmp_path / "bare"
    empty.mkdir(parents=True)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv(native.CACHE_ENV, str(empty / "cache"))
    monkeypatch.setattr(native, "SHIPPED_DIR", empty)
    monkeypatch.setenv(native_cpu.DISABLE_ENV, "1")

    def refuse(*args: object, **kw: object) -> str:
        raise AssertionError("the build compiled the library")

    monkeypatch.setattr(native_build, "compile_to", refuse)


def test_the_same_module_and_options_build_the_same_bytes_anywhere(
    tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for opts in ({}, {"quant": "int4", "norm_kernel": "auto"}):
        build(tiny_module, str(tmp_path / "here"), "onnxruntime", options=opts)
        with monkeypatch.context() as m:
            _another_machine(tmp_path / "m", m)
            assert native_cpu.machine_problem() == "this CPU lacks avx2"
            build(tiny_module, str(tmp_path / "there"), "onnxruntime", options=opts)
        here, there = _files(tmp_path / "here"), _files(tmp_path / "there")
        assert here.keys() == there.keys() and here == there
        man = json.loads(here["manifest.json"])
        assert man["custom_ops"] == ["llmir_ops"]  # llmir's kernels, for x86-64-v3
        assert b'cpu = "x86-64-v3"' in here["model.lowered.llmir"]
        for d in ("here", "there", "m"):
            shutil.rmtree(tmp_path / d)


def test_portable_x86_64_has_no_llmir_ops_and_runs_without_avx2(
    tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build(tiny_module, str(tmp_path / "art"), "onnxruntime", options={"cpu": "x86-64"})
    man = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert man["custom_ops"] == [] and native.DOMAIN not in man["opset"]
    text = (tmp_path / "art" / "model.lowered.llmir").read_text()
    assert 'cpu = "x86-64"' in text and 'kernel = "llmir"' not in text
    _another_machine(tmp_path, monkeypatch)
    assert len(greedy(open_decoder(str(tmp_path / "art")), [1, 5, 9], 3)) == 3


def test_cpu_host_probes_this_machine_only_when_asked(
    tiny_module: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cpu_of(module: Any) -> str:
        return str(module.attrs["ort.options"]["cpu"])

    if WHY is None:  # this machine runs llmir's kernels
        assert cpu_of(lower(tiny_module, options={"cpu": "host"})) == "x86-64-v3"
    _another_machine(tmp_path, monkeypatch)
    assert cpu_of(lower(tiny_module, options={})) == "x86-64-v3"  # the default: no probe
    low = lower(tiny_module, options={"cpu": "host"})
    assert cpu_of(low) == "x86-64"
    assert not any(op.attrs.get("kernel") == "llmir" for op in low.main.ops)


def test_an_unknown_cpu_is_a_usage_error(tiny_module: Any) -> None:
    with pytest.raises(InputError, match="cpu must be one of x86-64-v3, x86-64, host, got 'arm64'"):
        lower(tiny_module, options={"cpu": "arm64"})


def test_opening_a_v3_artifact_on_a_cpu_without_avx2_is_one_line_exit_2(
    tiny_module: Any, tmp_path: Path
) -> None:
    art = tmp_path / "art"
    build(tiny_module, str(art), "onnxruntime", options={})
    # the CLI, on a CPU whose /proc/cpuinfo lacks avx2 (faked: the probe is replaced)
    script = (
        "import sys\n"
        "from llmir_core.targets.onnxruntime.native import cpu\n"
        f"cpu.cpu_flags = lambda path=None: {sorted(NO_AVX2)!r}\n"
        f"sys.argv = ['llmir', 'run', {str(art)!r}, '--prompt-ids', '1,5,9',"
        " '--max-new-tokens', '2']\n"
        "from llmir_cli.main import main\n"
        "main()\n"
    )
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 2, r.stderr
    want = (
        "this artifact was built for cpu=x86-64-v3 (llmir kernels: AVX2, FMA, F16C); this CPU "
        "lacks avx2: rebuild with --target-opt cpu=x86-64"
    )
    assert want in r.stderr and "Traceback" not in r.stderr
    assert len([x for x in r.stderr.splitlines() if "error" in x.lower()]) == 1


@needs_kernel
def test_an_artifact_runs_with_no_cc_on_path(tiny_module: Any, tmp_path: Path) -> None:
    art = tmp_path / "art"
    build(tiny_module, str(art), "onnxruntime", options={})
    here = greedy(open_decoder(str(art)), [1, 5, 9], 4)  # the library is built by now
    bare = tmp_path / "bin"
    bare.mkdir()
    script = (
        "import json, shutil\n"
        "assert shutil.which('cc') is None and shutil.which('gcc') is None\n"
        "from llmir_core.targets.onnxruntime.runner import open_decoder\n"
        "from tests.decoder.helpers import greedy\n"
        f"print(json.dumps(greedy(open_decoder({str(art)!r}), [1, 5, 9], 4)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CC"}
    env.update(PATH=str(bare), PYTHONPATH=str(REPO))
    r = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == here
