"""Decode speed and peak RSS: llmir's onnxruntime decoder build vs onnxruntime-genai's model builder.

The model is SmolLM2-135M-shaped with seeded random weights (hidden 576, 30 layers, 9 heads,
3 KV heads, vocab 49152, intermediate 1536, tied embeddings), generated as a Hugging Face folder
(config.json + model.safetensors + tokenizer.json) under --work. Both tools build from that
folder: llmir (`import_hf` + `build_decoder`, f32 and int4) and onnxruntime-genai
(`python -m onnxruntime_genai.models.builder -p fp32|int4 -e cpu`). Then, batch 1, prompt 128
tokens, generate 128, greedy, --threads intra-op threads:

- every measurement runs in its own worker process, so peak RSS is per tool (VmHWM: unlike
  ru_maxrss, it does not inherit the parent's high-water mark across fork + exec);
- the tools are interleaved round-robin (--rounds rounds, order rotated), because this machine's
  memory bandwidth and the other processes on its two cores change from minute to minute;
- each worker measures the CPU time other processes used during its timed window (from
  /proc/stat); runs where others took more than --busy-limit of a core are marked busy and left
  out of the medians (all runs are kept in --json);
- medians, min-max, and ratios llmir / genai at the same precision are printed.

`--diagnose` looks for where an int4 (or fp32) decode difference against genai comes from, on
the two builds as they are (`--variants llmir-int4,genai-int4`):

- the graphs onnxruntime actually runs: each model is optimized by onnxruntime (level all, as a
  session does) and compared by kernel kind, MatMulNBits attribute sets (bits, block_size,
  accuracy_level, zero points given or not, N x K), the attention op's attributes and inputs,
  the logits' shape, and the rotary caches;
- the step in one process, interleaved in blocks of --block decode steps: llmir's decoder, genai's
  model.onnx driven by the same loop as llmir (I/O binding, shared KV buffers, a bound logits
  buffer: the graph alone), and genai's own Generator (graph + genai's loop). Both the wall time
  and the process CPU time per step are reported: at 1 thread without spinning the CPU time is
  the work done, which a busy machine inflates much less than the wall time. Blocks in which
  other processes used more than --busy-limit cores are left out of the wall-time medians.

`--choices` instead compares llmir's own options in one process, interleaved in blocks of decode
steps (ratios survive a noisy machine better than absolute numbers): intra-op threads 1 vs 2,
MatMulNBits accuracy level 0 (fp32 activations) vs 4 (int8 activations), thread spinning on/off.

Needs `pip install onnxruntime-genai onnx-ir` (onnx-ir: the builder imports it without declaring
it) and torch + transformers (the builder loads the model with them). Run:

    python benchmarks/decode_vs_ortgenai.py --work /tmp/llmir-bench --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("llmir-f32", "genai-fp32", "llmir-int4", "genai-int4")


# -- preparing the model and the builds ------------------------------------------------------------


def prepare(work: Path, threads: int, variants: list[str], log: Any) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from tests.decoder.tiny import SMOLLM2_135M, make_llama_folder

    info: dict[str, Any] = {}
    hf = work / "smollm2-135m-random"
    if not (hf / "model.safetensors").is_file():
        log("generating the SmolLM2-135M-shaped random model ...")
        make_llama_folder(hf, SMOLLM2_135M, seed=0)
    for v in variants:
        out = work / v
        if (out / ("manifest.json" if v.startswith("llmir") else "genai_config.json")).is_file():
            continue
        t0 = time.perf_counter()
        if v.startswith("llmir"):
            log(f"building {v} with llmir ...")
            from llmir_core.frontends.hf import import_hf
            from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

            build_decoder(import_hf(hf), str(out), quant="int4" if v.endswith("int4") else None)
        else:
            log(f"building {v} with onnxruntime-genai's model builder ...")
            precision = v.split("-", 1)[1]
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
                    precision,
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
        info[f"build_s.{v}"] = time.perf_counter() - t0
    for v in variants:
        if v.startswith("genai"):  # genai takes its thread count from genai_config.json
            path = work / v / "genai_config.json"
            cfg = json.loads(path.read_text())
            so = cfg["model"]["decoder"].setdefault("session_options", {})
            so.update({"intra_op_num_threads": threads, "inter_op_num_threads": 1})
            path.write_text(json.dumps(cfg, indent=4))
        data = sum(f.stat().st_size for f in (work / v).glob("model.onnx*"))
        info[f"model_mb.{v}"] = data / 1e6
    return info


# -- one measurement (worker process) ------------------------------------------------------------------


def _cpu_busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs from /proc/stat."""
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _calibrate() -> float:
    """ms for a fixed memory-bound numpy workload (a slow machine shows here too)."""
    a = np.ones(4 << 20, np.float32)
    t = time.perf_counter()
    for _ in range(20):
        float(a.sum())
    return (time.perf_counter() - t) * 1000


