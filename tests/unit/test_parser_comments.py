"""Comment lines inside a function body parse in linear time, whatever text they hold.

The op-line pattern skips whitespace and `//` comments before an op; written as a repeated group
of repeated parts it backtracked exponentially when a comment held op-like text (a FileCheck line
such as `// CHECK: %x = core.constant {value = dense<{{...}}>}`): parsing such a file hung."""

from __future__ import annotations

import time

from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module


def _module(comment: str, copies: int) -> str:
    body = "\n".join([f"    // {comment}   " for _ in range(copies)])
    return f"""module @m {{
  func.func @f(%a: tensor<2xf32>) -> tensor<2xf32> {{
{body}
    %b = core.add %a, %a : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
{body}
    return %b : tensor<2xf32>
  }}
}}
"""


def test_op_like_comments_parse_quickly() -> None:
    comment = r"CHECK: %x = core.constant {value = dense<{{\[\[.*\]\]}}>} : () -> //  loc("
    t0 = time.process_time()
    m = parse_module(_module(comment, 300), "t.llmir")
    # generous bound (well under a second on any machine); the old pattern never finished
    assert time.process_time() - t0 < 5.0
    assert [op.name for op in m.functions[0].ops] == ["core.add"]


def test_comment_mentioning_loc_does_not_attach_a_location() -> None:
    m = parse_module(_module('loc("not-this")', 1), "t.llmir")
    assert "not-this" not in print_module(m)
