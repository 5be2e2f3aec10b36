"""examples/Makefile runs the whole pipeline (init, import, optimize, verify, build, bench) on a
tiny model from an offline directory mirror, and a second `make` has nothing to do."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.decoder.tiny import make_llama_folder


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_makefile_pipeline_offline(tmp_path: Path) -> None:
    model = make_llama_folder(tmp_path / "src")
    files = {p.name: p.read_bytes() for p in sorted(model.iterdir()) if p.is_file()}
    mirror = tmp_path / "mirror"
    (mirror / "blobs").mkdir(parents=True)
    for data in files.values():
        (mirror / "blobs" / hashlib.sha256(data).hexdigest()).write_bytes(data)
    index = {
        "index_version": 1,
        "models": {
            "tiny-llama:1": {
                "description": "tiny",
                "source": {"hf": "org/tiny-llama", "revision": "main"},
                "format": "safetensors",
                "quantization": "f32",
                "license": "mit",
                "parameters": 1,
                "files": [
                    {"path": p, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                    for p, d in files.items()
                ],
            }
        },
    }
    (mirror / "index.json").write_text(json.dumps(index))
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "NO_COLOR": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
    }
    args = [
        "make",
        "-f",
        str(REPO / "examples" / "Makefile"),
        "MODEL=tiny-llama:1",
        f"INIT_FLAGS=--registry {mirror} --offline",
        f"LLMIR={sys.executable} -m llmir_cli.app",
    ]
    r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    project = tmp_path / "tiny-llama-1"
    bench = json.loads((project / "bench.json").read_text())
    assert bench["results"]["decode_tokens_per_s_aggregate"]["mean"] > 0
    assert (project / "opt.llmir").is_file() and (project / "build" / "manifest.json").is_file()
    again = subprocess.run(
        [*args, "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0  # `make -q`: exit 0 means every target is up to date
