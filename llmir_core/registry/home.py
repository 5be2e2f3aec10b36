"""Where llmir keeps its own state, and the Hugging Face settings read from the environment.

Settings are read at call time (not import time) so one process can change them, and so the
tests can point each run at its own folders and fake hub.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "on", "yes", "true"}


def llmir_home() -> Path:
    """LLMIR_HOME, else $XDG_CACHE_HOME/llmir, else ~/.cache/llmir.

    It holds cached copies of remote indexes (`registries/`) and models materialized from
    directory mirrors (`models/`). Model files pulled from the hub stay in the hub's cache.
    """
    explicit = os.environ.get("LLMIR_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llmir"


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


@dataclass(frozen=True)
class HubSettings:
    """The huggingface_hub settings llmir passes explicitly on every call."""

    endpoint: str
    cache_dir: Path
    token: str | None
    offline: bool


def hub_settings() -> HubSettings:
    """Read HF_ENDPOINT, HF_HUB_CACHE / HF_HOME, HF_TOKEN and HF_HUB_OFFLINE now."""
    endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    cache = os.environ.get("HF_HUB_CACHE")
    if cache:
        cache_dir = Path(cache).expanduser()
    else:
        hf_home = os.environ.get("HF_HOME")
        if hf_home:
            base = Path(hf_home).expanduser()
        else:
            xdg = os.environ.get("XDG_CACHE_HOME")
            base = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface"
        cache_dir = base / "hub"
    return HubSettings(
        endpoint=endpoint,
        cache_dir=cache_dir,
        token=os.environ.get("HF_TOKEN") or None,
        offline=env_flag("HF_HUB_OFFLINE"),
    )
