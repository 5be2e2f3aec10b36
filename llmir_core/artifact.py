"""Writing an artifact folder: what every target's serializer shares.

An artifact is a folder a target's runtime opens: the target's files plus `manifest.json`,
which names the target and records every file's size and sha256. Every target writes it the
same way, through `ArtifactWriter`:

    with ArtifactWriter(out_dir) as w:
        w.write_bytes("model.onnx", data)            # or w.add(name) for a file written at w.path(name)
        tok = w.write_tokenizer(module)               # tokenizer.json, chat_template.jinja
        manifest = manifest_head("onnxruntime", model="model.onnx", source=..., pipeline=...)
        w.finish({**manifest, ...})                   # hashes, manifest.json, rename into place

The files go to a temp folder beside `out_dir`; `finish` writes the manifest with the sha256 of
every file added, then renames the folder into place (the old artifact goes only once the new
one is in). Anything that fails before `finish` (an exception, Ctrl-C) removes the temp folder
and leaves `out_dir` as it was. `check_artifact_dir` refuses an output folder llmir must not
replace (a file, a link, a folder holding something other than an artifact llmir built).

The checked-open half (reading a manifest, checking the files against it before a runtime
loads them) is `llmir_core.artifact_check`; the errors are `llmir_core.errors` (`BuildError`:
the module uses something the target cannot express).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from types import TracebackType
from typing import TYPE_CHECKING, Any

from llmir_core.artifact_check import MANIFEST
from llmir_core.errors import BuildError, InputError
from llmir_core.fileio import replace_dir, sha256_file

if TYPE_CHECKING:
    from llmir_core.ir.core import Module

ARTIFACT_FORMAT = "llmir-artifact"  # the manifest's "format": marks a folder llmir built
SCHEMA_VERSION = 1
TOKENIZER_FILE = "tokenizer.json"
TEMPLATE_FILE = "chat_template.jinja"
LOWERED_FILE = "model.lowered.llmir"  # the lowered module the runtime's tags point into


def jsonable(x: Any) -> Any:
    """x as JSON data: dict keys as strings, tuples as lists, anything else unknown as str."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def source_digest(module: Module, source_path: str | None) -> tuple[str, str | None]:
    """(sha256, file name) of the .llmir the artifact is built from (of its text when unsaved)."""
    src = source_path or module.source
    if src and os.path.isfile(src):
        return sha256_file(src), os.path.basename(src)
    from llmir_core.ir.printer import print_module

    return hashlib.sha256(print_module(module).encode()).hexdigest(), None


def source_record(module: Module, source_path: str | None = None) -> dict[str, Any]:
    """The manifest's `source` ({file, sha256}): the file the module was lowered from (its
    `llmir.source` attribute, set by the lowering), else the module's own file or text."""
    rec = module.attrs.get("llmir.source")
    if isinstance(rec, dict) and rec.get("sha256"):
        return {"file": str(rec.get("file") or "") or None, "sha256": str(rec["sha256"])}
    sha, name = source_digest(module, source_path)
    return {"file": name, "sha256": sha}


def manifest_head(
    target: str,
    *,
    model: str,
    source: dict[str, Any],
    pipeline: Any = None,
    builder: str | None = None,
    lowered: str | None = None,
    target_options: Any = None,
) -> dict[str, Any]:
    """The fields every target's manifest starts with (the target adds its own, `finish` adds
    `files`): format, versions, target, the model file, the source it was built from, the
    lowered text's file, the pass pipeline that lowered it and the build options it used
    (`target_options`: every declared option with its effective value)."""
    from llmir_core import SPEC_VERSION, __version__

    head: dict[str, Any] = {
        "format": ARTIFACT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "llmir_version": __version__,
        "spec_version": SPEC_VERSION,
        "target": target,
        "model": model,
        "source": {"file": source.get("file") or None, "sha256": source.get("sha256")},
        "lowered": lowered,
        "pipeline": jsonable(pipeline) if isinstance(pipeline, (list, tuple)) else None,
        "target_options": jsonable(target_options) if target_options is not None else None,
    }
    if builder is not None:
        head["builder"] = builder
    return head


# -- the output folder ---------------------------------------------------------------------------


