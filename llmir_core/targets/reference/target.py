"""The `reference` target: the numpy reference interpreter as a target (contract.py).

- `capabilities`: every registered op with reference semantics or a decomposition (the
  interpreter runs a decomposition when an op has no reference), plus `core.weight`; every
  dtype; the device `cpu`.
- `lowering(options)`: `lower-reference` only (checks the capability table, records
  `target = "reference"`): the ops the -O preset leaves are what the interpreter runs. No build
  options.
- `serialize`: the artifact (artifact.py): `model.llmir` (the lowered module, its weights
  pointing into `weights.bin`), `weights.bin`, the tokenizer and chat template of an LLM, and
  `manifest.json` (`"target": "reference"`, with a `decoder` section for a decoder module).
- `open(dir)`: a `ReferenceDecoder` (the Decoder protocol) for a decoder artifact, a
  `ReferenceRunner` (tensor runner) otherwise or with `tensors=True`; `open_batch(dir, slots)`:
  a `SerialBatchDecoder` over one decoder per slot (runner.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llmir_core.errors import InputError

if TYPE_CHECKING:  # the table imports this module to read `dialects` and `passes`: keep it light
    from llmir_core.ir.core import Module
    from llmir_core.targets.contract import Capabilities, TargetOption

NAME = "reference"


def _capabilities() -> Capabilities:
    from llmir_core.dialects.registry import all_ops
    from llmir_core.ir.types import DType
    from llmir_core.targets.contract import Capabilities

    ops = {"core.weight"}  # the interpreter maps weights itself
    reasons = {}
    for name, od in all_ops().items():
        if od.reference is not None or od.decompose is not None:
            ops.add(name)
        elif name not in ops:
            reasons[name] = "it declares neither reference semantics nor a decomposition"
    return Capabilities(
        frozenset(ops), frozenset(d.value for d in DType), frozenset({"cpu"}), reasons
    )


class ReferenceTarget:
    name = NAME
    dialects: tuple[str, ...] = ()
    passes: tuple[str, ...] = ("llmir_core.targets.reference.lower:LowerReference",)
    options: tuple[TargetOption, ...] = ()

    def __init__(self) -> None:
        self._caps: Capabilities | None = None

    @property
    def capabilities(self) -> Capabilities:
        if self._caps is None:  # computed on first use: the op registry imports the table
            self._caps = _capabilities()
        return self._caps

    def lowering(self, options: Mapping[str, Any]) -> list[Any]:
        """lower-reference (the module as the -O preset left it is what the interpreter runs)."""
        from llmir_core.targets.reference.lower import LowerReference

        if options:
            raise InputError(
                f"the reference target takes no build options (got {', '.join(sorted(options))})",
                hint="drop them, or build with --target onnxruntime",
            )
        return [LowerReference()]

    def serialize(
        self,
        module: Module,
        out_dir: str,
        *,
        source_path: str | None = None,
        lowered_text: str | None = None,
    ) -> dict[str, Any]:
        """A module -> artifact folder (lowered first when it is not yet); the manifest.
        lowered_text is not needed: model.llmir is the module printed again with its weights
        moved, line for line the same text."""
        from llmir_core.targets.reference.artifact import write_artifact

        if module.attrs.get("target") != NAME:
            from llmir_core.passes.base import PassContext, clone_module

            module = clone_module(module)
            for p in self.lowering({}):
                p.run(module, PassContext())
        return write_artifact(module, out_dir, source_path=source_path)

    def open(self, artifact_dir: str, **options: Any) -> Any:
        """max_context: cap on the tokens a sequence holds; tensors=True: a tensor runner even
        for a decoder. Other runtime options (threads, spin) do not apply to numpy and are
        ignored. `llmir_core.targets.open_artifact` checked the files already."""
        from llmir_core.targets.reference.runner import open_runner

        return open_runner(artifact_dir, **options)

    def open_batch(self, artifact_dir: str, slots: int, **options: Any) -> Any:
        """`slots` decoders over one loaded module, run one sequence at a time."""
        from llmir_core.targets.reference.runner import open_batch

        return open_batch(artifact_dir, slots, **options)


TARGET = ReferenceTarget()

__all__ = ["TARGET", "ReferenceTarget"]
