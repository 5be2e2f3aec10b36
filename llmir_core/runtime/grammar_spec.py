"""What a constrained generation must produce, before any tokenizer is involved.

A `GrammarSpec` names the language the output must belong to: `json_schema` (a JSON Schema
document, as OpenAI's `response_format: {"type": "json_schema"}` and `llmir run --json-schema`
give it), `json_object` (any JSON object), `lark` (a Lark grammar in llguidance's dialect) or
`regex`. `llmir_core.runtime.grammar` compiles it against a tokenizer into a per-sequence
token mask; this module imports nothing heavy so request parsing can build one freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

GrammarKind = Literal["json_schema", "json_object", "lark", "regex"]
JSON_OPTIONS: Any = {  # llguidance's JsonCompileOptions: compact JSON, as json.dumps writes it
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": False,
}


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    value: Any = None  # the schema (a dict), the grammar or pattern text; None for json_object
    source: str = ""  # where it came from, for error messages ("response_format", a file name)


__all__ = ["GrammarSpec", "GrammarKind", "JSON_OPTIONS"]
