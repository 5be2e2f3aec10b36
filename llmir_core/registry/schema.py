"""The registry's JSON Schema validator: `llmir_core.json_schema` (shared with the artifact
manifest check, which must not import this package)."""

from llmir_core.json_schema import SchemaError, path_text, validate

__all__ = ["SchemaError", "path_text", "validate"]
