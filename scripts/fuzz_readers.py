"""Fuzz every file reader and every writing command longer than the test suite does.

Three sweeps, each case run in this process and checked for: exit 0, 1 or 2 (no internal error or
traceback), one `error:` line naming the file (line:col for .llmir text), nothing left behind,
each case under a time bound:

- mutants (tests/inputs/fuzzing.py): structure-aware mutants of valid files, per reader;
- damage (tests/inputs/damage.py): every file a command reads cut at every eighth, bits flipped,
  wrong magic, huge declared sizes, paths escaping the folder, broken/looping/folder symlinks;
- writers (tests/inputs/writers.py): every writing command with ENOSPC, EROFS or Ctrl-C at every
  eighth of its writes (exit 2 naming the output, or 130; the folder left exactly as it was).

Exit 1 if any case failed.

    python scripts/fuzz_readers.py --cases 2000                 # mutants, every reader
    python scripts/fuzz_readers.py --reader gguf --cases 500 --start 10000
    python scripts/fuzz_readers.py --reader onnx --show 3        # print the first failures in full
    python scripts/fuzz_readers.py --damage --writers           # the file and disk fault matrices
    python scripts/fuzz_readers.py --full                       # all three, 2000 mutants, 16 flips
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=None, help="mutants per reader (default 500)")
    p.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--reader", action="append", help="only this reader (repeatable); default: all")
    p.add_argument("--show", type=int, default=1, help="failures to print in full per reader")
    p.add_argument("--damage", action="store_true", help="run the damaged-file matrix")
    p.add_argument("--writers", action="store_true", help="run the disk-fault matrix")
    p.add_argument("--full", action="store_true", help="every sweep, at its largest")
    args = p.parse_args(argv)
    only_matrices = (args.damage or args.writers) and args.cases is None and not args.full
    cases = args.cases if args.cases is not None else (2000 if args.full else 500)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="llmir-fuzz-") as tmp:
        os.environ["LLMIR_HOME"] = str(Path(tmp) / "home")  # the artifact-check state and caches
        os.environ.setdefault("NO_COLOR", "1")
        from tests.decoder.tiny import TINY, make_llama_folder

        root = Path(tmp)
        llama = make_llama_folder(root / "llama", TINY)
        gguf_file = _gguf(llama, root / "tiny.gguf")
        failed = 0
        if not only_matrices:
            failed += _mutants(args, cases, root, llama, gguf_file)
        if args.damage or args.full:
            failed += _damage(args, root, llama, gguf_file)
        if args.writers or args.full:
            failed += _writers(args, root, llama, gguf_file)
    print(f"{'FAILED' if failed else 'ok'}: {failed} failing case(s)")
    return 1 if failed else 0


def _mutants(args: Any, cases: int, root: Path, llama: Path, gguf_file: Path | None) -> int:
    from tests.inputs.fuzzing import Seeds, make_readers, peak_rss_mb, run_reader

    readers = make_readers(Seeds(root, llama, gguf_file))
    chosen = args.reader or list(readers)
    unknown = [r for r in chosen if r not in readers]
    if unknown:
        sys.exit(f"unknown reader(s) {unknown}; known: {', '.join(readers)}")
    failed = 0
    for name in chosen:
        t0 = time.perf_counter()
        failures, codes = run_reader(readers[name], cases, root / "work", start=args.start)
        dt = time.perf_counter() - t0
        summary = ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))
        print(
            f"{name:16} {cases} cases in {dt:6.1f} s ({summary}); {len(failures)} failed; "
            f"peak RSS {peak_rss_mb():.0f} MB",
            flush=True,
        )
        for seed, outcome in failures[: args.show]:
            _show(f"seed {seed}", outcome)
        failed += len(failures)
    return failed


def _damage(args: Any, root: Path, llama: Path, gguf_file: Path | None) -> int:
    from tests.inputs.damage import Files, artifact_targets, damages, make_targets, run_case
    from tests.inputs.helpers import invoke

    files = Files(root / "damage", llama, gguf_file)
    files.split = _split(llama, root / "split") if gguf_file is not None else None
    targets = make_targets(files)
    try:
        from llmir_core.frontends.hf import import_hf
        from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

        build_decoder(import_hf(llama, root / "d.llmir"), str(root / "llama.art"))
        code, _, err = invoke("build", str(files.small / "m.llmir"), "-o", str(root / "small.art"))
        assert code == 0, err
        invoke("run", str(root / "llama.art"), "--prompt", "ab", "-n", "1")  # builds the ops
        targets.update(artifact_targets(root / "small.art", root / "llama.art"))
    except ImportError:
        print("onnxruntime is not installed: skipping the artifact files", file=sys.stderr)
    failed = 0
    for name, target in targets.items():
        t0, bad, ds = time.perf_counter(), [], damages(target, full=args.full)
        for d in ds:
            outcome = run_case(target, d, root / "work")
            if outcome.problems:
                bad.append((d.name, outcome))
        dt = time.perf_counter() - t0
        print(f"{name:44} {len(ds):3} cases in {dt:5.1f} s; {len(bad)} failed", flush=True)
        for what, outcome in bad[: args.show]:
            _show(what, outcome)
        failed += len(bad)
    return failed


def _writers(args: Any, root: Path, llama: Path, gguf_file: Path | None) -> int:
    from tests.inputs.writers import FAULTS, Inputs, make_writers, sweep

    failed = 0
    for name, writer in make_writers(Inputs(root / "writers", llama, gguf_file)).items():
        for fault in FAULTS:
            t0 = time.perf_counter()
            ran, bad = sweep(writer, fault, root / "work")
            dt = time.perf_counter() - t0
            print(
                f"{name:28} {fault:6} {ran:3} cases in {dt:5.1f} s; {len(bad)} failed", flush=True
            )
            for at, outcome in bad[: args.show]:
                _show(f"at write {at}", outcome)
            failed += len(bad)
    return failed


def _show(what: str, outcome: Any) -> None:
    print(
        f"  {what}: {'; '.join(outcome.problems)}\n    "
        + outcome.err.strip().replace("\n", "\n    ")
    )


def _gguf(llama: Path, out: Path) -> Path | None:
    try:
        import gguf  # noqa: F401  (write_gguf imports it when it runs)
        from safetensors.numpy import load_file

        from tests.llm.gguf_convert import write_gguf
    except ImportError:
        print("gguf or safetensors is not installed: skipping the GGUF reader", file=sys.stderr)
        return None
    write_gguf(llama, load_file(str(llama / "model.safetensors")), out)
    return out


def _split(llama: Path, out: Path) -> Path:
    from safetensors.numpy import load_file

    from tests.llm.gguf_convert import write_gguf

    out.mkdir()
    write_gguf(
        llama, load_file(str(llama / "model.safetensors")), out / "m.gguf", split_max_tensors=7
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
