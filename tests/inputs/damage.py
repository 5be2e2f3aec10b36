"""Files damaged the way disks, downloads and attackers damage them, for every file a command
reads: cut at every eighth of its length, bits flipped, the magic bytes wrong, a size or count
declared huge, a path escaping the model folder, the file replaced by a symlink to nowhere, to
itself or to a folder. Shared by tests/inputs/test_damaged_files.py and scripts/fuzz_readers.py.

A `Target` makes a working copy of valid inputs in a folder and names the one file to damage
and the command that reads it; `damages(target)` lists what is done to that file; `run_case`
damages it, runs the command in this process and checks the outcome (see fuzzing.check_outcome:
exit 0, 1 or 2, one `error:` line naming the damaged file, `file:line:col` for text, nothing
left behind, no traceback).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.inputs.fuzzing import CASE_SECONDS, Outcome, check_outcome
from tests.inputs.helpers import invoke, listing

Edit = Callable[[bytes], bytes]


@dataclass(frozen=True)
class Target:
    """A file a command reads: `setup(work)` copies valid inputs into `work` and returns the
    command's argv and the file to damage."""

    name: str
    setup: Callable[[Path], tuple[list[str], Path]]
    located: bool = False  # a text format: its errors carry file:line:col
    huge: Edit | None = None  # declare a size or count far past the file
    escape: Edit | None = None  # make a path inside the file point outside its folder
    reseal: Callable[[Path], None] | None = None  # run after the damage (an artifact's hashes)
    names: str = ""  # a file beside the damaged one that its errors may name instead
    syntax: str = ""  # "json" or "toml": a damaged file that does not parse is located


@dataclass(frozen=True)
class Damage:
    name: str
    edit: Edit | None  # None: the file is replaced by a symlink (see `link`)
    link: str = ""  # "dangling", "loop" or "folder"


def cut(k: int) -> Edit:
    return lambda b: b[: len(b) * k // 8]


def flips(seed: int, n: int = 4) -> Edit:
    """`n` random bits flipped (seeded), in the file's first 4 KiB where the headers are."""

    def edit(b: bytes) -> bytes:
        if not b:
            return b
        rng = random.Random(seed)
        out = bytearray(b)
        for _ in range(n):
            i = rng.randrange(min(len(out), 4096))
            out[i] ^= 1 << rng.randrange(8)
        return bytes(out)

    return edit


def wrong_magic(b: bytes) -> bytes:
    return b"LLMX" + b[4:]


def damages(target: Target, *, full: bool = False) -> list[Damage]:
    """Every eighth cut, bit flips (3 seeds, 16 with `full`), wrong magic, the target's huge
    size and escaping path, and three symlinks."""
    out = [Damage(f"cut {k}/8", cut(k)) for k in range(8)]
    out += [Damage(f"flip #{s}", flips(s)) for s in range(16 if full else 3)]
    out.append(Damage("wrong magic", wrong_magic))
    if target.huge is not None:
        out.append(Damage("huge size", target.huge))
    if target.escape is not None:
        out.append(Damage("escaping path", target.escape))
    out += [Damage(f"symlink {k}", None, k) for k in ("dangling", "loop", "folder")]
    return out


def _apply(damage: Damage, f: Path, work: Path) -> None:
    if damage.edit is not None:
        data = f.read_bytes()
        f.unlink()  # a hard link or a read-only copy must not carry the edit back to the seed
        f.write_bytes(damage.edit(data))
        return
    f.unlink()
    if damage.link == "dangling":
        f.symlink_to(f.parent / "no-such-file")
    elif damage.link == "loop":
        f.symlink_to(f.name)
    else:
        (work / "a-folder").mkdir(exist_ok=True)
        f.symlink_to(work / "a-folder")


def run_case(target: Target, damage: Damage, work: Path) -> Outcome:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    argv, f = target.setup(work)
    _apply(damage, f, work)
    if target.reseal is not None and damage.edit is not None:
        target.reseal(f)
    before = listing(work)
    t0 = time.perf_counter()
    code, _out, err = invoke(*argv)
    dt = time.perf_counter() - t0
    located = damage.edit is not None and f.stat().st_size > 0
    located = located and (target.located or _unparsable(target.syntax, f))
    # the file's path, or its name beside the path of its folder or of a file it names
    names = str(f) if str(f) in err or f.name not in err or os.sep not in err else f.name
    if target.names and names not in err:
        names = str(f.parent / target.names)
    problems = check_outcome(code, err, names, located=located, left=listing(work), before=before)
    if dt > CASE_SECONDS:
        problems.append(f"took {dt:.1f} s")
    return Outcome(code, err, dt, problems)


def _unparsable(syntax: str, f: Path) -> bool:
    """Does `f` fail to parse as `syntax` (then its error must carry file:line:col)?"""
    if not syntax:
        return False
    import tomllib

    try:
        text = f.read_bytes().decode("utf-8")
        json.loads(text) if syntax == "json" else tomllib.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):  # JSON/TOMLDecodeError: ValueError
        return True
    return False


