"""A small JSON Schema validator for the subset of keywords llmir's schemas use (the registry
index, registry/index.schema.json; artifact manifests, llmir_core/runtime/manifest.schema.json).

jsonschema is not a dependency, so this checks: $ref (to #/$defs/...), type, enum, const,
required, properties, additionalProperties, propertyNames, pattern, minLength, minimum, items,
minItems, allOf and if/then. A schema that uses any other validation keyword is rejected, so
the subset can never be exceeded silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

JsonPath = tuple[str | int, ...]  # keys and indices from the document's root

_ANNOTATIONS = {
    "$schema",
    "$id",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "$defs",
}
_KEYWORDS = {
    "$ref",
    "type",
    "enum",
    "const",
    "required",
    "properties",
    "additionalProperties",
    "propertyNames",
    "pattern",
    "minLength",
    "minimum",
    "items",
    "minItems",
    "allOf",
    "if",
    "then",
}
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


@dataclass(frozen=True)
class SchemaError:
    """One violation: the path of the offending value and what is wrong with it."""

    path: JsonPath
    message: str


def path_text(path: JsonPath) -> str:
    """`models["a:b"].files[0].sha256` style, for messages."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$]*", part):
            out += f".{part}" if out else part
        else:
            out += f'["{part}"]'
    return out or "(top level)"


def validate(instance: Any, schema: dict[str, Any]) -> list[SchemaError]:
    """All violations of `schema` by `instance`, in document order."""
    errors: list[SchemaError] = []
    _check(instance, schema, schema, (), errors)
    return errors


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"schema $ref {ref!r}: only local references (#/...) are supported")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node  # type: ignore[no-any-return]


def _check(
    value: Any,
    schema: dict[str, Any],
    root: dict[str, Any],
    path: JsonPath,
    errors: list[SchemaError],
) -> None:
    unknown = set(schema) - _KEYWORDS - _ANNOTATIONS
    if unknown:
        raise ValueError(f"schema uses unsupported keywords {sorted(unknown)}")
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, path, errors)
    for part in schema.get("allOf", ()):
        _check(value, part, root, path, errors)
    if "if" in schema and "then" in schema:
        trial: list[SchemaError] = []
        _check(value, schema["if"], root, path, trial)
        if not trial:
            _check(value, schema["then"], root, path, errors)
    if "type" in schema:
        allowed = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in allowed):
            errors.append(SchemaError(path, f"expected {' or '.join(allowed)}, got {_kind(value)}"))
            return
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(repr(c) for c in schema["enum"])
        errors.append(SchemaError(path, f"{value!r} is not one of {choices}"))
    if "const" in schema and value != schema["const"]:
        errors.append(SchemaError(path, f"expected {schema['const']!r}, got {value!r}"))
    if isinstance(value, str):
        _check_string(value, schema, path, errors)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(SchemaError(path, f"{value} is less than {schema['minimum']}"))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(SchemaError(path, f"needs at least {schema['minItems']} item(s)"))
        if "items" in schema:
            for index, item in enumerate(value):
                _check(item, schema["items"], root, (*path, index), errors)
    if isinstance(value, dict):
        _check_object(value, schema, root, path, errors)


def _check_string(
    value: str, schema: dict[str, Any], path: JsonPath, errors: list[SchemaError]
) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(
            SchemaError(
                path,
                "must not be empty"
                if schema["minLength"] == 1
                else f"shorter than {schema['minLength']} characters",
            )
        )
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(SchemaError(path, f"{value!r} does not match {schema['pattern']}"))


def _check_object(
    value: dict[str, Any],
    schema: dict[str, Any],
    root: dict[str, Any],
    path: JsonPath,
    errors: list[SchemaError],
) -> None:
    for name in schema.get("required", []):
        if name not in value:
            errors.append(SchemaError(path, f"missing required field {name!r}"))
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if "propertyNames" in schema:
            before = len(errors)
            _check(key, schema["propertyNames"], root, (*path, key), errors)
            for i in range(before, len(errors)):
                errors[i] = SchemaError(errors[i].path, f"bad name {key!r}: {errors[i].message}")
        if key in props:
            _check(item, props[key], root, (*path, key), errors)
        elif extra is False:
            known = ", ".join(sorted(props)) or "none"
            errors.append(SchemaError((*path, key), f"unknown field {key!r} (known: {known})"))
        elif isinstance(extra, dict):
            _check(item, extra, root, (*path, key), errors)


def _kind(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__
