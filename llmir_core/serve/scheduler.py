"""Continuous batching: one thread runs every admitted sequence through a `BatchDecoder`.

Each loop iteration (a *step*):

1. drops cancelled requests (their slot is free again) and admits waiting ones while slots are
   free (first come, first served);
2. runs one prefill chunk (at most `chunk` prompt tokens) of the oldest sequence still in
   prefill: a newcomer never stalls the others for longer than one chunk (when no sequence is
   decoding, the whole rest of the prompt at once);
3. runs one batched decode forward for every sequence past its prefill, samples each one's next
   token with its own `Sampler` (seeded per request) and streams its text.

Mixed steps, on a decoder whose `step` is one forward (`mixed_steps`: an onnxruntime artifact
on llmir's attention kernel, left-padded rows): step 2 gives every sequence in prefill its
chunk in one forward (S = the longest chunk, at most `chunk` tokens while others decode; when
none decodes, the oldest's whole rest, the others' beside it; as many sequences as fit
`step_tokens` rows x S), so newcomers arriving together wait one forward, not one step each.
The decode rows join that forward (one mixed batch: a forward saved) when it still computes at
most `step_tokens` cells (rows x S) beyond the decode tokens (a row computes S columns whatever
it holds); otherwise they decode in a forward of their own after it. A request asking for the
prompt's log-probabilities keeps the single-sequence prefill (every row's logits).

A request arriving while others decode joins at the next step. Sampling and the stop rules are
those of `llmir run` (`llmir_core.runtime.stop`), so a request gets the tokens it would get
alone with the same seed. The waiting queue is bounded (`QueueFull`); after `close()` new
requests are refused (`ShuttingDown`) and the loop ends once the admitted ones finish.

Log-probabilities (`/v1/completions`' `logprobs`, `echo`): a request with `logprobs` set gets
each generated token's log-probability and top alternatives (an end-of-sequence token's too);
with `echo_logprobs` also each prompt token's after the first. Such a prompt is prefilled in
chunks of at most `chunk` tokens even alone (every row of logits is kept for a chunk), through
`BatchDecoder.prefill_rows`. `max_tokens` 0 ends a request after its prefill.

Choices of one prompt (`n` > 1): a request whose `group` holds n - 1 siblings is admitted when
n slots are free; it prefills the prompt (chunked or mixed as any other), then the decoder's
`fork` copies its KV rows into the siblings' slots and each sibling samples its first token
from the same last logits row with its own sampler, then decodes as any sequence. The prompt is
prefilled once (the snapshot's `prefill_shared` counts the sequences that got it by fork);
cancelling any request of a group cancels the group.

A request takes its place in the queue before its prompt is parsed, rendered and tokenized
(`reserve()`, on the server's worker threads), so that work counts against the same limit:
`submit(req, ticket)` turns the reservation into a waiting request, `ticket.release()` gives
it back when preparing the request failed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llmir_core.runtime import grammar
from llmir_core.runtime.batch_decoder import BatchDecoder
from llmir_core.runtime.sampling import Sampler
from llmir_core.runtime.stop import StopPolicy, TextStream

from .logprobs import TokenLogprob, score
from .metrics import Metrics


class QueueFull(Exception):
    """The waiting queue is full: retry later."""


class ShuttingDown(Exception):
    """The server is draining and takes no new requests."""


class Ticket:
    """A place in the queue held while a request is prepared (see `Scheduler.reserve`)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.held = True

    def release(self) -> None:
        """Give the place back (idempotent; a no-op once the request was submitted)."""
        with self.sched._cond:
            if self.held:
                self.held = False
                self.sched.preparing -= 1


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # stop | length
    stop_reason: str  # eos | stop_string | length | context
    ttft_s: float
    token_times: list[float]  # monotonic time of each generated token
    prompt_logprobs: list[TokenLogprob] | None = None  # prompt_ids[1:]'s, when asked for
    logprobs: list[TokenLogprob] | None = None  # the generated tokens' (and an eos'), when asked


@dataclass
class GenRequest:
    """One sequence to generate. `on_text(piece)` and `on_done(completion or exception)` are
    called from the scheduler thread."""

    prompt_ids: list[int]
    max_tokens: int
    sampler: Sampler
    on_text: Callable[[str], None]
    on_done: Callable[[Completion | BaseException], None]
    stop: tuple[str, ...] = ()
    eos_ids: tuple[int, ...] = ()
    logprobs: int | None = None  # alternatives per token; None: no log-probabilities
    echo_logprobs: bool = False  # the prompt tokens' log-probabilities too (needs logprobs)
    group: list[GenRequest] = field(default_factory=list)  # siblings forked from this prefill
    leader: GenRequest | None = None  # a sibling: whose prefill it is forked from
    constraint: grammar.Constraint | None = None  # the grammar the output must follow
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    # scheduler state
    slot: int = -1
    cached: int = 0  # prompt tokens already in the KV rows
    ids: list[int] = field(default_factory=list)
    policy: StopPolicy | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_lp: list[TokenLogprob] = field(default_factory=list)
    gen_lp: list[TokenLogprob] = field(default_factory=list)


