"""Options shared by every command, as Annotated aliases."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer


class OutputFormat(str, Enum):
    human = "human"
    json = "json"


FormatOpt = Annotated[
    OutputFormat,
    typer.Option(
        "--format", "-f", help="Result format on stdout: human or json.", case_sensitive=False
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Only print results and errors.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Print more detail on stderr.")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show a Python traceback on errors.")]

# -- lowering options: `llmir build` and `llmir optimize --target` take the same ones ------------

OptLevelOpt = Annotated[
    int | None,
    typer.Option(
        "-O",
        help="Optimization preset 0, 1, 2 or 3; with a target, run before its lowering "
        "(default: [build] opt_level of ./llmir.toml, else 2).",
        show_default=False,
    ),
]
QuantOpt = Annotated[
    str | None,
    typer.Option(
        "--quant",
        help="Decoders: quantize float weights to int4 (MatMulNBits, blockwise) or int8 "
        "(DynamicQuantizeMatMul, per output channel; a tied lm_head MatMulNBits).",
        show_default=False,
    ),
]
MaxLenOpt = Annotated[
    int | None,
    typer.Option(
        "--max-len",
        help="Decoders: KV-cache positions to preallocate (default: the model's context).",
        show_default=False,
    ),
]
AccuracyLevelOpt = Annotated[
    int | None,
    typer.Option(
        "--accuracy-level",
        help="Decoders: MatMulNBits activation precision 0-4 (4 = int8, fastest; 1 = fp32).",
        show_default=False,
    ),
]
LogitsOpt = Annotated[
    str | None,
    typer.Option(
        "--logits",
        help="Decoders: logits for the 'last' position only (what generation reads; the "
        "default) or for 'all' positions (perplexity, `llmir run --tensors`).",
        show_default=False,
    ),
]
WeightDTypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="Decoders: store matmul weights and the embedding table in f16 or bf16 (half the "
        "f32 bytes; computed in f32 where the CPU has no 16-bit kernel), or f32 (default: "
        "each weight in the width its source stores, e.g. an F16 GGUF's f16).",
        show_default=False,
    ),
]
PrepackOpt = Annotated[
    str | None,
    typer.Option(
        "--prepack",
        help="Decoders: 'session' (default) lets onnxruntime repack the matmul weights when the "
        "artifact opens (fastest decode and prefill; load time and a heap copy grow with the "
        "weights); 'none' keeps f32 weights memory-mapped as stored (fastest load, lowest "
        "peak RSS; not for int4/int8). f32 matmuls read their weights in place either way "
        "(--f32-matmul).",
        show_default=False,
    ),
]
Int8MatmulOpt = Annotated[
    str | None,
    typer.Option(
        "--int8-matmul",
        help="Decoders with --quant int8: the int8 matmul kernel, 'llmir' (default: llmir's own "
        "kernel reading the int8 weights in place, where its library builds; else "
        "'nbits'), 'qgemm-s8pair' (onnxruntime's DynamicQuantizeMatMul, prepacked at "
        "load), 'qgemm-u8' or 'nbits' (MatMulNBits blocks).",
        show_default=False,
    ),
]
F32MatmulOpt = Annotated[
    str | None,
    typer.Option(
        "--f32-matmul",
        help="Decoders: the f32 matmul kernel, 'llmir' (default: llmir's own kernel reading the "
        "f32 weights in place, stored in 16-row panels, where its library builds; else 'mlas') "
        "or 'mlas' (onnxruntime's FusedMatMul, repacked when the artifact opens: slower load, "
        "a heap copy of the weights).",
        show_default=False,
    ),
]
AttentionKernelOpt = Annotated[
    str | None,
    typer.Option(
        "--attention-kernel",
        help="Decoders: the attention kernel, 'auto' (default: llmir's own grouped-query "
        "attention where its library builds and takes the head size, else onnxruntime's), "
        "'llmir' (an input error where it cannot take the op) or 'onnxruntime' "
        "(com.microsoft GroupQueryAttention).",
        show_default=False,
    ),
]
GgufKernelsOpt = Annotated[
    str | None,
    typer.Option(
        "--gguf-kernels",
        help="Decoders from GGUF: 'exact' (default: every block format runs as stored, read in "
        "place by llmir's kernel) or 'requant' (the faster form: k-quants and the _1 formats "
        "requantized to int4/int8 blocks, their error in the report).",
        show_default=False,
    ),
]
GenericOpt = Annotated[
    bool,
    typer.Option(
        "--generic",
        help="Build a decoder with the generic op-by-op lowering (no KV-cache buffers).",
    ),
]

# -- chat templates: `llmir run --chat` and `llmir serve` render them within the same bound ----

ChatTemplateOpt = Annotated[
    str | None,
    typer.Option(
        "--chat-template",
        help="Chat template to use instead of the model's: a built-in name (chatml, gemma, "
        "llama3) or a Jinja template file.",
        show_default=False,
    ),
]

TemplateTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--template-timeout",
        envvar="LLMIR_TEMPLATE_TIMEOUT",
        help="Seconds a chat template may take to render before it is stopped (default 2).",
        show_default=False,
    ),
]