class _Llmir:
    def __init__(self, path: str, threads: int) -> None:
        from llmir_core.targets.onnxruntime.runner import open_decoder

        self.dec = open_decoder(path, threads)

    def run(self, prompt: np.ndarray, gen: int) -> tuple[float, float, int]:
        d = self.dec
        d.reserve(len(prompt) + gen)  # as genai sizes its buffers from max_length
        d.reset(1)
        t0 = time.perf_counter()
        logits = d.forward(prompt[None].astype(np.int64))
        t1 = time.perf_counter()
        for _ in range(gen - 1):
            logits = d.forward(np.array([[int(logits[0, -1].argmax())]], np.int64))
        return t1 - t0, time.perf_counter() - t1, gen - 1


class _Genai:
    def __init__(self, path: str, threads: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(path)

    def run(self, prompt: np.ndarray, gen: int) -> tuple[float, float, int]:
        og = self.og
        p = og.GeneratorParams(self.model)
        n = len(prompt) + gen
        p.set_search_options(max_length=n, min_length=n, do_sample=False)
        g = og.Generator(self.model, p)
        t0 = time.perf_counter()
        g.append_tokens(prompt.astype(np.int32))  # the prefill runs here
        t1 = time.perf_counter()
        g.generate_next_token()  # picks token 1 from the prefill's logits (no model run)
        t2 = time.perf_counter()
        steps = 0
        while not g.is_done():
            g.generate_next_token()  # one model run on the previous token, then a pick
            steps += 1
        return t1 - t0, time.perf_counter() - t2, steps


def worker(variant: str, path: str, threads: int, prompt_len: int, gen_len: int) -> dict[str, Any]:
    prompt = np.random.default_rng(0).integers(3, 49152, prompt_len)
    t = time.perf_counter()
    runner = _Llmir(path, threads) if variant.startswith("llmir") else _Genai(path, threads)
    load_s = time.perf_counter() - t
    runner.run(prompt[:16], 8)  # warm-up: first-call allocations and prepacking
    calib = _calibrate()
    busy0, tot0 = _cpu_busy_jiffies()
    own0 = sum(os.times()[:2])
    w0 = time.perf_counter()
    prefill_s, decode_s, steps = runner.run(prompt, gen_len)
    wall = time.perf_counter() - w0
    busy1, tot1 = _cpu_busy_jiffies()
    own = sum(os.times()[:2]) - own0
    hz = os.sysconf("SC_CLK_TCK")
    others = max(0.0, (busy1 - busy0) / hz - own)  # CPU seconds other processes used meanwhile
    return {
        "variant": variant,
        "prefill_ms": prefill_s * 1000,
        "decode_tok_s": steps / decode_s,
        "decode_steps": steps,
        "load_s": load_s,
        "peak_rss_mb": _peak_rss_mb(),
        "others_cores": others / wall,
        "calib_ms": calib,
        "loadavg": os.getloadavg()[0],
    }


# -- the comparison ----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--work", default="/tmp/llmir-bench", help="folder for the model and the builds"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--busy-limit",
        type=float,
        default=0.15,
        help="a run is busy when other processes used more than this many cores",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        help="before each run, wait up to this many seconds for a quiet second",
    )
    ap.add_argument("--json", help="write every run and the summary here")
    ap.add_argument("--choices", action="store_true", help="compare llmir's own build/run options")
    ap.add_argument(
        "--diagnose",
        action="store_true",
        help="llmir vs genai: the optimized graphs compared, and decode steps interleaved in one process",
    )
    ap.add_argument("--block", type=int, default=8, help="with --diagnose: steps per timed block")
    ap.add_argument("--blocks", type=int, default=12, help="with --diagnose: blocks per runner")
    ap.add_argument(
        "--spin", type=int, default=0, help="with --diagnose: 1 = pool threads spin (as genai's do)"
    )
    ap.add_argument(
        "--only", default="", help="with --choices: run the comparisons whose title has this"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = Path(a.work)
    if a.choices:
        choices(work, a)
        return
    if a.diagnose:
        diagnose(work, a)
        return
    if a.worker:
        print(
            json.dumps(worker(a.worker, str(work / a.worker), a.threads, a.prompt_len, a.gen_len))
        )
        return
    variants = [v for v in a.variants.split(",") if v]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    work.mkdir(parents=True, exist_ok=True)
    info = prepare(work, a.threads, variants, log)
    runs: list[dict[str, Any]] = []
    for r in range(a.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            if a.wait_idle:
                wait_idle(a.wait_idle, a.busy_limit)
            p = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--work",
                    str(work),
                    "--worker",
                    v,
                    "--threads",
                    str(a.threads),
                    "--prompt-len",
                    str(a.prompt_len),
                    "--gen-len",
                    str(a.gen_len),
                ],
                capture_output=True,
                text=True,
            )
            if p.returncode:
                raise SystemExit(f"worker {v} failed:\n{p.stderr[-3000:]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            res["round"] = r
            res["busy"] = res["others_cores"] > a.busy_limit
            runs.append(res)
            log(
                f"round {r + 1}/{a.rounds} {v:11s} decode {res['decode_tok_s']:6.1f} tok/s  prefill "
                f"{res['prefill_ms']:6.1f} ms  rss {res['peak_rss_mb']:5.0f} MB  others {res['others_cores']:.2f} "
                f"cores{'  BUSY' if res['busy'] else ''}"
            )
    summary = summarize(runs, variants)
    print_table(summary, a, info)
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {"config": vars(a), "info": info, "runs": runs, "summary": summary}, indent=2
            )
        )


