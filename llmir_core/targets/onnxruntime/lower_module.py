"""lower-ort-module: the last onnxruntime lowering step. It checks that every op left is one the
target runs (its capability table, including a kernel for the 16-bit float dtype each op computes
in; the first op it cannot run fails the pass with its location and reason) and records on the module what the serializer needs: `target = "onnxruntime"`,
`ort.options` (max_len, last_logits, quant, accuracy_level, prepack, cpu: the build options) and `llmir.source`
(file name and sha256 of the module as it was before lowering, which the artifact's manifest
names). A module with `target` set is lowered: `llmir build` serializes it as is.

`prepack` is the session's weight handling, decided here so the lowered module shows it:
"session" (onnxruntime repacks matmul weights when the session opens) or "none" (f32 weights
stay memory-mapped as stored: fastest load; lower-ort-weight-dtype then gives the f32 matmuls to
llmir's in-place `ort.matmul_f32` where it builds, else they run unpacked, slower). "none" is
refused when the module has MatMulNBits ops (onnxruntime runs them unpacked ~40x slower,
measured; `kernel = "llmir"` ones read their blocks as stored and are fine). With "session" the
serializer lays model.onnx out for prepacking (`targets/onnxruntime/load_layout.py`: a tied table's
non-matmul readers get their own name over the same bytes, its matmul node comes first): the
same nodes and bytes, a lower peak RSS.

Invariant: computes what it got (it changes no op); idempotent.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import ClassVar

from llmir_core.errors import CheckFailed
from llmir_core.ir.core import Module
from llmir_core.passes.base import PassContext
from llmir_core.targets.onnxruntime.lower_common import (
    ACCURACY_LEVEL,
    LAST_LOGITS,
    PREPACK,
    TARGET,
    check_accuracy_level,
    check_prepack,
    declare_ort,
    is_decoder,
    parse_quant,
)
from llmir_core.targets.onnxruntime.native.cpu import CPU


def source_record(module: Module, source_path: str | None = None) -> dict[str, str]:
    """{file, sha256} of the .llmir a module comes from (of its text when it has no file)."""
    src = source_path or module.source
    if src and os.path.isfile(src):
        from llmir_core.fileio import sha256_file

        return {"file": os.path.basename(src), "sha256": sha256_file(src)}
    from llmir_core.ir.printer import print_module

    return {"file": "", "sha256": hashlib.sha256(print_module(module).encode()).hexdigest()}


@dataclass(frozen=True)
class LowerOrtModule:
    name: ClassVar[str] = "lower-ort-module"
    summary: ClassVar[str] = (
        "check the onnxruntime capability table; record target and build options"
    )
    quant: str = ""
    quant_block: int = 32
    accuracy_level: int = ACCURACY_LEVEL
    max_len: int = 0
    last_logits: bool = LAST_LOGITS
    generic: bool = False  # keep the generic op-by-op build for a decoder (no KV buffers)
    dtype: str = ""  # weight storage dtype of a decoder (f16 | bf16; "" = f32)
    prepack: str = PREPACK  # session | none (see the module docstring)
    cpu: str = CPU  # what the lowering's kernel choice was for (native/cpu.py), recorded

    def run(self, module: Module, ctx: PassContext) -> bool:
        parse_quant(self.quant, self.quant_block)
        check_accuracy_level(self.accuracy_level)
        if self.max_len < 0:
            from llmir_core.errors import InputError

            raise InputError(f"--max-len must be >= 1, got {self.max_len}")
        from llmir_core.targets import get_target
        from llmir_core.targets.onnxruntime.lower_weight_dtype import parse_weight_dtype

        parse_weight_dtype(self.dtype)
        check_prepack(self.prepack)
        if self.prepack == "none":
            nbits = [
                op
                for f in module.functions
                for op in f.ops
                if op.name == "ort.matmul_nbits" and op.attrs.get("kernel") != "llmir"
            ]
            if nbits:
                from llmir_core.errors import Diagnostic, InputError

                msg = (
                    f"--prepack none: {len(nbits)} ort.matmul_nbits op(s) (int4/int8 weights) "
                    "need onnxruntime's prepacked layout (unpacked they run ~40x slower)"
                )
                pos = nbits[0].pos
                raise InputError(
                    f"{pos}: error: {msg}" if pos else msg,
                    diagnostics=[Diagnostic("error", msg, pos)],
                    hint="use --prepack session (the default) for quantized builds",
                )
        problems = get_target(TARGET).capabilities.check(module, kernels=True)
        if problems:
            raise CheckFailed(
                f"{len(problems)} op(s) cannot run on {TARGET}: {problems[0].message}",
                diagnostics=problems,
                hint="remove or change them before lowering (see `llmir verify FILE --target onnxruntime`)",
            )
        opts = {
            "quant": self.quant or "f32",
            "quant_block": self.quant_block,
            "accuracy_level": self.accuracy_level,
            "max_len": self.max_len,
            "last_logits": self.last_logits and not self.generic and is_decoder(module),
            "generic": self.generic,
            "prepack": self.prepack,
            "cpu": self.cpu,
        }
        if self.dtype not in ("", "f32"):
            opts["dtype"] = self.dtype
        before = dict(module.attrs)
        if "llmir.source" not in module.attrs:
            module.attrs["llmir.source"] = source_record(module)
        module.attrs["target"] = TARGET
        module.attrs["ort.options"] = opts
        declare_ort(module)
        return module.attrs != before
