"""llguidance vs xgrammar on Gemma 3's vocabulary: the measurement that chose llguidance.

For each library found (xgrammar is not a dependency of llmir: put it on PYTHONPATH for this
run, e.g. `pip install --no-deps --target /tmp/grammar/xgr xgrammar apache-tvm-ffi`), on the
tokenizer of a built artifact (`--artifact`, or `--gguf FILE` built once; measured on Gemma 3
270M, 262144 tokens) and the schema
suite below (the JSON style llmir enforces: `", "` and `": "` separators, no free whitespace):

- import time of the library;
- tokenizer setup: the library's tokenizer index from the token bytes (`token_bytes`, the same
  bytes for both, timed apart);
- grammar compile time per schema (xgrammar's compiler cache is off, so each is a real compile);
- per-token mask time along a valid output (the instance's tokens, then the final mask that
  allows only end-of-sequence): mean and p99 over all schemas, and the final-mask check.

It prints each library's numbers and the xgrammar / llguidance ratios, and writes
benchmarks/results/grammar_mask.json.

    PYTHONPATH=$PWD:/tmp/grammar/xgr python benchmarks/grammar_mask.py

Measured 2026-12-03 on the shared 2-core machine (other jobs running, so absolute times wobble;
see the JSON for this run's numbers and `load`): see docs/serve.md ("Structured outputs").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

S = {"type": "string", "maxLength": 24}
SUITE: list[tuple[str, dict[str, Any], Any]] = [
    (
        "flat",
        {
            "type": "object",
            "properties": {"name": S, "age": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["name", "age", "ok"],
            "additionalProperties": False,
        },
        {"name": "Ada Lovelace", "age": 36, "ok": True},
    ),
    (
        "nested",
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "address": {
                            "type": "object",
                            "properties": {
                                "city": S,
                                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                            },
                            "required": ["city", "zip"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["id", "address"],
                    "additionalProperties": False,
                }
            },
            "required": ["user"],
            "additionalProperties": False,
        },
        {"user": {"id": 7, "address": {"city": "Paris", "zip": "75001"}}},
    ),
    (
        "enum",
        {
            "type": "object",
            "properties": {
                "color": {"enum": ["red", "green", "blue"]},
                "size": {"enum": ["S", "M", "L"]},
            },
            "required": ["color", "size"],
            "additionalProperties": False,
        },
        {"color": "green", "size": "M"},
    ),
    (
        "array",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 4,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": S,
                            "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                        },
                        "required": ["sku", "qty"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
        {"items": [{"sku": "A-100", "qty": 2}, {"sku": "B-7", "qty": 13}]},
    ),
    (
        "bounds",
        {
            "type": "object",
            "properties": {
                "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                "score": {"type": "integer", "minimum": -50, "maximum": 50},
            },
            "required": ["year", "score"],
            "additionalProperties": False,
        },
        {"year": 2026, "score": -12},
    ),
    (
        "patterns",
        {
            "type": "object",
            "properties": {
                "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.(com|org)$"},
                "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                "note": {"type": "string", "maxLength": 40},
            },
            "required": ["email", "code", "note"],
            "additionalProperties": False,
        },
        {"email": "ada@example.org", "code": "ABC-123", "note": "grammar-constrained decoding"},
    ),
]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def run_llguidance(
    toks: list[bytes],
    special: list[int],
    tokenizer: Any,
    eos: list[int],
    cases: list[tuple[str, str, list[int]]],
) -> dict[str, Any]:
    t0 = time.perf_counter()
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    from llmir_core.runtime.grammar import JSON_OPTIONS

    out: dict[str, Any] = {"import_s": time.perf_counter() - t0, "version": llguidance.__version__}

    class W:
        tokens = toks
        special_token_ids = special
        eos_token_id = eos[0]
        bos_token_id = tokenizer.bos_id

        def __call__(self, s: Any) -> list[int]:
            return tokenizer.encode(
                s.decode() if isinstance(s, bytes) else s, add_special_tokens=False
            )

    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(W()), n_vocab=len(toks), eos_token=eos
    )
    out["tokenizer_s"] = time.perf_counter() - t0
    compile_s, mask_s, final_ok = {}, [], True
    bm = allocate_token_bitmask(1, len(toks))
    for name, schema, ids in cases:
        t0 = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        compile_s[name] = time.perf_counter() - t0
        assert not m.is_error(), m.get_error()
        for t in ids:
            t0 = time.perf_counter()
            fill_next_token_bitmask(m, bm)
            mask_s.append(time.perf_counter() - t0)
            assert (bm[0, t // 32] >> (t % 32)) & 1, (name, t)
            assert m.consume_token(t), (name, m.get_error())
        t0 = time.perf_counter()
        fill_next_token_bitmask(m, bm)
        mask_s.append(time.perf_counter() - t0)
        allowed = np.nonzero(np.unpackbits(bm[0].view(np.uint8), bitorder="little"))[0]
        final_ok &= set(allowed.tolist()) == set(eos)
    out.update(compile_s=compile_s, mask_s=mask_s, final_mask_only_eos=final_ok)
    return out


def run_xgrammar(
    toks: list[bytes], special: list[int], eos: list[int], cases: list[tuple[str, str, list[int]]]
) -> dict[str, Any]:
    t0 = time.perf_counter()
    import xgrammar as xgr

    out: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    sp = set(special)
    vocab = [b"" if i in sp else t for i, t in enumerate(toks)]  # xgrammar: special = empty
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(toks), stop_token_ids=eos)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    out["tokenizer_s"] = time.perf_counter() - t0
    compile_s, mask_s, final_ok = {}, [], True
    bm = xgr.allocate_token_bitmask(1, len(toks))
    for name, schema, ids in cases:
        t0 = time.perf_counter()
        cg = compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(", ", ": "), strict_mode=True
        )
        m = xgr.GrammarMatcher(cg)
        compile_s[name] = time.perf_counter() - t0
        for t in ids:
            t0 = time.perf_counter()
            m.fill_next_token_bitmask(bm)
            mask_s.append(time.perf_counter() - t0)
            assert (int(bm[0, t // 32]) >> (t % 32)) & 1, (name, t)
            assert m.accept_token(t), name
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(bm)
        mask_s.append(time.perf_counter() - t0)
        words = bm[0].numpy().astype(np.int32)
        allowed = np.nonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))[0]
        final_ok &= set(allowed.tolist()) == set(eos)
    out.update(compile_s=compile_s, mask_s=mask_s, final_mask_only_eos=final_ok)
    return out


def summary(r: dict[str, Any]) -> dict[str, Any]:
    ms = r.pop("mask_s")
    c = list(r["compile_s"].values())
    return {
        **r,
        "compile_mean_s": statistics.mean(c),
        "compile_max_s": max(c),
        "mask_tokens": len(ms),
        "mask_mean_us": statistics.mean(ms) * 1e6,
        "mask_p50_us": pct(ms, 50) * 1e6,
        "mask_p99_us": pct(ms, 99) * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", help="a built decoder artifact (or give --gguf)")
    ap.add_argument("--gguf", type=Path, help="a GGUF file, imported and built into --work once")
    ap.add_argument("--work", type=Path, default=Path("/tmp/llmir-grammar-decode"))
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/grammar_mask.json"))
    args = ap.parse_args()
    if args.artifact is None:
        if args.gguf is None or not args.gguf.is_file():
            sys.exit("grammar_mask: give --artifact DIR or --gguf FILE (a file that exists)")
        from batch_decode import build  # the same import + build as the batched-decode bench

        args.artifact = build(args.gguf, args.work)
    from llmir_core.runtime.grammar import token_bytes
    from llmir_core.runtime.textgen import load_artifact_tokenizer

    manifest = json.loads((Path(args.artifact) / "manifest.json").read_text())
    tok = load_artifact_tokenizer(args.artifact, manifest)
    eos = list(tok.eos_ids)
    t0 = time.perf_counter()
    toks, special = token_bytes(tok, max(tok.vocab_size, manifest["decoder"]["vocab"]))
    bytes_s = time.perf_counter() - t0
    cases = [(n, s, tok.encode(json.dumps(v), add_special_tokens=False)) for n, s, v in SUITE]
    res: dict[str, Any] = {
        "artifact": args.artifact,
        "vocab": len(toks),
        "token_bytes_s": bytes_s,
        "valid_output_tokens": {n: len(ids) for n, _, ids in cases},
        "load": os.getloadavg()[0],
        "libraries": {},
    }
    res["libraries"]["llguidance"] = summary(run_llguidance(toks, special, tok, eos, cases))
    if importlib.util.find_spec("xgrammar") is None:
        print("xgrammar: not installed (put it on PYTHONPATH to compare)")
    else:
        res["libraries"]["xgrammar"] = summary(run_xgrammar(toks, special, eos, cases))
    for name, r in res["libraries"].items():
        print(
            f"{name:10s} import {r['import_s']:.2f} s  tokenizer {r['tokenizer_s']:.2f} s  "
            f"compile mean {r['compile_mean_s'] * 1e3:.1f} ms (max {r['compile_max_s'] * 1e3:.1f})  "
            f"mask mean {r['mask_mean_us']:.0f} us  p99 {r['mask_p99_us']:.0f} us  "
            f"final mask only EOS: {r['final_mask_only_eos']}"
        )
    libs = res["libraries"]
    if "xgrammar" in libs:
        a, b = libs["xgrammar"], libs["llguidance"]
        ratios = {
            k: a[k] / b[k]
            for k in ("import_s", "tokenizer_s", "compile_mean_s", "mask_mean_us", "mask_p99_us")
        }
        res["xgrammar_over_llguidance"] = ratios
        print("xgrammar / llguidance: " + "  ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    print(f"token bytes ({len(toks)} tokens): {bytes_s:.2f} s; load {res['load']:.1f}")
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
