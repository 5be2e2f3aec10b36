"""The onnxruntime target as a lowering: optimize --target shows ort ops and validates each pass,
its build is byte-identical to building the import, a wrong lowering is caught, and the
capability table names what the target cannot run."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmir_core.ir.printer import print_module
from tests.conftest import run_cli
from tests.decoder.tiny import UNPROVED_LOWERINGS, unproved_passes


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd)


@pytest.fixture(scope="module")
def lowered(tiny_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("lowered")
    (d / "m.llmir").write_text(print_module(tiny_module))
    r = _cli(
        "optimize",
        "m.llmir",
        "--target",
        "onnxruntime",
        "--verify-each",
        "--report",
        "-o",
        "l.llmir",
        cwd=d,
    )
    # two lowerings are checked by measurement only: inconclusive, exit 3, the file written
    unproved = unproved_passes(r.stderr)
    assert r.returncode == 3 and unproved and unproved <= UNPROVED_LOWERINGS, r.stderr
    assert "group-query-attention" in r.stdout and "packed QKV" in r.stdout
    assert "pipeline:              canonicalize," in r.stdout  # the report names what ran
    from llmir_core.targets import pipeline

    # every other pass proved: the -O2 preset and the lowering (what `llmir build` runs)
    timings = r.stdout.split("== pass timings ==")[1]
    assert timings.count(" equivalent (") == len(pipeline()) - len(unproved) > 4
    return d


def test_lowered_file_shows_target_ops(lowered: Path) -> None:
    text = (lowered / "l.llmir").read_text()
    for op in (
        "ort.group_query_attention",
        "ort.skip_simplified_layer_norm",
        # f32 matmuls: llmir's in-place kernel for cpu=x86-64-v3 (the default; the gated MLP
        # one matmul with the SwiGLU epilogue), whatever this machine has
        "ort.matmul_f32",
        'epilogue = "swiglu"',
    ):
        assert op in text
    assert "llm.scaled_dot_product_attention" not in text and 'target = "onnxruntime"' in text


def test_build_of_lowered_is_byte_identical(lowered: Path) -> None:
    assert _cli("build", "m.llmir", "-o", "A", cwd=lowered).returncode == 0
    assert _cli("build", "l.llmir", "-o", "B", cwd=lowered).returncode == 0
    names = sorted(p.name for p in (lowered / "A").iterdir())
    assert names == sorted(p.name for p in (lowered / "B").iterdir())
    for n in names:
        assert (lowered / "A" / n).read_bytes() == (lowered / "B" / n).read_bytes(), n


@pytest.mark.parametrize(
    "edit",
    [
        ("kv_num_heads = 2", "kv_num_heads = 1"),
        ("epsilon = 1e-05", "epsilon = 0.001"),
        ("do_rotary = true", "do_rotary = false"),
        # the fixture's attention uses the default scale (0: 1/sqrt(head_dim)); set it to 0.5
        ("{do_rotary = true, ", "{do_rotary = true, scale = 0.5, "),
    ],
)
def test_edited_lowered_op_is_caught(lowered: Path, edit: tuple[str, str]) -> None:
    """Edit one attribute of the first lowered op that has it: not equivalent, exit 1, the op
    named with its location in the edited file."""
    text = (lowered / "l.llmir").read_text()
    assert edit[0] in text
    bad = text.replace(edit[0], edit[1], 1)
    (lowered / "bad.llmir").write_text(bad)
    r = _cli("verify", "bad.llmir", "--against", "m.llmir", cwd=lowered)
    assert r.returncode == 1, r.stdout + r.stderr
    line = bad[: bad.index(edit[1])].count("\n") + 1
    out = r.stdout + r.stderr  # not equivalent (stdout), or ill-typed (a diagnostic on stderr)
    assert re.search(
        rf"optimized: ort\.\w+ at bad\.llmir:{line}:\d+|bad\.llmir:{line}:\d+: error: ort\.\w+", out
    ), out


def test_swapped_weight_offset_is_caught(lowered: Path) -> None:
    """Two weights of one shape with their file offsets swapped (layer 0's and layer 1's
    gate_proj): the lowered module reads the wrong bytes; verify --against names the weight."""
    text = (lowered / "l.llmir").read_text()
    found = [
        re.search(
            rf'name = "model\.layers\.{i}\.mlp\.gate_proj\.weight", nbytes = \d+, offset = (\d+)',
            text,
        )
        for i in (0, 1)
    ]
    assert found[0] and found[1]
    a, b = found[0], found[1]
    bad = (
        text[: a.start(1)]
        + b.group(1)
        + text[a.end(1) : b.start(1)]
        + a.group(1)
        + text[b.end(1) :]
    )
    (lowered / "bad_offset.llmir").write_text(bad)
    r = _cli("verify", "bad_offset.llmir", "--against", "m.llmir", cwd=lowered)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not equivalent" in r.stdout
    line = text[: a.start(1)].count("\n") + 1
    assert re.search(rf"optimized: core\.weight at bad_offset\.llmir:{line}:\d+", r.stdout), (
        r.stdout
    )


def test_verify_target_lists_unsupported_ops(tmp_path: Path) -> None:
    (tmp_path / "d.llmir").write_text(
        'module @m attributes {llmir.dialects = ["core", "llm"], llmir.version = "0.1"} {\n'
        '  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32, device="cuda"> {\n'
        '    %y = llm.to_device %x {device = "cuda"} : (tensor<4xf32>) -> tensor<4xf32, device="cuda">\n'
        '    return %y : tensor<4xf32, device="cuda">\n  }\n}\n'
    )
    r = _cli("verify", "d.llmir", "--target", "onnxruntime", cwd=tmp_path)
    assert r.returncode == 1
    assert (
        "d.llmir:3:" in r.stderr and "llm.to_device places its result on device 'cuda'" in r.stderr
    )
    assert _cli("verify", "d.llmir", "--target", "nope", cwd=tmp_path).returncode == 2


def test_unknown_target_is_an_input_error(tmp_path: Path, lowered: Path) -> None:
    r = _cli("optimize", "m.llmir", "--target", "nope", "-o", "x.llmir", cwd=lowered)
    assert r.returncode == 2 and "unknown target 'nope'" in r.stderr


def _lower_validated(module: Any) -> tuple[Any, Any]:
    """optimize -O2 --target onnxruntime --verify-each, in process: every pass must validate.
    Returns (the -O2 module, the lowered module)."""
    from llmir_core.passes.base import clone_module
    from llmir_core.passes.manager import run_pipeline
    from llmir_core.passes.pipeline import preset
    from llmir_core.smt.tv import validate_pass
    from llmir_core.targets import get_target

    opt = run_pipeline(clone_module(module), preset(2), validator=validate_pass)
    assert opt.failed_validation is None, opt.failed_validation
    res = run_pipeline(
        clone_module(opt.module), get_target("onnxruntime").lowering({}), validator=validate_pass
    )
    assert res.failed_validation is None, res.failed_validation
    return opt.module, res.module


@pytest.mark.parametrize(
    "arch", ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "gemma2"]
)
def test_architectures_lower_with_validation(arch: str, tmp_path: Path) -> None:
    """Each architecture lowers to one GroupQueryAttention per layer after -O2, every pass
    validated, and the lowered file builds the artifact `llmir build` of the -O2 module builds."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.ir.parser import parse_module
    from llmir_core.targets import build

    from .tiny import ARCH_SHAPES, make_llama_folder

    if arch not in ARCH_SHAPES:
        pytest.skip(f"no tiny {arch} shape in tests/decoder/tiny.py")
    module = import_hf(
        make_llama_folder(tmp_path / arch, ARCH_SHAPES[arch], tokenizer=False),
        str(tmp_path / "m.llmir"),
        require_tokenizer=False,
    )
    opt, lowered = _lower_validated(module)
    assert (
        sum(op.name == "ort.group_query_attention" for op in lowered.main.ops)
        == ARCH_SHAPES[arch].layers
    )
    (tmp_path / "m.llmir").write_text(print_module(opt))  # what -O2 gives, saved, then lowered
    from llmir_core.targets import lower

    lowered = lower(parse_module((tmp_path / "m.llmir").read_text(), str(tmp_path / "m.llmir")))
    (tmp_path / "l.llmir").write_text(print_module(lowered))
    build(
        parse_module((tmp_path / "m.llmir").read_text(), str(tmp_path / "m.llmir")),
        str(tmp_path / "A"),
        source_path=str(tmp_path / "m.llmir"),
    )
    build(
        parse_module((tmp_path / "l.llmir").read_text(), str(tmp_path / "l.llmir")),
        str(tmp_path / "B"),
    )
    for f in sorted(p.name for p in (tmp_path / "A").iterdir()):
        assert (tmp_path / "A" / f).read_bytes() == (tmp_path / "B" / f).read_bytes(), f


