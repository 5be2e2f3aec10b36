"""Bad `.llmir` text: lone surrogate escapes, dimensions past int64, bytes that are not UTF-8 and
a megabyte-long line each get one located error (exit 2) from every command that reads the file,
and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmir_core.errors import clip_line
from tests.inputs.helpers import invoke, listing, rejected

GOOD = """module @m {
  func.func @main(%x: tensor<?b x 4 x f32>) -> tensor<?b x 4 x f32> {
    %y = core.add %x, %x : (tensor<?b x 4 x f32>, tensor<?b x 4 x f32>) -> tensor<?b x 4 x f32>
    return %y : tensor<?b x 4 x f32>
  }
}
"""

CASES = {
    "lone high surrogate": (
        GOOD.replace("module @m {", 'module @m attributes {a = "ok \\ud800"} {'),
        ":1:31:",
        "a lone UTF-16 surrogate",
    ),
    "lone low surrogate after a pair": (
        GOOD.replace("module @m {", 'module @m attributes {a = "\\ud83d\\ude00\\udc00"} {'),
        ":1:40:",
        "a lone UTF-16 surrogate",
    ),
    "surrogate in a location": (
        GOOD.replace("f32>\n    return", 'f32> loc("\\udfff")\n    return'),
        ":3:",
        "a lone UTF-16 surrogate",
    ),
    "dimension of 10^23": (
        GOOD.replace("?b x 4 x f32>) ->", "?b x 100000000000000000000000 x f32>) ->", 1),
        ":2:35:",
        "larger than the largest int64",
    ),
    "compact dimension of 10^23": (
        GOOD.replace("%x: tensor<?b x 4 x f32>", "%x: tensor<100000000000000000000000x4xf32>"),
        ":2:30:",
        "larger than the largest int64",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["verify", "fmt -i", "build", "optimize"])
def test_bad_text_is_located(tmp_path: Path, case: str, command: str) -> None:
    text, where, message = CASES[case]
    f = tmp_path / "m.llmir"
    f.write_text(text, encoding="utf-8")
    args = {
        "verify": ["verify"],
        "fmt -i": ["fmt", "-i"],
        "build": ["build", "-o", str(tmp_path / "out")],
        "optimize": ["optimize", "-o", str(tmp_path / "o.llmir")],
    }[command]
    code, out, err = invoke(*args, str(f))
    line = rejected(code, err, expect=2, names=f"{f}{where}")
    assert message in line
    assert listing(tmp_path) == {"m.llmir"} and f.read_text(encoding="utf-8") == text


def test_surrogate_pairs_still_parse(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text(
        GOOD.replace("module @m {", 'module @m attributes {a = "\\ud83d\\ude00 \\\\ud800"} {')
    )
    code, out, err = invoke("fmt", str(f))
    assert code == 0, err
    assert '"\U0001f600 \\\\ud800"' in out


def test_not_utf8_gets_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_bytes(GOOD.encode().replace(b"core.add", b"core.\xff\xfeadd"))
    code, out, err = invoke("verify", str(f))
    rejected(code, err, expect=2, names=f"{f}:3:15: error: not UTF-8 text (byte 0xff at offset 96)")
    assert "core.\ufffd\ufffdadd" in err  # the line, shown with replacement characters


def test_long_line_diagnostic_is_clipped_around_the_column(tmp_path: Path) -> None:
    f = tmp_path / "m.llmir"
    f.write_text(
        GOOD.replace("module @m {", "module @m attributes {a = [" + "1, " * 100_000 + "%]} {")
    )
    code, out, err = invoke("verify", str(f))
    rejected(code, err, expect=2, names=f"{f}:1:300028:")
    assert len(err) < 1000
    shown, caret = err.splitlines()[1:3]
    assert shown.startswith("  ...") and shown.endswith("%]} {")
    assert caret.index("^") == shown.index("%")


def test_clip_line() -> None:
    assert clip_line("abc", 2) == ("abc", 1)
    assert clip_line("x" * 400, 399) == ("x" * 400, 398)  # ordinary long IR lines are shown whole
    line = "x" * 500 + "Y" + "z" * 500
    shown, caret = clip_line(line, 501, width=20, limit=100)
    assert shown[caret] == "Y" and shown.startswith("...") and shown.endswith("...")
    shown, caret = clip_line(line, 1, width=20, limit=100)
    assert caret == 0 and not shown.startswith("...")
    shown, caret = clip_line(line, len(line), width=20, limit=100)
    assert shown[caret] == "z" and not shown.endswith("...")
