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
    from llmir_core.targets.contract import Capabilities, TargetOption

NAME = "onnxruntime"
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
    ) + ("llmir_core.targets.onnxruntime.pack_weights:PackOrtWeights",)

    @property
    def options(self) -> tuple[TargetOption, ...]:
        """The build options (options.py; imported here: opening an artifact needs no IR)."""
        from llmir_core.targets.onnxruntime.options import OPTIONS

        return OPTIONS

    @property
    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = _capabilities()
        return self._caps

    def lowering(self, options: Mapping[str, Any]) -> list[Any]:
        # long: the pass list, a table: each option handed to the pass that reads it
        """lower-ort-precision, then lower-ort-attention, -norms, -moe, -matmul, -embedding,
        -weight-dtype, -logits, pack-ort-weights (decoders only; no-ops elsewhere) and -module."""
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
        from llmir_core.targets.onnxruntime.pack_weights import PackOrtWeights

        quant = str(options.get("quant") or "").replace("none", "")
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
            PackOrtWeights(),
            module,
        ]

    def check_options(self, module: Module, options: Mapping[str, Any]) -> None:
        """The refusals the declarations cannot state: the decoder options need a decoder
        module and the decoder lowering (not `generic`); int8_matmul needs quant int8."""
        from llmir_core.targets.onnxruntime.lower_common import is_decoder
        from llmir_core.targets.onnxruntime.options import DECODER_ONLY

        given = [k for k in DECODER_ONLY if k in options]
        if given and (options.get("generic") or not is_decoder(module)):
            raise InputError(
                f"options {', '.join(given)} apply to decoder builds only",
                hint="import an LLM (HF folder or GGUF) to get a decoder module; without --generic",
            )
        if "int8_matmul" in options and options.get("quant") != "int8":
            raise InputError(
                "--int8-matmul applies to --quant int8 builds only",
                hint="add --quant int8 (--target-opt quant=int8), or drop --int8-matmul",
            )

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
        manifest = _manifest(artifact_dir)
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

    def open_batch(self, artifact_dir: str, slots: int, **options: Any) -> Any:
        """`slots` sequences in one shared KV buffer (OrtBatchDecoder); threads, max_context.
        `llmir_core.targets.open_batch_artifact` checked the files already."""
        from llmir_core.artifact_check import decoder_section
        from llmir_core.targets.onnxruntime.batch_runner import OrtBatchDecoder

        manifest = _manifest(artifact_dir)
        decoder_section(artifact_dir, manifest)
        return OrtBatchDecoder(
            artifact_dir,
            slots,
            threads=options.get("threads"),
            max_context=options.get("max_context"),
            manifest=manifest,
        )

    # -- what core checkers reach through the table (they never import the target) ------------

    def session_for_module(self, module: Module, threads: int | None = 1) -> Any:
        """(runner, input names, output names) of a module built in memory (onnx_backend)."""
        from llmir_core.targets.onnxruntime.graph import session_for_module

        return session_for_module(module, threads)

    def gguf_weight_problem(self, weight: Any, fmt: str) -> str | None:
        """Why ort.matmul_gguf's weight is not a stored `fmt` tensor, or None (verifier)."""
        from llmir_core.targets.onnxruntime.dialect import gguf_weight_problem

        return gguf_weight_problem(weight, fmt)

    def kv_int8_codes(self, x: Any, scale: Any) -> Any:
        """onnxruntime's int8 KV cache store: x's codes at `scale` (the dialect's; smt.kv_int8)."""
        from llmir_core.targets.onnxruntime.dialect import kv_int8_codes

        return kv_int8_codes(x, scale)

    def last_logits_interface(self, before: Module, after: Module) -> Module | None:
        """`before` restricted to the last position's logits when `after` computes only those
        (lower-ort-logits), else None (smt.tv)."""
        from llmir_core.targets.onnxruntime.lower_logits import last_logits_interface

        return last_logits_interface(before, after)


def _manifest(artifact_dir: str) -> dict[str, Any]:
    """The artifact's manifest, its shape checked (not its files), built for this target."""
    from llmir_core.targets import read_manifest

    manifest = read_manifest(artifact_dir)
    if manifest["target"] != NAME:
        raise InputError(f"{artifact_dir}: artifact target is {manifest['target']!r}, not {NAME}")
    return manifest


TARGET = OrtTarget()

__all__ = ["TARGET", "OrtTarget"]