class Scheduler:
    """Owns the `BatchDecoder`; only its thread touches it."""

    def __init__(
        self,
        decoder: BatchDecoder,
        decode_text: Callable[[list[int]], str],
        *,
        max_queue: int = 64,
        chunk: int = 32,
        metrics: Metrics | None = None,
        step_tokens: int | None = None,
    ) -> None:
        """chunk: prompt tokens a sequence prefills per step while others decode. step_tokens:
        (mixed steps) the most rows x columns a forward computes beyond its decode tokens
        (default 4 chunks; the oldest sequence's chunk always goes)."""
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.decoder = decoder
        self.decode_text = decode_text
        self.max_queue = max_queue
        self.chunk = chunk
        self.step_tokens = step_tokens or 4 * chunk
        self.metrics = metrics or Metrics()
        self.metrics.queue_depth = lambda: len(self.waiting) + self.preparing
        self.metrics.active = lambda: len(self.active)
        self.waiting: deque[GenRequest] = deque()
        self.preparing = 0  # places reserved by requests still being parsed and tokenized
        self.active: list[GenRequest] = []
        self.free = list(range(decoder.slots))
        self.steps = 0
        self.max_batch_seen = 0
        # mixed steps (decoders whose `step` is one forward: prompt chunks of every sequence in
        # prefill, beside the decode rows when their pads are cheap); counters for the snapshot
        self.mixed = bool(getattr(decoder, "mixed_steps", False))
        self.mixed_steps = 0  # forwards holding prompt chunks and decode rows
        self.prefill_batches = 0  # `step` forwards holding prompt chunks
        self.prefill_shared = 0  # sequences whose prompt rows came by fork (n > 1)
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="llmir-scheduler", daemon=True)

    # -- the request side (any thread) ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def _check_room(self) -> None:
        """Raise unless one more request fits: free slots take waiting ones, then the queue."""
        if self._closing:
            raise ShuttingDown("the server is shutting down")
        if len(self.waiting) + self.preparing >= self.max_queue + len(self.free):
            raise QueueFull(
                f"{len(self.waiting) + self.preparing} requests are waiting "
                f"(--max-queue {self.max_queue})"
            )

    def reserve(self) -> Ticket:
        """Hold a place for a request about to be prepared (QueueFull, ShuttingDown)."""
        with self._cond:
            self._check_room()
            self.preparing += 1
            return Ticket(self)

    def submit(self, req: GenRequest, ticket: Ticket | None = None) -> None:
        """Queue req, in the place `ticket` holds (given back on any error), or a new one."""
        try:
            if 1 + len(req.group) > self.decoder.slots:
                raise ValueError(
                    f"{1 + len(req.group)} choices of one prompt, but the server has "
                    f"{self.decoder.slots} slots (--max-batch)"
                )
            if len(req.prompt_ids) >= self.decoder.max_context:
                raise ValueError(
                    f"the prompt has {len(req.prompt_ids)} tokens, but the model's context is "
                    f"{self.decoder.max_context} (with room for at least one new token)"
                )
            with self._cond:
                if ticket is not None and ticket.held:
                    if self._closing:
                        raise ShuttingDown("the server is shutting down")
                    ticket.held = False
                    self.preparing -= 1
                else:
                    self._check_room()
                self.waiting.append(req)
                self._cond.notify()
        finally:
            if ticket is not None:
                ticket.release()

    def cancel(self, req: GenRequest) -> None:
        """Stop generating for req (its client went away); its slot is freed at the next step."""
        with self._cond:
            leader = req.leader or req
            for r in (leader, *leader.group):  # a group goes together
                r.cancelled = True
            self._cond.notify()

    def close(self) -> None:
        """Refuse new requests; the loop ends after the admitted and waiting ones finish."""
        with self._cond:
            self._closing = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def closing(self) -> bool:
        return self._closing

    # -- the scheduler thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._drop_cancelled()
                while not self.waiting and not self.active and not self._closing:
                    self._cond.wait()
                    self._drop_cancelled()
                if self._closing and not self.waiting and not self.active:
                    return
                while self.waiting and len(self.free) > len(self.waiting[0].group):
                    self._admit(self.waiting.popleft())
            try:
                self._step()
            except BaseException as exc:  # a failed forward fails its requests, not the server
                for req in list(self.active):
                    self._finish(req, exc)

    def _admit(self, req: GenRequest) -> None:
        """Give req (and its siblings) a slot and a stop policy."""
        for r in (req, *req.group):
            r.slot = self.free.pop(0)
            r.policy = StopPolicy(
                self.decode_text,
                stop=r.stop,
                eos_ids=r.eos_ids,
                max_tokens=r.max_tokens,
                prompt_tokens=len(r.prompt_ids),
                max_context=self.decoder.max_context,
            )
            self.active.append(r)

    def _drop_cancelled(self) -> None:
        self.waiting = deque(r for r in self.waiting if not r.cancelled)
        for req in [r for r in self.active if r.cancelled]:
            self._release(req)

    def _release(self, req: GenRequest) -> None:
        if req in self.active:
            self.active.remove(req)
            self.free.append(req.slot)
            self.free.sort()  # low slots first: a decode step binds rows up to the highest one

    def _step(self) -> None:
        self.steps += 1
        grammar.prefetch(r.constraint for r in self.active)  # next masks, beside the forward
        if self.mixed:
            self._mixed_step()
        else:
            self._prefill_oldest(lambda r: True)
            self._decode()

    def _mixed_step(self) -> None:
        """Step 2 for every sequence in prefill in one forward, beside the decode rows when
        their pads are cheap (see the module's docstring)."""
        self._prefill_oldest(lambda r: r.echo_logprobs)  # every row's logits: a forward alone
        decoding = self._ready()
        rows = self._chunks(bool(decoding))
        if not rows:
            self._decode()
            return
        width = max(len(ids) for _, ids in rows)
        cells = (len(rows) + len(decoding)) * width - len(decoding)  # beyond the decode tokens
        if decoding and cells <= self.step_tokens:  # the decode rows' pads are cheap: one forward
            self.mixed_steps += 1
            self._forward(rows + [(r, [r.ids[-1]]) for r in decoding])
            return
        self._forward(rows)  # a batched prefill, then the decode rows in a forward of width 1
        self._decode()

    def _chunks(self, decoding: bool) -> list[tuple[GenRequest, list[int]]]:
        """This step's prompt chunks, oldest first: S tokens each (fewer where the prompt
        ends), as many sequences as fit `step_tokens` (rows x S; the oldest always)."""
        pending = [
            r
            for r in self.active
            if r.cached < len(r.prompt_ids)
            and not r.echo_logprobs
            and not r.cancelled
            and r.leader is None
        ]
        if not pending:
            return []
        rest = [len(r.prompt_ids) - r.cached for r in pending]
        if decoding:  # chunks of at most `chunk` tokens bound the decoding sequences' stall
            width = min(self.chunk, max(rest))
        else:  # nothing to stall: the oldest's whole rest, the others (a chunk at least) beside it
            width = max(rest[0], min(self.chunk, max(rest)))
        n = max(1, min(len(pending), self.step_tokens // width))
        return [(r, r.prompt_ids[r.cached : r.cached + width]) for r in pending[:n]]

    def _ready(self) -> list[GenRequest]:
        return [
            r for r in self.active if r.cached == len(r.prompt_ids) and r.ids and not r.cancelled
        ]

    def _prefill_oldest(self, which: Callable[[GenRequest], bool]) -> None:
        """One prefill chunk of the oldest sequence in prefill that `which` takes, alone."""
        pre = next(
            (
                r
                for r in self.active
                if r.cached < len(r.prompt_ids) and r.leader is None and which(r)
            ),
            None,
        )
        if pre is None:
            return
        # chunks only bound the stall of sequences that decode: with none, prefill it all
        decoding = any(r.ids and not r.cancelled for r in self.active)
        whole = not decoding and not pre.echo_logprobs
        part = pre.prompt_ids[pre.cached : None if whole else pre.cached + self.chunk]
        if pre.echo_logprobs:
            rows = self.decoder.prefill_rows(pre.slot, part, pre.cached)
            nxt = pre.prompt_ids[pre.cached + 1 : pre.cached + len(part) + 1]
            pre.prompt_lp += score(rows, nxt, pre.logprobs or 0)
            logits = rows[-1]
        else:
            logits = self.decoder.prefill(pre.slot, part, pre.cached)
        self._prefilled(pre, part, logits)

    def _prefilled(self, req: GenRequest, part: list[int], logits: np.ndarray) -> None:
        req.cached += len(part)
        self.metrics.prompt(len(part))
        if req.cached == len(req.prompt_ids):
            self._fork(req, logits)
            if req.max_tokens > 0:
                self._emit(req, logits)
            else:
                self._finish(req, "length")

    def _fork(self, req: GenRequest, logits: np.ndarray) -> None:
        """req's prompt is in: copy its KV rows into its siblings' slots; each samples its first
        token from `logits` (a copy each: a sampler may adjust what it is given)."""
        sibs = [s for s in req.group if not s.cancelled]
        if not sibs:
            return
        self.decoder.fork(req.slot, [s.slot for s in sibs], req.cached)
        self.prefill_shared += len(sibs)
        for s in sibs:
            s.cached = req.cached
            s.prompt_lp = list(req.prompt_lp)
            if s.max_tokens > 0:
                self._emit(s, logits.copy())
            else:
                self._finish(s, "length")

    def _forward(self, rows: list[tuple[GenRequest, list[int]]]) -> None:
        """One `step` forward over prompt chunks and decode tokens (a decoding request's row is
        its last token); each row's logits go where the separate forwards would send them."""
        decode = [bool(r.ids) for r, _ in rows]
        if not all(decode):
            self.prefill_batches += 1
        starts = [
            len(r.prompt_ids) + len(r.ids) - 1 if d else r.cached for (r, _), d in zip(rows, decode)
        ]
        logits = self.decoder.step([(r.slot, ids, s) for (r, ids), s in zip(rows, starts)])
        self.max_batch_seen = max(self.max_batch_seen, sum(decode))
        for (r, ids), d, row in zip(rows, decode, logits):
            if d:
                self._emit(r, row)
            else:
                self._prefilled(r, ids, row)

    def _decode(self) -> None:
        """One batched decode forward for every sequence past its prefill."""
        ready = self._ready()
        if not ready:
            return
        self.max_batch_seen = max(self.max_batch_seen, len(ready))
        grammar.prefetch(r.constraint for r in ready)
        logits = self.decoder.decode(
            [r.slot for r in ready],
            [r.ids[-1] for r in ready],
            [len(r.prompt_ids) + len(r.ids) - 1 for r in ready],
        )
        for r, row in zip(ready, logits):
            self._emit(r, row)

    def _emit(self, req: GenRequest, logits: np.ndarray) -> None:
        """Sample req's next token from logits, stream it, and finish req when the stop policy
        says so (llmir_core.runtime.stop: the one `llmir run` follows)."""
        assert req.policy is not None
        c = req.constraint  # the grammar's mask: ids it does not allow next at -inf
        allowed = logits if c is None else c.apply(logits)
        tok = req.sampler.pick(allowed, [*req.prompt_ids, *req.ids])
        if c is not None and tok not in req.eos_ids:
            c.accept(tok)
        if req.logprobs is not None:
            req.gen_lp += score(logits, [tok], req.logprobs)
        now = time.monotonic()
        if not req.token_times:
            self.metrics.first_token(now - req.arrived)
        piece, why = req.policy.push(tok)
        if why != "eos":
            self.metrics.token(now - req.token_times[-1] if req.token_times else None)
            req.token_times.append(now)
            req.ids.append(tok)
        if piece:
            req.on_text(piece)
        if why is None and c is not None and c.done:  # only the end can follow: end here
            why = "eos"
        if why is not None:
            self._finish(req, why)

    def _finish(self, req: GenRequest, why: str | BaseException) -> None:
        with self._cond:
            self._release(req)
        if isinstance(why, BaseException):
            req.on_done(why)
            return
        assert req.policy is not None
        rest = req.policy.finish()
        if rest:
            req.on_text(rest)
        ttft = (
            req.token_times[0] - req.arrived if req.token_times else time.monotonic() - req.arrived
        )
        req.on_done(
            Completion(
                req.policy.text,
                list(req.ids),
                len(req.prompt_ids),
                "stop" if why in ("eos", "stop_string") else "length",
                why,
                ttft,
                list(req.token_times),
                list(req.prompt_lp) if req.echo_logprobs else None,
                list(req.gen_lp) if req.logprobs is not None else None,
            )
        )

    def snapshot(self) -> dict[str, Any]:
        return {
            "waiting": len(self.waiting),
            "preparing": self.preparing,
            "active": len(self.active),
            "slots": self.decoder.slots,
            "steps": self.steps,
            "max_batch_seen": self.max_batch_seen,
            "mixed_steps": self.mixed_steps,
            "prefill_batches": self.prefill_batches,
            "prefill_shared": self.prefill_shared,
        }


__all__ = [
    "Scheduler",
    "GenRequest",
    "Completion",
    "TextStream",
    "Ticket",
    "QueueFull",
    "ShuttingDown",
]
