"""Structure-aware fuzzing of every file llmir reads, shared by tests/inputs/test_fuzz_readers.py
(a few hundred seeded cases per reader) and scripts/fuzz_readers.py (as many as asked).

Each `Reader` starts from valid files, mutates one of them the way its format is built (JSON
values replaced, deleted, retyped, nested; ONNX attributes, dims, types and data; GGUF metadata
values and types, tensor dims, types and offsets; `.llmir` tokens; safetensors header fields), runs
the command that reads it in this process, and checks the outcome: exit 0, 1 or 2 (never an
internal error or a traceback); on failure an `error:` line that names the file (with
`line:col` for a text syntax error) and no output left behind; each case within a time bound,
and the whole run within a memory bound (checked by the callers).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import re
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.inputs import gguf_edit as ge
from tests.inputs.helpers import invoke, listing

CASE_SECONDS = 20.0  # generous for a loaded 2-core machine; a hang takes far longer


# -- JSON values ---------------------------------------------------------------------------------

_ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**63,
    -(2**63) - 1,
    10**30,
    1e308,
    -0.5,
    1e-300,
    "",
    "x",
    "two",
    "\ud800",
    "../../etc/passwd",
    [],
    {},
    [1, 2],
    {"a": 1},
    [[[[[]]]]],
    float("inf"),
    float("nan"),
]


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:8]):  # long arrays: the first items stand for the rest
            out += _paths(v, (*at, i))
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        value = value[p]
    return value


def mutate_json_value(rng: random.Random, value: Any, rounds: int = 3) -> Any:
    """Change 1..rounds values of a JSON document: replace, delete, retype, nest, duplicate."""
    value = copy.deepcopy(value)
    for _ in range(rng.randint(1, rounds)):
        paths = _paths(value)
        path = rng.choice(paths)
        how = rng.choice(
            ["replace", "replace", "delete", "retype", "nest", "scale", "duplicate", "rename"]
        )
        if not path:
            if how in ("replace", "retype"):
                value = rng.choice(_ODD_VALUES)
            continue
        parent, key = _get(value, path[:-1]), path[-1]
        old = parent[key]
        if how == "replace":
            parent[key] = copy.deepcopy(rng.choice(_ODD_VALUES))
        elif how == "delete":
            del parent[key]
        elif how == "retype":
            parent[key] = (
                str(old)
                if not isinstance(old, str)
                else (len(old) if rng.random() < 0.5 else [old])
            )
        elif how == "nest":
            parent[key] = [old] if rng.random() < 0.5 else {"v": old}
        elif how == "scale" and isinstance(old, (int, float)) and not isinstance(old, bool):
            parent[key] = rng.choice([old * 10**9, -old, old + 1, old - 1, 0, old / 3])
        elif how == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(old))
        elif how == "rename" and isinstance(parent, dict):
            parent[str(key) + rng.choice(["_", "X", ".", "/.."])] = parent.pop(key)
    return value


def json_text(rng: random.Random, value: Any) -> str:
    """Serialize, sometimes with a textual fault (truncated, a character changed or inserted)."""
    text = json.dumps(value, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5)
    r = rng.random()
    if r < 0.1 and text:
        return text[: rng.randint(0, len(text) - 1)]
    if r < 0.2 and text:
        i = rng.randint(0, len(text) - 1)
        return text[:i] + rng.choice('{}[],:"\\x0\n') + text[i + 1 :]
    if r < 0.25:
        return "[" * 5000 + "]" * 5000
    return text


def _write(path: Path, text: str) -> None:
    """Write text as UTF-8; a lone surrogate becomes the bytes no UTF-8 reader accepts."""
    path.write_bytes(text.encode("utf-8", "surrogatepass"))


# -- outcomes ---------------------------------------------------------------------------------------


@dataclass
class Outcome:
    code: int
    err: str
    seconds: float
    problems: list[str] = field(default_factory=list)


def check_outcome(
    code: int,
    err: str,
    names: str,
    *,
    located: bool = False,
    left: set[str] | None = None,
    before: set[str] | None = None,
) -> list[str]:
    """What is wrong with one run's outcome (empty when it is clean)."""
    problems = []
    if code not in (0, 1, 2):
        problems.append(f"exit {code}")
    if "Traceback" in err or "internal error" in err:
        problems.append(
            "internal error: " + err.strip().splitlines()[-1][:300]
            if err.strip()
            else "internal error"
        )
    if code in (1, 2):
        lines = [ln for ln in err.splitlines() if "error:" in ln]
        if not lines:
            problems.append(f"no error line: {err[:300]!r}")
        elif names not in lines[0] and names not in err:
            problems.append(f"error does not name {names}: {lines[0][:300]}")
        elif located and not re.search(re.escape(names) + r":\d+:\d+", err):
            problems.append(f"error has no line:col: {lines[0][:300]}")
        if before is not None and left is not None and left != before:
            problems.append(f"left behind: {sorted(left - before)[:5]}")
    return problems


