"""Fixtures for the registry tests: a fake hub, an isolated environment, and helpers.

Every test runs with a guard that refuses non-loopback connections and name lookups, in this
process and in every llmir subprocess (netguard/sitecustomize.py on PYTHONPATH).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from registry_fakehub import FakeHub
from registry_netguard import install, uninstall

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
_PROXY_VARS = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"}


@pytest.fixture(autouse=True)
def _no_internet() -> Iterator[None]:
    install()
    yield
    uninstall()


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as fake:
        yield fake


@pytest.fixture
def env(tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point llmir and huggingface_hub at tmp folders and the fake hub.

    Sets the variables in this process (for core calls) and returns them for subprocesses.
    """
    for key in list(os.environ):
        if key.upper() in _PROXY_VARS or key.startswith(("HF_", "HUGGINGFACE_", "LLMIR_")):
            monkeypatch.delenv(key)
    values = {
        "LLMIR_HOME": tmp_path / "llmir-home",
        "HF_HOME": tmp_path / "hf-home",
        "XDG_CACHE_HOME": tmp_path / "xdg",
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_COLOR": "1",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, str(value))
    # huggingface_hub reads its telemetry switch once, at import: its agent-detection call
    # would otherwise go to the endpoint it saw then.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    sub = dict(os.environ)
    sub["PYTHONPATH"] = os.pathsep.join([str(HERE / "netguard"), str(HERE), str(REPO)])
    return sub


def llmir(
    env: dict[str, str], *args: str, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (stdout and stderr captured: not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "llmir_cli.app", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, cwd: Path | None = None) -> Ran:
    """Run the CLI in this process with typer's CliRunner (faster than a subprocess; the
    environment set by the `env` fixture applies)."""
    from typer.testing import CliRunner

    from llmir_cli.app import app

    before = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, list(args), prog_name="llmir", catch_exceptions=False)
    finally:
        os.chdir(before)
    return Ran(result.exit_code, result.stdout, result.stderr)


def safetensors_bytes(n: int, seed: int = 0) -> bytes:
    """A real (tiny) safetensors file: one float32 tensor."""
    data = np.random.default_rng(seed).standard_normal(n).astype(np.float32).tobytes()
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, len(data)]}})
    raw = header.encode() + b" " * (-len(header) % 8)
    return len(raw).to_bytes(8, "little") + raw + data


def tiny_model(n: int = 4096, seed: int = 0) -> dict[str, bytes]:
    return {
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 8}).encode(),
        "generation_config.json": b'{"do_sample": false}',
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
        "model.safetensors": safetensors_bytes(n, seed),
    }


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def entry(
    repo: str,
    files: dict[str, bytes | None],
    *,
    revision: str = "main",
    fmt: str = "safetensors",
    include: list[str] | None = None,
) -> dict[str, Any]:
    """An index entry; a file given with bytes is pinned (sha256 and size), None is not."""
    out: dict[str, Any] = {
        "description": f"test model {repo}",
        "source": {"hf": repo, "revision": revision},
        "format": fmt,
        "quantization": "f32",
        "license": "mit",
        "parameters": 4096,
        "files": [
            {
                "path": p,
                "sha256": sha256(d) if d is not None else None,
                "size": len(d) if d is not None else None,
            }
            for p, d in files.items()
        ],
    }
    if include:
        out["include"] = include
    return out


def write_index(path: Path, models: dict[str, dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"index_version": 1, "models": models}, indent=2) + "\n")
    return path
