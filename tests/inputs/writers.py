"""Every command that writes files, run under a full or read-only disk (tests/inputs/faults.py)
at every eighth of its writes. Shared by tests/inputs/test_write_faults.py and
scripts/fuzz_readers.py --writers.

Each outcome must be: exit 2, one `error:` line that names a path in the output's folder and
the disk's complaint (for SIGINT: exit 130 and the one line `interrupted`), no traceback, and
the folder exactly as it was (no output, no temp file, no half-written file, an in-place edit's
file unchanged).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmir_cli import _signals
from tests.inputs.damage import TEXT
from tests.inputs.faults import SIGINT, disk_fault, eighths
from tests.inputs.fuzzing import Outcome
from tests.inputs.helpers import invoke

FAULTS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS, "SIGINT": SIGINT}


@dataclass(frozen=True)
class Writer:
    """A writing command: `setup(work)` makes its inputs in `work` and returns its argv."""

    name: str
    setup: Callable[[Path], list[str]]


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under `folder` with its kind and content hash (what 'unchanged' means)."""
    out: dict[str, str] = {}
    for d, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = os.path.join(d, name)
            rel = os.path.relpath(p, folder)
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            elif os.path.isdir(p):
                out[rel] = "dir"
            else:
                with open(p, "rb") as fh:
                    out[rel] = hashlib.sha256(fh.read()).hexdigest()
    return out


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    left = sorted(set(after) - set(before))
    gone = sorted(set(before) - set(after))
    edited = sorted(k for k in before if k in after and before[k] != after[k])
    return [
        f"{what}: {names[:4]}"
        for what, names in (("left behind", left), ("removed", gone), ("changed", edited))
        if names
    ]


def check_interrupted(code: int, err: str) -> list[str]:
    problems = [] if code == 130 else [f"exit {code}"]
    if err != "interrupted\n":
        problems.append(f"stderr is not the one line 'interrupted': {err[-300:]!r}")
    return problems


def check_write_failure(code: int, err: str, work: Path, complaint: str) -> list[str]:
    problems = []
    if code != 2:
        problems.append(f"exit {code}")
    if "Traceback" in err or "internal error" in err:
        problems.append("internal error: " + (err.strip().splitlines() or [""])[-1][:300])
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    if len(lines) != 1:
        problems.append(f"{len(lines)} error lines: {err[:300]!r}")
    elif str(work) not in lines[0]:
        problems.append(f"error names no path: {lines[0][:300]}")
    elif complaint not in lines[0]:
        problems.append(f"error does not say {complaint!r}: {lines[0][:300]}")
    return problems


def run_fault(writer: Writer, fault: str, at: int, work: Path) -> Outcome | None:
    """Run the command with the `at`-th event failing; None when the command has fewer events."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    argv = writer.setup(work)
    before = snapshot(work)
    t0 = time.perf_counter()
    with disk_fault(work, FAULTS[fault], at) as f:
        try:
            code, _out, err = invoke(*argv)
        finally:  # the process goes on: `interrupted` may be printed again
            _signals._announced = False
    dt = time.perf_counter() - t0
    if not f.fired:
        return None
    if fault == "SIGINT":
        problems = check_interrupted(code, err)
    else:
        problems = check_write_failure(code, err, work, os.strerror(FAULTS[fault]))
    problems += changes(before, snapshot(work))
    return Outcome(code, err, dt, problems)


def count_events(writer: Writer, fault: str, work: Path) -> int:
    """The command's writes (ENOSPC) or files created (EROFS) under its folder, on a clean run."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    argv = writer.setup(work)
    with disk_fault(work, FAULTS[fault], 0) as f:
        code, _out, err = invoke(*argv)
    assert code == 0, f"{writer.name}: {err}"
    return f.events


