"""`llmir bench ARTIFACT --vs PEER`: llmir side by side with other runtimes on the same weights.

Peers (each needs its own package, the `bench` extra; none is needed to run llmir):

- `ort-genai:DIR`: an onnxruntime-genai model folder (`onnxruntime_genai.models.builder` output);
- `transformers:DIR`: a Hugging Face folder, run by transformers on torch (f32);
- `llama.cpp:FILE.gguf`: a GGUF file, run by llama-cpp-python.

Every tool gets the same prompt token ids (seeded random ids in [3, vocab)) and decodes greedily
for `gen_len` tokens, with the same intra-op thread count. Each measurement runs in a fresh
process (`python -m llmir_core.runtime.peers`), so peak RSS (VmHWM) and load time are the tool's
own; the tools are interleaved run by run (order rotated each round) because this machine's speed
drifts. A worker imports the tool's libraries (timed apart: import_s), loads the model (load_s),
warms up on a short prompt, then times one generation: prefill (the prompt's forward), time to
first token (prefill + picking it), decode tok/s (tokens after the first over their time), and
measures the CPU other processes took meanwhile
(/proc/stat): runs where that exceeds `busy_limit` cores are marked busy and left out of the
medians when clean runs exist. Greedy agreement: whether each peer's first `agree` generated
tokens equal llmir's.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from llmir_core import tracing
from llmir_core.errors import InputError

PEERS_SCHEMA = 1
KINDS = {
    "ort-genai": ("onnxruntime_genai", "pip install onnxruntime-genai"),
    "transformers": ("transformers", "pip install torch transformers"),
    "llama.cpp": ("llama_cpp", "pip install llama-cpp-python"),
}
_LIBS = {
    "llmir": (
        "onnxruntime",
        "llmir_core.targets.onnxruntime.runner",
        "llmir_core.targets.onnxruntime.session",
    ),
    "ort-genai": ("onnxruntime_genai",),
    "transformers": ("torch", "transformers"),
    "llama.cpp": ("llama_cpp",),
}
METRICS = ("prefill_ms", "ttft_ms", "decode_tok_s", "peak_rss_mb", "load_s", "import_s")


@dataclass(frozen=True)
class Peer:
    kind: str  # "llmir" or one of KINDS
    path: str

    @property
    def label(self) -> str:
        return (
            "llmir"
            if self.kind == "llmir"
            else f"{self.kind}:{os.path.basename(self.path.rstrip('/'))}"
        )


def parse_peer(spec: str) -> Peer:
    """`KIND:PATH` -> Peer; InputError for an unknown kind or a missing path."""
    kind, sep, path = spec.partition(":")
    if not sep or not path:
        raise InputError(
            f"--vs {spec}: expected KIND:PATH",
            hint="peers: " + ", ".join(f"{k}:PATH" for k in KINDS),
        )
    if kind not in KINDS:
        raise InputError(
            f"--vs {spec}: unknown peer '{kind}' (known: {', '.join(KINDS)})",
            hint="e.g. --vs transformers:./SmolLM2-135M --vs llama.cpp:smol.gguf",
        )
    if not os.path.exists(path):
        raise InputError(f"--vs {spec}: {path}: no such file or folder")
    if kind == "llama.cpp" and not os.path.isfile(path):
        raise InputError(f"--vs {spec}: llama.cpp takes a .gguf file")
    if kind in ("ort-genai", "transformers") and not os.path.isdir(path):
        raise InputError(f"--vs {spec}: {kind} takes a model folder")
    return Peer(kind, os.path.abspath(path))


# -- the worker (one fresh process per measurement) ----------------------------------------------


def _busy_jiffies() -> int:
    with open("/proc/stat", encoding="ascii") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    return sum(parts) - parts[3] - (parts[4] if len(parts) > 4 else 0)


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM; unlike ru_maxrss it is not inherited across fork + exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _decoder_manifest(art_dir: str) -> dict[str, Any]:
    """The artifact's manifest, its files checked, with a decoder section."""
    from llmir_core.artifact_check import decoder_section, open_checked

    manifest = open_checked(art_dir)
    decoder_section(art_dir, manifest)
    return manifest


