"""`import --no-tokenizer` really drops the tokenizer: the build has none and `run` takes token ids."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from llmir_cli.app import app
from llmir_core.targets.onnxruntime.runner import open_decoder

from .helpers import greedy


def _invoke(*args: object) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


def test_no_tokenizer_through_build_and_run(tiny_dir: Path, tmp_path: Path) -> None:
    assert (tiny_dir / "tokenizer.json").is_file()  # the folder has one: --no-tokenizer skips it
    code, _, err = _invoke("import", tiny_dir, "--no-tokenizer", "-o", tmp_path / "m.llmir")
    assert code == 0, err
    assert "llm.tokenizer" not in (tmp_path / "m.llmir").read_text()
    code, _, err = _invoke("build", tmp_path / "m.llmir", "-o", tmp_path / "art")
    assert code == 0, err
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert (
        not manifest["decoder"].get("tokenizer")
        and not (tmp_path / "art" / "tokenizer.json").exists()
    )

    code, out, err = _invoke("run", tmp_path / "art", "--prompt", "hello")
    assert code == 2 and "has no tokenizer, so it cannot take text" in err and "--prompt-ids" in err
    code, out, err = _invoke("run", tmp_path / "art", "--prompt-ids", "5,6,7", "-n", "6")
    assert code == 0, err
    want = greedy(open_decoder(str(tmp_path / "art")), [5, 6, 7], 6)
    assert out.split() == [str(i) for i in want]
    code, out, err = _invoke(
        "run",
        tmp_path / "art",
        "--prompt-ids",
        "5 6",
        "--prompt-ids",
        "[7]",
        "-n",
        "3",
        "--format",
        "json",
    )
    assert code == 0, err
    res = json.loads(out)["results"]
    assert [r["prompt_token_ids"] for r in res] == [[5, 6], [7]] and all(
        len(r["token_ids"]) == 3 for r in res
    )


def test_prompt_ids_errors(tiny_artifact: Path) -> None:
    for ids, msg in (
        ("1,x", "'x' is not a token id"),
        ("", "no token ids"),
        ("99999", "token id 99999 is outside the vocabulary"),
    ):
        code, _, err = _invoke("run", tiny_artifact, "--prompt-ids", ids)
        assert code == 2 and msg in err, err
    code, _, err = _invoke("run", tiny_artifact, "--prompt-ids", "1", "--prompt", "x")
    assert code == 2 and "pick one" in err
    code, _, err = _invoke("run", tiny_artifact, "--prompt-ids", "1", "--stop", "x")
    assert code == 2 and "--prompt-ids takes and gives token ids" in err