def sweep(
    writer: Writer, fault: str, work: Path, *, points: int = 8
) -> tuple[int, list[tuple[int, Outcome]]]:
    """Fault the command at every eighth of its events (`points` < 8: the first, middle and
    last few); return the number of cases run and the failing ones."""
    n = count_events(writer, fault, work)
    ats = eighths(n)
    if points < len(ats):
        step = max(1, len(ats) // points)
        ats = sorted({ats[0], *ats[::step], ats[-1]})[:points]
    failures, ran = [], 0
    for at in ats:
        o = run_fault(writer, fault, at, work)
        if o is None:
            continue
        ran += 1
        if o.problems:
            failures.append((at, o))
    return ran, failures


class Inputs:
    """The valid inputs the writers start from, copied into each case's folder."""

    def __init__(self, root: Path, llama_dir: Path, gguf_file: Path | None) -> None:
        import numpy as np

        self.root, self.llama, self.gguf = root, llama_dir, gguf_file
        root.mkdir(parents=True, exist_ok=True)
        np.ones((16, 16), np.float32).tofile(root / "w.bin")
        (root / "m.llmir").write_text(TEXT)
        np.save(root / "x.npy", np.ones((2, 16), np.float32))

    def small(self, work: Path) -> Path:
        for name in ("w.bin", "m.llmir", "x.npy"):
            shutil.copyfile(self.root / name, work / name)
        return work / "m.llmir"

    def decoder(self, work: Path) -> Path:
        """The tiny llama as .llmir text whose weights point at the seed folder (read only)."""
        from llmir_core.frontends import import_model, write_module

        f = work / "d.llmir"
        write_module(import_model(str(self.llama), out_path=str(f)), str(f))
        return f


def make_writers(inputs: Inputs) -> dict[str, Writer]:
    w: dict[str, Writer] = {}

    def add(name: str, setup: Callable[[Path], list[str]]) -> None:
        w[name] = Writer(name, setup)

    add("import hf", lambda d: ["import", str(inputs.llama), "-o", str(d / "m.llmir")])
    if inputs.gguf is not None:
        g = inputs.gguf
        add("import gguf", lambda d: ["import", str(g), "-o", str(d / "m.llmir")])
    try:
        from tests.onnx import models

        llm = models.llm23(0, d=16, heads=2, kv=1, max_pos=8).SerializeToString()

        def onnx_import(d: Path) -> list[str]:
            src = d / "src"
            src.mkdir()
            (src / "m.onnx").write_bytes(llm)  # weights inside: written to m.weights.bin
            return ["import", str(src / "m.onnx"), "-o", str(d / "m.llmir")]

        add("import onnx", onnx_import)
    except ImportError:
        pass
    add(
        "optimize -O2",
        lambda d: ["optimize", str(inputs.small(d)), "-O2", "-o", str(d / "o.llmir")],
    )
    add(
        "optimize --quant int4",
        lambda d: [
            "optimize",
            str(inputs.decoder(d)),
            "--target",
            "onnxruntime",
            "--quant",
            "int4",
            "-o",
            str(d / "q.llmir"),
        ],
    )
    add(
        "optimize quantize-weights",
        lambda d: [
            "optimize",
            str(inputs.decoder(d)),
            "--passes",
            "quantize-weights{bits=4}",
            "--allow-unproved",
            "-o",
            str(d / "q.llmir"),
        ],
    )
    add("build", lambda d: ["build", str(inputs.small(d)), "-o", str(d / "out")])
    add("build decoder", lambda d: ["build", str(inputs.decoder(d)), "-o", str(d / "out")])

    def fmt_in_place(d: Path) -> list[str]:
        f = inputs.small(d)
        f.write_text(f.read_text().replace("  ", "    "))  # not canonical: fmt -i rewrites it
        return ["fmt", "-i", str(f)]

    add("fmt -i", fmt_in_place)
    add("init", lambda d: ["init", str(d / "proj"), "--model", str(inputs.llama), "-q"])

    def run_outputs(d: Path) -> list[str]:
        f = inputs.small(d)
        return ["run", str(f), "--input", f"x={d / 'x.npy'}", "--output-dir", str(d / "outs")]

    add("run --output-dir", run_outputs)
    return w