# -- readers ----------------------------------------------------------------------------------------


@dataclass
class Reader:
    """A file kind: how to make a mutant of it in `work`, and the command that reads it."""

    name: str
    make: Callable[[random.Random, Path], tuple[list[str], str, bool]]  # -> argv, names, located

    def case(self, seed: int, work: Path) -> Outcome:
        rng = random.Random(f"{self.name}:{seed}")
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        argv, names, located = self.make(rng, work)
        before = listing(work)
        t0 = time.perf_counter()
        code, _out, err = _read_lock(argv[1]) if argv[0] == READ_LOCK else invoke(*argv)
        dt = time.perf_counter() - t0
        problems = check_outcome(
            code, err, names, located=located, left=listing(work), before=before
        )
        if dt > CASE_SECONDS:
            problems.append(f"took {dt:.1f} s")
        return Outcome(code, err, dt, problems)


READ_LOCK = "<read_lock>"  # llmir.lock is read by `init` after the hub; its reader runs directly


def _read_lock(path: str) -> tuple[int, str, str]:
    """read_lock as the CLI would report it: (exit code, stdout, stderr)."""
    import traceback

    from llmir_core.errors import LlmirError
    from llmir_core.registry.lockfile import read_lock

    try:
        read_lock(Path(path))
    except LlmirError as exc:
        return exc.exit_code, "", f"error: {exc.message}\n"
    except Exception:
        return 70, "", "internal error\n" + traceback.format_exc()
    return 0, "", ""


class Seeds:
    """The valid files mutants start from, made once (a tiny llama folder, its GGUF, ONNX models,
    .llmir texts, the shipped registry index)."""

    def __init__(self, root: Path, llama_dir: Path, gguf_file: Path | None) -> None:
        self.root = root
        self.llama_dir = llama_dir
        self.gguf = ge.read(gguf_file) if gguf_file is not None else None
        self.config = json.loads((llama_dir / "config.json").read_text())
        self.tokenizer = json.loads((llama_dir / "tokenizer.json").read_text())
        raw = (llama_dir / "model.safetensors").read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        self.st_header = json.loads(raw[8 : 8 + n])
        self.st_data = raw[8 + n :]
        repo = Path(__file__).resolve().parents[2]
        self.index = json.loads((repo / "registry" / "index.json").read_text())
        self.llmir_texts = _llmir_corpus(repo)
        self.onnx_models = _onnx_corpus()

    def hf_folder(self, work: Path) -> Path:
        folder = work / "model"
        folder.mkdir()
        for f in self.llama_dir.iterdir():
            shutil.copyfile(f, folder / f.name)
        return folder


def _llmir_corpus(repo: Path) -> list[str]:
    texts = [(repo / "examples" / "decoder.llmir").read_text()]
    for p in sorted((repo / "tests" / "filecheck").rglob("*.llmir"))[:40]:
        for case in re.split(r"(?m)^// -----$", p.read_text(encoding="utf-8")):
            body = "\n".join(ln for ln in case.split("\n") if not ln.strip().startswith("//"))
            if "module" in body and len(body) < 6000:
                texts.append(body)
    return texts


def _onnx_corpus() -> list[bytes]:
    try:
        from tests.onnx import models
    except ImportError:
        return []
    return [
        models.mlp(0, hidden=8).SerializeToString(),
        models.llm23(0, d=16, heads=2, kv=1, max_pos=8).SerializeToString(),
    ]


_TOKEN = re.compile(
    r'(tensor<[^<>]*(?:<[^<>]*>[^<>]*)*>|"(?:[^"\\\n]|\\.)*"|[%@?!]?[\w.$]+|->|\s+|.)', re.S
)


