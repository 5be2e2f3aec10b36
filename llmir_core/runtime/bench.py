"""Measuring a decoder: prefill, time to first token, decode tokens/s, inter-token latency, RSS.

Inputs are random token ids (seeded), so a benchmark needs no tokenizer. Each run prefills
`prompt_len` tokens for `batch` sequences and then decodes `gen_len` tokens greedily.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmir_core import __version__, tracing
from llmir_core.interrupts import caused_by_interrupt

from .generate import Decoder
from .trace_attrs import kv_cache_bytes

BENCH_SCHEMA = 2  # 2: decode_tokens_per_s split into _aggregate and _per_sequence; kernels


@dataclass
class RunStats:
    prefill_s: float
    ttft_s: float
    decode_s: float
    itl_s: list[float]

    def decode_tps(self, batch: int) -> float:
        """Tokens decoded per second by the whole batch (every sequence's tokens counted)."""
        return batch * len(self.itl_s) / self.decode_s if self.decode_s > 0 else 0.0

    def decode_tps_per_sequence(self) -> float:
        """Tokens per second one sequence of the batch sees (the aggregate over the batch)."""
        return len(self.itl_s) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class BenchResult:
    prompt_len: int
    gen_len: int
    batch: int
    threads: int | None
    runs: list[RunStats] = field(default_factory=list)
    spin: bool | None = None  # the decoder's pool threads spin between kernels
    peak_rss_mb: float = 0.0
    fingerprint: dict[str, Any] = field(default_factory=dict)
    # {op name: instruction-set variant} of the kernels the artifact runs ({}: none reported)
    kernels: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        def ms(xs: list[float]) -> dict[str, float]:
            return {
                "mean": statistics.fmean(xs),
                "stddev": statistics.pstdev(xs) if len(xs) > 1 else 0.0,
            }

        itl = sorted(x for r in self.runs for x in r.itl_s)

        def pct(p: float) -> float:
            if not itl:
                return 0.0
            return float(np.percentile(np.asarray(itl), p)) * 1000

        prefill = [r.prefill_s * 1000 for r in self.runs]
        return {
            "prefill_ms": ms(prefill),
            "prefill_tokens_per_s": ms(
                [self.batch * self.prompt_len / (r.prefill_s or 1e-9) for r in self.runs]
            ),
            "ttft_ms": ms([r.ttft_s * 1000 for r in self.runs]),
            "decode_tokens_per_s_aggregate": ms([r.decode_tps(self.batch) for r in self.runs]),
            "decode_tokens_per_s_per_sequence": ms(
                [r.decode_tps_per_sequence() for r in self.runs]
            ),
            "itl_ms": {"p50": pct(50), "p90": pct(90), "p99": pct(99)},
            "peak_rss_mb": self.peak_rss_mb,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "bench_schema": BENCH_SCHEMA,
            "config": {
                "prompt_len": self.prompt_len,
                "gen_len": self.gen_len,
                "batch": self.batch,
                "threads": self.threads,
                "spin": self.spin,
                "runs": len(self.runs),
            },
            "results": self.summary(),
            "runs": [
                {
                    "prefill_s": r.prefill_s,
                    "ttft_s": r.ttft_s,
                    "decode_s": r.decode_s,
                    "itl_s": r.itl_s,
                }
                for r in self.runs
            ],
            "kernels": self.kernels,
            "fingerprint": self.fingerprint,
        }


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def hardware_fingerprint() -> dict[str, Any]:
    cpu, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name") and cpu in ("", platform.machine()):
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    flags = sorted(
                        have
                        & {
                            "avx",
                            "avx2",
                            "fma",
                            "f16c",
                            "avx512f",
                            "avx512bw",
                            "avx512_vnni",
                            "avx512_bf16",
                            "avx_vnni",
                            "amx_tile",
                            "amx_bf16",
                            "amx_int8",
                            "sse4_2",
                            "neon",
                            "asimd",
                        }
                    )
                    break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "cpu_flags": flags,
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "llmir": __version__,
        "numpy": np.__version__,
    }
    try:
        import onnxruntime  # noqa: PLC0415  (optional: only to report its version)

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError as exc:
        if caused_by_interrupt(exc):  # a Ctrl-C during the import, not a missing package
            raise KeyboardInterrupt from None
        info["onnxruntime"] = None
    return info


def run_bench(
    decoder: Decoder,
    vocab: int,
    *,
    prompt_len: int,
    gen_len: int,
    batch: int = 1,
    runs: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    seed: int = 0,
    model_hash: str | None = None,
    progress: Any = None,
) -> BenchResult:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, prompt_len), dtype=np.int64)
    res = BenchResult(prompt_len, gen_len, batch, threads, spin=getattr(decoder, "spin", None))
    for i in range(warmup + runs):
        decoder.reset(batch)
        with tracing.span(
            "bench run",
            {"llmir.bench.run": i + 1, "llmir.bench.warmup": i < warmup, "llmir.batch": batch},
        ) as run_span:
            t0 = time.perf_counter()
            with tracing.span("prefill", {"gen_ai.usage.input_tokens": batch * prompt_len}):
                logits = decoder.forward(ids)
            t1 = time.perf_counter()
            nxt = np.argmax(logits[:, -1], axis=-1).astype(np.int64)[:, None]
            ttft = time.perf_counter() - t0
            itl: list[float] = []
            d0 = time.perf_counter()
            with tracing.span("decode", {"gen_ai.usage.output_tokens": batch * gen_len}):
                for _ in range(max(gen_len - 1, 0)):
                    s = time.perf_counter()
                    logits = decoder.forward(nxt)
                    nxt = np.argmax(logits[:, -1], axis=-1).astype(np.int64)[:, None]
                    itl.append(time.perf_counter() - s)
            decode_s = time.perf_counter() - d0
            run_span.set(
                {
                    "gen_ai.usage.input_tokens": batch * prompt_len,
                    "gen_ai.usage.output_tokens": batch * gen_len,
                    "gen_ai.server.time_to_first_token": ttft,
                    "llmir.decode.tokens_per_s": batch * len(itl) / decode_s
                    if decode_s > 0
                    else None,
                    "llmir.kv_cache.bytes": kv_cache_bytes(decoder),
                }
            )
        if i >= warmup:
            res.runs.append(RunStats(t1 - t0, ttft, decode_s, itl))
        if progress is not None:
            progress(i + 1, warmup + runs)
    res.peak_rss_mb = peak_rss_mb()
    res.fingerprint = {**hardware_fingerprint(), "model_sha256": model_hash}
    return res
