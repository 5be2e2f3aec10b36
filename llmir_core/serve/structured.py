"""Structured outputs: OpenAI's `response_format`, enforced by grammar-constrained decoding.

`response_format(body)` reads the field (chat and completions both take it, as vLLM does) into
a `GrammarSpec`, or None for `{"type": "text"}` / no field:

- `{"type": "json_object"}`: the output is a JSON object;
- `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`: the
  output validates against `schema`. `strict` false is enforced all the same (the mask admits
  nothing else); a schema keyword the grammar library does not implement is a 400, never
  dropped.

Mistakes are 400s naming the deepest field (`response_format.json_schema.name`, ...).
`compile_for(model, spec)` compiles a spec against the served model's tokenizer (cached: a
client sends the same schema again and again); its errors are 400s naming
`response_format.json_schema.schema`. `constraint(model, spec)` starts one sequence's mask.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from llmir_core.runtime.grammar_spec import GrammarSpec

from .schemas import bad

if TYPE_CHECKING:
    from llmir_core.runtime.grammar import Constraint, Grammar

    from .model import ServedModel

PARAM = "response_format"
SCHEMA_PARAM = "response_format.json_schema.schema"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
CACHE_SIZE = 64  # compiled grammars kept per server


def _keys(obj: dict[str, Any], allowed: set[str], where: str) -> None:
    for k in obj:
        if k not in allowed:
            raise bad(
                f"{where}.{k}",
                f"'{where}.{k}' is not supported by this server",
                "unsupported_parameter",
            )


def response_format(body: dict[str, Any]) -> GrammarSpec | None:
    """The grammar `response_format` asks for (None: free text); APIError 400 on a mistake."""
    rf = body.get(PARAM)
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise bad(PARAM, f"'{PARAM}' must be an object, got {rf!r:.40}", "invalid_type")
    kind = rf.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise bad(
            f"{PARAM}.type",
            f"'{PARAM}.type' must be 'text', 'json_object' or 'json_schema', got {kind!r:.40}",
        )
    if kind != "json_schema":
        _keys(rf, {"type"}, PARAM)
        return None if kind == "text" else GrammarSpec("json_object", None, PARAM)
    _keys(rf, {"type", "json_schema"}, PARAM)
    js = rf.get("json_schema")
    where = f"{PARAM}.json_schema"
    if not isinstance(js, dict):
        raise bad(
            where,
            f"'{where}' must be an object with 'name' and 'schema'",
            "missing_required_parameter" if js is None else "invalid_type",
        )
    _keys(js, _JSON_SCHEMA_KEYS, where)
    name = js.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad(
            f"{where}.name",
            f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-', got {name!r:.40}",
            "missing_required_parameter" if name is None else "invalid_value",
        )
    for key, types in (("strict", (bool,)), ("description", (str,))):
        if js.get(key) is not None and not isinstance(js[key], types):
            raise bad(f"{where}.{key}", f"'{where}.{key}' has the wrong type", "invalid_type")
    schema = js.get("schema")
    if not isinstance(schema, dict):
        raise bad(
            SCHEMA_PARAM,
            f"'{SCHEMA_PARAM}' must be a JSON Schema object",
            "missing_required_parameter" if schema is None else "invalid_type",
        )
    return GrammarSpec("json_schema", schema, SCHEMA_PARAM)


_cache: OrderedDict[tuple[Any, ...], Grammar] = OrderedDict()
_lock = threading.Lock()


def compile_for(model: ServedModel, spec: GrammarSpec | None) -> Grammar | None:
    """spec compiled for model's tokenizer (cached); APIError 400 naming the spec's source."""
    if spec is None:
        return None
    from llmir_core.runtime.grammar import GrammarError, compile_grammar

    vocab = model.manifest.get("decoder", {}).get("vocab")
    # the tokenizer's id is unique while runtime.grammar's index cache keeps it alive
    key = (id(model.tokenizer), vocab, model.eos_ids, spec.kind, json.dumps(spec.value))
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    try:
        g = compile_grammar(spec, model.tokenizer, vocab=vocab, eos_ids=model.eos_ids)
    except GrammarError as exc:
        param = spec.source or PARAM
        raise bad(param, exc.message) from None
    with _lock:
        _cache[key] = g
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return g


def constraint(model: ServedModel, spec: GrammarSpec | None) -> Constraint | None:
    """A new sequence's constraint for spec (None: unconstrained)."""
    g = compile_for(model, spec)
    return None if g is None else g.constraint()


__all__ = ["response_format", "compile_for", "constraint", "PARAM", "SCHEMA_PARAM"]