def wait_idle(limit_s: float, busy_limit: float) -> float:
    """Wait (at most limit_s) for one second in which all processes together use less than
    busy_limit cores; returns the last second's busy cores."""
    hz = os.sysconf("SC_CLK_TCK")
    end = time.monotonic() + limit_s
    while True:
        b0, _ = _cpu_busy_jiffies()
        time.sleep(1.0)
        b1, _ = _cpu_busy_jiffies()
        busy = (b1 - b0) / hz
        if busy < busy_limit or time.monotonic() > end:
            return busy


def choices(work: Path, a: argparse.Namespace) -> None:
    """Interleaved decode-speed comparison of llmir options (one process, same prompt)."""
    from llmir_core.frontends.hf import import_hf
    from llmir_core.targets.onnxruntime.runner import open_decoder
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    prepare(work, a.threads, ["llmir-f32", "llmir-int4"], lambda m: print(m, file=sys.stderr))
    for name, kw in (
        ("llmir-int4-acc0", {"quant": "int4", "accuracy_level": 0}),
        ("llmir-int8", {"quant": "int8"}),
    ):
        if not (work / name / "manifest.json").is_file():
            build_decoder(import_hf(work / "smollm2-135m-random"), str(work / name), **kw)
    sets = {
        "threads (f32)": {
            "f32 2 threads": ("llmir-f32", 2, None),
            "f32 1 thread": ("llmir-f32", 1, None),
        },
        "threads (int4)": {
            "int4 2 threads": ("llmir-int4", 2, None),
            "int4 1 thread": ("llmir-int4", 1, None),
        },
        "accuracy level (int4, 2 threads)": {
            "int4 acc 4": ("llmir-int4", 2, None),
            "int4 acc 0": ("llmir-int4-acc0", 2, None),
            "int8 acc 4": ("llmir-int8", 2, None),
        },
        "spinning (int4, 2 threads)": {
            "spin on": ("llmir-int4", 2, True),
            "spin off": ("llmir-int4", 2, False),
        },
    }
    prompt = np.random.default_rng(0).integers(3, 49152, a.prompt_len)
    for title, variants in sets.items():
        if a.only not in title:
            continue
        decs = {
            k: open_decoder(str(work / d), t, spin=spin) for k, (d, t, spin) in variants.items()
        }
        state = {}
        for k, d in decs.items():
            d.reserve(a.prompt_len + a.gen_len * a.rounds + 16)
            d.reset(1)
            state[k] = d.forward(prompt[None])
        times: dict[str, list[float]] = {k: [] for k in decs}
        for _ in range(a.rounds):
            for k, d in decs.items():  # blocks of 16 steps, alternating
                logits = state[k]
                t = time.perf_counter()
                for _ in range(16):
                    logits = d.forward(np.array([[int(logits[0, -1].argmax())]], np.int64))
                times[k].append(16 / (time.perf_counter() - t))
                state[k] = logits
        base = statistics.median(next(iter(times.values())))
        print(
            f"{title}: "
            + ", ".join(
                f"{k} {statistics.median(v):.1f} tok/s ({statistics.median(v) / base:.2f}x)"
                for k, v in times.items()
            )
            + f"  [load {os.getloadavg()[0]:.1f}]"
        )
        del decs


