"""Import speed and memory for multi-GB models: a safetensors folder and a GGUF file.

Writes a Llama-3-8B-shaped model (bf16 safetensors in 4 shards with an index, ~16 GB; a Q4_0
GGUF with a 128k-token vocabulary, ~4.5 GB) as sparse files — the headers are real, the tensor
bytes are holes, so the files take no disk space — then imports each in a fresh process and
prints the wall time and the peak RSS. Import reads only headers and metadata; the target is
seconds and < 300 MB.

    python benchmarks/llm_import_bench.py [--dir DIR] [--layers 32] [--keep] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN, INTER, HEADS, KV, VOCAB = 4096, 14336, 32, 8, 128256


def tensor_shapes(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    hd = HIDDEN // HEADS
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
            (p + "self_attn.q_proj.weight", (HEADS * hd, HIDDEN)),
            (p + "self_attn.k_proj.weight", (KV * hd, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV * hd, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * hd)),
            (p + "mlp.gate_proj.weight", (INTER, HIDDEN)),
            (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, INTER)),
        ]
    out += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    return out


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def write_sparse_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...]]]) -> int:
    header: dict = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, shape in tensors:
        nbytes = numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        fh.truncate(8 + len(text) + pos)  # a hole: no data written
    return 8 + len(text) + pos


def write_hf_folder(folder: Path, layers: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    tensors = tensor_shapes(layers)
    shards = 4
    per = -(-len(tensors) // shards)
    wmap, total = {}, 0
    for s in range(shards):
        part = tensors[s * per : (s + 1) * per]
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        total += write_sparse_safetensors(folder / name, part)
        wmap.update({t: name for t, _ in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": wmap})
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "vocab_size": VOCAB,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "bos_token_id": 128000,
        "eos_token_id": 128001,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")
    return total


def write_sparse_gguf(path: Path, layers: int) -> int:
    import gguf
    import numpy as np

    q4 = gguf.GGMLQuantizationType.Q4_0
    w = gguf.GGUFWriter(None, "llama")
    for key, val in (
        ("context_length", 131072),
        ("embedding_length", HIDDEN),
        ("block_count", layers),
        ("feed_forward_length", INTER),
        ("attention.head_count", HEADS),
        ("attention.head_count_kv", KV),
    ):
        w.add_uint32(f"llama.{key}", val)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32("llama.rope.freq_base", 500000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list([f"tok{i}" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([f"t{i} o{i}" for i in range(280000)])
    w.add_bos_token_id(128000)
    w.add_eos_token_id(128001)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    total = 0
    for name, shape in tensor_shapes(layers):
        gname = names.get(name) or tmap.get_name(name, try_suffixes=(".weight",))
        if len(shape) == 1:
            nbytes = numel(shape) * 4
            w.add_tensor_info(gname, shape, np.dtype(np.float32), nbytes)
        else:
            nbytes = numel(shape) // 32 * 18
            w.add_tensor_info(gname, shape, np.dtype(np.float32), nbytes, raw_dtype=q4)
        total += gguf.GGUFWriter.ggml_pad(nbytes, w.data_alignment)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fh = w.fout[0]
    end = gguf.GGUFWriter.ggml_pad(fh.tell(), w.data_alignment)
    w.close()
    os.truncate(path, end + total)  # a hole for the tensor data
    return end + total


# Peak RSS is VmHWM: ru_maxrss carries the parent's peak across fork + exec on Linux.
_PEAK = """
def peak_mb():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""
_CHILD = (
    _PEAK
    + """
import sys, time
t = time.perf_counter()
from llmir_core.frontends import import_model
m = import_model(sys.argv[1], out_path=sys.argv[2], require_tokenizer=False)  # a placeholder tokenizer
dt = time.perf_counter() - t
print(f"{dt:.3f} {peak_mb():.1f} {m.op_count()}")
"""
)


def measure(src: Path, out: Path) -> tuple[float, float, int]:
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(src), str(out)], capture_output=True, text=True
    )
    if res.returncode:
        raise SystemExit(res.stderr)
    wall, rss, ops = res.stdout.split()
    return float(wall), float(rss), int(ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="where to write the models (default: a temp folder)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--out", help="write the results as JSON (benchmarks/results/llm_import.json)")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    root = Path(args.dir or tempfile.mkdtemp(prefix="llmir_import_bench_"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        st_size = write_hf_folder(root / "hf", args.layers)
        gg_size = write_sparse_gguf(root / "model.gguf", args.layers)
        print(f"wrote sparse models in {time.perf_counter() - t:.1f} s under {root}")
        base = subprocess.run(
            [sys.executable, "-c", _PEAK + "import llmir_core.frontends; print(peak_mb())"],
            capture_output=True,
            text=True,
        )
        print(
            f"baseline: python + import llmir_core.frontends, peak RSS {float(base.stdout):.0f} MB"
        )
        print(f"{'input':<28} {'size':>9} {'ops':>6} {'import s':>9} {'peak RSS MB':>12}")
        for label, src, size in (
            ("safetensors bf16 (4 shards)", root / "hf", st_size),
            ("GGUF Q4_0 (128k vocab)", root / "model.gguf", gg_size),
        ):
            wall, rss, ops = measure(src, root / (src.stem + ".llmir"))
            flag = "" if rss < 300 else "  (over the 300 MB target)"
            print(f"{label:<28} {size / 2**30:>7.2f}GB {ops:>6} {wall:>9.2f} {rss:>12.1f}{flag}")
            rows.append(
                {"input": label, "bytes": size, "ops": ops, "import_s": wall, "peak_rss_mb": rss}
            )
        if args.out:
            result = {
                "benchmark": "benchmarks/llm_import_bench.py",
                "layers": args.layers,
                "baseline_rss_mb": float(base.stdout),
                "loadavg": os.getloadavg()[0],
                "rows": rows,
            }
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
