"""An op set that adds an op to a built-in dialect (llm): refused."""

from __future__ import annotations

from llmir_core.dialects.registry import register

from ._op import identity_op

register(identity_op("llm.swish"))
