"""`llmir import NAME:TAG` resolves the reference as `llmir init` does (here: a directory mirror,
offline, so no connection is made) and imports the pulled model folder."""

from __future__ import annotations

from pathlib import Path

from conftest import entry, llmir, sha256, write_index

from tests.decoder.tiny import make_llama_folder


def _mirror(tmp_path: Path) -> Path:
    model = make_llama_folder(tmp_path / "src")
    files = {p.name: p.read_bytes() for p in sorted(model.iterdir()) if p.is_file()}
    mirror = tmp_path / "mirror"
    write_index(mirror / "index.json", {"tiny-llama:1": entry("org/tiny-llama", dict(files))})
    (mirror / "blobs").mkdir()
    for data in files.values():
        (mirror / "blobs" / sha256(data)).write_bytes(data)
    return mirror


def test_import_a_registry_reference_offline(env, hub, tmp_path) -> None:
    mirror = _mirror(tmp_path)
    out = tmp_path / "m.llmir"
    r = llmir(env, "import", "tiny-llama:1", "--registry", str(mirror), "--offline", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert hub.connections == 0
    assert "resolving tiny-llama:1" in r.stderr
    assert out.is_file()
    assert llmir(env, "verify", str(out)).returncode == 0


def test_import_an_unknown_reference_suggests_names(env, hub, tmp_path) -> None:
    mirror = _mirror(tmp_path)
    r = llmir(
        env,
        "import",
        "tiny-lama:1",
        "--registry",
        str(mirror),
        "--offline",
        "-o",
        str(tmp_path / "m.llmir"),
    )
    assert r.returncode == 2
    assert "tiny-llama:1" in r.stderr  # the close name is suggested
    assert not (tmp_path / "m.llmir").exists()


def test_import_without_tokenizer_needs_the_flag(env, hub, tmp_path) -> None:
    model = make_llama_folder(tmp_path / "m", tokenizer=False)
    r = llmir(env, "import", str(model), "-o", str(tmp_path / "a.llmir"))
    assert r.returncode == 2 and "tokenizer.json is missing" in r.stderr
    r = llmir(env, "import", str(model), "--no-tokenizer", "-o", str(tmp_path / "a.llmir"))
    assert r.returncode == 0, r.stderr
