"""lm-evaluation-harness scores `llmir serve`: `lm_eval --model local-completions` on the local
tasks of tests/data/lm_eval_task (a multiple-choice task, scored by log-likelihoods, and a
generate_until task) completes, and every log-likelihood it logs equals the one computed
directly from the same artifact (one forward of context + continuation, a log-softmax, the sum
over the continuation's tokens); every generation equals the artifact's greedy text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, import_or_skip

from .conftest import Running
from .direct import greedy, token_logprobs
from .test_logprobs import ok

import_or_skip("lm_eval", "the test extra (lm-eval) is not installed")
import_or_skip("tenacity", "the test extra (lm-eval[api]: tenacity) is not installed")

TASKS = REPO / "tests" / "data" / "lm_eval_task"
TOL = 1e-4


def _samples(out: Path, task: str) -> list[dict[str, Any]]:
    (path,) = out.glob(f"**/samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_lm_eval_scores_llmir_serve(
    served_full: Running, full_artifact: Path, tmp_path: Path
) -> None:
    # lm-eval finds the server's /tokenizer_info and /tokenize and tokenizes through them (its
    # `remote` backend); `tokenizer=HF_FOLDER,tokenizer_backend=huggingface` gives the same ids
    # (tests/serve/test_logprobs_tokenize.py)
    url = served_full.url + "/v1/completions"
    model_args = f"model={served_full.model.name},base_url={url},max_retries=1"
    out = tmp_path / "out"
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
    }
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        "llmir_tiny_choice,llmir_tiny_gen",
        "--include_path",
        str(TASKS),
        "--batch_size",
        "4",  # several prompts per request
        "--log_samples",
        "--output_path",
        str(out),
    ]
    # the tasks' data_files are relative to their folder
    proc = subprocess.run(
        cmd, cwd=TASKS, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Using remote tokenizer backend" in proc.stderr, proc.stderr[-3000:]

    tok = served_full.model.tokenizer
    choice = _samples(out, "llmir_tiny_choice")
    assert len(choice) == 5
    checked = 0
    for doc in choice:
        for arg, resp in zip(doc["arguments"].values(), doc["resps"]):
            context, continuation = arg["arg_0"], arg["arg_1"]
            # lm-eval's split of the pair into tokens (its _encode_pair; no special tokens)
            ctx = tok.encode(context, add_special_tokens=False)
            whole = tok.encode(context + continuation, add_special_tokens=False)
            assert whole[: len(ctx)] == ctx
            direct = float(token_logprobs(full_artifact, whole)[len(ctx) - 1 :].sum())
            got = float(resp[0][0])
            assert got == pytest.approx(direct, abs=TOL), (context, continuation)
            checked += 1
    assert checked == 14

    gen = _samples(out, "llmir_tiny_gen")
    assert len(gen) == 3
    for doc in gen:
        args = doc["arguments"]["gen_args_0"]
        ids = tok.encode(args["arg_0"], add_special_tokens=False)
        kw = args["arg_1"]
        text = tok.decode(greedy(full_artifact, ids, kw["max_gen_toks"], served_full.model.eos_ids))
        want = text.split(kw["until"][0])[0]
        assert doc["resps"][0][0] == want
        # the server's own greedy answer to the same text (it encodes to the same ids: the
        # tiny tokenizer adds no BOS)
        assert served_full.model.encode_text(args["arg_0"]) == ids
        same = ok(served_full, prompt=args["arg_0"], max_tokens=8, temperature=0, stop="\n")
        assert same["choices"][0]["text"] == want
