"""How a decoder's model.onnx is laid out for onnxruntime's prepacking (peak RSS at load).

With `prepack = "session"` (lower-ort-module) onnxruntime copies each constant matmul weight into
its kernels' layout when the session opens: it reads the weight (page faults on the memory-mapped
model.onnx.data), writes the packed copy on the heap and then drops the weight, one node at a time
in node order. Two things keep more than that in memory, both measured on the SmolLM2-135M shape
(docs/load.md):

- a weight also read by an op that does not prepack (the tied embedding table: the `Gather` and the
  lm_head's matmul share it) stays mapped, and its pages stay resident once the prepack has read
  them: f32 +113 MB for the whole session;
- the weight prepacked last is resident together with every packed copy: the lm_head's table
  (the largest weight) comes last in topological order.

`alias_and_order` gives every non-prepacking reader of a prepacked external weight its own
initializer over the same bytes of the data file (no extra disk; onnxruntime maps each
initializer on its own), and lists the prepacking nodes of those weights first, so the largest
source is read and dropped while little else is packed. onnxruntime sorts the graph itself; the
node list is then not in topological order, which the ONNX checker would flag (a model-file
layout choice, recorded in the manifest's `decoder.load_layout`). Computes what it got: the same
nodes, the same bytes.
"""

from __future__ import annotations

from typing import Any

# op type -> the inputs onnxruntime prepacks (constant weights it copies into a kernel layout)
PREPACKED_INPUTS: dict[str, tuple[int, ...]] = {
    "MatMul": (1,),
    "FusedMatMul": (1,),
    "Gemm": (1,),
    "MatMulNBits": (1, 2, 3),
}


def alias_and_order(model: Any) -> dict[str, Any]:
    """Rewrite `model` (an onnx.ModelProto) in place; return what was done:
    {"aliases": {alias: weight}, "first": [node names moved to the front]}."""
    from onnx import TensorProto

    g = model.graph
    external = {t.name: t for t in g.initializer if t.data_location == TensorProto.EXTERNAL}
    prepacked: dict[str, list[Any]] = {}  # weight -> prepacking nodes
    other: dict[str, list[tuple[Any, int]]] = {}  # weight -> (node, input index) of the rest
    for node in g.node:
        packs = (
            PREPACKED_INPUTS.get(node.op_type, ()) if node.domain in ("", "com.microsoft") else ()
        )
        for i, name in enumerate(node.input):
            if name not in external:
                continue
            if i in packs:
                prepacked.setdefault(name, []).append(node)
            else:
                other.setdefault(name, []).append((node, i))
    shared = [w for w in prepacked if w in other]
    if not shared:
        return {"aliases": {}, "first": []}
    taken = {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    taken |= {v.name for v in g.input}
    aliases: dict[str, str] = {}
    for w in shared:
        alias = f"{w}.mapped"
        k = 1
        while alias in taken:
            k += 1
            alias = f"{w}.mapped{k}"
        taken.add(alias)
        t = g.initializer.add()
        t.CopyFrom(external[w])
        t.name = alias
        for node, i in other[w]:
            node.input[i] = alias
        aliases[alias] = w
    first_ids = {id(n) for w in shared for n in prepacked[w]}
    first = [n for n in g.node if id(n) in first_ids]
    rest = [n for n in g.node if id(n) not in first_ids]
    kept = [type(n)() for n in first + rest]
    for new, old in zip(kept, first + rest):
        new.CopyFrom(old)
    del g.node[:]
    g.node.extend(kept)
    return {"aliases": aliases, "first": [n.name for n in kept[: len(first)]]}


__all__ = ["PREPACKED_INPUTS", "alias_and_order"]
