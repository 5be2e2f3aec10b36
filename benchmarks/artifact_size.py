"""Artifact bytes against the GGUF file it was built from (issue 11: "an artifact built from a GGUF
no larger than the GGUF file").

For each model shape (random weights, seeded: SmolLM2-135M and Qwen2.5-0.5B, as
benchmarks/vs_peers.py makes them) and GGUF type (Q4_0, Q8_0, F16; tests/llm/gguf_convert.py
writes the files with llama.cpp's conventions, so the tied embedding of a Q4_0 file stays Q8_0
when its width is not a multiple of 256), this runs `llmir import X.gguf` + `llmir build` (plus
any --build-arg) and reports:

- the GGUF file's bytes and its tensor bytes (the rest is metadata: the tokenizer);
- the artifact's bytes per file and in all, and the sum of its initializers' bytes;
- the ratios artifact/GGUF (files) and initializers/GGUF tensors (weights alone);
- the largest initializers, so that a table or a copy the GGUF does not hold shows at once.

    python benchmarks/artifact_size.py                          # both shapes, Q4_0 Q8_0 F16
    python benchmarks/artifact_size.py --models smollm2 --types Q4_0
    python benchmarks/artifact_size.py --build-arg=--dtype --build-arg=f16
    python benchmarks/artifact_size.py --tree /path/to/other/checkout --out before.json

Everything is cached under --work (the HF folders and GGUF files; artifacts are rebuilt each
run). Results go to benchmarks/results/artifact_size.json (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TYPES = ("Q4_0", "Q8_0", "F16")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


TREE = REPO  # the llmir checkout that imports and builds (--tree: another one, for before/after)


def llmir(*args: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "llmir_cli.app", *args],
        capture_output=True,
        text=True,
        cwd=str(TREE),  # `python -m` puts the working folder first on sys.path
        env={**os.environ, "PYTHONPATH": str(TREE)},
    )
    if r.returncode:
        raise SystemExit(f"llmir {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def write_gguf(hf: Path, out: Path, qtype: str) -> None:
    """The HF folder's weights as a GGUF file of `qtype`, with a placeholder byte-level BPE
    vocabulary llmir can build a tokenizer from (tokens t0..tN, with 't' and '0' for the one
    merge llama.cpp requires)."""
    from safetensors.numpy import load_file

    from tests.llm.gguf_convert import write_gguf as convert

    state = load_file(str(hf / "model.safetensors"))
    vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
    tokens = [f"t{i}" for i in range(vocab)]
    tokens[-2:] = ["0", "t"]
    tok = {
        "model": "gpt2",
        "pre": "gpt-2",
        "tokens": tokens,
        "token_type": [1] * vocab,
        "merges": ["t 0"],
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tmp = out.with_suffix(".tmp")
    convert(hf, state, tmp, qtype, tokenizer=tok)
    tmp.replace(out)


def gguf_tensor_bytes(path: Path) -> dict[str, int]:
    """Bytes of the file's tensors by GGUF type."""
    import gguf

    by: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        by[t.tensor_type.name] = by.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return by


def initializers(model: Path) -> list[tuple[int, str, list[int]]]:
    """(bytes, name, dims) of each initializer of model.onnx, largest first."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    m = onnx.load(str(model), load_external_data=False)
    out = []
    for t in m.graph.initializer:
        if uses_external_data(t):
            n = int({e.key: e.value for e in t.external_data}.get("length", 0))
        else:
            n = len(t.raw_data) if t.raw_data else t.ByteSize()
        out.append((n, t.name, list(t.dims)))
    return sorted(out, reverse=True)


def measure(work: Path, name: str, qtype: str, build_args: list[str]) -> dict[str, Any]:
    from benchmarks.vs_peers import shapes
    from tests.decoder.tiny import make_llama_folder

    hf = work / name / "hf"
    if not (hf / "model.safetensors").is_file():
        log(f"{name}: writing the random-weight model folder")
        make_llama_folder(hf, shapes()[name], seed=0)
    gg = work / name / f"model.{qtype.lower()}.gguf"
    if not gg.is_file():
        log(f"{name}: GGUF {qtype}")
        write_gguf(hf, gg, qtype)
    mod = work / name / f"model.{qtype.lower()}.llmir"
    art = work / name / f"art-{qtype.lower()}-{TREE.name}"
    log(f"{name} {qtype}: llmir import + build {' '.join(build_args)}")
    llmir("import", str(gg), "-o", str(mod), "-q")
    if art.exists():
        shutil.rmtree(art)
    llmir("build", str(mod), "-o", str(art), "-q", *build_args)
    files = {p.name: p.stat().st_size for p in sorted(art.iterdir()) if p.is_file()}
    inits = initializers(art / "model.onnx")
    tensors = gguf_tensor_bytes(gg)
    gguf_bytes, t_bytes = gg.stat().st_size, sum(tensors.values())
    art_bytes, i_bytes = sum(files.values()), sum(n for n, _, _ in inits)
    return {
        "model": name,
        "gguf_type": qtype,
        "build_args": build_args,
        "tree": str(TREE),
        "gguf_bytes": gguf_bytes,
        "gguf_tensor_bytes": t_bytes,
        "gguf_tensor_bytes_by_type": tensors,
        "artifact_bytes": art_bytes,
        "artifact_files": files,
        "initializer_bytes": i_bytes,
        "artifact_over_gguf": round(art_bytes / gguf_bytes, 4),
        "initializers_over_gguf_tensors": round(i_bytes / t_bytes, 4),
        "largest_initializers": [
            {"name": nm, "dims": dims, "bytes": n} for n, nm, dims in inits[:6]
        ],
    }


def report(rows: list[dict[str, Any]]) -> None:
    mb = 1e6
    head = (
        f"{'model':<14}{'type':<6}{'GGUF MB':>10}{'artifact MB':>13}{'ratio':>8}"
        f"{'tensors MB':>12}{'inits MB':>10}{'ratio':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['model']:<14}{r['gguf_type']:<6}{r['gguf_bytes'] / mb:>10.2f}"
            f"{r['artifact_bytes'] / mb:>13.2f}{r['artifact_over_gguf']:>7.4f}x"
            f"{r['gguf_tensor_bytes'] / mb:>12.2f}{r['initializer_bytes'] / mb:>10.2f}"
            f"{r['initializers_over_gguf_tensors']:>7.4f}x"
        )
        files = ", ".join(f"{k} {v / mb:.3f}" for k, v in r["artifact_files"].items())
        print(f"  files MB: {files}")
        big = ", ".join(
            f"{x['name']} {x['dims']} {x['bytes'] / mb:.2f}" for x in r["largest_initializers"][:4]
        )
        print(f"  largest initializers MB: {big}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-artifact-size"))
    ap.add_argument("--models", default="smollm2,qwen2.5-0.5b")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--build-arg", action="append", default=[], help="passed to llmir build")
    ap.add_argument("--tree", type=Path, default=REPO, help="llmir checkout to build with")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/artifact_size.json")
    a = ap.parse_args()
    global TREE
    TREE = a.tree.resolve()
    a.work = a.work.resolve()
    rows = []
    for name in a.models.split(","):
        for q in a.types.split(","):
            rows.append(measure(a.work, name, q, a.build_arg))
    report(rows)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    tmp.replace(a.out)
    log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