class _Runner(Protocol):
    """A loaded model; `run(ids, gen)` -> (prefill_s, ttft_s, decode_s, generated ids)."""

    def run(self, ids: list[int], gen: int) -> tuple[float, float, float, list[int]]: ...


class _LlmirRunner:
    def __init__(self, path: str, threads: int) -> None:
        from llmir_core.targets import open_artifact

        self.dec = open_artifact(path, threads=threads)

    def run(self, ids: list[int], gen: int) -> tuple[float, float, float, list[int]]:
        d = self.dec
        d.reserve(len(ids) + gen)
        d.reset(1)
        t0 = time.perf_counter()
        logits = d.forward(np.asarray([ids], np.int64))
        t1 = time.perf_counter()
        out = [int(logits[0, -1].argmax())]
        t2 = time.perf_counter()
        for _ in range(gen - 1):
            logits = d.forward(np.asarray([[out[-1]]], np.int64))
            out.append(int(logits[0, -1].argmax()))
        return t1 - t0, t2 - t0, time.perf_counter() - t2, out


class _GenaiRunner:
    def __init__(self, path: str, threads: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        cfg = og.Config(path)
        cfg.clear_providers()  # CPU
        if (
            threads
        ):  # the same thread count as the others (without editing the folder's genai_config.json)
            so = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
            cfg.overlay(json.dumps({"model": {"decoder": {"session_options": so}}}))
        self.model = og.Model(cfg)

    def run(self, ids: list[int], gen: int) -> tuple[float, float, float, list[int]]:
        og = self.og
        p = og.GeneratorParams(self.model)
        n = len(ids) + gen
        p.set_search_options(max_length=n, min_length=n, do_sample=False)
        g = og.Generator(self.model, p)
        t0 = time.perf_counter()
        g.append_tokens(np.asarray(ids, np.int32))  # the prefill runs here
        t1 = time.perf_counter()
        g.generate_next_token()  # picks token 1 from the prefill's logits
        t2 = time.perf_counter()
        while not g.is_done():
            g.generate_next_token()
        seq = [int(x) for x in g.get_sequence(0)]
        return t1 - t0, t2 - t0, time.perf_counter() - t2, seq[len(ids) : len(ids) + gen]


class _TransformersRunner:
    def __init__(self, path: str, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def run(self, ids: list[int], gen: int) -> tuple[float, float, float, list[int]]:
        torch = self.torch
        x = torch.tensor([ids], dtype=torch.long)
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(input_ids=x, use_cache=True)
            t1 = time.perf_counter()
            tok = int(out.logits[0, -1].argmax())
            t2 = time.perf_counter()
            toks = [tok]
            past = out.past_key_values
            for _ in range(gen - 1):
                out = self.model(
                    input_ids=torch.tensor([[toks[-1]]]), past_key_values=past, use_cache=True
                )
                past = out.past_key_values
                toks.append(int(out.logits[0, -1].argmax()))
            return t1 - t0, t2 - t0, time.perf_counter() - t2, toks


class _LlamaCppRunner:
    def __init__(self, path: str, threads: int, n_ctx: int) -> None:
        import llama_cpp

        self.lc = llama_cpp
        n = threads or os.cpu_count() or 1
        self.llm = llama_cpp.Llama(
            model_path=path,
            n_ctx=n_ctx,
            n_batch=max(32, n_ctx),
            n_threads=n,
            n_threads_batch=n,
            verbose=False,
        )
        self.vocab = self.llm.n_vocab()

    def _last_logits(self) -> np.ndarray:
        ptr = self.lc.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab,))

    def run(self, ids: list[int], gen: int) -> tuple[float, float, float, list[int]]:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(ids)
        t1 = time.perf_counter()
        toks = [int(self._last_logits().argmax())]
        t2 = time.perf_counter()
        for _ in range(gen - 1):
            self.llm.eval([toks[-1]])
            toks.append(int(self._last_logits().argmax()))
        return t1 - t0, t2 - t0, time.perf_counter() - t2, toks


