"""The window scheme of `llmir eval` (llmir_core/runtime/evaluate.py, docs/eval.md): every token
scored exactly once, each window as wide as --ctx, its scored tokens after the context it gives,
and the settings' errors."""

from __future__ import annotations

import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.evaluate import DEFAULT_CTX, plan_windows, resolve_ctx

CASES = [
    (n, ctx, stride, bos)
    for n in (2, 3, 7, 64, 65, 100, 1000)
    for ctx, stride in ((2, 1), (3, 1), (3, 2), (8, 4), (8, 7), (8, 1), (16, None), (64, 63))
    for bos in (False, True)
]


@pytest.mark.parametrize(("n", "ctx", "stride", "bos"), CASES)
def test_every_token_is_scored_exactly_once(
    n: int, ctx: int, stride: int | None, bos: bool
) -> None:
    windows, step = plan_windows(n, ctx, stride, bos)
    assert step == (stride if stride is not None else ctx // 2)
    scored = [i for w in windows for i in range(w.score_from, w.end)]
    # with a BOS, T[0] is predicted from it; without, T[0] has nothing to be predicted from
    assert scored == list(range(0 if bos else 1, n))
    for k, w in enumerate(windows):
        width = (w.end - w.begin) + (1 if bos else 0)
        assert width <= ctx and w.begin == k * step
        # a window is cut short only by the end of the text
        assert width == ctx or w.end == n
        # the first scored token has something before it in the window (a token or the BOS)
        assert w.first_row(bos) >= 0
        if k:
            assert w.first_row(bos) + 1 == ctx - step  # positions of context before it
    assert windows[-1].end == n and all(w.end < n for w in windows[:-1])


def test_window_inputs_start_with_the_bos() -> None:
    windows, _ = plan_windows(10, 4, 2, True)
    toks = list(range(100, 110))
    assert [w.inputs(toks, 1) for w in windows] == [
        [1, 100, 101, 102],
        [1, 102, 103, 104],
        [1, 104, 105, 106],
        [1, 106, 107, 108],
        [1, 108, 109],
    ]
    assert [(w.score_from, w.end) for w in windows] == [(0, 3), (3, 5), (5, 7), (7, 9), (9, 10)]
    plain, _ = plan_windows(10, 4, 2, False)
    assert [w.inputs(toks, None) for w in plain][:2] == [[100, 101, 102, 103], [102, 103, 104, 105]]
    assert [(w.score_from, w.end) for w in plain] == [(1, 4), (4, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize(
    ("n", "ctx", "stride", "message"),
    [
        (10, 1, None, "--ctx must be at least 2 tokens, got 1"),
        (10, 0, None, "--ctx must be at least 2 tokens, got 0"),
        (10, 8, 0, "--stride must be between 1 and 7 (--ctx minus 1), got 0"),
        (10, 8, 8, "--stride must be between 1 and 7 (--ctx minus 1), got 8"),
        (10, 8, -3, "--stride must be between 1 and 7 (--ctx minus 1), got -3"),
        (1, 8, None, "the text has 1 token(s); perplexity needs at least 2"),
        (0, 8, None, "the text has 0 token(s); perplexity needs at least 2"),
    ],
)
def test_bad_settings_are_one_clear_error(
    n: int, ctx: int, stride: int | None, message: str
) -> None:
    with pytest.raises(InputError) as err:
        plan_windows(n, ctx, stride, True)
    assert err.value.message == message


def test_ctx_defaults_and_is_capped_by_the_model() -> None:
    assert resolve_ctx(None, None) == DEFAULT_CTX == 512
    assert resolve_ctx(None, 256) == 256  # the default shrinks to the model's context
    assert resolve_ctx(100, 256) == 100
    with pytest.raises(InputError, match=r"--ctx 300 exceeds the model's context of 256 tokens"):
        resolve_ctx(300, 256)  # an explicit --ctx does not shrink silently
    with pytest.raises(InputError, match="--ctx must be at least 2"):
        resolve_ctx(1, None)
