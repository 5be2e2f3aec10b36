"""The onnxruntime target's build options (`--target-opt KEY=VALUE`; the older flags such as
`--quant` are aliases). The choices are written out here, not imported from the passes, so that
opening an artifact imports no lowering code; tests/targets/test_options.py checks that they
match the passes' tables."""

from __future__ import annotations

from llmir_core.targets.contract import TargetOption

CPUS = ("x86-64-v3", "x86-64", "host")

OPTIONS: tuple[TargetOption, ...] = (
    TargetOption(
        "quant",
        "str",
        "Decoders: quantize float weights to int4 (MatMulNBits, blockwise) or int8 "
        "(per output channel); none keeps them as stored (alias --quant).",
        "none",
        ("none", "int4", "int8"),
    ),
    TargetOption("quant_block", "int", "Decoders: block size for quant (alias --quant-block).", 32),
    TargetOption(
        "max_len",
        "int",
        "Decoders: KV-cache positions to preallocate; unset: the model's context "
        "(alias --max-len).",
    ),
    TargetOption(
        "accuracy_level",
        "int",
        "Decoders: MatMulNBits activation precision (4 = int8, fastest; 1 = fp32) "
        "(alias --accuracy-level).",
        4,
        ("0", "1", "2", "3", "4"),
    ),
    TargetOption(
        "last_logits",
        "bool",
        "Decoders: logits for the last position only (what generation reads); false: for "
        "every position (alias --logits last|all).",
        True,
    ),
    TargetOption(
        "dtype",
        "str",
        "Decoders: store matmul weights and the embedding table in f16, bf16 or f32; unset: "
        "each weight in the width its source stores (alias --dtype).",
        None,
        ("f16", "bf16", "f32"),
    ),
    TargetOption(
        "prepack",
        "str",
        "Decoders: session lets onnxruntime repack matmul weights when the artifact opens; "
        "none keeps them memory-mapped as stored (alias --prepack).",
        "session",
        ("session", "none"),
    ),
    TargetOption(
        "int8_matmul",
        "str",
        "Decoders with quant int8: the int8 matmul kernel (alias --int8-matmul).",
        "llmir",
        ("llmir", "qgemm-s8pair", "qgemm-u8", "nbits"),
    ),
    TargetOption(
        "f32_matmul",
        "str",
        "Decoders: the f32 matmul kernel; auto: llmir's, reading 16-row panels in place, "
        "where it runs (alias --f32-matmul llmir); ort: onnxruntime's FusedMatMul (alias "
        "--f32-matmul mlas); custom: llmir's always.",
        "auto",
        ("auto", "ort", "custom"),
    ),
    TargetOption(
        "attention_kernel",
        "str",
        "Decoders: auto: llmir's attention where it runs; llmir: always (an error where it "
        "cannot); onnxruntime: com.microsoft GroupQueryAttention (alias --attention-kernel).",
        "auto",
        ("auto", "llmir", "onnxruntime"),
    ),
    TargetOption(
        "gguf_kernels",
        "str",
        "Decoders from GGUF: exact runs every block format as stored; requant requantizes "
        "k-quants and the _1 formats to int4/int8 blocks (alias --gguf-kernels).",
        "exact",
        ("exact", "requant"),
    ),
    TargetOption(
        "nbits_kernel",
        "str",
        "Decoders: the kernel of 4/8-bit block matmuls (llmir's, onnxruntime's MLAS, or auto).",
        "auto",
        ("auto", "llmir", "mlas"),
    ),
    TargetOption(
        "norm_kernel",
        "str",
        "Decoders: the kernel of the fused norms (onnxruntime's, llmir's, or auto).",
        "onnxruntime",
        ("onnxruntime", "auto", "llmir"),
    ),
    TargetOption(
        "swiglu",
        "bool",
        "Decoders: fuse the gated MLP's activation into the matmul epilogue.",
        True,
    ),
    TargetOption(
        "nbits_scales",
        "str",
        "Decoders: the dtype of block scales of weights llmir quantizes for its kernel.",
        "f16",
        ("f16", "f32"),
    ),
    TargetOption(
        "cpu",
        "str",
        "Which CPU the llmir kernels are chosen for: x86-64-v3 (AVX2, FMA), x86-64 (portable "
        "onnxruntime ops), host (this machine, only when asked).",
        "x86-64-v3",
        CPUS,
    ),
    TargetOption(
        "generic",
        "bool",
        "Build a decoder with the generic op-by-op lowering (no KV-cache buffers) "
        "(alias --generic).",
        False,
    ),
)
# options that need the decoder lowering (refused for generic builds and non-decoder modules)
DECODER_ONLY = tuple(o.name for o in OPTIONS if o.name not in ("generic", "cpu"))

__all__ = ["CPUS", "DECODER_ONLY", "OPTIONS"]