def _runner(kind: str, path: str, threads: int, n_ctx: int) -> _Runner:
    if kind == "llmir":
        return _LlmirRunner(path, threads)
    if kind == "ort-genai":
        return _GenaiRunner(path, threads)
    if kind == "transformers":
        return _TransformersRunner(path, threads)
    if kind == "llama.cpp":
        return _LlamaCppRunner(path, threads, n_ctx)
    raise InputError(f"unknown peer kind {kind}")


def worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """One measurement in this process: load, warm up, then one timed greedy generation."""
    kind, ids, gen = cfg["kind"], [int(x) for x in cfg["ids"]], int(cfg["gen_len"])
    module, hint = KINDS.get(kind, ("onnxruntime", "pip install onnxruntime"))
    t = time.perf_counter()
    try:  # libraries are imported before the load is timed (the load is the model's, for every tool)
        for name in _LIBS[kind]:
            importlib.import_module(name)
        if kind == "transformers":
            from transformers import AutoModelForCausalLM  # noqa: F401  (a lazy module: resolve it now)
    except ImportError:
        raise InputError(f"peer {kind} needs the `{module}` package", hint=hint) from None
    import_s = time.perf_counter() - t
    t = time.perf_counter()
    runner = _runner(kind, cfg["path"], int(cfg["threads"]), len(ids) + gen + 8)
    load_s = time.perf_counter() - t
    runner.run(ids[: min(16, len(ids))], min(8, gen))  # first-call allocations, weight prepacking
    hz = os.sysconf("SC_CLK_TCK")
    b0, own0, w0 = _busy_jiffies(), sum(os.times()[:2]), time.perf_counter()
    prefill_s, ttft_s, decode_s, toks = runner.run(ids, gen)
    wall = time.perf_counter() - w0
    others = max(0.0, (_busy_jiffies() - b0) / hz - (sum(os.times()[:2]) - own0))
    steps = len(toks) - 1
    return {
        "prefill_ms": prefill_s * 1e3,
        "ttft_ms": ttft_s * 1e3,
        "decode_tok_s": steps / decode_s if decode_s > 0 and steps else None,
        "peak_rss_mb": peak_rss_mb(),
        "load_s": load_s,
        "import_s": import_s,
        "tokens": toks,
        "others_cores": others / wall if wall > 0 else 0.0,
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        # llmir's pool threads spin only on an idle machine (ort_decoder.auto_spin); the peers'
        # do by default (onnxruntime spins, llama.cpp polls): a run without it is not like for like
        "spin": getattr(getattr(runner, "dec", None), "spin", None),
    }


def _main() -> None:
    """`python -m llmir_core.runtime.peers` reads the worker's config (JSON) on stdin and prints
    one JSON line: the measurement, or {"error": ..., "hint": ...}."""
    cfg = json.loads(sys.stdin.read())
    try:
        out: dict[str, Any] = worker(cfg)
    except InputError as exc:
        out = {"error": exc.message, "hint": exc.hint}
    except Exception as exc:  # a peer library's own failure: reported as that peer's error
        out = {
            "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        }
    sys.stdout.write(json.dumps(out) + "\n")


# -- the comparison --------------------------------------------------------------------------------


@dataclass
class VsResult:
    config: dict[str, Any]
    tools: list[Peer]
    runs: list[dict[str, Any]] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        agree = int(self.config["agree"])
        ref: list[int] = next((r["tokens"] for r in self.runs if r["tool"] == "llmir"), [])
        for t in self.tools:
            mine = [r for r in self.runs if r["tool"] == t.label]
            clean = [r for r in mine if not r["busy"]]
            use = clean or mine
            s: dict[str, Any] = {
                "kind": t.kind,
                "path": t.path,
                "runs": len(mine),
                "clean_runs": len(clean),
            }
            for m in METRICS:
                vals = [r[m] for r in use if r.get(m) is not None]
                s[m] = statistics.median(vals) if vals else None
            toks = mine[0]["tokens"] if mine else []
            s["first_tokens"] = toks[:agree]
            first_diff = next(
                (i for i, (a, b) in enumerate(zip(toks[:agree], ref[:agree])) if a != b), None
            )
            s["agrees"] = first_diff is None and len(toks) >= min(agree, len(ref))
            s["first_difference"] = first_diff
            out[t.label] = s
        base = out.get("llmir", {})
        for s in out.values():
            s["ratio_to_llmir"] = {
                m: (s[m] / base[m] if s.get(m) and base.get(m) else None) for m in METRICS
            }
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "peers_schema": PEERS_SCHEMA,
            "config": self.config,
            "summary": self.summary(),
            "runs": self.runs,
            "fingerprint": self.fingerprint,
        }


