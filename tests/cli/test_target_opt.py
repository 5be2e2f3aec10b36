"""`--target-opt KEY=VALUE` and `--list-options` on `llmir build` / `llmir optimize --target`:
the declarations listed without an input file, every misuse one line and exit 2, the old
onnxruntime flags giving the very artifact their --target-opt spelling gives, the manifest
recording every declared option, and triton's arch / max_len / kv_cache reachable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.artifact_check import read_manifest
from llmir_core.ir.printer import print_module
from llmir_core.targets import get_target

from ..decoder.tiny import TINY, make_llama_folder


def _cli(*args: Any, cwd: Path | None = None) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama imported to m.llmir (a decoder module)."""
    from llmir_core.frontends.hf import import_hf

    root = tmp_path_factory.mktemp("opt")
    folder = make_llama_folder(root / "hf", TINY, tokenizer=False)
    module = import_hf(folder, str(root / "m.llmir"), require_tokenizer=False)
    (root / "m.llmir").write_text(print_module(module))
    return root / "m.llmir"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("command", ["build", "optimize"])
@pytest.mark.parametrize("target", ["onnxruntime", "triton"])
def test_list_options_needs_no_input(command: str, target: str) -> None:
    r = _cli(command, "--target", target, "--list-options")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["option", "kind", "default", "choices"]
    names = [o.name for o in get_target(target).options]
    assert [ln.split()[0] for ln in lines[1:]] == names
    r = _cli(command, "--target", target, "--list-options", "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["kind"] == "target_options" and data["target"] == target
    assert [o["name"] for o in data["options"]] == names


@pytest.mark.parametrize("command", ["build", "optimize"])
def test_triton_lists_arch_max_len_kv_cache(command: str) -> None:
    r = _cli(command, "--target", "triton", "--list-options", "-f", "json")
    assert r.exit_code == 0, r.output
    rows = {o["name"]: o for o in json.loads(r.stdout)["options"]}
    assert {"arch", "max_len", "kv_cache"} <= set(rows)
    assert rows["kv_cache"]["choices"] == ["native", "int8"] and rows["max_len"]["kind"] == "int"


def test_optimize_list_options_needs_a_target() -> None:
    r = _cli("optimize", "--list-options")
    assert r.exit_code == 2 and "--list-options needs --target" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize(
    "args,message",
    [
        (("--target", "nope", "--list-options"), "unknown target 'nope'"),
        (("--target-opt", "foo=1"), "--target-opt: unknown option 'foo' for target onnxruntime"),
        (("--target-opt", "quant=int3"), "--target-opt quant must be one of none, int4, int8"),
        (("--target-opt", "max_len=many"), "--target-opt max_len must be an integer, got 'many'"),
        (("--target-opt", "swiglu=perhaps"), "--target-opt swiglu must be true or false"),
        (("--target-opt", "cpu=arm64"), "--target-opt cpu must be one of x86-64-v3, x86-64, host"),
        (("--target-opt", "max_len"), "--target-opt takes KEY=VALUE, got 'max_len'"),
        (("--max-len", "8", "--target-opt", "max_len=9"), "--max-len and --target-opt max_len"),
        (
            ("--target", "triton", "--quant", "int4"),
            "--quant: unknown option 'quant' for target triton",
        ),
        (
            ("--target", "triton", "--target-opt", "kv_cache=fp8"),
            "kv_cache must be one of native, int8",
        ),
        (
            ("--target", "triton", "--target-opt", "arch=sm80"),
            "--target-opt arch must be CUDA architectures",
        ),
    ],
)
def test_bad_option_is_one_line_and_exit_2(
    args: tuple[str, ...], message: str, decoder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "x"
    r = _cli("build", decoder, "-o", out, *args)
    assert r.exit_code == 2, r.output
    assert message in r.stderr and len(r.stderr.splitlines()) <= 2, r.stderr  # error + hint
    assert "Traceback" not in r.output and not out.exists()


def test_build_needs_input_and_output(decoder: Path) -> None:
    r = _cli("build", "-o", "x")
    assert r.exit_code == 2 and "missing input file" in r.stderr
    r = _cli("build", decoder)
    assert r.exit_code == 2 and "missing --output" in r.stderr


def test_optimize_takes_target_opt_only_with_target(decoder: Path) -> None:
    r = _cli("optimize", decoder, "--target-opt", "quant=int4")
    assert r.exit_code == 2 and "--target-opt: lowering options need --target" in r.stderr


def test_aliases_give_the_target_opt_artifact(decoder: Path, tmp_path: Path) -> None:
    """--quant/--max-len/--logits/--f32-matmul are spellings of the options: the same bytes."""
    a, b = tmp_path / "a", tmp_path / "b"
    alias = ["--quant", "int4", "--quant-block", "16", "--max-len", "48", "--logits", "all"]
    r = _cli("build", decoder, "-o", a, *alias, "--accuracy-level", "1")
    assert r.exit_code == 0, r.output
    opts = ["quant=int4", "quant-block=16", "max_len=48", "last_logits=false", "accuracy_level=1"]
    r = _cli("build", decoder, "-o", b, *[x for o in opts for x in ("--target-opt", o)])
    assert r.exit_code == 0, r.output
    assert _files(a) == _files(b)
    recorded = read_manifest(str(a))["target_options"]
    declared = get_target("onnxruntime").options
    assert list(recorded) == sorted(o.name for o in declared)  # every declared option
    assert recorded["quant"] == "int4" and recorded["max_len"] == 48
    assert recorded["last_logits"] is False and recorded["quant_block"] == 16
    assert recorded["cpu"] == "x86-64-v3" and recorded["prepack"] == "session"  # defaults


def test_optimize_then_build_records_the_same_options(decoder: Path, tmp_path: Path) -> None:
    low = decoder.with_name("lowered.llmir")  # beside its weights, as build reads them
    flags = ["--target-opt", "max_len=40", "--target-opt", "f32_matmul=ort"]
    r = _cli("optimize", decoder, "--target", "onnxruntime", *flags, "-o", low)
    assert r.exit_code == 0, r.output
    assert "llmir.target_options = {" in low.read_text()
    assert _cli("build", low, "-o", tmp_path / "a").exit_code == 0
    assert _cli("build", decoder, *flags, "-o", tmp_path / "b").exit_code == 0
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert read_manifest(str(tmp_path / "b"))["target_options"]["f32_matmul"] == "ort"
