"""Target build options as declarations (llmir_core.targets.options): parsing `--target-opt`
texts by kind, the one-line errors, the defaults filled in, the onnxruntime declarations kept in
step with the passes' tables, and `build_options` taking options for any target."""

from __future__ import annotations

from typing import Any

import pytest

from llmir_core.errors import InputError
from llmir_core.ir.parser import parse_module
from llmir_core.targets import build_options, get_target
from llmir_core.targets.contract import TargetOption
from llmir_core.targets.options import (
    check_options,
    describe,
    effective,
    parse_assignments,
)

PLAIN = """module @m {
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = core.add %x, %x : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
"""


class _Toy:
    name = "toy"
    options = (
        TargetOption("n", "int", "a count", 3),
        TargetOption("on", "bool", "a switch", False),
        TargetOption("mode", "str", "a mode", "a", ("a", "b")),
        TargetOption("tag", "str", "any text"),
    )


def test_values_parse_by_kind() -> None:
    got = parse_assignments(_Toy(), ["n=7", "on=yes", "mode=b", "tag=x=y"])
    assert got == {"n": 7, "on": True, "mode": "b", "tag": "x=y"}
    assert parse_assignments(_Toy(), ["on=False"]) == {"on": False}


@pytest.mark.parametrize(
    "item,message",
    [
        (
            "size=1",
            "--target-opt: unknown option 'size' for target toy (its options: n, on, mode, tag)",
        ),
        ("n=seven", "--target-opt n must be an integer, got 'seven'"),
        ("on=maybe", "--target-opt on must be true or false, got 'maybe'"),
        ("mode=c", "--target-opt mode must be one of a, b, got 'c'"),
        ("n", "--target-opt takes KEY=VALUE, got 'n'"),
        ("=1", "--target-opt takes KEY=VALUE, got '=1'"),
    ],
)
def test_bad_assignment_is_one_line(item: str, message: str) -> None:
    with pytest.raises(InputError) as e:
        parse_assignments(_Toy(), [item])
    assert str(e.value.message) == message


def test_an_option_given_twice_is_refused() -> None:
    with pytest.raises(InputError, match="--target-opt n is given twice"):
        parse_assignments(_Toy(), ["n=1", "n=2"])


def test_typed_values_are_checked_and_named_as_spelled() -> None:
    assert check_options(_Toy(), {"n": 2, "tag": None}) == {"n": 2}  # None: not given
    with pytest.raises(InputError, match="^--count must be an integer, got 'x'$"):
        check_options(_Toy(), {"n": "x"}, {"n": "--count"})
    with pytest.raises(InputError, match="^--target-opt on must be true or false, got 1$"):
        check_options(_Toy(), {"on": 1})
    with pytest.raises(InputError, match="unknown option 'zz' for target toy"):
        check_options(_Toy(), {"zz": 1})


def test_effective_fills_every_default() -> None:
    assert effective(_Toy(), {"n": 5}) == {"n": 5, "on": False, "mode": "a", "tag": None}
    assert [r["name"] for r in describe(_Toy())] == ["n", "on", "mode", "tag"]


def test_declarations_are_well_formed() -> None:
    for name in ("onnxruntime", "triton"):
        t = get_target(name)
        names = [o.name for o in t.options]
        assert len(names) == len(set(names)), name
        for o in t.options:
            assert o.kind in ("str", "int", "bool") and o.help, o
            if o.default is not None:  # the default passes the option's own check
                check_options(t, {o.name: o.default})


