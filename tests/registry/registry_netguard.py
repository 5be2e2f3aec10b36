"""Refuse any connection or name lookup that is not loopback: the registry tests must never
reach the internet. Installed in-process by an autouse fixture and in every llmir subprocess
through netguard/sitecustomize.py."""

from __future__ import annotations

import socket
from typing import Any

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_saved: dict[str, Any] = {}


def _check(host: object) -> None:
    if isinstance(host, bytes):
        host = host.decode()
    if host not in _LOOPBACK:
        raise OSError(f"registry tests: blocked a non-loopback connection to {host!r}")


def install() -> None:
    if _saved:
        return
    _saved.update(
        connect=socket.socket.connect,
        connect_ex=socket.socket.connect_ex,
        getaddrinfo=socket.getaddrinfo,
    )

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _check(address[0])
        return _saved["connect"](self, address)

    def connect_ex(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _check(address[0])
        return _saved["connect_ex"](self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        _check(host)
        return _saved["getaddrinfo"](host, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo


def uninstall() -> None:
    if not _saved:
        return
    socket.socket.connect = _saved["connect"]  # type: ignore[method-assign]
    socket.socket.connect_ex = _saved["connect_ex"]  # type: ignore[method-assign]
    socket.getaddrinfo = _saved["getaddrinfo"]
    _saved.clear()
