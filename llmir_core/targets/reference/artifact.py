"""The reference target's artifact: the lowered module, its weights in one file, the manifest.

`write_artifact(module, out_dir)` writes into a temp folder beside out_dir, then renames it
into place:

- `weights.bin`: the bytes of every `core.weight` the module references (in GGUF, safetensors
  or any other file), each distinct byte range once, at an offset that is a multiple of 64, as
  stored (quantized blocks stay blocks); the runner memory-maps it;
- `model.llmir`: the lowered module, printed again with each `core.weight` pointing into
  `weights.bin` (file, offset; a pinned sha256 is dropped: the manifest's hash of weights.bin
  covers those bytes, checked once, not once per weight on every load) and the tokenizer
  attribute naming the copied `tokenizer.json`; one op per line as in the lowered text, so
  locations still point at the same lines;
- `tokenizer.json` and `chat_template.jinja` of an LLM (as the other targets copy them);
- `manifest.json`: `"target": "reference"`, every file's sha256 and size, the function's
  `inputs`/`outputs` signature, and for a decoder module the `decoder` section the generation
  loop, `llmir bench` and `llmir serve` read.

The folder names no path outside itself: moved or copied, it runs the same.
"""

from __future__ import annotations

import os
from typing import IO, Any

from llmir_core.errors import CheckFailed, InputError
from llmir_core.ir.core import Module
from llmir_core.ir.types import TensorType
from llmir_core.runtime.decoder import CacheSpec, cache_specs

NAME = "reference"
MODEL_FILE = "model.llmir"
WEIGHTS_FILE = "weights.bin"
MANIFEST = "manifest.json"
ALIGN = 64  # a cache line: every weight's first element is aligned for any dtype
_CHUNK = 8 << 20


def decoder_specs(module: Module) -> list[CacheSpec] | None:
    """The cache entries of a decoder module (input_ids, positions, one past per cache entry ->
    logits, one present per entry); None for any other module."""
    fn = module.main
    if [a.name for a in fn.args[:2]] != ["input_ids", "positions"] or len(fn.args) < 3:
        return None
    try:
        specs = cache_specs(fn)
    except InputError:
        return None
    logits = fn.outputs[0].type if fn.outputs else None
    if len(fn.outputs) != 1 + len(specs) or not isinstance(logits, TensorType):
        return None
    return specs if logits.rank == 3 and isinstance(logits.shape[-1], int) else None


def write_artifact(
    module: Module, out_dir: str, *, source_path: str | None = None
) -> dict[str, Any]:
    """Write the artifact of a module lowered for the reference target; return its manifest."""
    from llmir_core.artifact import ArtifactWriter, source_digest
    from llmir_core.ir.printer import print_module
    from llmir_core.passes.base import clone_module

    module = clone_module(module)  # the weight references are rewritten below
    rec = module.attrs.get("llmir.source")
    if isinstance(rec, dict) and rec.get("sha256"):  # the file the module was lowered from
        source = {"file": str(rec.get("file") or "") or None, "sha256": str(rec["sha256"])}
    else:
        sha, name = source_digest(module, source_path)
        source = {"file": name, "sha256": sha}
    with ArtifactWriter(out_dir) as w:
        has_weights = _pack_weights(module, w.path(WEIGHTS_FILE)) > 0
        if not has_weights:
            os.remove(w.path(WEIGHTS_FILE))  # a module without weights
        tok = w.write_tokenizer(module)
        if tok:
            module.attrs["llm.tokenizer"] = {"file": tok["file"], "format": "hf"}
        template = w.write_chat_template(module)
        w.write_text(MODEL_FILE, print_module(module))
        if has_weights:
            w.add(WEIGHTS_FILE)
        manifest = _manifest_body(module, source, tok, template)
        if has_weights:
            manifest["weights"] = WEIGHTS_FILE
        return w.finish(manifest)


