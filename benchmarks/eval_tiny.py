"""The example of docs/eval.md: `llmir eval` of an int4 build against the f32 build of the tiny
seeded-random llama (tests/decoder/tiny.py), on the first 4096 tokens of the shipped text.

    python benchmarks/eval_tiny.py   # writes benchmarks/results/eval_tiny.json

The model is random, so the numbers say how far int4 moves its distributions, not how well it
reads English (its perplexity is near the vocabulary's size).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "benchmarks" / "results" / "eval_tiny.json"
TEXT = ROOT / "tests" / "data" / "northanger_abbey.txt"


def llmir(*args: str, cwd: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "llmir_cli.app", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def main() -> None:
    from tests.decoder.tiny import TINY, make_llama_folder

    with tempfile.TemporaryDirectory() as tmp:
        make_llama_folder(Path(tmp) / "llama", TINY)
        (Path(tmp) / TEXT.name).write_bytes(TEXT.read_bytes())
        llmir("import", "llama", "-o", "tiny.llmir", cwd=tmp)
        llmir("build", "tiny.llmir", "--logits", "all", "-o", "f32.build", cwd=tmp)
        llmir(
            "build", "tiny.llmir", "--logits", "all", "--quant", "int4", "-o", "int4.build", cwd=tmp
        )
        args = ("eval", "int4.build", "--text", TEXT.name, "--max-tokens", "4096")
        args += ("--against", "f32.build")
        print(llmir(*args, cwd=tmp), end="")
        data = json.loads(llmir(*args, "--format", "json", cwd=tmp))
    OUT.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
