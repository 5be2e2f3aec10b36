"""GPU decode benchmark: llmir's triton build vs Hugging Face transformers on the same weights.

For each model shape (random weights, f16, written as a Hugging Face folder under --work):
SmolLM2-135M, Qwen2.5-0.5B and (with --shapes ...,llama3-8b) Llama-3-8B, it

- imports the folder with llmir and builds it for the triton target in f16 and (int4 variant)
  after `quantize-weights{bits=4}` (symmetric nbits, block 32), kernels compiled ahead of time
  for --arch;
- loads the same folder in transformers (f16), eager, and with a static cache + torch.compile
  (mode reduce-overhead);
- measures, batch 1, greedy: time to first token for a --prompt-len prompt (prefill + first
  pick), decode tokens/s over --gen-len tokens, peak GPU memory (torch.cuda.max_memory_allocated,
  reset before each variant), and the first --check-tokens greedy tokens (f16 variants must agree
  with HF eager);
- measures the device copy bandwidth in the same run (a 1 GiB device-to-device copy, bytes read +
  written), and reports each llmir variant's bytes read per decoded token (weights as stored in
  the artifact + the KV cache at the mean position) and the fraction of the copy bandwidth its
  decode speed implies.

Results go to --json (and a table on stdout, last). `--tiny` runs a tiny llama shape on whatever
device there is (under TRITON_INTERPRET=1 on the CPU: the test in tests/triton runs it that way).

    python benchmarks/gpu_decode.py --work /tmp/gpu-bench --json benchmarks/results/gpu_decode.json
"""

from __future__ import annotations

import argparse
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

from tests.decoder.tiny import LlamaShape, make_llama_folder  # noqa: E402

