"""The server opens its model through the target table (`open_batch_artifact` -> the target's
`open_batch`), never a runner of its own choosing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def test_serve_opens_the_artifact_through_its_target_s_open_batch(
    tiny_artifact: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import llmir_core.targets as targets
    from llmir_core.serve.model import open_served_model

    real = targets.get_target("onnxruntime")
    calls: list[tuple[str, str, int, dict[str, Any]]] = []

    class Spy:
        name = "onnxruntime"

        def open_batch(self, art: str, slots: int, **opts: Any) -> Any:
            calls.append((self.asked, art, slots, opts))
            return real.open_batch(art, slots, **opts)

    def get_target(name: str) -> Spy:
        spy = Spy()
        spy.asked = name  # type: ignore[attr-defined]
        return spy

    monkeypatch.setattr(targets, "get_target", get_target)
    model = open_served_model(str(tiny_artifact), max_batch=2, threads=1, max_context=40)
    assert calls == [
        ("onnxruntime", str(tiny_artifact), 2, {"threads": 1, "max_context": 40}),
    ]
    assert model.decoder.slots == 2 and model.max_context == 40
    assert model.manifest["target"] == "onnxruntime"