def _spawn(
    peer: Peer, ids: list[int], gen_len: int, threads: int, timeout: float
) -> dict[str, Any]:
    cfg = {"kind": peer.kind, "path": peer.path, "ids": ids, "gen_len": gen_len, "threads": threads}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads or os.cpu_count() or 1)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "llmir_core.runtime.peers"],
            input=json.dumps(cfg),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise InputError(f"{peer.label}: no result within {timeout:.0f} s") from None
    lines = p.stdout.strip().splitlines()
    try:
        res = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        res = None
    if not isinstance(res, dict):
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise InputError(f"{peer.label}: the worker failed (exit {p.returncode}): {tail}")
    if "error" in res:
        raise InputError(f"{peer.label}: {res['error']}", hint=res.get("hint"))
    return res


def compare(
    art_dir: str,
    peers: list[Peer],
    *,
    prompt_len: int = 128,
    gen_len: int = 128,
    runs: int = 3,
    threads: int | None = None,
    seed: int = 0,
    agree: int = 16,
    busy_limit: float = 0.25,
    timeout: float = 1800.0,
    progress: Callable[[str], None] | None = None,
) -> VsResult:
    # long: checks, then the interleaved fresh-process rounds and their table, read in one place
    """Interleaved, fresh-process runs of llmir (the artifact) and each peer on the same prompt ids."""
    from llmir_core.runtime.bench import hardware_fingerprint
    from llmir_core.runtime.cpu_load import resolve_threads

    for flag, v in (("--prompt-len", prompt_len), ("--gen-len", gen_len), ("--runs", runs)):
        if v < 1:
            raise InputError(f"{flag} must be >= 1, got {v}")
    if not peers:
        raise InputError("no peer given", hint="--vs KIND:PATH, KIND one of " + ", ".join(KINDS))
    manifest = _decoder_manifest(art_dir)
    dec = manifest["decoder"]
    ctx = dec.get("max_len")
    if ctx is not None and prompt_len + gen_len > ctx:
        raise InputError(
            f"--prompt-len + --gen-len = {prompt_len + gen_len} exceeds the model's context of {ctx}"
        )
    n_threads = resolve_threads(threads)
    vocab = int(dec["vocab"])
    ids = [
        int(x) for x in np.random.default_rng(seed).integers(min(3, vocab - 1), vocab, prompt_len)
    ]
    tools = [Peer("llmir", os.path.abspath(art_dir)), *peers]
    labels = [t.label for t in tools]
    if len(set(labels)) != len(labels):
        raise InputError(
            "the same peer is given twice: "
            + ", ".join(sorted({x for x in labels if labels.count(x) > 1}))
        )
    res = VsResult(
        {
            "prompt_len": prompt_len,
            "gen_len": gen_len,
            "runs": runs,
            "threads": n_threads,
            "seed": seed,
            "agree": agree,
            "busy_limit": busy_limit,
            "prompt_ids": ids,
        },
        tools,
    )
    for r in range(runs):
        order = tools[r % len(tools) :] + tools[: r % len(tools)]
        for t in order:
            if progress:
                progress(f"run {r + 1}/{runs}: {t.label}")
            with tracing.span(
                "peer run",
                {
                    "llmir.peer": t.label,
                    "llmir.bench.run": r + 1,
                    "llmir.threads": n_threads,
                    "gen_ai.usage.input_tokens": prompt_len,
                },
            ) as sp:
                out = _spawn(t, ids, gen_len, n_threads, timeout)
                out.update({"tool": t.label, "round": r, "busy": out["others_cores"] > busy_limit})
                sp.set(
                    {
                        "gen_ai.usage.output_tokens": len(out["tokens"]),
                        "gen_ai.server.time_to_first_token": out["ttft_ms"] / 1e3,
                        "llmir.decode.tokens_per_s": out["decode_tok_s"],
                        "llmir.peak_rss_mb": out["peak_rss_mb"],
                        "llmir.busy": out["busy"],
                    }
                )
            res.runs.append(out)
    res.fingerprint = {
        **hardware_fingerprint(),
        "artifact": os.path.basename(os.path.abspath(art_dir)),
        "weights": (dec.get("quant") or {}).get("f32_weights"),
        "peer_versions": _versions([t.kind for t in peers]),
    }
    return res