def test_onnxruntime_choices_match_the_passes() -> None:
    """The declarations spell the passes' tables out (opening an artifact imports no pass):
    the choices and defaults must stay in step with them."""
    from llmir_core.targets.onnxruntime import lower_common as lc
    from llmir_core.targets.onnxruntime.lower_attention import ATTENTION_KERNEL
    from llmir_core.targets.onnxruntime.lower_matmul import INT8_MATMUL, NBITS_KERNEL, NBITS_SCALES
    from llmir_core.targets.onnxruntime.lower_norms import NORM_KERNEL
    from llmir_core.targets.onnxruntime.lower_weight_dtype import (
        F32_KERNEL,
        F32_KERNELS,
        WEIGHT_DTYPES,
    )

    opts = {o.name: o for o in get_target("onnxruntime").options}
    table: dict[str, tuple[tuple[str, ...], Any]] = {
        "quant": (("none", *lc.QUANT_MODES), "none"),
        "prepack": (lc.PREPACK_MODES, lc.PREPACK),
        "gguf_kernels": (lc.GGUF_KERNELS, lc.GGUF_KERNEL),
        "attention_kernel": (ATTENTION_KERNEL, ATTENTION_KERNEL[0]),
        "int8_matmul": (INT8_MATMUL, INT8_MATMUL[0]),
        "nbits_kernel": (NBITS_KERNEL, NBITS_KERNEL[0]),
        "nbits_scales": (NBITS_SCALES, NBITS_SCALES[0]),
        "norm_kernel": (NORM_KERNEL, NORM_KERNEL[0]),
        "f32_matmul": (F32_KERNELS, F32_KERNEL),
        "dtype": ((*WEIGHT_DTYPES, "f32"), None),
    }
    for name, (choices, default) in table.items():
        assert sorted(opts[name].choices) == sorted(choices), name
        assert opts[name].default == default, name
    assert opts["accuracy_level"].default == lc.ACCURACY_LEVEL
    assert opts["last_logits"].default is lc.LAST_LOGITS
    assert opts["cpu"].choices == ("x86-64-v3", "x86-64", "host")
    assert opts["cpu"].default == "x86-64-v3"


def test_build_options_takes_any_targets_options() -> None:
    """Options of a target other than onnxruntime are no longer refused; an alias flag is an
    option like any other (--max-len is triton's max_len too)."""
    m = parse_module(PLAIN, "m.llmir")
    got = build_options(m, "triton", target_opts=["arch=sm_80", "kv_cache=int8"], max_len=64)
    assert got == {"arch": "sm_80", "kv_cache": "int8", "max_len": 64}
    with pytest.raises(InputError, match="^--quant: unknown option 'quant' for target triton"):
        build_options(m, "triton", quant="int4")
    with pytest.raises(InputError, match="^--target-opt arch must be CUDA architectures"):
        build_options(m, "triton", target_opts=["arch=sm80"])
    with pytest.raises(InputError, match="^--target-opt max_len must be >= 1, got 0$"):
        build_options(m, "triton", target_opts=["max_len=0"])
    with pytest.raises(InputError, match="^--max-len and --target-opt max_len both given$"):
        build_options(m, "triton", target_opts=["max_len=3"], max_len=4)


def test_onnxruntime_refusals_are_its_hook() -> None:
    m = parse_module(PLAIN, "m.llmir")
    assert build_options(m, "onnxruntime", target_opts=["cpu=x86-64"]) == {"cpu": "x86-64"}
    with pytest.raises(InputError, match="^options quant apply to decoder builds only$"):
        build_options(m, "onnxruntime", target_opts=["quant=int4"])
    with pytest.raises(InputError, match="^--logits must be 'last' or 'all', got 'some'$"):
        build_options(m, "onnxruntime", logits="some")


def test_manifest_schema_takes_target_options() -> None:
    from llmir_core.artifact_check import manifest_schema
    from llmir_core.json_schema import validate

    base = {"target": "llmir-test", "files": {}}  # a target with no required fields
    ok = {**base, "target_options": {"arch": "sm_80", "max_len": None, "split_k": 0}}
    assert validate(ok, manifest_schema()) == []
    assert validate({**base, "target_options": ["arch=sm_80"]}, manifest_schema())
    assert validate({**base, "target_options": {"arch": ["sm_80"]}}, manifest_schema())
