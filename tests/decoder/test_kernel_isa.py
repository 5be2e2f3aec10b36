"""The instruction-set variant of llmir's kernels (native/isa.h): chosen when an artifact
registers the library, AVX-512 VNNI where the CPU has it, `LLMIR_KERNEL_ISA=avx2` forcing the
AVX2 fallback; a bad value, or `avx512` on a CPU without it, is one clear error at open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmir_core.errors import InputError
from llmir_core.targets import build
from llmir_core.targets.onnxruntime import native
from llmir_core.targets.onnxruntime.runner import open_decoder
from tests.conftest import requires

WHY = native.unavailable_reason()
needs_kernel = requires(None if WHY is None else f"llmir's custom op cannot run: {WHY}")


@pytest.fixture
def art(tiny_module: Any, tmp_path: Path) -> str:
    build(tiny_module, str(tmp_path / "art"), "onnxruntime", options={"quant": "int8"})
    return str(tmp_path / "art")


@needs_kernel
def test_unknown_isa_is_one_clear_error_at_open(art: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ISA_ENV, "sse2")
    with pytest.raises(
        InputError, match="LLMIR_KERNEL_ISA=sse2: expected one of auto, avx2, avx512"
    ):
        open_decoder(art)


@needs_kernel
def test_avx512_on_a_cpu_without_it_is_refused(art: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmir_core.targets.onnxruntime.native import cpu

    monkeypatch.setenv(native.ISA_ENV, "avx512")
    monkeypatch.setattr(cpu, "cpu_flags", lambda path=cpu.CPUINFO: {"avx2", "fma", "f16c"})
    with pytest.raises(InputError, match="LLMIR_KERNEL_ISA=avx512, and this CPU lacks avx512f"):
        open_decoder(art)


@needs_kernel
def test_forced_fallback_runs_avx2_everywhere(art: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ISA_ENV, "avx2")
    open_decoder(art)  # registers under the forced choice
    variants = native.kernel_variants()
    assert variants and set(variants.values()) == {"avx2"}
    monkeypatch.delenv(native.ISA_ENV)
    auto = native.kernel_variants()
    has512 = not native.missing_avx512()
    assert set(auto) == set(variants)
    if not has512:
        assert set(auto.values()) == {"avx2"}


@needs_kernel
def test_the_batched_runner_names_the_same_variants(
    art: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmir_core.targets import open_batch_artifact

    monkeypatch.setenv(native.ISA_ENV, "avx2")
    batch = open_batch_artifact(art, 2)
    one = open_decoder(art)
    assert batch.kernel_variants() == one.kernel_variants() != {}
    assert set(batch.kernel_variants().values()) == {"avx2"}
