"""lower-ort-embedding: an embedding lookup into a table stored in blocks becomes
`ort.gather_block_quantized` (com.microsoft.GatherBlockQuantized), so the table stays as small
as its blocks instead of being written out as f32.

Runs after lower-ort-matmul. An `llm.embedding(table, ids)` of a decoder, with a static 2-D f32
table, is rewritten when:

- the table is also the weight of an `ort.matmul_nbits` (a tied lm_head) whose blocks are
  symmetric: the lookup takes the head's bits, block size, `quantize` and `scale_dtype`, and the serializer
  stores the blocks once for both;
- else the table is a GGUF tensor in a block format that repacks losslessly (q4_0, q8_0, q5_0,
  q6_k, q3_k): `quantize = "none"` (exact: the values are the GGUF file's);
- else the build quantizes float weights (`--quant int4|int8`, symmetric): the rows are rounded
  to those blocks (`quantize = "sym"`; the report gives the max abs error).

Anything else (f32 builds, GGUF formats with mins or a non-linear table: q4_1, q5_1, q2_k,
q4_k, q5_k, iq4_nl, iq4_xs) keeps `llm.embedding`, a plain Gather over the exactly dequantized
table: an untied GGUF table is never requantized (a tied one shares the head's blocks, which
are requantized only when `--quant` or `gguf_kernels = requant` asks).
Invariant: a rewrite with `quantize = "none"` computes exactly what it replaced (its
decomposition is the `llm.embedding`); a "sym" one differs by the reported rounding: its
meaning is the lookup in `llm.dequantize(llm.quantize(table))`, and it is logged as an instance
of the approximate rule `nbits-int{4,8}-sym-embedding` (llmir_core/rewrite/nbits_rules.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType
from llmir_core.passes.base import PassContext
from llmir_core.passes.rewriting import Conversion, Converted, apply_conversions
from llmir_core.rewrite.nbits_rules import rule_name
from llmir_core.rewrite.rule import RuleInstance, value_loc
from llmir_core.targets.onnxruntime.lower_common import (
    Graph,
    NbitsFormat,
    WSrc,
    declare_ort,
    is_decoder,
    legal,
    nbits_format,
    parse_quant,
    quantize_mode,
    tt,
    weight_src,
)


@dataclass(frozen=True)
class LowerOrtEmbedding:
    name: ClassVar[str] = "lower-ort-embedding"
    summary: ClassVar[str] = (
        "embedding lookups in block-stored tables (tied quantized lm_head, GGUF blocks, "
        "--quant) -> ort.gather_block_quantized"
    )
    quant: str = ""
    quant_block: int = 32

    def run(self, module: Module, ctx: PassContext) -> bool:
        if not is_decoder(module):  # other modules keep the generic op-by-op build
            return False
        changed = apply_conversions(module, ctx, self.table(module), legal)
        if changed:
            declare_ort(module)
        return changed

    def table(self, module: Module) -> tuple[Conversion, ...]:
        """The conversion-pattern table: one row, with this pass's options."""
        fmt = parse_quant(self.quant, self.quant_block)
        base = os.path.dirname(os.path.abspath(module.source)) if module.source else os.getcwd()

        def convert(fn: Function, op: Op) -> Converted | str:
            if tt(op.results[0]).dtype != DType.f32:
                return "not f32"
            g = Graph(fn)
            choice = self._choose(g, op, fmt)
            if choice is None:
                return "the table is not stored in blocks that it can keep"
            nb, mode, why = choice
            sd = _tied_scale_dtype(g, op.operands[0])
            attrs: dict[str, object] = {"bits": nb.bits, "block_size": nb.block, "quantize": mode}
            if sd != "f32":
                attrs["scale_dtype"] = sd
            if mode != "sym":
                return Converted(attrs, note=why)
            src = weight_src(g, op.operands[0])
            assert src is not None
            why += f", max abs error {embedding_error(src, nb, base, sd):.3g}"
            return Converted(attrs, note=why, instance=_instance(op, op.results[0], nb, sd))

        target = "ort.gather_block_quantized"
        return (
            Conversion(
                "lower-ort-embedding.gather_block_quantized", "llm.embedding", target, convert
            ),
        )

    def _choose(
        self, g: Graph, op: Op, fmt: NbitsFormat | None
    ) -> tuple[NbitsFormat, str, str] | None:
        """(format, quantize, description) for the lookup, or None to keep it a Gather."""
        table = op.operands[0]
        src = weight_src(g, table)
        if src is None:
            return None
        for u in g.uses(table):
            if (
                u.name == "ort.matmul_nbits"
                and len(u.operands) == 2
                and u.operands[1] is table
                and u.attrs.get("quantize", "none") in ("none", "sym")
            ):
                nb = NbitsFormat(int(u.attrs["bits"]), int(u.attrs["block_size"]), False)
                mode = str(u.attrs.get("quantize", "none"))
                return nb, mode, f"{src.label}: the tied lm_head's int{nb.bits} blocks, stored once"
        if src.kind == "gguf":
            own = nbits_format(src, None)
            if own is not None and not own.asym and quantize_mode(src, own) == "none":
                return (
                    own,
                    "none",
                    f"{src.label}: {src.scheme} kept exactly (repacked losslessly to int"
                    f"{own.bits} block {own.block})",
                )
            return None
        if src.kind in ("f32", "cast") and fmt is not None and not fmt.asym:
            if src.cols % fmt.block:
                return None
            return fmt, "sym", f"{src.label}: f32 quantized to int{fmt.bits} block {fmt.block}"
        return None


