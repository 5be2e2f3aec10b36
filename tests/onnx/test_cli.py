"""`llmir import` / `build` / `run`: results, errors, exit codes, and no leftover files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from typer.testing import CliRunner

from llmir_cli.app import app
from tests.conftest import run_cli
from tests.onnx.models import _model, mlp, save


def _invoke(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    save(mlp(), str(tmp_path / "m.onnx"), external=True)
    np.save(
        tmp_path / "x.npy", np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)
    )
    return tmp_path


def test_import_build_run_pipeline(model_dir: Path) -> None:
    """End to end; the import as a real subprocess, the rest in-process (each process pays ~2 s
    of module loading)."""
    d = model_dir
    r = run_cli("import", str(d / "m.onnx"), "-o", str(d / "m.llmir"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{d / 'm.llmir'}: 9 ops, 2 weights")
    code, _, err = _invoke("build", d / "m.llmir", "--target", "onnxruntime", "-o", d / "art")
    assert code == 0, err
    code, out, err = _invoke(
        "run",
        d / "art",
        "--input",
        f"x={d / 'x.npy'}",
        "--output-dir",
        d / "o1",
        "--format",
        "json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["schema_version"] == 1 and data["backend"] == "onnxruntime"
    assert data["outputs"][0]["name"] == "y" and data["outputs"][0]["shape"] == [2, 3, 64]
    code, out, err = _invoke(
        "run", d / "m.llmir", "--input", f"x={d / 'x.npy'}", "--output-dir", d / "o2"
    )
    assert code == 0, err
    assert out.startswith("y: float32[2, 3, 64]  min ")
    np.testing.assert_allclose(
        np.load(d / "o1" / "y.npy"), np.load(d / "o2" / "y.npy"), rtol=1e-5, atol=1e-6
    )


def test_build_is_byte_identical_and_manifest_is_complete(model_dir: Path) -> None:
    d = model_dir
    assert _invoke("import", d / "m.onnx", "-o", d / "m.llmir")[0] == 0
    for out in ("a", "b"):
        code, _, err = _invoke("build", d / "m.llmir", "-o", d / out)
        assert code == 0, err
    files = sorted(os.listdir(d / "a"))
    assert files == ["manifest.json", "model.lowered.llmir", "model.onnx", "model.onnx.data"]
    for f in files:
        assert (d / "a" / f).read_bytes() == (d / "b" / f).read_bytes(), f
    assert _invoke("build", d / "m.llmir", "-o", d / "a")[0] == 0  # rebuilding in place is allowed
    man = json.loads((d / "a" / "manifest.json").read_text())
    assert man["target"] == "onnxruntime" and man["llmir_version"]
    assert man["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["?batch", "?seq", 64]}]
    assert man["source"]["sha256"] == hashlib.sha256((d / "m.llmir").read_bytes()).hexdigest()
    for f, info in man["files"].items():
        assert info["sha256"] == hashlib.sha256((d / "a" / f).read_bytes()).hexdigest()
    # every weight is external data: the graph file holds no tensor bytes
    proto = onnx.load(str(d / "a" / "model.onnx"), load_external_data=False)
    assert all(
        t.data_location == T.EXTERNAL for t in proto.graph.initializer if t.name.startswith("w_")
    )
    assert (d / "a" / "model.onnx").stat().st_size < 4096


def test_generic_build_writes_its_lowered_module(model_dir: Path) -> None:
    """The generic build keeps the lowered module (manifest `lowered`), the file its nodes'
    `llmir.line` tags point into (what `bench --profile` maps onto), and names the pipeline; the
    lowered module `optimize --target` writes builds the same bytes."""
    from llmir_core.targets.onnxruntime.nodeinfo import node_sources

    d = model_dir
    assert _invoke("import", d / "m.onnx", "-o", d / "m.llmir")[0] == 0
    assert _invoke("build", d / "m.llmir", "-o", d / "a")[0] == 0
    man = json.loads((d / "a" / "manifest.json").read_text())
    assert man["lowered"] == "model.lowered.llmir" and "model.lowered.llmir" in man["files"]
    assert man["pipeline"][0] == "canonicalize" and man["pipeline"][-1] == "lower-ort-module"
    lines = (d / "a" / "model.lowered.llmir").read_text().splitlines()
    assert 'target = "onnxruntime"' in lines[0]
    sources = node_sources(onnx.load(str(d / "a" / "model.onnx"), load_external_data=False))
    assert sources
    for info in sources.values():  # each tag names the line:col of its op in the lowered module
        line, col = (int(x) for x in info["line"].split(":"))
        assert lines[line - 1][col - 1 :].startswith(info["op"] + " "), (info, lines[line - 1])
    code, _, err = _invoke(
        "optimize", d / "m.llmir", "--target", "onnxruntime", "-o", d / "l.llmir"
    )
    assert code == 0, err
    assert _invoke("build", d / "l.llmir", "-o", d / "b")[0] == 0
    for f in sorted(os.listdir(d / "a")):
        assert (d / "a" / f).read_bytes() == (d / "b" / f).read_bytes(), f


def _bad_models(d: Path) -> dict[str, tuple[Path, str]]:
    """name -> (model path, expected message fragment)."""
    save(mlp(), str(d / "emb.onnx"))
    data = (d / "emb.onnx").read_bytes()
    (d / "trunc.onnx").write_bytes(data[: len(data) // 2])
    (d / "corrupt.onnx").write_bytes(
        bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8))
    )
    save(mlp(), str(d / "ext.onnx"), external=True)

    def relocate(name: str, location: str) -> Path:
        m = onnx.load(str(d / "ext.onnx"), load_external_data=False)
        for t in m.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    e.value = location
        onnx.save(m, str(d / name))
        return d / name

    (d / "short.data").write_bytes((d / "ext.onnx.data").read_bytes()[:40000])
    x = [h.make_tensor_value_info("x", T.FLOAT, [2])]
    y = [h.make_tensor_value_info("b", T.FLOAT, [2])]
    onnx.save(
        _model(
            [
                h.make_node("Add", ["x", "b"], ["a"], name="n1"),
                h.make_node("Relu", ["a"], ["b"], name="n2"),
            ],
            x,
            y,
        ),
        str(d / "cycle.onnx"),
    )
    onnx.save(
        _model([h.make_node("Add", ["x", "nope"], ["b"], name="add0")], x, y),
        str(d / "dangling.onnx"),
    )
    return {
        "truncated": (d / "trunc.onnx", "not a valid ONNX model (truncated or corrupt"),
        "corrupt": (d / "corrupt.onnx", "not a valid ONNX model"),
        "path-traversal": (
            relocate("trav.onnx", "../ext.onnx.data"),
            "outside the model's folder; refusing it (path traversal)",
        ),
        "absolute-location": (relocate("abs.onnx", str(d / "ext.onnx.data")), "path traversal"),
        "missing-data": (
            relocate("missing.onnx", "missing.data"),
            "external data file 'missing.data' for tensor 'w_up' not found",
        ),
        "short-data": (
            relocate("short.onnx", "short.data"),
            "has 40000 bytes but tensor 'w_down' needs bytes 32768..65536",
        ),
        "cycle": (d / "cycle.onnx", "the graph has a cycle through node(s) n1, n2"),
        "dangling": (
            d / "dangling.onnx",
            "node 'add0' (Add) reads 'nope', which no node, initializer or graph input defines",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "truncated",
        "corrupt",
        "path-traversal",
        "absolute-location",
        "missing-data",
        "short-data",
        "cycle",
        "dangling",
    ],
)
def test_bad_input_one_line_exit_2_no_output(tmp_path: Path, case: str) -> None:
    src, fragment = _bad_models(tmp_path)[case]
    out = tmp_path / "out" / "model.llmir"
    out.parent.mkdir()
    code, stdout, err = _invoke("import", src, "-o", out)
    assert code == 2
    assert fragment in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and all(
        ln.startswith(("error: ", "hint: ")) for ln in lines
    )
    assert "Traceback" not in err and stdout == ""
    assert os.listdir(out.parent) == []  # no output, no weights file, no temp file


def test_failed_import_removes_its_weights_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save(mlp(), str(tmp_path / "emb.onnx"))
    import llmir_core.frontends as fe

    def boom() -> None:
        raise OSError(28, "No space left on device")

    # the weights file is written first; make writing the .llmir (the second file) fail
    monkeypatch.setattr(fe, "atomic_write", _fail_second(fe.atomic_write, boom))
    out = tmp_path / "o"
    out.mkdir()
    code, _, err = _invoke("import", tmp_path / "emb.onnx", "-o", out / "m.llmir")
    assert code != 0
    assert os.listdir(out) == []


def _fail_second(real, boom):
    calls = {"n": 0}

    def wrapper(path, mode="w"):
        calls["n"] += 1
        if calls["n"] == 2:
            boom()
        return real(path, mode)

    return wrapper


def test_unknown_op_and_keep_unknown(tmp_path: Path) -> None:
    m = _model(
        [h.make_node("Hardmax", ["x"], ["y"], name="hmax")],
        [h.make_tensor_value_info("x", T.FLOAT, [3])],
        [h.make_tensor_value_info("y", T.FLOAT, [3])],
        opset=21,
    )
    onnx.save(m, str(tmp_path / "u.onnx"))
    code, _, err = _invoke("import", tmp_path / "u.onnx", "-o", tmp_path / "u.llmir")
    assert (
        code == 2
        and "node 'hmax' (Hardmax, opset 21): ONNX op Hardmax is not known to llmir" in err
    )
    assert not (tmp_path / "u.llmir").exists()
    assert (
        _invoke("import", tmp_path / "u.onnx", "-o", tmp_path / "u.llmir", "--keep-unknown")[0] == 0
    )
    assert _invoke("build", tmp_path / "u.llmir", "-o", tmp_path / "art")[0] == 0
    np.save(tmp_path / "x.npy", np.array([1, 2, 3], np.float32))
    code, out, err = _invoke("run", tmp_path / "art", "-i", f"x={tmp_path / 'x.npy'}")
    assert code == 0 and "y: float32[3]  min 0  max 1" in out, err
    code, out, err = _invoke("run", tmp_path / "u.llmir", "-i", f"x={tmp_path / 'x.npy'}")
    assert code == 1 and "was kept opaque and has no reference semantics" in err


def _two_input_model(d: Path) -> Path:
    m = _model(
        [h.make_node("Add", ["a", "b"], ["y"], name="add")],
        [
            h.make_tensor_value_info("a", T.FLOAT, ["batch", 4]),
            h.make_tensor_value_info("b", T.FLOAT, ["batch", 4]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, ["batch", 4])],
    )
    onnx.save(m, str(d / "two.onnx"))
    assert _invoke("import", d / "two.onnx", "-o", d / "two.llmir")[0] == 0
    assert _invoke("build", d / "two.llmir", "-o", d / "two")[0] == 0
    return d


@pytest.mark.parametrize("target", ["two.llmir", "two"])
def test_run_input_errors(tmp_path: Path, target: str) -> None:
    d = _two_input_model(tmp_path)
    f32 = np.ones((2, 4), np.float32)
    np.save(d / "a.npy", f32)
    np.save(d / "b3.npy", np.ones((3, 4), np.float32))
    np.save(d / "b64.npy", f32.astype(np.float64))
    np.save(d / "b5.npy", np.ones((2, 5), np.float32))
    np.save(d / "r3.npy", np.ones((2, 4, 1), np.float32))
    a = f"a={d / 'a.npy'}"
    cases = [
        ([a], "missing input(s): b"),
        ([a, f"b={d / 'a.npy'}", f"c={d / 'a.npy'}"], "unknown input(s): c"),
        ([a, f"b={d / 'b64.npy'}"], "input b has dtype float64, expected f32"),
        ([a, f"b={d / 'b3.npy'}"], "input b dim 0 is 3, but ?batch is 2 (from a dim 0)"),
        ([a, f"b={d / 'b5.npy'}"], "input b dim 1 is 5, expected 4"),
        ([a, f"b={d / 'r3.npy'}"], "expected rank 2"),
        ([a, "b"], "expected NAME=FILE"),
        ([a, f"b={d / 'nope.npy'}"], "no such file"),
    ]
    for specs, fragment in cases:
        args = (
            ["run", d / target]
            + [x for s in specs for x in ("--input", s)]
            + ["--output-dir", d / "out"]
        )
        code, out, err = _invoke(*args)
        assert code == 2, (specs, err)
        assert fragment in err, (fragment, err)
        assert not (d / "out").exists()


def test_run_tensorproto_input(tmp_path: Path) -> None:
    d = _two_input_model(tmp_path)
    for name in ("a", "b"):
        t = nh.from_array(np.full((2, 4), 1.5, np.float32), name)
        (d / f"{name}.pb").write_bytes(t.SerializeToString())
    code, out, err = _invoke(
        "run", d / "two.llmir", "-i", f"a={d / 'a.pb'}", "-i", f"b={d / 'b.pb'}", "-o", d / "o"
    )
    assert code == 0, err
    np.testing.assert_array_equal(np.load(d / "o" / "y.npy"), np.full((2, 4), 3.0, np.float32))


def test_build_refuses_a_foreign_folder(tmp_path: Path) -> None:
    d = _two_input_model(tmp_path)
    (d / "other").mkdir()
    (d / "other" / "keep.txt").write_text("mine")
    code, _, err = _invoke("build", d / "two.llmir", "-o", d / "other")
    assert code == 2 and "not an llmir artifact" in err
    assert os.listdir(d / "other") == ["keep.txt"]
    code, _, err = _invoke("build", d / "two.llmir", "-o", d / "x", "--target", "tpu")
    assert code == 2 and "unknown target 'tpu'" in err and not (d / "x").exists()