def _manifest_problem(out_dir: str) -> str | None:
    """None when out_dir is provably an llmir artifact (a manifest that says so, and no file or
    folder the manifest does not list), else why it is not."""
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.isfile(path) or os.path.islink(path):
        return f"no {MANIFEST}"
    try:
        if os.path.getsize(path) > 64 << 20:
            return f"{MANIFEST} is too large for an llmir manifest"
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return f"{MANIFEST} is not an llmir manifest (not JSON)"
    if not isinstance(data, dict):
        return f"{MANIFEST} is not an llmir manifest (not a JSON object)"
    files = data.get("files")
    # Manifests written before the "format" marker: the fields only an llmir build writes.
    legacy = (
        isinstance(data.get("llmir_version"), str)
        and data.get("schema_version") == 1
        and isinstance(files, dict)
        and all(isinstance(f, dict) and "sha256" in f and "bytes" in f for f in files.values())
    )
    if data.get("format") != ARTIFACT_FORMAT and not legacy:
        return f"{MANIFEST} is not an llmir manifest"
    if not isinstance(files, dict) or not all(isinstance(n, str) for n in files):
        return f"{MANIFEST} lists no files"
    return _unlisted(out_dir, set(files) | {MANIFEST})


def _unlisted(out_dir: str, listed: set[str]) -> str | None:
    """Why out_dir holds something beyond the `listed` files (paths with '/'), or None."""
    for root, dirs, names in os.walk(out_dir):
        dirs.sort()
        for entry in sorted(dirs) + sorted(names):
            full = os.path.join(root, entry)
            rel = os.path.relpath(full, out_dir).replace(os.sep, "/")
            if rel in listed and (os.path.islink(full) or not os.path.isfile(full)):
                return f"{rel!r} is not a regular file"
            if os.path.islink(full) or rel not in listed and entry not in dirs:
                return f"it holds {rel!r}, which {MANIFEST} does not list"
            if entry in dirs and not any(n.startswith(rel + "/") for n in listed):
                return f"it holds {rel!r}, which {MANIFEST} does not list"
    return None


def check_artifact_dir(out_dir: str) -> None:
    """Refuse an output folder llmir must not replace: its parent missing, a file, a symbolic
    link, or a non-empty folder that is not provably an llmir artifact (see
    _manifest_problem). Called before the build and again right before the swap."""
    parent = os.path.dirname(out_dir)
    if not os.path.isdir(parent):
        raise InputError(f"{out_dir}: folder {parent} does not exist", hint="create it first")
    if os.path.islink(out_dir):
        raise InputError(
            f"{out_dir}: is a symbolic link; llmir replaces the output folder as a whole",
            hint="pass the folder it points to, or a new output folder",
        )
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(f"{out_dir}: exists and is not a folder")
    if not os.path.isdir(out_dir):
        return
    try:
        empty = not os.listdir(out_dir)
        problem = None if empty else _manifest_problem(out_dir)
    except OSError as exc:
        problem = f"cannot read it ({exc.strerror or exc})"
    if problem:
        raise InputError(
            f"{out_dir}: folder exists, is not empty and is not an llmir artifact: {problem}",
            hint="pick a new output folder; llmir only replaces a folder holding nothing but "
            "an artifact it built",
        )


def artifact_tmp_dir(out_dir: str) -> str:
    """A temp folder beside out_dir to build into (then `replace_dir`), with ordinary permissions."""
    try:
        tmp = tempfile.mkdtemp(
            prefix=f".{os.path.basename(out_dir)}.", suffix=".tmp", dir=os.path.dirname(out_dir)
        )
    except OSError as exc:  # a read-only or full disk, no permission: the user's to fix
        raise InputError(
            f"{out_dir}: cannot create the artifact in {os.path.dirname(out_dir)}: {exc.strerror}",
            hint="write the artifact somewhere else (-o DIR)",
        ) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the artifact is an ordinary folder
    return tmp


# -- the writer ----------------------------------------------------------------------------------


