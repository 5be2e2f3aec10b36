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

WeightDTypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="onnxruntime decoders: store matmul weights and the embedding table in f16 or bf16 "
        "(half the f32 bytes; computed in f32 where the CPU has no 16-bit kernel).",
        show_default=False,
    ),
]
