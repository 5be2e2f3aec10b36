"""Targets and op sets from other packages, through entry points (issue 23, item 1).

The plugin packages live in tests/plugins (llmir_ext_demo: the `ext` op set and the `numpy-ext`
target; llmir_ext_bad: plugins llmir must refuse). Each test installs them for real: it writes
a `<dist>-1.0.dist-info` folder (METADATA, entry_points.txt) into a temp folder on the path, so
importlib.metadata finds the entry points exactly as for a pip-installed package. CLI checks run
`python -m llmir_cli` in a subprocess with that folder on PYTHONPATH; in-process checks restore
the op registry afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"
DEMO = {
    "llmir.dialects": {"ext": "llmir_ext_demo.ops"},
    "llmir.targets": {"numpy-ext": "llmir_ext_demo.target:TARGET"},
}
BAD = {
    "llmir.dialects": {
        "broken": "llmir_ext_bad.broken",
        "shadow": "llmir_ext_bad.shadow",
        "intrude": "llmir_ext_bad.intrude",
    },
    "llmir.targets": {
        "broken-target": "llmir_ext_bad._op:TARGET",  # no such object
        "onnxruntime": "llmir_ext_demo.target:TARGET",
    },
}
PASSES_TARGET = "llmir_ext_bad.shadow_pass:TARGET"
T = "tensor<?n x 8 x f32>"
EXT_MODULE = f"""module @ext_demo attributes {{llmir.dialects = ["core", "ext"], llmir.version = "0.1"}} {{
  func.func @main(%x: {T}) -> {T} {{
    %a = ext.swish_beta %x {{beta = 1.5}} : ({T}) -> {T}
    %y = ext.soft_clip %a {{bound = 2.0}} : ({T}) -> {T}
    return %y : {T}
  }}
}}
"""
CORE_MODULE = f"""module @plain attributes {{llmir.dialects = ["core"], llmir.version = "0.1"}} {{
  func.func @main(%x: {T}) -> {T} {{
    %y = core.silu %x : ({T}) -> {T}
    return %y : {T}
  }}
}}
"""


def expected(x: np.ndarray) -> np.ndarray:
    """What EXT_MODULE computes, written out in numpy."""
    a = x / (1.0 + np.exp(-1.5 * x))
    return 2.0 * np.tanh(a / 2.0)


def install(site: Path, dist: str, groups: dict[str, dict[str, str]]) -> None:
    """A distribution `dist` with these entry points, as pip leaves it in site-packages."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = []
    for group, eps in groups.items():
        lines += [f"[{group}]", *(f"{k} = {v}" for k, v in eps.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))


