"""Every reader fuzzed with structure-aware mutants of valid files (see tests/inputs/fuzzing.py):
exit 0, 1 or 2, never an internal error; an error names the file (with line:col for .llmir
text); no output left behind; each case in bounded time and the run in bounded memory.

Seeded and short here (CASES per reader); `python scripts/fuzz_readers.py --cases N` runs more.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.inputs.fuzzing import Seeds, make_readers, peak_rss_mb, run_reader

CASES = int(os.environ.get("LLMIR_FUZZ_CASES", "250"))
READERS = [
    "llmir",
    "onnx",
    "safetensors",
    "gguf",
    "config.json",
    "tokenizer.json",
    "registry index",
    "llmir.lock",
]
MEMORY_MB = 1500  # growth of peak RSS allowed over a reader's run


@pytest.fixture(scope="module")
def seeds(llama_dir: Path, llama_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    return Seeds(tmp_path_factory.mktemp("fuzz"), llama_dir, llama_gguf)


@pytest.mark.parametrize("name", READERS)
def test_reader_survives_mutants(seeds: Seeds, name: str, tmp_path: Path) -> None:
    readers = make_readers(seeds)
    if name not in readers:
        pytest.skip(f"{name}: the package that writes its seed files is not installed")
    before = peak_rss_mb()
    failures, codes = run_reader(readers[name], CASES, tmp_path / "work")
    report = "\n".join(f"seed {seed}: {'; '.join(o.problems)}" for seed, o in failures[:10])
    assert not failures, f"{len(failures)} of {CASES} {name} cases failed:\n{report}"
    assert codes.get(2, 0) + codes.get(1, 0) > CASES // 4, f"too few mutants were rejected: {codes}"
    assert peak_rss_mb() - before < MEMORY_MB
