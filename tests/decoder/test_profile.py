"""`llmir bench --profile`: onnxruntime's per-kernel time mapped onto the lines of the .llmir file."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import onnx
import pytest

from llmir_core.errors import InputError
from llmir_core.runtime.profile import profile_artifact
from llmir_core.targets.onnxruntime.nodeinfo import node_sources
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def parsed_artifact(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An artifact built from a .llmir file (so its ops have lines), and that file."""
    from llmir_core.frontends import import_model
    from llmir_core.ir.parser import parse_file
    from llmir_core.targets.onnxruntime.serialize_decoder import build_decoder

    tmp = tmp_path_factory.mktemp("prof")
    src = tmp / "tiny.llmir"
    import_model(tiny_dir, out_path=src)
    out = tmp / "art"
    build_decoder(parse_file(str(src)), str(out), source_path=str(src))
    return out, src


def test_every_node_names_its_llmir_line(parsed_artifact: tuple[Path, Path]) -> None:
    """Each node names the lowered op it was serialized from, its line in the lowered module the
    build wrote into the artifact, and the op's loc (where the import found it)."""
    art, src = parsed_artifact
    manifest = json.loads((art / "manifest.json").read_text())
    assert (
        manifest["lowered"] == "model.lowered.llmir" and "model.lowered.llmir" in manifest["files"]
    )
    model = onnx.load(str(art / "model.onnx"), load_external_data=False)
    sources = node_sources(model)
    assert set(sources) == {n.name for n in model.graph.node}
    lowered = (art / "model.lowered.llmir").read_text().splitlines()
    original = src.read_text()
    for info in sources.values():
        line, col = (int(x) for x in info["line"].split(":"))
        assert (
            lowered[line - 1][col - 1 :].startswith(info["op"]) or info["op"] in lowered[line - 1]
        )
        assert info["loc"] and f'loc("{info["loc"]}")' in lowered[line - 1]
        assert f'loc("{info["loc"]}")' in original  # the loc is the imported module's
    assert any(i["op"].startswith("ort.") for i in sources.values())


def test_profile_attributes_the_decode_step_to_lines(parsed_artifact: tuple[Path, Path]) -> None:
    art, _ = parsed_artifact
    res = profile_artifact(
        str(art), prompt_len=8, decode_steps=4, threads=1, warmup_steps=1, measure_bandwidth=False
    )
    assert res.source == "model.lowered.llmir" and res.bandwidth_gbs is None
    text = (art / "model.lowered.llmir").read_text().splitlines()
    for ph in res.phases:
        assert not ph.unmapped and ph.kernel_us > 0
        # every kernel lands on an op, and so does the dispatch time before it
        assert sum(o.kernel_us for o in ph.ops.values()) == pytest.approx(ph.kernel_us)
        assert sum(o.dispatch_us for o in ph.ops.values()) == pytest.approx(ph.dispatch_us)
        assert ph.attributed_us == pytest.approx(ph.kernel_us + ph.dispatch_us)
        assert (
            ph.attributed_us <= ph.step_us * 1.001
        )  # dispatch is inside the run, not counted twice
        assert ph.unprofiled_step_us is not None and ph.unprofiled_step_us > 0
        ops = ph.ranked()
        kinds = {o.op for o in ops}
        assert {
            "ort.group_query_attention",
            "ort.matmul_f32",  # cpu=x86-64-v3 (the default): llmir's kernel
            "ort.simplified_layer_norm",
            "ort.skip_simplified_layer_norm",
            "llm.embedding",
        } <= kinds
        for o in ops:
            assert o.op in text[int(o.line.split(":")[0]) - 1] and o.loc
        attn = [o for o in ops if o.op == "ort.group_query_attention"]
        assert len(attn) == 2 and all("GroupQueryAttention" in o.nodes for o in attn)
        mlp = [o for o in ops if o.loc.startswith("hf:model.layers.0.mlp")]
        assert sum(o.bytes for o in mlp) >= 3 * 64 * 96 * 4  # its three weight matrices
    d = res.to_json()
    assert d["profile_schema"] == 1 and set(d["phases"]) == {"prefill", "decode"}
    dec = d["phases"]["decode"]
    assert dec["steps"] == 4 and dec["kernel_coverage"] == pytest.approx(1.0)
    assert dec["attributed_share"] >= dec["kernel_share"] and dec["unprofiled_step_us"] > 0
    assert all(
        op["us"] == pytest.approx(op["kernel_us"] + op["dispatch_us"], abs=2e-3)
        for op in dec["ops"]
    )
    assert all(op["file"] == "model.lowered.llmir" and op["line"] >= 1 for op in dec["ops"])


def test_bench_profile_cli(parsed_artifact: tuple[Path, Path]) -> None:
    art, _ = parsed_artifact
    r = run_cli(
        "bench",
        str(art),
        "--profile",
        "--prompt-len",
        "6",
        "--profile-steps",
        "2",
        "--threads",
        "1",
        "--format",
        "json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["kind"] == "bench-profile" and d["read_bandwidth_gb_per_s"] > 0
    assert d["phases"]["decode"]["ops"][0]["bandwidth_share"] is not None
    r = run_cli(
        "bench",
        str(art),
        "--profile",
        "--prompt-len",
        "6",
        "--profile-steps",
        "2",
        "--threads",
        "1",
        "--top",
        "3",
    )
    assert r.returncode == 0, r.stderr
    assert (
        "decode step (mean of 2)" in r.stdout
        and "model.lowered.llmir:" in r.stdout
        and "hf:model.layers." in r.stdout
    )
    r = run_cli("bench", str(art), "--profile", "--top", "0")
    assert r.returncode == 2 and "--top must be >= 1" in r.stderr


def test_profile_needs_tagged_nodes(parsed_artifact: tuple[Path, Path], tmp_path: Path) -> None:
    art, _ = parsed_artifact
    old = tmp_path / "old"
    shutil.copytree(art, old)
    model = onnx.load(str(old / "model.onnx"), load_external_data=False)
    for nd in model.graph.node:
        del nd.metadata_props[:]
    onnx.save(model, str(old / "model.onnx"))
    # an artifact built without node tags (an older llmir) has a manifest matching its files
    manifest = json.loads((old / "manifest.json").read_text())
    data = (old / "model.onnx").read_bytes()
    manifest["files"]["model.onnx"] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
    }
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="do not name the .llmir ops"):
        profile_artifact(str(old), prompt_len=4, decode_steps=1, measure_bandwidth=False)
    with pytest.raises(InputError, match="exceeds the model's context of 256"):
        profile_artifact(str(art), prompt_len=250, decode_steps=8)