def _mutate_llmir(rng: random.Random, text: str) -> str:
    toks = _TOKEN.findall(text)
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(len(toks))
        how = rng.choice(["delete", "duplicate", "replace", "swap", "char", "number"])
        if how == "delete":
            del toks[k]
        elif how == "duplicate":
            toks.insert(k, toks[k])
        elif how == "replace":
            toks[k] = rng.choice(toks)
        elif how == "swap" and k + 1 < len(toks):
            toks[k], toks[k + 1] = toks[k + 1], toks[k]
        elif how == "number":
            toks[k] = re.sub(
                r"\d+",
                lambda m: rng.choice(["0", "-1", "99999999999999999999999", "4294967296"]),
                toks[k],
            )
        else:
            j = rng.randint(0, len(toks[k]))
            toks[k] = toks[k][:j] + rng.choice('%@"\\{}<>x?\ud800\x00\xff\n') + toks[k][j:]
    return "".join(toks)


def make_readers(seeds: Seeds) -> dict[str, Reader]:
    readers: dict[str, Reader] = {}

    def llmir(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
        f = work / "m.llmir"
        text = _mutate_llmir(rng, rng.choice(seeds.llmir_texts))
        if rng.random() < 0.1:
            f.write_bytes(
                text.encode("utf-8", "surrogatepass")[: rng.randint(0, len(text))] + b"\xff"
            )
        else:
            f.write_text(text, encoding="utf-8", errors="surrogatepass")
        cmd = rng.choice([["verify"], ["fmt"], ["build", "-o", str(work / "out")]])
        # text errors are located; what a backend cannot build (after the text verified) names the file
        return [*cmd, str(f)], str(f), cmd[0] != "build"

    readers["llmir"] = Reader("llmir", llmir)

    def config(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
        folder = seeds.hf_folder(work)
        (folder / "config.json").unlink()
        _write(folder / "config.json", json_text(rng, mutate_json_value(rng, seeds.config)))
        return ["import", str(folder), "-o", str(work / "m.llmir")], str(folder), False

    readers["config.json"] = Reader("config.json", config)

    def tokenizer(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
        folder = seeds.hf_folder(work)
        (folder / "tokenizer.json").unlink()
        _write(folder / "tokenizer.json", json_text(rng, mutate_json_value(rng, seeds.tokenizer)))
        return ["import", str(folder), "-o", str(work / "m.llmir")], str(folder), False

    readers["tokenizer.json"] = Reader("tokenizer.json", tokenizer)

    def safetensors(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
        folder = seeds.hf_folder(work)
        (folder / "model.safetensors").unlink()
        header = json_text(rng, mutate_json_value(rng, seeds.st_header)).encode(
            "utf-8", "surrogatepass"
        )
        n = len(header)
        if rng.random() < 0.15:
            n = rng.choice([0, 7, n + 1, n - 1, 2**40, 2**64 - 1])
        data = (
            seeds.st_data
            if rng.random() < 0.9
            else seeds.st_data[: rng.randint(0, len(seeds.st_data))]
        )
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", n) + header + data)
        return (
            ["import", str(folder), "-o", str(work / "m.llmir")],
            str(folder / "model.safetensors"),
            False,
        )

    readers["safetensors"] = Reader("safetensors", safetensors)

    def index(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
        reg = work / "reg"
        reg.mkdir()
        _write(reg / "index.json", json_text(rng, mutate_json_value(rng, seeds.index)))
        names = list(seeds.index.get("models", {})) or ["x:y"]
        cmd = rng.choice(
            [
                ["registry", "list"],
                ["registry", "show", rng.choice(names)],
                ["registry", "search", "qwen"],
            ]
        )
        # an error names index.json, or the registry folder (a model the index does not list)
        return [*cmd, "--registry", str(reg), "--offline"], str(reg), False

    readers["registry index"] = Reader("registry index", index)

    def lock(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
        f = work / "llmir.lock"
        _write(f, _lock_text(rng))
        return [READ_LOCK, str(f)], str(f), False

    readers["llmir.lock"] = Reader("llmir.lock", lock)

    if seeds.gguf is not None:
        g0 = seeds.gguf

        def gguf(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
            g = _mutate_gguf(rng, copy.deepcopy(g0))
            f = work / "m.gguf"
            data = ge.encode(g)
            if rng.random() < 0.1:
                data = data[: rng.randint(0, len(data))]
            f.write_bytes(data)
            return ["import", str(f), "-o", str(work / "m.llmir")], str(f), False

        readers["gguf"] = Reader("gguf", gguf)

    if seeds.onnx_models:

        def onnx_reader(rng: random.Random, work: Path) -> tuple[list[str], str, bool]:
            f = work / "m.onnx"
            f.write_bytes(_mutate_onnx(rng, rng.choice(seeds.onnx_models)))
            return ["import", str(f), "-o", str(work / "m.llmir")], str(f), False

        readers["onnx"] = Reader("onnx", onnx_reader)
    return readers


_LOCK = {
    "lock_version": 1,
    "model": {
        "ref": "smollm2:135m",
        "kind": "registry",
        "repo": "HuggingFaceTB/SmolLM2-135M",
        "revision": "main",
        "format": "safetensors",
    },
    "files": [
        {"path": "config.json", "size": 10, "sha256": "a" * 64},
        {"path": "model.safetensors", "size": 100, "sha256": "b" * 64},
    ],
}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return '""'


def _lock_text(rng: random.Random) -> str:
    doc = mutate_json_value(rng, _LOCK)
    if not isinstance(doc, dict):
        return _toml_value(doc)
    lines = [
        f"{json.dumps(k)} = {_toml_value(v)}"
        for k, v in doc.items()
        if not isinstance(v, (dict, list))
    ]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += [f"[{json.dumps(k)}]"] + [
                f"{json.dumps(a)} = {_toml_value(b)}" for a, b in v.items()
            ]
        elif isinstance(v, list) and all(isinstance(x, dict) for x in v):
            for x in v:
                lines += [f"[[{json.dumps(k)}]]"] + [
                    f"{json.dumps(a)} = {_toml_value(b)}" for a, b in x.items()
                ]
        elif isinstance(v, list):
            lines.append(f"{json.dumps(k)} = {_toml_value(v)}")
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.15 and text:
        i = rng.randint(0, len(text) - 1)
        text = text[:i] + rng.choice('[]{}="\\\n#') + text[i + 1 :]
    return text


_GGUF_VALUES: list[tuple[int, Any]] = [
    (ge.U32, 0),
    (ge.I32, -1),
    (ge.U64, 2**63),
    (ge.U64, 10**15),
    (ge.F32, float("nan")),
    (ge.F32, -1.0),
    (ge.STRING, "two"),
    (ge.STRING, ""),
    (ge.ARRAY, (ge.U32, [1, 2])),
    (ge.ARRAY, (ge.STRING, [])),
    (7, True),
    (ge.F32, 1e30),
]


def _mutate_gguf(rng: random.Random, g: ge.GGUF) -> ge.GGUF:
    for _ in range(rng.randint(1, 3)):
        how = rng.choice(
            [
                "value",
                "value",
                "drop",
                "tensor_dims",
                "tensor_type",
                "tensor_offset",
                "duplicate",
                "version",
                "array",
            ]
        )
        if how == "value" and g.kvs:
            k = rng.choice(g.kvs)
            k.type, k.value = rng.choice(_GGUF_VALUES)
        elif how == "drop" and g.kvs:
            g.kvs.remove(rng.choice(g.kvs))
        elif how == "duplicate" and g.kvs:
            g.kvs.append(copy.deepcopy(rng.choice(g.kvs)))
        elif how == "version":
            g.version = rng.choice([0, 1, 2, 4, 2**31])
        elif how == "array":
            arrays = [k for k in g.kvs if k.type == ge.ARRAY]
            if arrays:
                k = rng.choice(arrays)
                et, items = k.value
                retyped = rng.choice(
                    [
                        (ge.U32, [7] * len(items)),
                        (ge.F32, [0.5] * len(items)),
                        (ge.STRING, ["t"] * len(items)),
                    ]
                )
                k.value = (
                    (et, items[: rng.randint(0, len(items))]) if rng.random() < 0.5 else retyped
                )
        elif g.tensors:
            t = rng.choice(g.tensors)
            if how == "tensor_dims":
                t.dims = rng.choice(
                    [
                        [],
                        [0],
                        t.dims[::-1],
                        [d * 2 for d in t.dims],
                        [2**40] * len(t.dims),
                        t.dims + [1],
                    ]
                )
            elif how == "tensor_type":
                t.type = rng.choice([0, 1, 2, 8, 12, 30, 99, 1000])
            else:
                t.offset = rng.choice([t.offset + 1, t.offset + 32, 2**40, 0, t.offset * 2])
    return g


def _mutate_onnx(rng: random.Random, data: bytes) -> bytes:
    import onnx
    from onnx import AttributeProto, TensorProto, helper

    m = onnx.ModelProto()
    m.ParseFromString(data)
    g = m.graph
    for _ in range(rng.randint(1, 3)):
        how = rng.choice(
            [
                "attr_type",
                "attr_value",
                "init_dims",
                "init_data",
                "init_type",
                "node_input",
                "op_type",
                "opset",
                "drop_node",
                "input_dims",
                "bytes",
            ]
        )
        if how == "attr_type" and any(n.attribute for n in g.node):
            n = rng.choice([n for n in g.node if n.attribute])
            a = rng.choice(n.attribute)
            name = a.name
            n.attribute.remove(a)
            n.attribute.append(
                rng.choice(
                    [
                        helper.make_attribute(name, 1),
                        helper.make_attribute(name, [1.5, 2.0]),
                        helper.make_attribute(name, "x"),
                        helper.make_attribute(name, [3, -9]),
                    ]
                )
            )
        elif how == "attr_value" and any(n.attribute for n in g.node):
            n = rng.choice([n for n in g.node if n.attribute])
            a = rng.choice(n.attribute)
            if a.type == AttributeProto.INT:
                a.i = rng.choice([-(2**62), -1, 0, 2**62, 99])
            elif a.type == AttributeProto.INTS:
                del a.ints[:]
                a.ints.extend(rng.choice([[], [0, 0], [99, -99], [2**62]]))
            elif a.type == AttributeProto.FLOAT:
                a.f = rng.choice([float("nan"), float("inf"), -1.0, 0.0])
        elif how.startswith("init") and g.initializer:
            t = rng.choice(g.initializer)
            if how == "init_dims":
                dims = list(t.dims)
                del t.dims[:]
                t.dims.extend(
                    rng.choice(
                        [[-2, 3], dims[::-1], [d + 1 for d in dims], [2**40, 2**40], [], [0]]
                    )
                )
            elif how == "init_data":
                t.raw_data = (
                    t.raw_data[: rng.randint(0, len(t.raw_data))]
                    if rng.random() < 0.7
                    else t.raw_data * 2
                )
            else:
                t.data_type = rng.choice(
                    [0, TensorProto.STRING, TensorProto.INT4, TensorProto.DOUBLE, 40, 999]
                )
        elif how == "node_input" and g.node:
            n = rng.choice(g.node)
            if n.input:
                n.input[rng.randrange(len(n.input))] = rng.choice(
                    ["", "nope", n.output[0] if n.output else "x"]
                )
        elif how == "op_type" and g.node:
            rng.choice(g.node).op_type = rng.choice(
                ["Nope", "Add", "Reshape", "If", "Loop", "MatMul"]
            )
        elif how == "opset":
            m.opset_import[0].version = rng.choice([1, 12, 13, 29, 10**6])
        elif how == "drop_node" and g.node:
            g.node.remove(rng.choice(g.node))
        elif how == "input_dims" and g.input:
            tt = rng.choice(g.input).type.tensor_type
            if tt.shape.dim:
                tt.shape.dim[0].dim_value = rng.choice([-1, 0, 2**62])
    out = m.SerializeToString()
    if rng.random() < 0.1:
        cut = rng.randint(0, len(out))
        out = out[:cut] + bytes([rng.randrange(256)]) + out[cut + 1 :]
    return out


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux ru_maxrss is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_reader(
    reader: Reader, cases: int, work: Path, start: int = 0
) -> tuple[list[tuple[int, Outcome]], dict[int, int]]:
    """Run `cases` seeded cases; return the failing ones and a count per exit code."""
    failures = []
    codes: dict[int, int] = {}
    for seed in range(start, start + cases):
        outcome = reader.case(seed, work)
        codes[outcome.code] = codes.get(outcome.code, 0) + 1
        if outcome.problems:
            failures.append((seed, outcome))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    return failures, codes
