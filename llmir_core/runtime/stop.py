"""The stop policy: when a generated sequence ends, the same for `llmir run` (`generate`) and
the server's scheduler, so a request stops where it would stop alone.

`StopPolicy.push(tok)` takes each sampled token in turn and returns the text that became safe to
show and the reason generation ends there, if it does, checked in this order:

- `eos`: the token is an end-of-generation id (not added to the output);
- `stop_string`: the text now holds a stop string (the text is cut before it);
- `length`: `max_tokens` tokens were generated;
- `context`: the next forward would pass the model's context (`max_context`).

`TextStream` is the incremental detokenizer underneath: an incomplete UTF-8 sequence is held
back, and so is a tail that could still become a stop string.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    """Incremental detokenization with stop strings, the way generate() streams and the server sends: an incomplete UTF-8
    sequence is held back, and so is a tail that could still become a stop string."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str]) -> None:
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) - 1 for s in self.stop), default=0)
        self.ids: list[int] = []
        self.emitted = ""
        self.stopped = False

    def push(self, tok: int) -> str:
        """Add a token; return the text that became safe to show (sets `stopped` on a stop string)."""
        self.ids.append(tok)
        text = self.decode(self.ids)
        stable = text[:-1] if text.endswith("\ufffd") else text
        hit = next((s for s in self.stop if s in stable), None)
        if hit is not None:
            self.stopped = True
            return self._advance(stable[: stable.index(hit)])
        return self._advance(stable[: len(stable) - self.hold] if self.hold else stable)

    def finish(self) -> str:
        """The rest of the text once generation ends without a stop string."""
        return "" if self.stopped else self._advance(self.decode(self.ids))

    def _advance(self, safe: str) -> str:
        if len(safe) > len(self.emitted) and safe.startswith(self.emitted):
            piece = safe[len(self.emitted) :]
            self.emitted = safe
            return piece
        return ""


class StopPolicy:
    """Where one sequence stops (see the module docstring)."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        *,
        stop: Sequence[str] = (),
        eos_ids: Sequence[int] = (),
        max_tokens: int,
        prompt_tokens: int,
        max_context: int | None = None,
    ) -> None:
        self.stream = TextStream(decode, stop)
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context
        self.generated = 0

    def push(self, tok: int) -> tuple[str, str | None]:
        """The text `tok` makes safe to show, and why generation ends with it (None: go on)."""
        if tok in self.eos_ids:
            return "", "eos"
        self.generated += 1
        piece = self.stream.push(tok)
        if self.stream.stopped:
            return piece, "stop_string"
        if self.generated >= self.max_tokens:
            return piece, "length"
        if self.max_context is not None and self.prompt_tokens + self.generated > self.max_context:
            return piece, "context"
        return piece, None

    def finish(self) -> str:
        """The rest of the text once generation ends without a stop string."""
        return self.stream.finish()

    @property
    def text(self) -> str:
        """The text shown so far (cut before the stop string when one was hit)."""
        return self.stream.emitted


__all__ = ["StopPolicy", "TextStream"]