# -- the files ---------------------------------------------------------------------------------


def _json_edit(change: Callable[[object], object]) -> Edit:
    return lambda b: json.dumps(change(json.loads(b))).encode()


def _safetensors_huge(b: bytes) -> bytes:
    return struct.pack("<Q", 2**62) + b[8:]


def _safetensors_escape(b: bytes) -> bytes:
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8 : 8 + n])
    name = next(k for k in header if k != "__metadata__")
    header[name]["data_offsets"] = [0, 2**40]
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b[8 + n :]


def _gguf_huge(b: bytes) -> bytes:  # magic, u32 version, u64 tensor count, u64 kv count
    return b[:8] + struct.pack("<QQ", 2**62, 2**62) + b[24:]


def _gguf_escape(b: bytes) -> bytes:  # the first key's length: past the end of the file
    return b[:24] + struct.pack("<Q", 2**40) + b[32:]


def npy_huge(b: bytes) -> bytes:
    return _npy_header(b, "(1099511627776, 16)")


def _npy_escape(b: bytes) -> bytes:  # a declared shape whose product overflows int64
    return _npy_header(b, "(4294967296, 4294967296, 16)")


def _npy_header(b: bytes, shape: str) -> bytes:
    (hlen,) = struct.unpack("<H", b[8:10])
    header = b[10 : 10 + hlen].decode("latin1")
    new = header.replace(header[header.index("(") : header.index(")") + 1], shape)
    new = new.rstrip() + " " * (hlen - len(new.rstrip()) - 1) + "\n" if len(new) <= hlen else new
    return b[:8] + struct.pack("<H", len(new)) + new.encode("latin1") + b[10 + hlen :]


def _pb_huge(b: bytes) -> bytes:
    import onnx

    t = onnx.TensorProto()
    t.ParseFromString(b)
    del t.dims[:]
    t.dims.extend([2**40, 16])
    return t.SerializeToString()


def _pb_escape(b: bytes) -> bytes:
    """The tensor's data moved to external data at ../../etc/passwd."""
    import onnx

    t = onnx.TensorProto()
    t.ParseFromString(b)
    t.ClearField("raw_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "128")):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t.SerializeToString()


def _onnx_escape(b: bytes) -> bytes:
    """Its first initializer moved to external data at ../../etc/passwd."""
    import onnx

    m = onnx.ModelProto()
    m.ParseFromString(b)
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    del t.float_data[:]
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "64")):
        e = t.external_data.add()
        e.key, e.value = k, v
    return m.SerializeToString()


def _onnx_huge(b: bytes) -> bytes:
    import onnx

    m = onnx.ModelProto()
    m.ParseFromString(b)
    t = m.graph.initializer[0]
    del t.dims[:]
    t.dims.extend([2**40, 2**40])
    return m.SerializeToString()


TEXT = """module @m {
  func.func @main(%x: tensor<?b x 16 x f32>) -> tensor<?b x 16 x f32> {
    %w = core.weight {file = "w.bin", name = "w", nbytes = 1024, offset = 0} : () -> tensor<16x16xf32>
    %y = core.matmul %x, %w : (tensor<?b x 16 x f32>, tensor<16x16xf32>) -> tensor<?b x 16 x f32>
    return %y : tensor<?b x 16 x f32>
  }
}
"""