# -- --diagnose: the same graph? the same step? ------------------------------------------------------


def optimized_graph(path: Path) -> Any:
    """The model onnxruntime runs (graph optimization level all), loaded without its weights."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        so.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "opt.data"
        )
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        return onnx.load(str(Path(tmp) / "opt.onnx"), load_external_data=False)


def graph_summary(model: Any) -> dict[str, Any]:
    """Kernel counts and the attributes that pick the kernels' code paths."""
    from collections import Counter

    import onnx

    g = model.graph
    shapes = {i.name: [int(d) for d in i.dims] for i in g.initializer}
    kinds = Counter(f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in g.node)
    matmuls: Counter[str] = Counter()
    attention: Counter[str] = Counter()
    for n in g.node:
        at = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "MatMulNBits":
            zp = len(n.input) > 3 and bool(n.input[3])
            matmuls[
                f"bits={at.get('bits', 4)} block={at['block_size']} acc={at.get('accuracy_level', 0)} "
                f"zero_points={'yes' if zp else 'no'} NxK={at['N']}x{at['K']}"
            ] += 1
        elif n.op_type in ("GroupQueryAttention", "Attention", "MultiHeadAttention"):
            given = [i for i, x in enumerate(n.input) if x]
            keep = {k: v for k, v in at.items() if k not in ("scale",)}
            attention[f"{n.op_type} {sorted(keep.items())} inputs={given}"] += 1
    rotary = {i.name: shapes[i.name] for i in g.initializer if "cos" in i.name or "sin" in i.name}
    logits = [
        [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
        for o in g.output
        if o.name == "logits"
    ]
    kv = [i.name for i in g.input if "past" in i.name]
    return {
        "nodes": len(g.node),
        "kinds": dict(sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
        "matmul_nbits": dict(sorted(matmuls.items())),
        "attention": dict(attention),
        "rotary_caches": rotary,
        "logits_shape": logits[0] if logits else None,
        "kv_inputs": len(kv),
    }


class _StepRunner:
    """One decode loop, timed in blocks: start() prefills, step() decodes one token."""

    def start(self, prompt: np.ndarray, capacity: int) -> None: ...

    def step(self) -> None: ...


class _LlmirSteps(_StepRunner):
    def __init__(self, path: Path, threads: int, spin: bool) -> None:
        from llmir_core.targets.onnxruntime.runner import open_decoder

        self.dec = open_decoder(str(path), threads, spin=spin)

    def start(self, prompt: np.ndarray, capacity: int) -> None:
        self.dec.reserve(capacity)
        self.dec.reset(1)
        self.tok = int(self.dec.forward(prompt[None].astype(np.int64))[0, -1].argmax())

    def step(self) -> None:
        logits = self.dec.forward(np.array([[self.tok]], np.int64))
        self.tok = int(logits[0, -1].argmax())


class _GenaiGraphSteps(_StepRunner):
    """genai's model.onnx through llmir's kind of loop: shared KV buffers bound in and out,
    one-token input and logits buffers bound once, the attention mask a view of a ones row."""

    def __init__(self, path: Path, threads: int, spin: bool) -> None:
        import onnxruntime as ort

        from llmir_core.targets.onnxruntime.runner import session_options

        self.ort = ort
        self.sess = ort.InferenceSession(
            str(path / "model.onnx"),
            session_options(threads, spin),
            providers=["CPUExecutionProvider"],
        )
        self.past = [i for i in self.sess.get_inputs() if i.name.startswith("past_key_values")]
        cfg = json.loads((path / "genai_config.json").read_text())["model"]
        self.vocab = int(cfg["vocab_size"])
        self.head_dim = int(cfg["decoder"]["head_size"])

    def start(self, prompt: np.ndarray, capacity: int) -> None:
        ort = self.ort
        io = self.io = self.sess.io_binding()
        self.buffers = []
        for i in self.past:
            buf = np.zeros((1, int(i.shape[1]), capacity, self.head_dim), np.float32)
            v = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(i.name, v)
            io.bind_ortvalue_output(i.name.replace("past_key_values", "present"), v)
            self.buffers.append(buf)
        self.mask = np.ones((1, capacity), np.int64)
        n = len(prompt)
        io.bind_cpu_input("input_ids", prompt[None].astype(np.int64))
        io.bind_cpu_input("attention_mask", self.mask[:, :n])
        first = np.empty((1, n, self.vocab), np.float32)
        io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(first))
        self.sess.run_with_iobinding(io)
        self.tok, self.n = int(first[0, -1].argmax()), n
        self.ids = np.zeros((1, 1), np.int64)
        self.logits = np.empty((1, 1, self.vocab), np.float32)
        io.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(self.ids))
        io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self.logits))

    def step(self) -> None:
        self.ids[0, 0] = self.tok
        self.n += 1
        self.io.bind_cpu_input("attention_mask", self.mask[:, : self.n])
        self.sess.run_with_iobinding(self.io)
        self.tok = int(self.logits[0, -1].argmax())


