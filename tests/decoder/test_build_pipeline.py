"""`llmir build` = `llmir optimize -O2 --target onnxruntime` + serialize, on fresh imports of every
supported architecture and of Q4_0/Q8_0 GGUF files (issue 9's acceptance, as a user runs it):

- `optimize -O2 --target onnxruntime --verify-each` validates every pass, and the lowered file
  shows the target's ops;
- `build` of the lowered file is byte-identical to `build` of the import, whose manifest names
  the passes that ran;
- greedy generation is what the build before -O2 ran first gives (`build -O0`: lowering only);
- the build flags mean the same on `optimize --target`, and misuses are one-line usage errors.

Models: the numpy-made folders of tests/decoder/tiny.py (no torch), GGUF files written from the
llama one by tests/llm/gguf_convert.py. The CLI runs in process (typer's CliRunner).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.ir.printer import print_module

from .helpers import greedy
from .tiny import ARCH_SHAPES, make_llama_folder

ARCHS = ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "gemma2"]
PROMPT = [int(t) for t in np.random.default_rng(3).integers(3, 128, 9)]


def _cli(*args: Any) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def _import(case: str, root: Path) -> tuple[Path, int]:
    """Import `case` (an architecture, or gguf-Q4_0 / gguf-Q8_0) into root/m.llmir; its layers."""
    from llmir_core.frontends.hf import import_hf

    if case.startswith("gguf-"):
        pytest.importorskip("gguf", reason="the gguf package writes the test file")
        from safetensors.numpy import load_file

        from llmir_core.frontends.gguf import import_gguf
        from tests.llm.gguf_convert import write_gguf

        folder = make_llama_folder(root / "hf", ARCH_SHAPES["llama"], tokenizer=False)
        gguf = root / "m.gguf"
        state = load_file(str(folder / "model.safetensors"))
        write_gguf(folder, state, gguf, case.removeprefix("gguf-"), tokenizer=False)
        module = import_gguf(gguf, str(root / "m.llmir"), require_tokenizer=False)
    else:
        folder = make_llama_folder(root / "hf", ARCH_SHAPES[case], tokenizer=False)
        module = import_hf(folder, str(root / "m.llmir"), require_tokenizer=False)
    (root / "m.llmir").write_text(print_module(module))
    return root / "m.llmir", int(module.attrs["llm.num_layers"])


def _same_files(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


@pytest.fixture
def chdir_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no ./llmir.toml: the defaults (-O2, onnxruntime)
    return tmp_path


@pytest.mark.parametrize("case", [*ARCHS, "gguf-Q4_0", "gguf-Q8_0"])
def test_build_is_optimize_o2_target_then_serialize(case: str, chdir_tmp: Path) -> None:
    from llmir_core.targets import open_artifact

    m, layers = _import(case, chdir_tmp)
    r = _cli(
        "optimize",
        m,
        "-O2",
        "--target",
        "onnxruntime",
        "--verify-each",
        "-f",
        "json",
        "-o",
        "l.llmir",
    )
    passes = json.loads(r.stdout)["passes"]
    unproved = [p for p in passes if p["validation"]["verdict"] != "equivalent"]
    assert r.exit_code == (3 if unproved else 0), r.output
    from llmir_core.targets import get_target

    lowering = [p.name for p in get_target("onnxruntime").lowering({})]
    assert "lower-ort-attention" in lowering and lowering[-1] == "lower-ort-module"
    assert [p["pass"] for p in passes][-len(lowering) :] == lowering  # -O2, then the target's
    # every -O2 step proved; a lowering SMT cannot match (the tiny llama's weight-dtype and
    # logits ones, biased QKV merges, requantized GGUF blocks) is checked by measurement only:
    # inconclusive with the outputs agreeing, never `equivalent`, never `not equivalent`
    for p in unproved:
        assert p["pass"] in lowering and p["validation"]["verdict"] == "inconclusive", p
        assert p["validation"]["agree"], p
    text = (chdir_tmp / "l.llmir").read_text()
    assert text.count("= ort.group_query_attention ") == layers
    assert 'target = "onnxruntime"' in text and "llm.scaled_dot_product_attention" not in text
    if case.startswith("gguf-"):  # the GGUF blocks go to MatMulNBits as they are
        assert "ort.matmul_nbits" in text and 'quantize = "none"' in text

    for args in (("m.llmir", "-o", "A"), ("l.llmir", "-o", "B"), ("m.llmir", "-O0", "-o", "C")):
        r = _cli("build", *args)
        assert r.exit_code == 0, r.output
    _same_files(chdir_tmp / "A", chdir_tmp / "B")
    manifest = json.loads((chdir_tmp / "A" / "manifest.json").read_text())
    assert manifest["pipeline"] == [p["spec"] for p in passes]
    assert manifest["lowered"] == "model.lowered.llmir"
    assert (
        json.loads((chdir_tmp / "C" / "manifest.json").read_text())["pipeline"][0] == (lowering[0])
    )
    # -O2 first changes no token: the artifact generates what the lowering-only build generates
    a, c = open_artifact(str(chdir_tmp / "A")), open_artifact(str(chdir_tmp / "C"))
    assert greedy(a, PROMPT, 12) == greedy(c, PROMPT, 12)


def test_build_flags_mean_the_same_on_optimize(chdir_tmp: Path) -> None:
    """--quant/--quant-block/--max-len/--accuracy-level given to `optimize --target` give the
    artifact `build` gives with them; a lowered module takes no more of them."""
    _import("llama", chdir_tmp)
    flags = ["--quant", "int4", "--quant-block", "16", "--max-len", "64", "--accuracy-level", "1"]
    r = _cli("optimize", "m.llmir", "--target", "onnxruntime", *flags, "-o", "q.llmir")
    assert r.exit_code == 0, r.output
    assert _cli("build", "q.llmir", "-o", "B").exit_code == 0
    r = _cli("build", "m.llmir", *flags, "-o", "A", "-f", "json")
    assert r.exit_code == 0, r.output
    _same_files(chdir_tmp / "A", chdir_tmp / "B")
    d = json.loads(r.stdout)["decoder"]
    assert d["quant"]["f32_weights"] == "int4" and d["quant"]["block"] == 16
    assert d["max_len"] == 64 and d["accuracy_level"] == 1
    assert any(s.startswith("lower-ort-module{") for s in json.loads(r.stdout)["pipeline"])

    for args, message in [
        (("build", "q.llmir", "--quant", "int8", "-o", "X"), "already lowered"),
        (("build", "q.llmir", "-O1", "-o", "X"), "(-O) were fixed when it was lowered"),
        (("optimize", "m.llmir", "--quant", "int4"), "--quant: lowering options need --target"),
        (("optimize", "m.llmir", "--generic", "--max-len", "8"), "--max-len, --generic: lowering"),
        (
            ("optimize", "m.llmir", "--target", "onnxruntime", "--generic", "--quant", "int4"),
            "apply to decoder builds only",
        ),
    ]:
        r = _cli(*args)
        assert r.exit_code == 2 and message in r.output, (args, r.output)
        assert "Traceback" not in r.output
    assert not (chdir_tmp / "X").exists()


def test_generic_decoder_build_goes_through_o2(chdir_tmp: Path) -> None:
    """--generic (the op-by-op lowering) takes the -O2 module too, on both paths."""
    _import("qwen2", chdir_tmp)
    r = _cli("optimize", "m.llmir", "--target", "onnxruntime", "--generic", "-o", "g.llmir")
    assert r.exit_code == 0, r.output
    assert _cli("build", "g.llmir", "-o", "B").exit_code == 0
    assert _cli("build", "m.llmir", "--generic", "-o", "A").exit_code == 0
    _same_files(chdir_tmp / "A", chdir_tmp / "B")
    manifest = json.loads((chdir_tmp / "A" / "manifest.json").read_text())
    assert "decoder" not in manifest and manifest["lowered"] == "model.lowered.llmir"
    assert "merge-qkv" in manifest["pipeline"]


def test_project_opt_level_is_the_default(chdir_tmp: Path) -> None:
    """[build] opt_level of ./llmir.toml is the -O both commands default to."""
    _import("llama", chdir_tmp)
    (chdir_tmp / "llmir.toml").write_text(
        '[model]\nref = "tiny:latest"\n\n[build]\ntarget = "onnxruntime"\nopt_level = 0\n'
    )
    assert _cli("build", "m.llmir", "-o", "A").exit_code == 0
    pipeline = json.loads((chdir_tmp / "A" / "manifest.json").read_text())["pipeline"]
    from llmir_core.targets import get_target

    lowering = [p.name for p in get_target("onnxruntime").lowering({})]
    assert pipeline == lowering  # no -O passes: the target's lowering only
    r = _cli("optimize", "m.llmir", "--target", "onnxruntime", "-o", "l.llmir")
    assert r.exit_code == 0, r.output
    assert re.search(rf"llmir\.pipeline = \[\"{lowering[0]}\"", (chdir_tmp / "l.llmir").read_text())


def test_a_target_may_declare_its_preset() -> None:
    """Both targets build after -O2 (lower-triton takes -O2's merged q/k/v projection + split);
    a target may declare another preset (`opt_level`). An explicit -O wins."""
    from llmir_core.passes import PRESETS
    from llmir_core.targets import pipeline

    names = [p.name for p in pipeline("onnxruntime")]
    assert names[: len(PRESETS["O2"])] == PRESETS["O2"] and names[-1] == "lower-ort-module"
    assert [p.name for p in pipeline("onnxruntime", opt_level=0)][0].startswith("lower-ort-")
    names = [p.name for p in pipeline("triton")]
    assert names[: len(PRESETS["O2"])] == PRESETS["O2"] and names[-1] == "lower-triton"
    assert [p.name for p in pipeline("triton", opt_level=0)] == [
        "fuse-add-rms-norm",
        "fuse-linear",
        "lower-triton",
    ]


def test_a_lowered_module_records_every_pipeline_over_it(chdir_tmp: Path) -> None:
    """A pipeline over an already lowered module appends its passes to `llmir.pipeline`."""
    _import("llama", chdir_tmp)
    assert (
        _cli("optimize", "m.llmir", "-O0", "--target", "onnxruntime", "-o", "l.llmir").exit_code
        == 0
    )
    assert _cli("optimize", "l.llmir", "--passes", "cse,dce", "-o", "l2.llmir").exit_code == 0
    assert _cli("build", "l2.llmir", "-o", "A").exit_code == 0
    from llmir_core.targets import get_target

    lowering = [p.name for p in get_target("onnxruntime").lowering({})]
    pipeline = json.loads((chdir_tmp / "A" / "manifest.json").read_text())["pipeline"]
    assert pipeline == [*lowering, "cse", "dce"]