def _pack_weights(module: Module, path: str) -> int:
    """Copy each distinct byte range the module's `core.weight` ops reference into `path` (at a
    multiple of ALIGN) and point the ops there; return the size written."""
    from llmir_core.weights import WeightRefError, check_weight_ref, expected_nbytes, resolve_path

    base = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()
    placed: dict[tuple[str, int, int], int] = {}
    with open(path, "wb") as out:
        for op in (op for fn in module.functions for op in fn.ops if op.name == "core.weight"):
            t = op.results[0].type
            where = f"{op.pos}: " if op.pos else ""
            try:
                check_weight_ref(op.attrs, t, base, True)  # inside its file, a pinned sha256 holds
            except WeightRefError as exc:
                raise CheckFailed(f"{where}core.weight: {exc}") from None
            assert isinstance(t, TensorType)  # check_weight_ref refuses anything else
            nbytes = op.attrs.get("nbytes")
            nbytes = expected_nbytes(t) if nbytes is None else int(nbytes)
            if nbytes is None:
                raise InputError(f"{where}core.weight: a weight needs a static shape, has {t}")
            src = os.path.realpath(resolve_path(op.attrs["file"], base))
            key = (src, int(op.attrs.get("offset", 0)), nbytes)
            if key not in placed:
                out.write(b"\0" * (-out.tell() % ALIGN))
                placed[key] = out.tell()
                _copy_range(src, key[1], nbytes, out)
            attrs = {k: v for k, v in op.attrs.items() if k != "sha256"}
            op.attrs = {**attrs, "file": WEIGHTS_FILE, "offset": placed[key], "nbytes": nbytes}
        return out.tell()


def _copy_range(src: str, offset: int, nbytes: int, out: IO[bytes]) -> None:
    with open(src, "rb") as fh:
        fh.seek(offset)
        left = nbytes
        while left > 0:
            chunk = fh.read(min(left, _CHUNK))
            if not chunk:  # check_weight_ref saw the range inside the file: it shrank since
                raise InputError(f"{src}: ended while its weights were copied", hint="build again")
            out.write(chunk)
            left -= len(chunk)


def _manifest_body(
    module: Module, source: dict[str, Any], tok: dict[str, Any] | None, template: str | None
) -> dict[str, Any]:
    """The manifest's fields other than the files: versions, target, signature, decoder."""
    from llmir_core import SPEC_VERSION, __version__
    from llmir_core.artifact import ARTIFACT_FORMAT, jsonable
    from llmir_core.ir.dims import format_dim
    from llmir_core.runtime.tensors import module_signature

    ins, outs = module_signature(module)  # plain tensors in: what `llmir run --input` feeds
    signature = [
        [
            {
                "name": s.name,
                "dtype": str(s.dtype),
                "shape": [d if isinstance(d, int) else format_dim(d) for d in s.shape],
            }
            for s in sigs
        ]
        for sigs in (ins, outs)
    ]
    specs = decoder_specs(module)
    pipeline = module.attrs.get("llmir.pipeline")
    body: dict[str, Any] = {
        "format": ARTIFACT_FORMAT,
        "schema_version": 1,
        "llmir_version": __version__,
        "spec_version": SPEC_VERSION,
        "target": NAME,
        "builder": "decoder" if specs else "tensors",
        "model": MODEL_FILE,
        "lowered": MODEL_FILE,  # the file the ops' locations point into
        "source": source,
        "pipeline": [str(p) for p in pipeline] if isinstance(pipeline, (list, tuple)) else None,
        "target_options": jsonable(module.attrs.get("llmir.target_options") or {}),
        "inputs": signature[0],
        "outputs": signature[1],
    }
    if specs:
        body["decoder"] = _decoder_section(module, specs, tok, template, jsonable)
    return body


def _decoder_section(
    module: Module,
    specs: list[CacheSpec],
    tok: dict[str, Any] | None,
    template: str | None,
    jsonable: Any,
) -> dict[str, Any]:
    """What the generation loop reads: cache entries, vocabulary, context, tokens, tokenizer."""
    fn = module.main
    logits = fn.outputs[0].type
    assert isinstance(logits, TensorType)
    ctx = module.attrs.get("llm.context_length")
    ctx = ctx if isinstance(ctx, int) and ctx > 0 else None
    layers = module.attrs.get("llm.num_layers")
    arg_types = {a.name: a.type for a in fn.args}
    return {
        "layers": layers if isinstance(layers, int) and layers > 0 else max(1, len(specs) // 2),
        "vocab": logits.shape[-1],
        "max_len": ctx,
        "context_length": ctx,
        "kv_cache": "concat",  # each step returns the cache grown by its rows
        "cache": [
            {
                "input": s.name,
                "kv_heads": s.kv_heads,
                "head_dim": s.head_dim,
                "dtype": str(getattr(arg_types[s.name], "dtype", "")),
            }
            for s in specs
        ],
        "logits": "last" if logits.shape[1] == 1 else "all",
        "eos_token_ids": [int(e) for e in module.attrs.get("llm.eos_token_ids") or ()],
        "bos_token_id": module.attrs.get("llm.bos_token_id"),
        "tokenizer": tok,
        "chat_template": template,
        "generation": jsonable(module.attrs.get("llm.generation") or {}),
        "architecture": module.attrs.get("llm.architecture"),
    }


__all__ = ["write_artifact", "decoder_specs", "MODEL_FILE", "WEIGHTS_FILE", "ALIGN"]
