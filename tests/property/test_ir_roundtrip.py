"""Properties of the IR over random well-typed modules (tests/property/strategies.py).

- print(parse(print(m))) == print(m) and parse(print(m)) == m, with any attribute values;
- every generated module verifies;
- the shapes inference assigns equal the shapes the interpreter produces, for random sizes of
  the symbolic dims.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from llmir_core.interp import Interpreter
from llmir_core.ir.dims import eval_dim
from llmir_core.ir.parser import parse_module
from llmir_core.ir.printer import print_module
from llmir_core.ir.types import TensorType, numpy_dtype
from llmir_core.verifier import verify
from tests.property.strategies import SYMS, attr_values, modules, random_inputs

PROFILE = settings(max_examples=150, deadline=None, derandomize=True, database=None)


@PROFILE
@given(modules())
def test_round_trip_and_verify(m) -> None:
    text = print_module(m)
    again = parse_module(text)
    assert again == m
    assert print_module(again) == text
    diags = verify(m, check_files=False) + verify(again, check_files=False)
    assert not diags, "\n".join(d.render() for d in diags) + "\n" + text


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(
    modules(), st.fixed_dictionaries({n: st.integers(1, 4) for n in SYMS}), st.integers(0, 2**31)
)
def test_inferred_shapes_match_the_interpreter(m, env, seed) -> None:
    fn = m.functions[0]
    interp = Interpreter(m, check_types=False)
    interp.trace = []
    interp.run(random_inputs(fn, env, np.random.default_rng(seed)))
    assert len(interp.trace) == len(fn.ops)
    for op, outs in interp.trace:
        for r, out in zip(op.results, outs):
            t = r.type
            assert isinstance(t, TensorType)
            assert out.dtype == numpy_dtype(t.dtype), (op.name, out.dtype, t)
            want = [eval_dim(d, env) for d in t.shape]
            got = list(np.shape(out))
            assert len(got) == len(want), (op.name, got, t)
            for g, w in zip(got, want):
                assert w is None or g == w, (op.name, got, str(t), env)


@PROFILE
@given(attr_values(max_leaves=12))
def test_any_attribute_value_round_trips(value) -> None:
    from llmir_core.ir.core import Function, Module

    m = Module("m", [Function("f", [], attrs={"a": value})])
    text = print_module(m)
    again = parse_module(text)
    assert again == m, text
    assert print_module(again) == text