def llmir(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(PLUGINS), str(REPO)])}
    env["LLMIR_HOME"] = str(cwd / "home")
    return subprocess.run(
        [sys.executable, "-m", "llmir_cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def demo_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    install(site, "llmir-ext-demo", DEMO)
    (tmp_path / "m.llmir").write_text(EXT_MODULE)
    np.save(tmp_path / "x.npy", np.linspace(-6, 6, 24, dtype=np.float32).reshape(3, 8))
    return site


def test_ext_ops_run_the_same_on_the_interpreter_and_onnxruntime(
    demo_site: Path, tmp_path: Path
) -> None:
    """The op set's ops parse and verify (`llmir run` of a .llmir verifies it first); the
    interpreter runs ext.swish_beta's reference and ext.soft_clip's decomposition; onnxruntime,
    which has a kernel for neither, is built their decompositions; both agree with numpy."""
    import onnx

    r = llmir(demo_site, "run", "m.llmir", "--input", "x=x.npy", "--output-dir", "ref",
              cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = llmir(demo_site, "build", "m.llmir", "--target", "onnxruntime", "-o", "ort",
              cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    graph = onnx.load(str(tmp_path / "ort" / "model.onnx"), load_external_data=False).graph
    kinds = {n.op_type for n in graph.node}
    assert {"Sigmoid", "Tanh", "Mul", "Div"} <= kinds, kinds
    assert not any(n.domain.startswith("ext") for n in graph.node)
    r = llmir(demo_site, "run", "ort", "--backend", "onnxruntime", "--input", "x=x.npy",
              "--output-dir", "out", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    x = np.load(tmp_path / "x.npy")
    ref, ort = np.load(tmp_path / "ref" / "y.npy"), np.load(tmp_path / "out" / "y.npy")
    np.testing.assert_allclose(ref, expected(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ort, ref, rtol=1e-5, atol=1e-6)


def test_plugin_target_builds_from_the_cli(demo_site: Path, tmp_path: Path) -> None:
    """`llmir build --target numpy-ext`: the plugin's lowering keeps ext.swish_beta (its native
    kernel) and decomposes ext.soft_clip (no kernel); `llmir optimize --list` names its pass;
    `llmir verify --target numpy-ext` checks a module against its capabilities."""
    r = llmir(demo_site, "build", "m.llmir", "--target", "numpy-ext", "-o", "np", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "np" / "manifest.json").read_text())
    assert manifest["target"] == "numpy-ext"
    lowered = (tmp_path / "np" / "model.llmir").read_text()
    assert "ext.swish_beta" in lowered and "ext.soft_clip" not in lowered
    assert "core.tanh" in lowered
    r = llmir(demo_site, "optimize", "--list", cwd=tmp_path)
    assert r.returncode == 0 and "lower-numpy-ext" in r.stdout, r.stdout + r.stderr
    r = llmir(demo_site, "verify", "m.llmir", "--target", "numpy-ext", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    llm = EXT_MODULE.replace(
        f"ext.soft_clip %a {{bound = 2.0}} : ({T})", f"llm.silu_mul %a, %a : ({T}, {T})"
    )
    (tmp_path / "llm.llmir").write_text(llm)
    r = llmir(demo_site, "verify", "llm.llmir", "--target", "numpy-ext", cwd=tmp_path)
    assert r.returncode != 0 and "llm.silu_mul cannot run here" in r.stderr, r.stderr


def test_broken_plugins_cost_one_line_each_and_core_keeps_working(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site, "llmir-ext-bad", BAD)
    (tmp_path / "m.llmir").write_text(CORE_MODULE)
    r = llmir(site, "build", "m.llmir", "--target", "onnxruntime", "-o", "ort", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    by = {w.split("'")[1]: w for w in warnings}
    assert set(by) == {"broken", "shadow", "intrude", "broken-target", "onnxruntime"}, warnings
    assert all("(package 'llmir-ext-bad')" in w for w in warnings), warnings
    assert "ModuleNotFoundError: No module named 'llmir_ext_missing_dependency'" in by["broken"]
    assert "op core.silu is refused: a built-in op has that name" in by["shadow"]
    assert "op llm.swish is refused: 'llm' is a built-in dialect" in by["intrude"]
    assert "'onnxruntime' is a built-in target" in by["onnxruntime"]
    assert json.loads((tmp_path / "ort" / "manifest.json").read_text())["target"] == "onnxruntime"
    r = llmir(site, "build", "m.llmir", "--target", "broken-target", "-o", "b", cwd=tmp_path)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(errors) == 1, r.stderr
    assert errors[0] == (
        "error: plugin target 'broken-target' (package 'llmir-ext-bad') failed to load "
        "(llmir_ext_bad._op:TARGET): AttributeError: module 'llmir_ext_bad._op' has no "
        "attribute 'TARGET'"
    )


def test_cli_startup_scans_no_entry_points() -> None:
    """`import llmir_cli.app` and `llmir --help` read no entry point (scanning waits for the
    first use of the op registry or the target table)."""
    code = (
        "import importlib.metadata as m\n"
        "def boom(*a, **k): raise SystemExit('entry points scanned at startup')\n"
        "m.entry_points = boom\n"
        "from typer.testing import CliRunner\n"
        "from llmir_cli.app import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr


# -- in process -----------------------------------------------------------------------------


@pytest.fixture
def plugged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The demo package installed and the op registry reloaded with it; restored afterwards."""
    from llmir_core.dialects import registry

    registry.all_ops()  # the built-in ops, loaded before the plugin is on the path
    ops, dialects = dict(registry.OPS), dict(registry.DIALECTS)
    site = tmp_path / "site"
    install(site, "llmir-ext-demo", DEMO)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setattr(registry, "_loaded", False)
    try:
        yield tmp_path
    finally:
        registry.OPS.clear()
        registry.OPS.update(ops)
        registry.DIALECTS.clear()
        registry.DIALECTS.update(dialects)
        for name in [m for m in sys.modules if m.startswith("llmir_ext_")]:
            del sys.modules[name]


def test_plugin_target_runs_its_native_kernel_not_the_decomposition(plugged: Path) -> None:
    from llmir_core.dialects import registry
    from llmir_core.ir.parser import parse_module
    from llmir_core.targets import build, get_target, open_artifact

    od = registry.all_ops()["ext.swish_beta"]

    def no(*_: object) -> list[object]:
        raise AssertionError("ext.swish_beta's decomposition used by numpy-ext")

    registry.OPS["ext.swish_beta"] = dataclasses.replace(od, decompose=no)
    t = get_target("numpy-ext")
    build(parse_module(EXT_MODULE, "m.llmir"), str(plugged / "art"), "numpy-ext")
    calls = sys.modules["llmir_ext_demo.target"].CALLS
    x = np.linspace(-6, 6, 24, dtype=np.float32).reshape(3, 8)
    y = open_artifact(str(plugged / "art")).run({"x": x})["y"]
    assert calls == {"ext.swish_beta": 1}
    np.testing.assert_allclose(y, expected(x), rtol=1e-5, atol=1e-6)
    assert t.name == "numpy-ext"


def test_a_plugin_cannot_shadow_a_builtin_op(
    plugged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmir_core.dialects import registry

    registry.all_ops()
    before = dict(registry.OPS)
    assert not registry.load_plugin_ops("llmir_ext_bad.shadow", "plugin op set 'shadow'")
    assert capsys.readouterr().err == (
        "warning: plugin op set 'shadow' is not loaded (llmir_ext_bad.shadow): op core.silu is "
        "refused: a built-in op has that name\n"
    )
    assert registry.OPS == before  # shadow.fine, registered before the refusal, is gone
    assert registry.OPS["core.silu"] is before["core.silu"]
    assert "llmir_ext_bad.shadow" not in sys.modules


def test_translation_validation_takes_the_decomposition_as_the_meaning(plugged: Path) -> None:
    """numpy-ext's lowering replaces ext.soft_clip by its decomposition: translation validation
    proves the two modules equal (the extension op is expanded through its decomposition, not
    an opaque function) without testing them."""
    from llmir_core.ir.parser import parse_module
    from llmir_core.passes.base import PassContext, clone_module
    from llmir_core.smt.tv import validate
    from llmir_core.targets import get_target

    before = parse_module(EXT_MODULE, "m.llmir")
    after = clone_module(before)
    (lower,) = get_target("numpy-ext").lowering({})
    lower.run(after, PassContext())
    assert [op.name for op in after.main.ops if op.name.startswith("ext.")] == ["ext.swish_beta"]
    verdict = validate(before, after, differential=False)
    assert verdict["verdict"] == "equivalent", verdict


@pytest.mark.parametrize(("c", "verdict"), [(2.0, "proved"), (3.0, "refuted")])
def test_rule_proofs_take_the_decomposition_as_the_meaning(
    plugged: Path, c: float, verdict: str
) -> None:
    """A rule over ext.soft_clip (no encoding of its own) is proved, or refuted, through its
    decomposition: soft_clip(x, bound=2) == c * tanh(x / c) holds for c = 2 only."""
    from llmir_core.rewrite.rule import Rule
    from llmir_core.rewrite.terms import K, V, t
    from llmir_core.smt.prove import prove

    lhs = t("ext.soft_clip", V("x"), bound=2.0)
    rhs = t("core.mul", K(c), t("core.tanh", t("core.div", V("x"), K(c))))
    assert (
        prove(Rule("soft-clip-def", "its definition", lhs, rhs, {"x": "... n"})).verdict == verdict
    )


def test_a_plugin_pass_cannot_shadow_a_builtin_pass(
    plugged: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmir_core.passes import CORE_PASS_CLASSES
    from llmir_core.targets import pass_classes

    site = plugged / "site2"
    install(site, "llmir-ext-passes", {"llmir.targets": {"shadow-pass": PASSES_TARGET}})
    monkeypatch.syspath_prepend(str(site))
    classes = pass_classes()
    by_name = {c.name: c for c in [*CORE_PASS_CLASSES, *classes]}
    assert by_name["cse"].__module__ == "llmir_core.passes.cse"
    assert by_name["lower-shadow-pass"].__module__ == "llmir_ext_bad.shadow_pass"
    assert "lower-numpy-ext" in by_name
    assert (
        "warning: plugin target 'shadow-pass' (package 'llmir-ext-passes'): pass 'cse' is "
        "ignored: another pass has that name\n"
    ) in capsys.readouterr().err


def test_an_object_that_is_not_a_target_is_refused_in_one_line(
    plugged: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmir_core.errors import InputError
    from llmir_core.targets import get_target, target_specs

    site = plugged / "site2"
    groups = {"llmir.targets": {"not-a-target": "llmir_ext_bad._op:identity_op"}}
    install(site, "llmir-ext-odd", groups)
    monkeypatch.syspath_prepend(str(site))
    assert "not-a-target" in target_specs()
    with pytest.raises(InputError) as err:
        get_target("not-a-target")
    assert err.value.message == (
        "plugin target 'not-a-target' (package 'llmir-ext-odd') is not a target: "
        "llmir_ext_bad._op:identity_op lacks name, capabilities, lowering, serialize, open"
    )
    assert get_target("numpy-ext").name == "numpy-ext"  # the others still load