class _GenaiSteps(_StepRunner):
    def __init__(self, path: Path, threads: int, spin: bool) -> None:
        import onnxruntime_genai as og

        self.og = og
        cfg = og.Config(str(path))
        cfg.clear_providers()
        so: dict[str, Any] = {
            "intra_op_num_threads": threads,
            "inter_op_num_threads": 1,
            # genai passes unknown string keys to onnxruntime as session config entries
            "session.intra_op.allow_spinning": "1" if spin else "0",
        }
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": so}}}))
        self.model = og.Model(cfg)

    def start(self, prompt: np.ndarray, capacity: int) -> None:
        p = self.og.GeneratorParams(self.model)
        p.set_search_options(max_length=capacity, min_length=capacity, do_sample=False)
        self.gen = self.og.Generator(self.model, p)
        self.gen.append_tokens(prompt.astype(np.int32))
        self.gen.generate_next_token()

    def step(self) -> None:
        self.gen.generate_next_token()


def diagnose(work: Path, a: argparse.Namespace) -> None:
    """Same graph? Same step time? (See the module docstring.)"""
    variants = [v for v in a.variants.split(",") if v]
    mine = next((v for v in variants if v.startswith("llmir")), "llmir-int4")
    peer = next((v for v in variants if v.startswith("genai")), "genai-int4")
    prepare(work, a.threads, [mine, peer], lambda m: print(m, file=sys.stderr))
    graphs = {
        mine: graph_summary(optimized_graph(work / mine / "model.onnx")),
        peer: graph_summary(optimized_graph(work / peer / "model.onnx")),
    }
    print(f"graphs onnxruntime runs (optimized, level all): {mine} vs {peer}")
    for key in ("nodes", "logits_shape", "kv_inputs", "rotary_caches"):
        print(f"  {key:14s} {graphs[mine][key]!s:40s} {graphs[peer][key]!s}")
    for key in ("kinds", "matmul_nbits", "attention"):
        names = sorted(set(graphs[mine][key]) | set(graphs[peer][key]))
        for n in names:
            x, y = graphs[mine][key].get(n, 0), graphs[peer][key].get(n, 0)
            print(f"  {x:4d} {y:4d}{'  ' if x == y else ' *'} {n}")
    spin = bool(a.spin)
    runners: dict[str, _StepRunner] = {
        mine: _LlmirSteps(work / mine, a.threads, spin),
        f"{peer} graph, llmir's loop": _GenaiGraphSteps(work / peer, a.threads, spin),
    }
    try:
        runners[f"{peer} (its Generator)"] = _GenaiSteps(work / peer, a.threads, spin)
    except ImportError:
        print("onnxruntime-genai is not installed: its Generator is left out", file=sys.stderr)
    prompt = np.random.default_rng(0).integers(3, 49152, a.prompt_len)
    per_start = 4  # blocks decoded per prefill (the cache length stays near the prompt's)
    capacity = a.prompt_len + per_start * a.block + 2
    wall: dict[str, list[float]] = {k: [] for k in runners}
    cpu: dict[str, list[float]] = {k: [] for k in runners}
    hz = os.sysconf("SC_CLK_TCK")
    dropped = 0
    for b in range(a.blocks):
        if b % per_start == 0:
            for r in runners.values():
                r.start(prompt, capacity)
        names = list(runners)
        names = names[b % len(names) :] + names[: b % len(names)]
        got: dict[str, tuple[float, float]] = {}
        busy0, _ = _cpu_busy_jiffies()
        own0 = sum(os.times()[:2])
        w0 = time.perf_counter()
        for k in names:
            c, t = time.process_time(), time.perf_counter()
            for _ in range(a.block):
                runners[k].step()
            got[k] = ((time.perf_counter() - t) / a.block, (time.process_time() - c) / a.block)
        others = ((_cpu_busy_jiffies()[0] - busy0) / hz - (sum(os.times()[:2]) - own0)) / (
            time.perf_counter() - w0
        )
        for k, (w, c) in got.items():
            cpu[k].append(c)
            if others <= a.busy_limit:
                wall[k].append(w)
        dropped += others > a.busy_limit
    print(
        f"\ndecode steps, {a.threads} thread(s), spin {'on' if spin else 'off'}, prompt {a.prompt_len}, "
        f"{a.blocks} blocks of {a.block} steps interleaved ({dropped} busy blocks left out of the "
        f"wall times), load average {os.getloadavg()[0]:.1f}"
    )
    base_c = statistics.median(cpu[mine])
    for k in runners:
        wm = statistics.median(wall[k]) * 1e3 if wall[k] else float("nan")
        cm = statistics.median(cpu[k]) * 1e3
        print(
            f"  {k:34s} wall {wm:7.2f} ms/step   cpu {cm:7.2f} ms/step   "
            f"llmir cpu / this cpu {base_c * 1e3 / cm:.3f}"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "config": vars(a),
                    "graphs": graphs,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "dropped_blocks": dropped,
                    "load_average": os.getloadavg()[0],
                },
                indent=2,
            )
        )