@pytest.mark.parametrize("scheme", ["q4_0", "q8_0"])
def test_gguf_weights_lower_to_lossless_matmul_nbits(scheme: str, tmp_path: Path) -> None:
    from llmir_core.frontends.hf import import_hf

    from .helpers import quantize_weights
    from .tiny import LlamaShape, make_llama_folder

    module = import_hf(
        make_llama_folder(tmp_path / "m", LlamaShape(), tokenizer=False), require_tokenizer=False
    )
    quantize_weights(module, tmp_path / "blob.bin", lambda name: scheme if "proj" in name else None)
    _, lowered = _lower_validated(module)
    nb = [op for op in lowered.main.ops if op.name == "ort.matmul_nbits"]
    assert nb and all(op.attrs["quantize"] == "none" for op in nb)
    assert any(
        op.name == "ort.group_query_attention" and op.attrs.get("packed") for op in lowered.main.ops
    )


@pytest.mark.parametrize(
    "arch", ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "gemma2"]
)
def test_transformers_models_lower_with_validation(arch: str, tmp_path: Path) -> None:
    """The same on models transformers itself made (tests/llm/tiny.py): every pass validates and
    every layer gets fused attention."""
    pytest.importorskip("torch", reason="tests/llm/tiny.py makes its models with torch")
    pytest.importorskip(
        "transformers", reason="tests/llm/tiny.py makes its models with transformers"
    )
    from llmir_core.frontends.hf import import_hf
    from tests.llm.tiny import ARCHS, make_model

    if arch not in ARCHS:
        pytest.skip(f"tests/llm/tiny.py has no {arch}")
    make_model(arch, tmp_path / arch)
    module = import_hf(tmp_path / arch, require_tokenizer=False)
    _, lowered = _lower_validated(module)
    layers = int(module.attrs["llm.num_layers"])
    assert sum(op.name == "ort.group_query_attention" for op in lowered.main.ops) == layers


