"""Every kernel compiles ahead of time for sm_80 and sm_90 without a GPU (PTX and cubin produced)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.conftest import import_or_skip

import_or_skip("torch", "the triton kernels need torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton kernels need triton (pip install 'llmir[gpu]')")

from llmir_core.errors import InputError  # noqa: E402
from llmir_core.targets.triton import aot  # noqa: E402

KERNELS = {
    "embedding_kernel",
    "rms_norm_kernel",
    "rotary_kernel",
    "gemv_kernel",
    "matmul_kernel",
    "qgemv_kernel",
    "qmatmul_kernel",
    "kv_append_kernel",
    "decode_attn_split_kernel",
    "decode_attn_reduce_kernel",
    "prefill_attn_kernel",
    "argmax_kernel",
    "sample_kernel",
}


@pytest.mark.slow
def test_every_kernel_compiles_for_sm80_and_sm90(tmp_path: Path) -> None:
    entries = aot.compile_in_subprocess("f16", [80, 90], str(tmp_path), one_each=True)
    assert {(e["kernel"], e["arch"]) for e in entries} == {
        (k, a) for k in KERNELS for a in ("sm_80", "sm_90")
    }
    for e in entries:
        ptx = (tmp_path / e["ptx"]["file"]).read_text()
        assert f".target {e['arch']}" in ptx and ".entry " + e["name"] in ptx
        cubin = (tmp_path / e["cubin"]["file"]).read_bytes()
        assert cubin[:4] == b"\x7fELF" and hashlib.sha256(cubin).hexdigest() == e["cubin"]["sha256"]
    assert len(os.listdir(tmp_path)) == 2 * len(entries)


def test_bad_arch_is_an_input_error() -> None:
    assert aot.parse_archs("sm_80, sm_90") == [80, 90]
    for bad in ("sm80", "sm_", "compute_90", ""):
        with pytest.raises(InputError):
            aot.parse_archs(bad)
