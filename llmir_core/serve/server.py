"""Running the app on uvicorn (imported lazily): bind, serve, drain on SIGTERM/SIGINT.

On the first SIGTERM (or Ctrl-C) the scheduler refuses new requests (503), uvicorn stops
accepting connections and waits for the responses in flight, then the scheduler finishes what
it admitted and `serve` returns the signal (uvicorn's own handlers would re-raise it and kill
the process; the CLI exits 0 after SIGTERM, 130 after Ctrl-C). A second Ctrl-C forces the exit.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from llmir_core.errors import InputError

from .app import MAX_BODY, create_app
from .model import ServedModel


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (so a busy port is one clear error, and port 0 picks a free one).

    TCP_NODELAY, which accepted connections inherit: without it a keep-alive client (requests,
    httpx, lm-eval) waits for its delayed ACK, about 40 ms, on every request after the first,
    because the response goes out in two writes (measured: 44 ms -> 1.5 ms per /health)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InputError(
            f"cannot listen on {host}:{port}: {exc.strerror}",
            hint="pick another --port, or stop the process using it",
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(
    model: ServedModel,
    *,
    api_key: str | None = None,
    max_body: int = MAX_BODY,
    playground: dict[str, Any] | None = None,
    log_level: str = "warning",
) -> Any:
    """A uvicorn.Server for the app whose exit signal first closes the scheduler to new requests."""
    try:
        import uvicorn
    except ImportError:
        raise InputError(
            "`llmir serve` needs starlette and uvicorn", hint="pip install 'llmir[serve]'"
        ) from None

    class _Server(uvicorn.Server):
        received: int | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            model.scheduler.close()
            self.received = self.received or sig
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    app = create_app(model, api_key=api_key, max_body=max_body, playground=playground)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=60,
        ws="none",
    )
    return _Server(config)


def serve(model: ServedModel, sock: socket.socket, **kwargs: Any) -> int | None:
    """Serve on sock until a signal; return it (None when stopped otherwise) after draining."""
    server = make_server(model, **kwargs)
    server.run(sockets=[sock])
    return server.received  # type: ignore[no-any-return]


__all__ = ["bind", "make_server", "serve"]