class Files:
    """The valid inputs every target copies from, made once in `root`."""

    def __init__(self, root: Path, llama_dir: Path, gguf_file: Path | None) -> None:
        import numpy as np

        self.root, self.llama, self.gguf = root, llama_dir, gguf_file
        small = root / "small"
        small.mkdir(parents=True, exist_ok=True)
        np.ones((16, 16), np.float32).tofile(small / "w.bin")
        (small / "m.llmir").write_text(TEXT)
        np.save(small / "x.npy", np.ones((2, 16), np.float32))
        self.small = small
        self.split: Path | None = None

    def copy_small(self, work: Path) -> Path:
        for f in self.small.iterdir():
            shutil.copyfile(f, work / f.name)
        return work

    def copy_llama(self, work: Path) -> Path:
        folder = work / "model"
        folder.mkdir()
        for f in self.llama.iterdir():
            shutil.copyfile(f, folder / f.name)
        return folder


def make_targets(files: Files) -> dict[str, Target]:  # noqa: C901 - one small closure per file
    t: dict[str, Target] = {}

    def text(cmd: list[str]) -> Callable[[Path], tuple[list[str], Path]]:
        def setup(work: Path) -> tuple[list[str], Path]:
            files.copy_small(work)
            out = {"build": ["-o", str(work / "out")], "optimize": ["-o", str(work / "o.llmir")]}
            return [*cmd, str(work / "m.llmir"), *out.get(cmd[0], [])], work / "m.llmir"

        return setup

    for cmd in (["verify"], ["fmt"], ["fmt", "-i"], ["build"], ["optimize", "-O2"]):
        t[f"llmir ({' '.join(cmd)})"] = Target(f"llmir ({' '.join(cmd)})", text(cmd), located=True)

    def weights(work: Path) -> tuple[list[str], Path]:
        files.copy_small(work)
        return ["build", str(work / "m.llmir"), "-o", str(work / "out")], work / "w.bin"

    t["weights file (build)"] = Target("weights file (build)", weights)

    def tensor(kind: str) -> Callable[[Path], tuple[list[str], Path]]:
        def setup(work: Path) -> tuple[list[str], Path]:
            import numpy as np

            files.copy_small(work)
            f = work / f"x.{kind}"
            if kind == "pb":
                import onnx.numpy_helper

                t = onnx.numpy_helper.from_array(np.ones((2, 16), np.float32), "x")
                f.write_bytes(t.SerializeToString())
            argv = ["run", str(work / "m.llmir"), "--input", f"x={f}"]
            return [*argv, "--output-dir", str(work / "outs")], f

        return setup

    t["run --input .npy"] = Target(
        "run --input .npy", tensor("npy"), huge=npy_huge, escape=_npy_escape
    )
    t["run --input .pb"] = Target("run --input .pb", tensor("pb"), huge=_pb_huge, escape=_pb_escape)

    def hf(name: str) -> Callable[[Path], tuple[list[str], Path]]:
        def setup(work: Path) -> tuple[list[str], Path]:
            folder = files.copy_llama(work)
            return ["import", str(folder), "-o", str(work / "m.llmir")], folder / name

        return setup

    def jinja(work: Path) -> tuple[list[str], Path]:
        argv, _ = hf("config.json")(work)
        f = work / "model" / "chat_template.jinja"
        f.write_text("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}\n")
        return argv, f

    t["hf chat_template.jinja"] = Target("hf chat_template.jinja", jinja, located=True)

    def tokenize(name: str, extra: list[str]) -> Callable[[Path], tuple[list[str], Path]]:
        def setup(work: Path) -> tuple[list[str], Path]:
            folder = files.copy_llama(work)
            argv = ["tokenize", str(folder), "hello", *extra]
            if "--jsonl" in extra:
                (work / "p.jsonl").write_text('"hello"\n"two words"\n')
                argv = ["tokenize", str(folder), "--jsonl", str(work / "p.jsonl")]
            return argv, (work / name if name == "p.jsonl" else folder / name)

        return setup

    t["tokenize tokenizer.json"] = Target(
        "tokenize tokenizer.json", tokenize("tokenizer.json", []), syntax="json"
    )

    def tokenize_llmir(work: Path) -> tuple[list[str], Path]:
        from llmir_core.frontends import import_model, write_module

        f = work / "d.llmir"
        write_module(import_model(str(files.llama), out_path=str(f)), str(f))
        return ["tokenize", str(f), "hello"], f

    t["tokenize .llmir"] = Target("tokenize .llmir", tokenize_llmir, located=True)
    t["tokenize --jsonl"] = Target(
        "tokenize --jsonl", tokenize("p.jsonl", ["--jsonl"]), located=True
    )
    for name in (
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        t[f"hf {name}"] = Target(
            f"hf {name}",
            hf(name),
            syntax="json",
            huge=_json_edit(lambda v: {**v, "vocab_size": 2**62} if isinstance(v, dict) else v),
        )
    t["hf model.safetensors"] = Target(
        "hf model.safetensors",
        hf("model.safetensors"),
        huge=_safetensors_huge,
        escape=_safetensors_escape,
    )

    def st_index(work: Path) -> tuple[list[str], Path]:
        folder = files.copy_llama(work)
        raw = (folder / "model.safetensors").read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        names = [k for k in json.loads(raw[8 : 8 + n]) if k != "__metadata__"]
        index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        return ["import", str(folder), "-o", str(work / "m.llmir")], folder / (
            "model.safetensors.index.json"
        )

    t["hf safetensors index"] = Target(
        "hf safetensors index",
        st_index,
        syntax="json",
        escape=_json_edit(
            lambda v: {
                **v,  # type: ignore[dict-item]
                "weight_map": dict.fromkeys(v["weight_map"], "../../etc/passwd"),  # type: ignore[index]
            }
        ),
    )

    if files.gguf is not None:
        gguf_file = files.gguf

        def gguf(work: Path) -> tuple[list[str], Path]:
            shutil.copyfile(gguf_file, work / "m.gguf")
            return ["import", str(work / "m.gguf"), "-o", str(work / "m.llmir")], work / "m.gguf"

        t["gguf"] = Target("gguf", gguf, huge=_gguf_huge, escape=_gguf_escape)

    if files.split is not None:
        shards = sorted(files.split.glob("*.gguf"))

        def split(work: Path) -> tuple[list[str], Path]:
            for s in shards:
                shutil.copyfile(s, work / s.name)
            first = work / shards[0].name
            return ["import", str(first), "-o", str(work / "m.llmir")], work / shards[-1].name

        def split_first(work: Path) -> tuple[list[str], Path]:
            argv, _ = split(work)
            return argv, work / shards[0].name

        for which, setup in (("last", split), ("first", split_first)):
            t[f"gguf split ({which} shard)"] = Target(
                f"gguf split ({which} shard)", setup, huge=_gguf_huge, escape=_gguf_escape
            )

    try:
        from tests.onnx import models
    except ImportError:
        return t
    mlp = models.mlp(0, hidden=8).SerializeToString()

    def onnx_model(work: Path) -> tuple[list[str], Path]:
        (work / "m.onnx").write_bytes(mlp)
        return ["import", str(work / "m.onnx"), "-o", str(work / "m.llmir")], work / "m.onnx"

    t["onnx"] = Target("onnx", onnx_model, huge=_onnx_huge, escape=_onnx_escape)

    def registry_index(work: Path) -> tuple[list[str], Path]:
        reg = work / "reg"
        reg.mkdir()
        repo = Path(__file__).resolve().parents[2]
        shutil.copyfile(repo / "registry" / "index.json", reg / "index.json")
        return ["registry", "list", "--registry", str(reg), "--offline"], reg / "index.json"

    t["registry index"] = Target("registry index", registry_index, syntax="json")

    def lock(work: Path) -> tuple[list[str], Path]:
        proj = work / "proj"
        code, _, err = invoke("init", str(proj), "--model", str(files.llama), "-q")
        assert code == 0, err
        return ["init", str(proj), "--offline"], proj / "llmir.lock"

    def lock_escape(b: bytes) -> bytes:
        return b.replace(b'path = "config.json"', b'path = "../../etc/passwd"')

    t["llmir.lock (init)"] = Target("llmir.lock (init)", lock, escape=lock_escape, syntax="toml")
    return t


def artifact_targets(small_art: Path, llama_art: Path) -> dict[str, Target]:
    """Every file of a built artifact, read by `run` (tensors in and text generation)."""
    t: dict[str, Target] = {}

    def art(src: Path, name: str, argv: list[str]) -> Callable[[Path], tuple[list[str], Path]]:
        def setup(work: Path) -> tuple[list[str], Path]:
            out = work / "art"
            shutil.copytree(src, out)
            extra = [a.replace("{work}", str(work)) for a in argv]
            if "--input" in argv:
                import numpy as np

                np.save(work / "x.npy", np.ones((2, 16), np.float32))
            return ["run", str(out), *extra], out / name

        return setup

    def prompts(work: Path) -> tuple[list[str], Path]:
        shutil.copytree(llama_art, work / "art")
        f = work / "prompts.txt"
        f.write_text("first prompt\nsecond prompt\n")
        return ["run", str(work / "art"), "--prompts-file", str(f), "-n", "1"], f

    t["run --prompts-file"] = Target("run --prompts-file", prompts, located=True)

    def tokenize_art(work: Path) -> tuple[list[str], Path]:
        shutil.copytree(llama_art, work / "art")
        return ["tokenize", str(work / "art"), "hello"], work / "art" / "manifest.json"

    t["tokenize artifact manifest.json"] = Target(
        "tokenize artifact manifest.json", tokenize_art, syntax="json"
    )

    def bench(work: Path) -> tuple[list[str], Path]:
        shutil.copytree(llama_art, work / "art")
        argv = ["bench", str(work / "art"), "--prompt-len", "2", "--gen-len", "1", "--runs", "1"]
        return [*argv, "--warmup", "0", "--verify-artifact"], work / "art" / "model.onnx"

    t["bench model.onnx (resealed)"] = Target("bench model.onnx (resealed)", bench, reseal=reseal)
    gen = ["--prompt", "ab", "-n", "1", "--verify-artifact"]
    tensors = ["--input", "x={work}/x.npy", "--verify-artifact"]
    for kind, src, argv in (("decoder artifact", llama_art, gen), ("artifact", small_art, tensors)):
        for name in sorted(os.listdir(src)):
            t[f"{kind} {name}"] = Target(
                f"{kind} {name}",
                art(src, name, argv),
                escape=_manifest_escape(name),
                syntax="json" if name == "manifest.json" else "",
            )
            if name != "manifest.json":  # the same damage behind a manifest that matches it
                t[f"{kind} {name} (resealed)"] = Target(
                    f"{kind} {name} (resealed)",
                    art(src, name, argv),
                    reseal=reseal,
                    # onnxruntime reads the weights for the model: its errors name model.onnx
                    names="model.onnx" if name == "model.onnx.data" else "",
                )
    return t


def reseal(f: Path) -> None:
    """Record the damaged file's size and sha256 in the artifact's manifest, as an attacker
    who ships a whole artifact would, so the readers behind the integrity check see it."""
    from llmir_core.fileio import sha256_file

    mpath = f.parent / "manifest.json"
    m = json.loads(mpath.read_text())
    if f.name in m["files"]:
        m["files"][f.name] = {"sha256": sha256_file(f), "bytes": f.stat().st_size}
        mpath.write_text(json.dumps(m, indent=2))


def _manifest_escape(name: str) -> Edit | None:
    if name != "manifest.json":
        return None

    def edit(b: bytes) -> bytes:
        m = json.loads(b)
        files = m.get("files", {})
        first = next(iter(files))
        files["../" + first] = files.pop(first)
        return json.dumps(m).encode()

    return edit
