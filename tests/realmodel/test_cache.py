"""The real-model cache (tests/realmodel/cache.py) on small files: made once, checked by sha256,
hashed again only when the file changed, remade when its bytes are wrong."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from . import cache

DATA = b"gemma" * 1000
SHA = hashlib.sha256(DATA).hexdigest()


class Maker:
    def __init__(self, data: bytes = DATA) -> None:
        self.data = data
        self.calls = 0

    def __call__(self, tmp: Path) -> None:
        self.calls += 1
        tmp.write_bytes(self.data)


def test_made_once_then_stamped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make = Maker()
    path = tmp_path / "m.gguf"
    assert cache.cached_file(path, SHA, make) == path
    assert path.read_bytes() == DATA and make.calls == 1
    hashed: list[Path] = []
    real = cache.sha256_of
    monkeypatch.setattr(cache, "sha256_of", lambda p: hashed.append(p) or real(p))
    cache.cached_file(path, SHA, make)
    assert make.calls == 1 and hashed == []  # the stamp matched: no hashing, no remaking


def test_changed_file_is_hashed_and_remade(tmp_path: Path) -> None:
    make = Maker()
    path = tmp_path / "m.gguf"
    cache.cached_file(path, SHA, make)
    bad = bytearray(DATA)
    bad[7] ^= 1
    path.write_bytes(bytes(bad))  # same size; the mtime moves
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    cache.cached_file(path, SHA, make)
    assert make.calls == 2 and path.read_bytes() == DATA


def test_a_stale_stamp_is_not_trusted(tmp_path: Path) -> None:
    """A stamp for other bytes (another expected sha256) does not vouch for the file."""
    make = Maker()
    path = tmp_path / "m.gguf"
    cache.cached_file(path, SHA, make)
    other = Maker(b"other")
    cache.cached_file(path, hashlib.sha256(b"other").hexdigest(), other)
    assert other.calls == 1 and path.read_bytes() == b"other"


def test_wrong_bytes_made_raise_and_leave_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    with pytest.raises(ValueError, match="expected " + SHA):
        cache.cached_file(path, SHA, Maker(b"not the file"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf.lock"]


def test_once_makes_once_and_retries_after_a_failure(tmp_path: Path) -> None:
    calls: list[int] = []

    def broken(p: Path) -> None:
        p.mkdir()
        calls.append(0)
        raise RuntimeError("build failed")

    with pytest.raises(RuntimeError):
        cache.once(tmp_path / "art", broken)
    assert not (tmp_path / "art").exists()

    def good(p: Path) -> None:
        p.mkdir()
        calls.append(1)

    assert cache.once(tmp_path / "art", good).is_dir()
    cache.once(tmp_path / "art", good)
    assert calls == [0, 1]
