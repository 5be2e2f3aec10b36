"""Running a reference artifact: the numpy interpreter over the artifact's `model.llmir`.

- `ReferenceDecoder`: the Decoder protocol (llmir_core.runtime.generate) through the
  interpreter (`FunctionDecoder`: the cache is the function's past/present tensors, grown by
  each step), with what `llmir run --prompt` and `llmir bench` read (manifest, vocab, reserve).
- `ReferenceRunner`: a tensor runner (`llmir run ARTIFACT --input`), keyed by the signature's
  names.
- `ReferenceBatchDecoder`: `SerialBatchDecoder` over one decoder per slot, all sharing one
  loaded module (`llmir serve`).

Weights are memory-mapped from `weights.bin` on first use and kept for the next steps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from llmir_core.errors import InputError
from llmir_core.interp import Interpreter
from llmir_core.ir.core import Module, Op
from llmir_core.runtime.batch_decoder import SerialBatchDecoder
from llmir_core.runtime.decoder import CacheSpec, FunctionDecoder, cache_specs
from llmir_core.runtime.kv_slots import context_limit

NAME = "reference"


class _Interpreter(Interpreter):
    """The reference interpreter, mapping each weight once (not once per step)."""

    def __init__(self, module: Module) -> None:
        super().__init__(module)
        self._weights: dict[int, list[Any]] = {}

    def eval_op(self, op: Op, args: list[Any], env: dict[str, int] | None = None) -> list[Any]:
        if op.name != "core.weight":
            return super().eval_op(op, args, env)
        got = self._weights.get(id(op))
        if got is None:
            got = self._weights[id(op)] = super().eval_op(op, args, env)
        return got


def _load(art_dir: str) -> tuple[dict[str, Any], Module]:
    """The manifest (its shape checked; `open_artifact` checked the files) and the module."""
    from llmir_core.ir.parser import parse_file
    from llmir_core.targets import read_manifest

    manifest = read_manifest(art_dir)
    if manifest["target"] != NAME:
        raise InputError(f"{art_dir}: artifact target is {manifest['target']!r}, not {NAME}")
    return manifest, parse_file(os.path.join(art_dir, manifest.get("model", "model.llmir")))


class ReferenceDecoder(FunctionDecoder):
    """A decoder artifact on the interpreter."""

    def __init__(
        self,
        art_dir: str,
        manifest: dict[str, Any],
        interp: Interpreter,
        specs: list[CacheSpec],
        max_context: int | None = None,
    ) -> None:
        dec = manifest["decoder"]
        super().__init__(interp.run, specs, context_limit(dec.get("max_len"), max_context))
        self.art_dir = art_dir
        self.manifest = manifest
        self.vocab = int(dec["vocab"])
        self.threads: int | None = None  # numpy's own (the bench fingerprint reads it)

    def reserve(self, tokens: int) -> None:
        """Nothing to size ahead: each step returns the cache grown by its rows."""


class ReferenceRunner:
    """A tensor runner: inputs and outputs keyed by the manifest's signature names."""

    def __init__(self, module: Module, manifest: dict[str, Any]) -> None:
        self.module = module
        self.manifest = manifest
        self.input_names = [e["name"] for e in manifest["inputs"]]
        self.output_names = [e["name"] for e in manifest["outputs"]]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from llmir_core.runtime.tensors import run_module

        return run_module(self.module, inputs)


class ReferenceBatchDecoder(SerialBatchDecoder):
    """`slots` reference decoders, one sequence at a time, with the artifact's manifest."""

    def __init__(
        self,
        art_dir: str,
        manifest: dict[str, Any],
        module: Module,
        slots: int,
        max_context: int | None = None,
    ) -> None:
        interp, specs = _Interpreter(module), cache_specs(module.main)
        limit = context_limit(manifest["decoder"].get("max_len"), max_context)
        if limit is None:
            raise InputError(
                f"{art_dir}: the manifest gives no max_len (the model declares no context "
                "length), which serving needs",
                hint="serve with --max-context N",
            )
        self.art_dir = art_dir
        self.manifest = manifest
        super().__init__(
            lambda: ReferenceDecoder(art_dir, manifest, interp, specs, limit),
            slots,
            int(manifest["decoder"]["vocab"]),
            limit,
        )


def open_runner(art_dir: str, **options: Any) -> ReferenceDecoder | ReferenceRunner:
    """The runner of a reference artifact: a decoder (max_context) for a decoder artifact, a
    tensor runner otherwise or with tensors=True."""
    manifest, module = _load(art_dir)
    if isinstance(manifest.get("decoder"), dict) and not options.get("tensors"):
        specs = cache_specs(module.main)
        return ReferenceDecoder(
            art_dir, manifest, _Interpreter(module), specs, options.get("max_context")
        )
    return ReferenceRunner(module, manifest)


def open_batch(art_dir: str, slots: int, **options: Any) -> ReferenceBatchDecoder:
    """`slots` decoders over one loaded module (max_context caps each sequence)."""
    manifest, module = _load(art_dir)
    if not isinstance(manifest.get("decoder"), dict):
        raise InputError(
            f"{art_dir}: not a decoder artifact (its manifest has no 'decoder' section)",
            hint="build an imported LLM with `llmir build MODEL.llmir --target reference`",
        )
    return ReferenceBatchDecoder(art_dir, manifest, module, slots, options.get("max_context"))


__all__ = [
    "ReferenceBatchDecoder",
    "ReferenceDecoder",
    "ReferenceRunner",
    "open_batch",
    "open_runner",
]
