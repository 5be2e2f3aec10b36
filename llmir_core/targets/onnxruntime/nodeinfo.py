"""Which .llmir op an emitted ONNX node comes from: `tag_node(node, op)` writes it into the node's
metadata_props, `node_sources(model)` reads it back (e.g. to map onnxruntime's per-node profile
onto the module's lines).

Keys: `llmir.op` (the op's name, e.g. `ort.matmul_nbits`), `llmir.line` (`LINE:COL` of the op in
the .llmir file the module was parsed from: the lowered module the build wrote into the artifact,
manifest `lowered`; else, e.g. the generic build, manifest `source.file`) and `llmir.loc`
(the op's `loc`: HF module, GGUF tensor or ONNX node it was imported from). A node emitted for a
matched group of ops (e.g. GroupQueryAttention for attention + rotary + KV concat) carries the op
the group was matched at.
"""

from __future__ import annotations

from typing import Any

OP_KEY, LINE_KEY, LOC_KEY = "llmir.op", "llmir.line", "llmir.loc"


def tag_node(node: Any, op: Any) -> None:
    """Record op (an llmir Op, or None) on node (an onnx NodeProto)."""
    if op is None:
        return
    entries = {OP_KEY: op.name}
    pos = getattr(op, "pos", None)
    if pos is not None:
        entries[LINE_KEY] = f"{pos.line}:{pos.col}"
    if getattr(op, "origin", None):
        entries[LOC_KEY] = op.origin
    for k, v in entries.items():
        e = node.metadata_props.add()
        e.key, e.value = k, v


def node_sources(model: Any) -> dict[str, dict[str, str]]:
    """node name -> {"op", "line", "loc"} (whichever were recorded) for every tagged node."""
    out: dict[str, dict[str, str]] = {}
    for nd in model.graph.node:
        props = {e.key: e.value for e in nd.metadata_props}
        if OP_KEY in props:
            out[nd.name] = {
                "op": props[OP_KEY],
                "line": props.get(LINE_KEY, ""),
                "loc": props.get(LOC_KEY, ""),
            }
    return out


__all__ = ["tag_node", "node_sources", "OP_KEY", "LINE_KEY", "LOC_KEY"]