SHAPES = {
    "tiny": LlamaShape(),
    "smollm2-135m": LlamaShape(
        vocab=49152,
        hidden=576,
        intermediate=1536,
        layers=30,
        heads=9,
        kv_heads=3,
        context=8192,
        rope_theta=100000.0,
        tie=True,
    ),
    "qwen2.5-0.5b": LlamaShape(
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
    ),
    "llama3-8b": LlamaShape(
        vocab=128256,
        hidden=4096,
        intermediate=14336,
        layers=32,
        heads=32,
        kv_heads=8,
        context=8192,
        rope_theta=500000.0,
        eps=1e-5,
    ),
}
VARIANTS = ("llmir-f16", "llmir-int4", "hf-eager", "hf-compile")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_folder(work: Path, name: str, dtype: str) -> Path:
    """The shape's HF folder with weights in dtype (f16 or f32)."""
    folder = work / f"{name}-{dtype}"
    if (folder / "model.safetensors").exists():
        return folder
    make_llama_folder(folder, SHAPES[name])
    if dtype == "f16":
        from safetensors.numpy import load_file, save_file

        path = folder / "model.safetensors"
        tensors = {k: v.astype(np.float16) for k, v in load_file(str(path)).items()}
        save_file(tensors, str(path), metadata={"format": "pt"})
        cfg = json.loads((folder / "config.json").read_text())
        cfg["torch_dtype"] = "float16"
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def build_llmir(folder: Path, out: Path, quant: bool, arch: str) -> Path:
    from llmir_core.frontends.hf import import_hf
    from llmir_core.passes import PASSES
    from llmir_core.passes.base import PassContext
    from llmir_core.targets.triton.target import TARGET

    if (out / "manifest.json").exists():
        return out
    module = import_hf(folder)
    if quant:
        PASSES["quantize-weights"](bits=4, weights_file=str(out) + ".q4.weights.bin").run(
            module, PassContext()
        )
    TARGET.serialize(module, str(out), arch=arch)
    return out


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> int | None:
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    return None


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes per second of a device copy (read + write counted), median of 10."""
    import torch

    a = torch.empty(nbytes // 2, dtype=torch.float16, device=device).normal_()
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(10):
        sync(device)
        t = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * a.numel() * a.element_size() / statistics.median(times)


def run_llmir(art: Path, prompt: list[int], gen: int, device: str) -> dict[str, Any]:
    from llmir_core.targets.triton.target import TARGET

    peak_reset(device)
    dec = TARGET.open(str(art))
    dec.reserve(len(prompt) + gen + 1)
    if device == "cuda":  # warm-up: compiles the kernels and captures the decode graph
        dec.reset(1)
        logits = dec.forward(np.asarray([prompt]))
        for _ in range(2):
            logits = dec.forward(np.asarray([[int(np.argmax(logits[0, -1]))]]))
    dec.reset(1)
    sync(device)
    t0 = time.perf_counter()
    logits = dec.forward(np.asarray([prompt]))
    tok = int(np.argmax(logits[0, -1]))
    ttft = time.perf_counter() - t0
    toks = [tok]
    t1 = time.perf_counter()
    for _ in range(gen):
        logits = dec.forward(np.asarray([[tok]]))
        tok = int(np.argmax(logits[0, -1]))
        toks.append(tok)
    sync(device)
    dt = time.perf_counter() - t1
    m = json.loads((art / "manifest.json").read_text())
    d = m["decoder"]
    kv_elem = 1 if d["kv_cache"] == "int8" else (2 if m["dtype"] in ("f16", "bf16") else 4)
    kv_rows = len(prompt) + gen / 2
    kv_bytes = sum(2 * c["kv_heads"] * c["head_dim"] * kv_elem * kv_rows for c in d["cache"]) / 2
    weights = m["files"]["weights.bin"]["bytes"]
    return {
        "ttft_ms": 1e3 * ttft,
        "decode_tok_s": gen / dt,
        "peak_gpu_bytes": peak(device),
        "tokens": toks,
        "bytes_per_token": weights + kv_bytes,
        "weights_bytes": weights,
    }


def run_hf(
    folder: Path, prompt: list[int], gen: int, device: str, compiled: bool
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    peak_reset(device)
    dtype = torch.float16 if device == "cuda" else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    model = model.to(device).eval()
    ids = torch.tensor([prompt], device=device)
    kw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    if compiled:
        model.generation_config.cache_implementation = "static"
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

    def generate(n: int) -> tuple[float, list[int]]:
        sync(device)
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(device)
        return time.perf_counter() - t, out[0, len(prompt) :].tolist()

    for _ in range(2 if compiled else 1):  # warm-up (compilation, graph capture)
        generate(4)
    t_first, _ = generate(1)
    t_all, toks = generate(gen + 1)
    return {
        "ttft_ms": 1e3 * t_first,
        "decode_tok_s": gen / max(t_all - t_first, 1e-9),
        "peak_gpu_bytes": peak(device),
        "tokens": toks,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/llmir-gpu-bench")
    ap.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--check-tokens", type=int, default=16)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--copy-bytes", type=int, default=1 << 30)
    ap.add_argument(
        "--tiny", action="store_true", help="the tiny llama shape only (tests, CPU interpreter)"
    )
    ap.add_argument(
        "--dtype",
        default="",
        choices=["", "f16", "f32"],
        help="weights of the model folders (default f16 on a GPU, f32 on the CPU)",
    )
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    shapes = ["tiny"] if a.tiny else [s.strip() for s in a.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if unknown or bad:
        print(
            f"error: unknown shape(s)/variant(s): {', '.join(unknown + bad)} "
            f"(shapes: {', '.join(SHAPES)}; variants: {', '.join(VARIANTS)})",
            file=sys.stderr,
        )
        return 2
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print(
            "error: no CUDA device (set TRITON_INTERPRET=1 to run the kernels on the CPU, slowly)",
            file=sys.stderr,
        )
        return 2
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(device, a.copy_bytes)
    log(f"device {device}: copy bandwidth {bw / 1e9:.1f} GB/s")
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "copy_bandwidth_gb_s": bw / 1e9,
        "dtype": a.dtype or ("f16" if device == "cuda" else "f32"),
        "prompt_len": a.prompt_len,
        "gen_len": a.gen_len,
        "shapes": {},
    }
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    rng = np.random.default_rng(0)
    for name in shapes:
        s = SHAPES[name]
        prompt = [int(x) for x in rng.integers(3, s.vocab, a.prompt_len)]
        dt = a.dtype or ("f16" if device == "cuda" else "f32")
        folder = make_folder(work, name, dt)
        runs: dict[str, Any] = {}
        for v in variants:
            log(f"{name}: {v}")
            if v.startswith("llmir"):
                art = build_llmir(folder, work / f"{name}-{v}", v.endswith("int4"), a.arch)
                r = run_llmir(art, prompt, a.gen_len, device)
                r["bandwidth_fraction"] = r["bytes_per_token"] * r["decode_tok_s"] / bw
            else:
                r = run_hf(folder, prompt, a.gen_len, device, compiled=v == "hf-compile")
            r["tokens"] = r["tokens"][: a.check_tokens]
            runs[v] = r
        ref = runs.get("hf-eager", {}).get("tokens")
        if ref is not None and "llmir-f16" in runs:
            runs["llmir-f16"]["tokens_agree_with_hf"] = runs["llmir-f16"]["tokens"] == ref
        for v in ("llmir-f16", "llmir-int4"):
            if v in runs:
                for base in ("hf-eager", "hf-compile"):
                    if base in runs:
                        runs[v][f"decode_x_{base}"] = (
                            runs[v]["decode_tok_s"] / runs[base]["decode_tok_s"]
                        )
        result["shapes"][name] = runs
    text = json.dumps(result, indent=2)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        tmp = a.json + ".tmp"
        Path(tmp).write_text(text + "\n")
        os.replace(tmp, a.json)
    print(
        f"{'shape':<14}{'variant':<12}{'TTFT ms':>10}{'tok/s':>10}{'peak MB':>10}{'BW frac':>9}  tokens ok"
    )
    for name, runs in result["shapes"].items():
        for v, r in runs.items():
            pk = f"{r['peak_gpu_bytes'] / 2**20:.0f}" if r.get("peak_gpu_bytes") else "-"
            frac = f"{r['bandwidth_fraction']:.2f}" if "bandwidth_fraction" in r else "-"
            ok = r.get("tokens_agree_with_hf", "")
            print(
                f"{name:<14}{v:<12}{r['ttft_ms']:>10.2f}{r['decode_tok_s']:>10.1f}{pk:>10}{frac:>9}  {ok}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