def _versions(kinds: list[str]) -> dict[str, str | None]:
    from importlib import metadata

    dists = {
        "ort-genai": "onnxruntime-genai",
        "transformers": "transformers",
        "llama.cpp": "llama-cpp-python",
    }
    out: dict[str, str | None] = {}
    for k in kinds:
        try:
            out[k] = metadata.version(dists[k])
        except metadata.PackageNotFoundError:
            out[k] = None
    if "transformers" in kinds:
        try:
            out["torch"] = metadata.version("torch")
        except metadata.PackageNotFoundError:
            out["torch"] = None
    return out


def format_table(res: VsResult) -> str:
    """The human table: one row per tool, values and ratios to llmir."""
    s = res.summary()
    c = res.config
    lines = [
        f"prompt {c['prompt_len']} tokens, generate {c['gen_len']} (greedy), {c['threads']} threads, "
        f"{c['runs']} interleaved runs per tool, medians of the runs not marked busy"
    ]
    widths = (28, 11, 9, 13, 12, 8, 9)
    head = ("tool", "prefill ms", "TTFT ms", "decode tok/s", "peak RSS MB", "load s", "import s")
    lines.append(
        " ".join(
            f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(head, widths))
        )
        + f"  first {c['agree']} tokens"
    )
    lines.append("-" * len(lines[-1]))
    fmts = {
        "prefill_ms": ".1f",
        "ttft_ms": ".1f",
        "decode_tok_s": ".1f",
        "peak_rss_mb": ".0f",
        "load_s": ".2f",
        "import_s": ".2f",
    }

    def row(label: str, cells: list[str], tail: str) -> str:
        return (
            " ".join([f"{label:<{widths[0]}}"] + [f"{x:>{w}}" for x, w in zip(cells, widths[1:])])
            + tail
        )

    for label, x in s.items():
        rt = x["ratio_to_llmir"]
        agree = (
            "(reference)"
            if label == "llmir"
            else ("agree" if x["agrees"] else f"differ at token {x['first_difference']}")
        )
        busy = (
            ""
            if x["clean_runs"] == x["runs"]
            else f"  [{x['runs'] - x['clean_runs']} of {x['runs']} runs busy]"
        )
        lines.append(
            row(
                label,
                ["-" if x[m] is None else format(x[m], f) for m, f in fmts.items()],
                f"  {agree}{busy}",
            )
        )
        if label != "llmir":
            lines.append(
                row("  / llmir", ["-" if rt[m] is None else f"{rt[m]:.3g}x" for m in fmts], "")
            )
    lines.append(
        "ratios are peer / llmir: above 1x the peer takes longer (ms, MB, s) or decodes faster (tok/s)"
    )
    mine = [r for r in res.runs if r.get("tool") == "llmir"]
    still = sum(1 for r in mine if r.get("spin") is False)
    if still and c["threads"] != 1:
        lines.append(
            f"llmir's threads did not spin in {still} of {len(mine)} runs (other processes were "
            "busy when it loaded); the peers' threads spin: those decode times are not like for like"
        )
    return "\n".join(lines) + "\n"


__all__ = [
    "Peer",
    "parse_peer",
    "compare",
    "format_table",
    "VsResult",
    "worker",
    "KINDS",
    "PEERS_SCHEMA",
]

if __name__ == "__main__":
    _main()