class ArtifactWriter:
    """Files written into a temp folder, then the manifest, then the folder renamed into place
    (see the module docstring). A context manager: leaving it without `finish` removes the
    temp folder."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = os.path.abspath(out_dir)
        check_artifact_dir(self.out_dir)
        self.tmp = ""
        self.files: list[str] = []
        self._digests: dict[str, str] = {}
        self._done = False

    def __enter__(self) -> ArtifactWriter:
        self.tmp = artifact_tmp_dir(self.out_dir)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._done:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, name: str) -> str:
        """Where the file `name` (a relative path, '/' between folders) goes in the temp folder."""
        return os.path.join(self.tmp, *name.split("/"))

    def add(self, name: str, sha256: str | None = None) -> None:
        """List a file written at `path(name)` (its sha256 when the writer computed it already)."""
        if name not in self.files:
            self.files.append(name)
        if sha256 is not None:
            self._digests[name] = sha256

    def write_bytes(self, name: str, data: bytes) -> None:
        with open(self.path(name), "wb") as fh:
            fh.write(data)
        self.add(name)

    def write_text(self, name: str, text: str) -> None:
        with open(self.path(name), "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        self.add(name)

    def write_lowered(self, lowered_text: str | None) -> str | None:
        """The lowered module's text as LOWERED_FILE (None when there is none): its name."""
        if lowered_text is None:
            return None
        self.write_text(LOWERED_FILE, lowered_text)
        return LOWERED_FILE

    def write_tokenizer(self, module: Module) -> dict[str, Any] | None:
        """tokenizer.json (copied from a Hugging Face folder or rebuilt from GGUF metadata) when
        the module names one: the manifest's `tokenizer` entry."""
        tok = copy_tokenizer(module, self.path(TOKENIZER_FILE))
        if tok:
            self.add(TOKENIZER_FILE)
        return tok

    def write_chat_template(self, module: Module) -> str | None:
        """The module's chat template as TEMPLATE_FILE (None when it has none): its name."""
        template = module.attrs.get("llm.chat_template")
        if not isinstance(template, str) or not template:
            return None
        self.write_text(TEMPLATE_FILE, template)
        return TEMPLATE_FILE

    def file_table(self) -> dict[str, dict[str, Any]]:
        """{name: {sha256, bytes}} of every file added."""
        return {
            f: {
                "sha256": self._digests.get(f) or sha256_file(self.path(f)),
                "bytes": os.path.getsize(self.path(f)),
            }
            for f in self.files
        }

    def finish(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Record every file in `manifest["files"]`, write manifest.json and move the folder
        into place; the manifest."""
        manifest["files"] = self.file_table()
        with open(os.path.join(self.tmp, MANIFEST), "w", encoding="utf-8") as fh:
            fh.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        replace_dir(self.tmp, self.out_dir, guard=check_artifact_dir)
        self._done = True
        return manifest


def copy_tokenizer(module: Module, dst: str) -> dict[str, Any] | None:
    """The module's tokenizer (attribute `llm.tokenizer`) written to dst as tokenizer.json:
    copied (hf) or rebuilt from GGUF metadata (gguf); the manifest entry, None without one."""
    from llmir_core.weights import resolve_path

    spec = module.attrs.get("llm.tokenizer")
    if not isinstance(spec, dict) or "file" not in spec:
        return None
    base = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
    path = resolve_path(str(spec["file"]), base)
    if spec.get("format") == "hf":
        if not os.path.isfile(path):
            raise InputError(
                f"{path}: tokenizer file not found (module attribute llm.tokenizer)",
                hint="import the model again, or build from a module without a tokenizer",
            )
        shutil.copyfile(path, dst)
    elif spec.get("format") == "gguf":
        from llmir_core.runtime.tokenizer import load_tokenizer

        load_tokenizer(module, base).backend.save(dst, pretty=False)  # compact: 35% smaller
    else:
        raise InputError(
            f"module @{module.name}: llm.tokenizer format '{spec.get('format')}' is not known (hf, gguf)"
        )
    return {"format": "hf", "file": os.path.basename(dst)}


__all__ = [
    "ARTIFACT_FORMAT",
    "ArtifactWriter",
    "BuildError",
    "LOWERED_FILE",
    "MANIFEST",
    "SCHEMA_VERSION",
    "TEMPLATE_FILE",
    "TOKENIZER_FILE",
    "artifact_tmp_dir",
    "check_artifact_dir",
    "copy_tokenizer",
    "jsonable",
    "manifest_head",
    "source_digest",
    "source_record",
]
