"""Session options of the decoder runtime: thread spinning follows how busy the CPUs are."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmir_core.runtime import cpu_load
from llmir_core.targets.onnxruntime import runner as ort_decoder


@pytest.mark.parametrize(("busy", "spin"), [(0.0, "1"), (0.1, "1"), (1.2, "0")])
def test_spinning_only_on_an_idle_machine(
    monkeypatch: pytest.MonkeyPatch, busy: float, spin: str
) -> None:
    monkeypatch.setattr(cpu_load, "busy_now", lambda: busy)
    so = ort_decoder.session_options(2)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == spin


def test_one_thread_never_spins_and_explicit_choice_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_load, "busy_now", lambda: 0.0)
    assert not ort_decoder.auto_spin(1)
    so = ort_decoder.session_options(2, spin=False)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    monkeypatch.setattr(cpu_load, "busy_now", lambda: 2.0)
    so = ort_decoder.session_options(2, spin=True)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "1"


@pytest.mark.parametrize(("busy", "spin"), [(0.0, True), (1.5, False)])
def test_the_decoder_says_whether_its_threads_spin(
    monkeypatch: pytest.MonkeyPatch, tiny_artifact: Path, busy: float, spin: bool
) -> None:
    from llmir_core.runtime.bench import run_bench

    monkeypatch.setattr(cpu_load, "busy_now", lambda: busy)
    dec = ort_decoder.open_decoder(str(tiny_artifact), threads=2)
    assert dec.spin is spin
    assert ort_decoder.open_decoder(str(tiny_artifact), threads=2, spin=not spin).spin is not spin
    assert ort_decoder.open_decoder(str(tiny_artifact), threads=1).spin is False
    res = run_bench(dec, dec.vocab, prompt_len=2, gen_len=2, runs=1, warmup=0, threads=2)
    assert res.to_json()["config"]["spin"] is spin


def test_busy_now_counts_other_runnable_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run-queue sample: this thread is not counted; a steady other runner counts 1."""
    seq = iter([1, 2, 1, 2] + [3] * 4)
    monkeypatch.setattr(cpu_load, "_procs_running", lambda: next(seq))
    assert cpu_load.busy_now(samples=4, interval_s=0.0) == pytest.approx(0.5)
    assert cpu_load.busy_now(samples=4, interval_s=0.0) == pytest.approx(2.0)

    def missing() -> int:
        raise ValueError("no procs_running")

    monkeypatch.setattr(cpu_load, "_procs_running", missing)
    monkeypatch.setattr(cpu_load, "busy_cores", lambda s: 0.7)
    assert cpu_load.busy_now() == pytest.approx(0.7)
