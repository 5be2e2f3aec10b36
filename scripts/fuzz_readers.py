"""Fuzz every file reader longer than the test suite does (tests/inputs/test_fuzz_readers.py).

Each case mutates a valid file the way its format is built (see tests/inputs/fuzzing.py), runs
the command that reads it in this process, and checks: exit 0, 1 or 2 (no internal error or
traceback), an error naming the file (line:col for .llmir text), nothing left behind, each case
under a time bound; the run's peak memory is printed. Exit 1 if any case failed.

    python scripts/fuzz_readers.py --cases 2000                 # every reader, seeds 0..1999
    python scripts/fuzz_readers.py --reader gguf --cases 500 --start 10000
    python scripts/fuzz_readers.py --reader onnx --show 3        # print the first failures in full
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=500, help="cases per reader (default 500)")
    p.add_argument("--start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--reader", action="append", help="only this reader (repeatable); default: all")
    p.add_argument("--show", type=int, default=1, help="failures to print in full per reader")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="llmir-fuzz-") as tmp:
        os.environ["LLMIR_HOME"] = str(Path(tmp) / "home")  # the artifact-check state and caches
        os.environ.setdefault("NO_COLOR", "1")
        from tests.decoder.tiny import TINY, make_llama_folder
        from tests.inputs.fuzzing import Seeds, make_readers, peak_rss_mb, run_reader

        root = Path(tmp)
        llama = make_llama_folder(root / "llama", TINY)
        gguf_file = _gguf(llama, root / "tiny.gguf")
        readers = make_readers(Seeds(root, llama, gguf_file))
        chosen = args.reader or list(readers)
        unknown = [r for r in chosen if r not in readers]
        if unknown:
            p.error(f"unknown reader(s) {unknown}; known: {', '.join(readers)}")
        failed = 0
        for name in chosen:
            t0 = time.perf_counter()
            failures, codes = run_reader(readers[name], args.cases, root / "work", start=args.start)
            dt = time.perf_counter() - t0
            summary = ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))
            print(
                f"{name:16} {args.cases} cases in {dt:6.1f} s ({summary}); {len(failures)} failed; "
                f"peak RSS {peak_rss_mb():.0f} MB",
                flush=True,
            )
            for seed, outcome in failures[: args.show]:
                print(
                    f"  seed {seed}: {'; '.join(outcome.problems)}\n    "
                    + outcome.err.strip().replace("\n", "\n    ")
                )
            failed += len(failures)
    return 1 if failed else 0


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


if __name__ == "__main__":
    sys.exit(main())
