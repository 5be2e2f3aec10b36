"""An op set that registers a fine op, then one named like a built-in op: refused whole."""

from __future__ import annotations

from llmir_core.dialects.registry import register

from ._op import identity_op

register(identity_op("shadow.fine"))
register(identity_op("core.silu"))