def test_kv_cache_int8_interface_runs(lowered: Path) -> None:
    """kv-cache-int8{interface=true} output lowers and builds a decoder artifact with an int8 KV
    cache (codes + per-position scales) that `run` and `bench` use; greedy tokens match f32's here."""
    r = _cli(
        "optimize",
        "m.llmir",
        "--passes",
        "kv-cache-int8{interface=true}",
        "--target",
        "onnxruntime",
        "-o",
        "ki.llmir",
        cwd=lowered,
    )
    assert r.returncode == 0, r.stderr
    assert _cli("build", "ki.llmir", "-o", "KI", cwd=lowered).returncode == 0
    import json

    d = json.loads((lowered / "KI" / "manifest.json").read_text())["decoder"]
    assert d["kv_dtype"] == "i8" and d["kv_bytes_per_token"] == 160 and d["layers"] == 2
    if not (lowered / "A").is_dir():
        assert _cli("build", "m.llmir", "-o", "A", cwd=lowered).returncode == 0
    a = _cli("run", "A", "--prompt", "hi", "--max-new-tokens", "6", cwd=lowered)
    b = _cli("run", "KI", "--prompt", "hi", "--max-new-tokens", "6", cwd=lowered)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout
    r = _cli(
        "bench",
        "KI",
        "--prompt-len",
        "8",
        "--gen-len",
        "4",
        "--runs",
        "1",
        "--format",
        "json",
        cwd=lowered,
    )
    assert r.returncode == 0, r.stderr


def test_assign_precision_builds_or_is_refused(lowered: Path) -> None:
    """assign-precision for the CPU (bf16 compute, host placement) builds and runs; for CUDA it is
    refused at optimize time with the capability table's reason and its location."""
    r = _cli(
        "optimize",
        "m.llmir",
        "--passes",
        "assign-precision{target=cpu},canonicalize",
        "--target",
        "onnxruntime",
        "-o",
        "ap.llmir",
        cwd=lowered,
    )
    assert r.returncode == 0, r.stderr
    assert _cli("build", "ap.llmir", "-o", "AP", cwd=lowered).returncode == 0
    assert _cli("run", "AP", "--prompt", "hi", "--max-new-tokens", "2", cwd=lowered).returncode == 0
    r = _cli(
        "optimize",
        "m.llmir",
        "--passes",
        "assign-precision{target=cuda}",
        "--target",
        "onnxruntime",
        "-o",
        "apc.llmir",
        cwd=lowered,
    )
    assert r.returncode == 1 and "on device 'cuda' (target devices: cpu)" in r.stderr
    assert not (lowered / "apc.llmir").exists()


def test_build_logits_option(lowered: Path) -> None:
    """`llmir build --logits all` keeps every position's logits; a bad value is a usage error."""
    assert _cli("build", "m.llmir", "-o", "ALL", "--logits", "all", cwd=lowered).returncode == 0
    man = json.loads((lowered / "ALL" / "manifest.json").read_text())
    assert man["decoder"]["logits"] == "all" and man["outputs"][0]["shape"][1] != 1
    r = _cli("build", "m.llmir", "-o", "X", "--logits", "some", cwd=lowered)
    assert r.returncode == 2 and "--logits must be 'last' or 'all'" in r.stderr
    assert not (lowered / "X").exists()
