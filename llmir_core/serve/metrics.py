"""Server metrics in the Prometheus text exposition format (version 0.0.4), no client library.

Counters: requests by route and status, generated and prompt tokens. Gauges: queue depth and
active sequences (read from the scheduler when scraped), tokens per second over the last
`window_s` seconds, and where the batch decoder reports them, the KV cache bytes its slots
reserved and touched (`llmir_kv_reserved_bytes`, `llmir_kv_touched_bytes`: see
llmir_core.runtime.kv_slots.KVUsage). Histograms: time to first token and inter-token latency, in seconds.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0
        self.n = 0

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, x)] += 1
        self.total += x
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, cum = [], 0
        for le, c in zip([*map(_num, self.buckets), "+Inf"], self.counts):
            cum += c
            out.append(f'{name}_bucket{{le="{le}"}} {cum}')
        out += [f"{name}_sum {_num(self.total)}", f"{name}_count {self.n}"]
        return out


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) else f"{int(x)}.0"


class Metrics:
    """Thread-safe: the scheduler thread observes tokens, the event loop counts requests."""

    def __init__(self, window_s: float = 10.0) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.generated = 0
        self.prompt_tokens = 0
        self.window_s = window_s
        self._recent: deque[float] = deque()  # times of recent generated tokens
        self.queue_depth: Callable[[], int] = lambda: 0
        self.active: Callable[[], int] = lambda: 0
        self.kv_reserved: Callable[[], int | None] = lambda: None
        self.kv_touched: Callable[[], int | None] = lambda: None

    def request(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] = self.requests.get((route, status), 0) + 1

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def token(self, since_last: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            self.generated += 1
            self._recent.append(now)
            if since_last is not None:
                self.itl.observe(since_last)

    def prompt(self, n: int) -> None:
        with self._lock:
            self.prompt_tokens += n

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0] < now - self.window_s:
                self._recent.popleft()
            return len(self._recent) / self.window_s

    def render(self) -> str:
        tps = self.tokens_per_second()
        kv = _kv_lines(self.kv_reserved(), self.kv_touched())
        with self._lock:
            lines = [
                "# HELP llmir_requests_total HTTP requests by route and status code.",
                "# TYPE llmir_requests_total counter",
            ]
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'llmir_requests_total{{route="{route}",status="{status}"}} {n}')
            lines += [
                "# HELP llmir_queue_depth Requests waiting for a batch slot.",
                "# TYPE llmir_queue_depth gauge",
                f"llmir_queue_depth {self.queue_depth()}",
                "# HELP llmir_active_sequences Sequences holding a batch slot (prefill or decode).",
                "# TYPE llmir_active_sequences gauge",
                f"llmir_active_sequences {self.active()}",
                "# HELP llmir_generated_tokens_total Tokens generated.",
                "# TYPE llmir_generated_tokens_total counter",
                f"llmir_generated_tokens_total {self.generated}",
                "# HELP llmir_prompt_tokens_total Prompt tokens prefilled.",
                "# TYPE llmir_prompt_tokens_total counter",
                f"llmir_prompt_tokens_total {self.prompt_tokens}",
                f"# HELP llmir_tokens_per_second Tokens generated per second over the last {self.window_s:g} s.",
                "# TYPE llmir_tokens_per_second gauge",
                f"llmir_tokens_per_second {_num(tps)}",
                "# HELP llmir_time_to_first_token_seconds From request arrival to its first token.",
                "# TYPE llmir_time_to_first_token_seconds histogram",
                *self.ttft.lines("llmir_time_to_first_token_seconds"),
                "# HELP llmir_inter_token_latency_seconds Between consecutive tokens of a sequence.",
                "# TYPE llmir_inter_token_latency_seconds histogram",
                *self.itl.lines("llmir_inter_token_latency_seconds"),
                *kv,
            ]
        return "\n".join(lines) + "\n"


def _kv_lines(reserved: int | None, touched: int | None) -> list[str]:
    """The KV gauges (none when the decoder does not report its KV memory)."""
    if reserved is None or touched is None:
        return []
    return [
        "# HELP llmir_kv_reserved_bytes KV cache buffers allocated for every slot at full context.",
        "# TYPE llmir_kv_reserved_bytes gauge",
        f"llmir_kv_reserved_bytes {reserved}",
        "# HELP llmir_kv_touched_bytes KV cache rows written so far (per slot: its highest "
        "position used, times the bytes a position takes).",
        "# TYPE llmir_kv_touched_bytes gauge",
        f"llmir_kv_touched_bytes {touched}",
    ]


__all__ = ["Metrics", "Histogram"]
