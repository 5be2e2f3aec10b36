"""An unreachable hub fails in seconds with llmir's one error line and hint: no huggingface_hub
retry lines, no ~30 s of backoff, no project folder left behind."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from conftest import entry, llmir, tiny_model, write_index
from registry_fakehub import FakeHub

from llmir_core.registry.hub import probe_target


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed once the socket is: connections are refused


@pytest.mark.parametrize("hub_via", ["endpoint", "proxy"])
def test_init_with_the_hub_unreachable_fails_fast_and_quietly(
    env: dict[str, str], hub: FakeHub, tmp_path: Path, hub_via: str
) -> None:
    files = tiny_model()
    hub.publish("org/tiny", files)
    index = write_index(
        tmp_path / "index.json",
        {
            "tiny:1": entry(
                "org/tiny",
                {"model.safetensors": files["model.safetensors"], "config.json": None},
                include=["*.json"],
            )
        },
    )
    dead = f"http://127.0.0.1:{_closed_port()}"
    env = {**env, "HF_ENDPOINT": dead} if hub_via == "endpoint" else {**env, "HTTP_PROXY": dead}
    t0 = time.monotonic()
    r = llmir(env, "init", str(tmp_path / "proj"), "--model", "tiny:1", "--registry", str(index))
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    want = (
        f"cannot reach the proxy {dead}"
        if hub_via == "proxy"
        else f"cannot reach the hub at {dead}"
    )
    assert len(lines) == 2 and lines[0].startswith(f"error: {want} for org/tiny@"), r.stderr
    assert lines[0].endswith("Connection refused") and lines[1].startswith("hint: "), r.stderr
    assert "Retry" not in r.stderr and r.stdout == ""
    assert took < 15, took  # huggingface_hub's backoff alone sleeps 23 s
    assert not (tmp_path / "proj").exists()


def test_the_probe_goes_to_the_proxy_unless_no_proxy_exempts_the_hub(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    ):
        monkeypatch.delenv(key, raising=False)
    assert probe_target("https://huggingface.co") == (
        "huggingface.co",
        443,
        "the hub at https://huggingface.co",
    )
    monkeypatch.setenv("HTTPS_PROXY", "proxy.example:3128")
    assert probe_target("https://huggingface.co")[:2] == ("proxy.example", 3128)
    assert probe_target("http://hub.local:8080")[:2] == ("hub.local", 8080)  # no http proxy set
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    assert probe_target("https://huggingface.co")[:2] == ("huggingface.co", 443)
