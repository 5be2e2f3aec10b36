"""`llmir run --format json` carries the exact generated text, escaped by JSON alone; the terminal
gets it display-safe (control characters shown as `\\x1b`). A scripted decoder emits tokens that
decode to terminal control sequences (ESC [2J, C1 CSI)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.runtime import textgen

CONTROL = ["\x1b[2J", "\x9b", "\x07"]  # clear screen, C1 CSI, bell


class _Scripted:
    """A decoder whose next tokens follow a script (then repeats the last)."""

    def __init__(self, manifest: dict[str, Any], script: list[int]) -> None:
        self.manifest = manifest
        self.script = script
        self.vocab = int(manifest["decoder"]["vocab"])
        self.max_context = 256
        self.length = 0
        self.step = 0

    def reserve(self, tokens: int) -> None:
        pass

    def reset(self, batch: int = 1) -> None:
        self.length = self.step = 0

    def forward(self, ids: np.ndarray) -> np.ndarray:
        self.length += ids.shape[1]
        logits = np.zeros((1, ids.shape[1], self.vocab), np.float32)
        logits[0, -1, self.script[min(self.step, len(self.script) - 1)]] = 1.0
        self.step += 1
        return logits


def _with_control_tokens(src: Path, dst: Path) -> list[int]:
    """Copy the artifact; three filler tokens become control sequences. Returns their ids."""
    shutil.copytree(src, dst)
    tok = json.loads((dst / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    ids = []
    for i, text in enumerate(CONTROL):
        tid = vocab.pop(f"<extra_{i}>")
        vocab[text] = tid
        ids.append(tid)
        for added in tok["added_tokens"]:
            if added["id"] == tid:
                added.update(content=text, special=False)
    data = json.dumps(tok).encode()
    (dst / "tokenizer.json").write_bytes(data)
    m = json.loads((dst / "manifest.json").read_text())
    m["files"]["tokenizer.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (dst / "manifest.json").write_text(json.dumps(m))
    return ids


@pytest.fixture
def scripted(tiny_artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    art = tmp_path / "art"
    ids = _with_control_tokens(tiny_artifact, art)
    manifest = json.loads((art / "manifest.json").read_text())
    monkeypatch.setattr(textgen, "open_decoder", lambda *a, **k: _Scripted(manifest, ids))
    return art


def test_json_text_is_the_exact_text(scripted: Path) -> None:
    r = CliRunner().invoke(app, ["run", str(scripted), "-p", "ab", "-n", "3", "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert "\\u001b[2J\\u009b\\u0007" in r.stdout  # escaped by JSON, nothing else
    res = json.loads(r.stdout)["results"][0]
    assert res["text"] == "".join(CONTROL)


def test_terminal_text_is_display_safe(scripted: Path) -> None:
    r = CliRunner().invoke(app, ["run", str(scripted), "-p", "ab", "-n", "3"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "\\x1b[2J\\x9b\\x07\n"
    assert "\x1b" not in r.stdout and "\x9b" not in r.stdout
