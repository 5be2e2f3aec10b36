"""The onnxruntime target: capability table, lowering pipeline, serializer and runners.

Decoder modules (the `llm_graph` signature) lower to `ort.*` ops (GroupQueryAttention over a
shared KV buffer, MatMulNBits, fused norms) and serialize through `ort_decoder`; any other module
keeps the op-by-op lowering of `ort_lower` (`ort.build`). `open` returns the `OrtDecoder` (the
`Decoder` protocol) for decoder artifacts and an `OrtRunner` (tensor runner) otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmir_core.errors import InputError

if TYPE_CHECKING:  # opening an artifact needs no IR (tests/decoder/test_open_imports.py)
    from llmir_core.ir.core import Module
    from llmir_core.targets.contract import Capabilities

NAME = "onnxruntime"
_OPTIONS = (
    "quant",
    "quant_block",
    "accuracy_level",
    "int8_matmul",
    "nbits_kernel",
    "attention_kernel",
    "norm_kernel",
    "max_len",
    "last_logits",
    "generic",
    "dtype",
    "prepack",
    "f32_matmul",
    "swiglu",
    "nbits_scales",
    "gguf_kernels",
    "cpu",
)
# ops with a definition the generic lowering cannot express in ONNX
_REASONS = {
    "llm.kv_cache_update": "the !llm.kv_cache type has no onnxruntime form; decoders keep their cache as "
    "past/present tensors",
    "llm.kv_cache_read": "the !llm.kv_cache type has no onnxruntime form",
}


def _capabilities() -> Capabilities:
    from llmir_core.dialects.registry import all_ops
    from llmir_core.targets.contract import Capabilities
    from llmir_core.targets.onnxruntime.onnx_lower import LOWER

    ops = set(LOWER) | {"core.weight", "ort.*", "llm.embedding"}
    for name, od in all_ops().items():
        if od.decompose is not None and name not in _REASONS:
            ops.add(name)  # lowered through its decomposition
    dtypes = {
        "f64",
        "f32",
        "f16",
        "bf16",
        "i64",
        "i32",
        "i16",
        "i8",
        "u8",
        "u16",
        "u32",
        "u64",
        "bool",
        "f8e4m3",
        "f8e5m2",
        "f8e4m3fnuz",
        "f8e5m2fnuz",
        "f8e8m0",
        "i4",
        "u4",
        "i2",
        "u2",
    }
    from llmir_core.targets.onnxruntime.kernel_table import MEASURED, PROBED

    kernels = {**PROBED, **MEASURED}
    return Capabilities(
        frozenset(ops),
        frozenset(dtypes),
        frozenset({"cpu"}),
        dict(_REASONS),
        folds_constants=True,
        kernels=kernels,
        kernels_source="onnxruntime CPU provider, llmir_core/targets/onnxruntime/kernel_table.py",
    )


_PASSES = (
    "precision",
    "attention",
    "norms",
    "moe",
    "matmul",
    "embedding",
    "weight_dtype",
    "logits",
    "module",
)
_CLASSES = (
    "Precision",
    "Attention",
    "Norms",
    "Moe",
    "Matmul",
    "Embedding",
    "WeightDtype",
    "Logits",
    "Module",
)


@dataclass
class OrtTarget:
    name: str = NAME
    _caps: Capabilities | None = None
    dialects: tuple[str, ...] = (
        "llmir_core.targets.onnxruntime.dialect",
        "llmir_core.targets.onnxruntime.dialect_moe",
    )
    passes: tuple[str, ...] = tuple(
        f"llmir_core.targets.onnxruntime.lower_{m}:LowerOrt{c}" for m, c in zip(_PASSES, _CLASSES)
    )

    @property
    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = _capabilities()
        return self._caps

    def lowering(self, options: Mapping[str, Any]) -> list[Any]:
        """lower-ort-precision, then lower-ort-attention, -norms, -moe, -matmul, -embedding,
        -weight-dtype, -logits (decoders only; no-ops elsewhere) and -module."""
        from llmir_core.targets.onnxruntime.lower_attention import (
            ATTENTION_KERNEL,
            LowerOrtAttention,
        )
        from llmir_core.targets.onnxruntime.lower_common import (
            ACCURACY_LEVEL,
            GGUF_KERNEL,
            LAST_LOGITS,
            PREPACK,
        )
        from llmir_core.targets.onnxruntime.lower_embedding import LowerOrtEmbedding
        from llmir_core.targets.onnxruntime.lower_logits import LowerOrtLogits
        from llmir_core.targets.onnxruntime.lower_matmul import (
            INT8_MATMUL,
            NBITS_KERNEL,
            LowerOrtMatmul,
        )
        from llmir_core.targets.onnxruntime.lower_module import LowerOrtModule
        from llmir_core.targets.onnxruntime.lower_moe import LowerOrtMoe
        from llmir_core.targets.onnxruntime.lower_norms import NORM_KERNEL, LowerOrtNorms
        from llmir_core.targets.onnxruntime.lower_precision import LowerOrtPrecision
        from llmir_core.targets.onnxruntime.lower_weight_dtype import (
            F32_KERNEL,
            LowerOrtWeightDtype,
            parse_weight_dtype,
        )

        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise InputError(
                f"unknown onnxruntime build option(s): {', '.join(unknown)}",
                hint=f"valid: {', '.join(_OPTIONS)}",
            )
        quant = str(options.get("quant") or "")
        block = int(options.get("quant_block", 32))
        level = int(options.get("accuracy_level", ACCURACY_LEVEL))
        last = bool(options.get("last_logits", LAST_LOGITS))
        dtype = str(options.get("dtype") or "")
        parse_weight_dtype(dtype)
        gguf = str(options.get("gguf_kernels") or GGUF_KERNEL)
        # the kernel choice: x86-64-v3 (llmir's kernels), x86-64 (portable ops); host probes
        # this machine here, once, only when asked (native/cpu.py); the passes read the result
        from llmir_core.targets.onnxruntime.native.cpu import CPU, resolve_cpu

        cpu = resolve_cpu(str(options.get("cpu") or CPU))
        module = LowerOrtModule(
            quant,
            block,
            level,
            int(options.get("max_len") or 0),
            last,
            bool(options.get("generic", False)),
            dtype,
            str(options.get("prepack") or PREPACK),
            cpu,
        )
        if options.get("generic"):
            return [LowerOrtPrecision(), module]
        return [
            LowerOrtPrecision(),
            LowerOrtAttention(
                quant,
                block,
                str(options.get("attention_kernel") or ATTENTION_KERNEL[0]),
                gguf,
                cpu,
            ),
            LowerOrtNorms(str(options.get("norm_kernel") or NORM_KERNEL[0]), cpu),
            LowerOrtMoe(quant, block, level),
            LowerOrtMatmul(
                quant,
                block,
                level,
                str(options.get("int8_matmul") or INT8_MATMUL[0]),
                str(options.get("nbits_kernel") or NBITS_KERNEL[0]),
                bool(options.get("swiglu", True)),
                str(options.get("nbits_scales") or "f16"),
                gguf,
                cpu,
            ),
            LowerOrtEmbedding(quant, block),
            # f32 weights: llmir's MatMulF32 reads them in place, stored in 16-row panels, where
            # the custom ops build (--f32-matmul llmir, the default); --f32-matmul mlas keeps
            # onnxruntime's FusedMatMul (repacked when the session opens)
            LowerOrtWeightDtype(
                dtype,
                f32_kernel=str(options.get("f32_matmul") or F32_KERNEL),
                swiglu=bool(options.get("swiglu", True)),
                cpu=cpu,
            ),
            LowerOrtLogits(last),
            module,
        ]

    def serialize(
        self,
        module: Module,
        out_dir: str,
        *,
        source_path: str | None = None,
        lowered_text: str | None = None,
    ) -> dict[str, Any]:
        """A lowered module -> artifact folder: the decoder serializer for decoder modules, the
        generic op-by-op build otherwise (and for `generic` lowerings). lowered_text: the text
        the module was parsed from when the build lowered it (its op positions point there)."""
        from llmir_core.targets.onnxruntime.lower_common import is_decoder, module_options

        opts = module_options(module)
        if is_decoder(module) and not opts.get("generic"):
            from llmir_core.targets.onnxruntime.serialize_decoder import serialize_decoder

            return serialize_decoder(module, out_dir, lowered_text=lowered_text)
        decoder_only = [k for k in ("max_len", "last_logits") if opts.get(k)]
        if opts.get("quant", "f32") != "f32":
            decoder_only.append("quant")
        if opts.get("dtype", "f32") not in ("", "f32"):
            decoder_only.append("dtype")
        if opts.get("prepack", "session") != "session":
            decoder_only.append("prepack")
        if decoder_only:
            raise InputError(
                f"{', '.join(decoder_only)} apply to decoder builds only",
                hint="import an LLM (HF folder or GGUF) to get a decoder module",
            )
        from llmir_core.targets.onnxruntime.graph import build as build_generic

        src = module.attrs.get("llmir.source")
        return build_generic(
            module,
            out_dir,
            NAME,
            source_path=source_path,
            source=dict(src) if isinstance(src, dict) else None,
            lowered_text=lowered_text,
        )

    def open(self, artifact_dir: str, **options: Any) -> Any:
        """threads, max_context, spin; tensors=True: a tensor runner even for a decoder.
        `llmir_core.targets.open_artifact` checked the files already: only the shape here."""
        from llmir_core.targets import read_manifest

        manifest = read_manifest(artifact_dir)
        if manifest["target"] != NAME:
            raise InputError(
                f"{artifact_dir}: artifact target is {manifest['target']!r}, not {NAME}"
            )
        if isinstance(manifest.get("decoder"), dict) and not options.get("tensors"):
            from llmir_core.targets.onnxruntime.runner import OrtDecoder

            return OrtDecoder(
                artifact_dir,
                manifest,
                options.get("threads"),
                options.get("max_context"),
                options.get("spin"),
            )
        from llmir_core.targets.onnxruntime.session import runner_for_artifact

        return runner_for_artifact(artifact_dir, options.get("threads"), manifest)


TARGET = OrtTarget()

__all__ = ["TARGET", "OrtTarget"]
