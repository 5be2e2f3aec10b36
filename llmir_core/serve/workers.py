"""Worker threads for the server's slow request work, so the event loop never waits on it.

Parsing a body, rendering a chat template and tokenizing a prompt take time proportional to
the request (and a hostile template is stopped only at its limit): `Workers.run(fn, ...)`
runs them on a few daemon threads and awaits the result. Daemon threads, not a
`ThreadPoolExecutor`, because the interpreter joins an executor's threads at exit: a worker
still busy with an abandoned job must never keep a draining server from exiting. A job that
outlives its `timeout` is abandoned (its thread finishes it and takes the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any


class JobTimeout(Exception):
    """A job ran past the time it was given."""


class Workers:
    def __init__(self, count: int = 4) -> None:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.count = count
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[], Any], asyncio.AbstractEventLoop, asyncio.Future[Any]]
        ] = queue.SimpleQueue()
        self._started = False
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self._started = True
            for i in range(self.count):
                threading.Thread(target=self._loop, name=f"llmir-worker-{i}", daemon=True).start()

    def _loop(self) -> None:
        while True:
            job, loop, fut = self._jobs.get()
            if fut.cancelled():  # abandoned while it waited
                continue
            try:
                result: Any = job()
                ok = True
            except BaseException as exc:  # handed to the awaiting coroutine
                result, ok = exc, False
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                loop.call_soon_threadsafe(_settle, fut, ok, result)

    async def run(self, job: Callable[[], Any], timeout: float | None = None) -> Any:
        """job()'s result (or its exception), computed on a worker thread."""
        self._start()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._jobs.put((job, loop, fut))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise JobTimeout(f"the job took more than {timeout:g} s") from None


def _settle(fut: asyncio.Future[Any], ok: bool, result: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(result)
    else:
        fut.set_exception(result)


__all__ = ["Workers", "JobTimeout"]
