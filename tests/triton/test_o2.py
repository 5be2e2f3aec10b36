"""The triton target builds after the default -O2 preset: lower-triton takes -O2's merged q/k/v
projection (one triton.matmul + core.split views), fused add+norm and gated MLP. The -O2 build
decodes the tiny decoder greedily to the same tokens as the -O0 build and as the reference
interpreter, logits within tolerance; `optimize -O2 --target triton` + build equals build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import import_or_skip

import_or_skip("torch", "the triton target needs torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton target needs triton (pip install 'llmir[gpu]')")

from llmir_core.interp import run  # noqa: E402
from llmir_core.targets import build, lower, lower_text  # noqa: E402
from llmir_core.targets.triton import aot  # noqa: E402
from llmir_core.targets.triton.target import CAPABILITIES, TARGET  # noqa: E402
from llmir_core.verifier import verify  # noqa: E402

from ..decoder.tiny import TINY, make_llama_folder  # noqa: E402

PROMPT = [1, 40, 17, 99, 5]
NEW = 3


@pytest.fixture(scope="module")
def tiny_module(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from llmir_core.frontends.hf import import_hf

    return import_hf(make_llama_folder(tmp_path_factory.mktemp("tiny") / "llama", TINY))


@pytest.fixture
def no_aot(monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds without ahead-of-time kernels (slow to compile; test_aot covers them)."""
    monkeypatch.setattr(aot, "parse_archs", lambda text: [])


def _reference_greedy(module: Any) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and last-position logits of the reference interpreter (full recompute)."""
    ids, toks, steps = list(PROMPT), [], []
    for _ in range(NEW + 1):
        feeds: dict[str, Any] = {
            "input_ids": np.asarray([ids]),
            "positions": np.arange(len(ids))[None],
        }
        for a in module.main.args[2:]:
            feeds[a.name] = np.zeros((1, a.type.shape[1], 0, a.type.shape[3]), np.float32)
        steps.append(np.asarray(run(module, feeds)[0])[0, -1])
        toks.append(int(np.argmax(steps[-1])))
        ids.append(toks[-1])
    return toks[:NEW], steps


def _greedy(dec: Any) -> tuple[list[int], list[np.ndarray]]:
    dec.reserve(len(PROMPT) + NEW)
    dec.reset(1)
    steps, toks = [dec.forward(np.asarray([PROMPT]))[0, -1]], []
    for _ in range(NEW):
        toks.append(int(np.argmax(steps[-1])))
        steps.append(dec.forward(np.asarray([[toks[-1]]]))[0, -1])
    return toks, steps


def test_o2_output_lowers_completely(tiny_module: Any) -> None:
    """-O2 + lower-triton: the merged q/k/v projection is one triton.matmul whose result
    core.split cuts into q, k, v; nothing is left without a kernel or glue; the reference
    semantics of the lowered module are the unlowered module's."""
    lowered = lower(tiny_module, "triton")
    assert not [d for d in verify(lowered) if d.severity == "error"]
    assert CAPABILITIES.check(lowered) == []
    ops = lowered.main.ops
    splits = [op for op in ops if op.name == "core.split"]
    assert len(splits) == TINY.layers
    producers = {id(r): op for op in ops for r in op.results}
    for sp in splits:
        assert producers[id(sp.operands[0])].name == "triton.matmul"
        assert len(sp.results) == 3
    names = {op.name for op in ops}
    assert {"triton.add_rms_norm", "triton.gated_matmul"} <= names
    assert not {n for n in names if n.startswith("llm.")}
    feeds: dict[str, Any] = {
        "input_ids": np.asarray([PROMPT]),
        "positions": np.arange(len(PROMPT))[None],
    }
    for a in tiny_module.main.args[2:]:
        feeds[a.name] = np.zeros((1, a.type.shape[1], 0, a.type.shape[3]), np.float32)
    np.testing.assert_allclose(
        run(lowered, feeds)[0], run(tiny_module, feeds)[0], rtol=1e-5, atol=1e-5
    )


def test_o2_build_matches_o0_and_the_reference(
    tiny_module: Any, tmp_path: Path, no_aot: None
) -> None:
    build(tiny_module, str(tmp_path / "o2"), "triton")
    build(tiny_module, str(tmp_path / "o0"), "triton", opt_level=0)
    assert "core.split" in (tmp_path / "o2" / "model.llmir").read_text()
    assert "core.split" not in (tmp_path / "o0" / "model.llmir").read_text()
    want_toks, want = _reference_greedy(tiny_module)
    o0_toks, o0 = _greedy(TARGET.open(str(tmp_path / "o0")))
    o2_toks, o2 = _greedy(TARGET.open(str(tmp_path / "o2")))
    assert o2_toks == o0_toks == want_toks
    for a, b, w in zip(o2, o0, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


def test_optimize_o2_then_build_equals_build(
    tiny_module: Any, tmp_path: Path, no_aot: None
) -> None:
    """As on the command line: m.llmir built, and m.llmir lowered (`optimize -O2 --target
    triton -o l.llmir`, which records target and source) then l.llmir built: same bytes."""
    from llmir_core.ir.parser import parse_file
    from llmir_core.ir.printer import print_module

    src = tmp_path / "m.llmir"
    src.write_text(print_module(tiny_module))
    lowered = tmp_path / "l.llmir"
    lowered.write_text(lower_text(parse_file(str(src)), "triton", opt_level=2))
    module = parse_file(str(lowered))
    assert module.attrs["target"] == "triton" and module.attrs["llmir.source"]["file"] == "m.llmir"
    build(parse_file(str(src)), str(tmp_path / "a"), "triton", source_path=str(src))
    build(module, str(tmp_path / "b"), "triton", source_path=str(lowered))
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for n in names:
        assert (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes(), n
    manifest = (tmp_path / "a" / "manifest.json").read_text()
    assert '"file": "m.llmir"' in manifest and "merge-qkv" in manifest


@pytest.mark.parametrize("arch", ["gemma2", "phi3", "qwen2", "qwen3"])
def test_o2_architectures_match_the_reference(arch: str, tmp_path: Path, no_aot: None) -> None:
    """gemma2 (norm offset, soft-caps, gelu_tanh), phi3 (its imported fused qkv), qwen2 (q/k/v
    biases in the merged projection), qwen3 (q/k norms on the split views): a prefill and a decode
    step of the -O2 build against the reference interpreter of the unlowered module."""
    from llmir_core.frontends.hf import import_hf

    from ..decoder.tiny import ARCH_SHAPES

    module = import_hf(make_llama_folder(tmp_path / "m", ARCH_SHAPES[arch]))
    build(module, str(tmp_path / "art"), "triton")
    assert "core.split" in (tmp_path / "art" / "model.llmir").read_text()
    prompt = PROMPT + [3]
    feeds: dict[str, Any] = {
        "input_ids": np.asarray([prompt]),
        "positions": np.arange(len(prompt))[None],
    }
    for a in module.main.args[2:]:
        feeds[a.name] = np.zeros((1, a.type.shape[1], 0, a.type.shape[3]), np.float32)
    want = run(module, feeds)[0]
    dec = TARGET.open(str(tmp_path / "art"))
    dec.reset(1)
    np.testing.assert_allclose(
        dec.forward(np.asarray([prompt[:-1]])), want[:, :-1], rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(
        dec.forward(np.asarray([prompt[-1:]])), want[:, -1:], rtol=1e-4, atol=1e-4
    )
