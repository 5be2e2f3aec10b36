"""`llmir serve` of a `--target reference` artifact: /v1/completions answers what `llmir run`
generates (the server's batch decoder is the target's `open_batch`)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from llmir_core.runtime.textgen import TextGenerator, TextGenOptions
from tests.decoder.reference_fixtures import ref_artifact, tiny_llmir  # noqa: F401  (fixtures)

from .conftest import start_server


def _complete(url: str, **body: Any) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/v1/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        data: dict[str, Any] = json.loads(r.read())
    return data


def _serve_and_compare(art: Path) -> None:
    run = start_server(art, max_batch=2, max_queue=4, chunk=4)
    try:
        got = _complete(
            run.url, model=run.model.name, prompt="Once upon", max_tokens=10, temperature=0
        )
        assert run.model.manifest["target"] == "reference"
    finally:
        run.stop()
    want = TextGenerator(str(art), TextGenOptions(max_new_tokens=10)).generate("Once upon")
    assert got["choices"][0]["text"] == want.result.text
    assert got["usage"]["completion_tokens"] == len(want.result.ids)


def test_llmir_serve_answers_completions(ref_artifact: Path) -> None:  # noqa: F811
    _serve_and_compare(ref_artifact)