def summarize(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in variants:
        mine = [r for r in runs if r["variant"] == v]
        clean = [r for r in mine if not r["busy"]] or mine  # all busy: use them, say so
        tps = [r["decode_tok_s"] for r in clean]
        out[v] = {
            "decode_tok_s": statistics.median(tps),
            "decode_min": min(tps),
            "decode_max": max(tps),
            "prefill_ms": statistics.median(r["prefill_ms"] for r in clean),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in mine),
            "clean_runs": sum(1 for r in mine if not r["busy"]),
            "runs": len(mine),
        }
    for prec, (mine, peer) in {
        "fp32": ("llmir-f32", "genai-fp32"),
        "int4": ("llmir-int4", "genai-int4"),
    }.items():
        if mine in out and peer in out:
            out[f"ratio.{prec}"] = {
                "decode": out[mine]["decode_tok_s"] / out[peer]["decode_tok_s"],
                "prefill": out[peer]["prefill_ms"] / out[mine]["prefill_ms"],
                "rss": out[mine]["peak_rss_mb"] / out[peer]["peak_rss_mb"],
                # per round, the same round's runs compared (robust to drift between rounds)
                "decode_paired_median": _paired(mine, peer, out, runs),
            }
    return out


def _paired(mine: str, peer: str, out: dict[str, Any], runs: list[dict[str, Any]]) -> float | None:
    ratios = []
    for r in {x["round"] for x in runs}:
        a = [x for x in runs if x["round"] == r and x["variant"] == mine and not x["busy"]]
        b = [x for x in runs if x["round"] == r and x["variant"] == peer and not x["busy"]]
        if a and b:
            ratios.append(a[0]["decode_tok_s"] / b[0]["decode_tok_s"])
    return statistics.median(ratios) if ratios else None


def print_table(s: dict[str, Any], a: argparse.Namespace, info: dict[str, Any]) -> None:
    print(
        f"\nSmolLM2-135M-shaped random model, batch 1, prompt {a.prompt_len}, generate {a.gen_len}, "
        f"{a.threads} threads, {a.rounds} interleaved rounds (medians of non-busy runs)"
    )
    print(
        f"{'variant':12s} {'decode tok/s':>13s} {'(min-max)':>15s} {'prefill ms':>11s} {'peak RSS MB':>12s} "
        f"{'files MB':>9s} {'clean':>6s}"
    )
    for v, r in s.items():
        if v.startswith("ratio"):
            continue
        print(
            f"{v:12s} {r['decode_tok_s']:13.1f} {r['decode_min']:7.1f}-{r['decode_max']:<7.1f} {r['prefill_ms']:11.1f} "
            f"{r['peak_rss_mb']:12.0f} {info.get(f'model_mb.{v}', 0):9.0f} {r['clean_runs']:>3d}/{r['runs']}"
        )
    for k, r in s.items():
        if k.startswith("ratio"):
            paired = f"{r['decode_paired_median']:.2f}" if r["decode_paired_median"] else "n/a"
            print(
                f"llmir / genai {k.split('.')[1]}: decode {r['decode']:.2f}x (paired per round {paired}x), "
                f"prefill speed {r['prefill']:.2f}x, peak RSS {r['rss']:.2f}x"
            )


if __name__ == "__main__":
    main()