def _tied_scale_dtype(g: Graph, table: Value) -> str:
    """The tied lm_head's `scale_dtype` (its blocks are the lookup's), else f32."""
    for u in g.uses(table):
        if u.name == "ort.matmul_nbits" and len(u.operands) == 2 and u.operands[1] is table:
            return str(u.attrs.get("scale_dtype", "f32"))
    return "f32"


def embedding_error(s: WSrc, nb: NbitsFormat, base: str, scale_dtype: str = "f32") -> float:
    """Max |rounded - table| over the table (what quantizing the embedding loses)."""
    from llmir_core.targets.onnxruntime.dialect import fake_quant
    from llmir_core.weights import load_weight

    assert s.op is not None
    w = np.asarray(load_weight(s.op.attrs, tt(s.op.results[0]), base).data)
    scheme = s.scheme if s.kind == "gguf" else None
    if scheme is not None:  # GGUF blocks (a q8_0 table requantized by --quant int4)
        from llmir_core.quant import gguf_blocks

        w = w.reshape(s.rows, -1)
    err = 0.0
    step = max(1, (8 << 20) // max(1, s.cols * 4))
    for r in range(0, s.rows, step):
        if scheme is not None:
            n = min(step, s.rows - r)
            x = gguf_blocks.dequantize(w[r : r + step], scheme, (n, s.cols))
        else:
            x = np.asarray(w[r : r + step], np.float32)
        err = max(
            err, float(np.abs(fake_quant(x, nb.bits, nb.block, "sym", scale_dtype) - x).max())
        )
    return err


def _instance(op: Op, y: Value, nb: NbitsFormat, scale_dtype: str) -> RuleInstance:
    """The rule instance of a "sym" lookup `y` in place of the llm.embedding `op`."""
    from llmir_core.targets.onnxruntime.dialect import nbits_qtype

    table, ids = op.operands
    root = op.results[0]
    return RuleInstance(
        rule_name(nb.bits, True, "embedding"),
        root.name,
        root.name,
        {"table": table.name, "ids": ids.name},
        {},
        {"format": nbits_qtype(nb.bits, nb.block, "sym", scale_dtype), "dtype": tt(table).dtype},
        value_loc(root),
    )
