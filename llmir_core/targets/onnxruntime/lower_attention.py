"""lower-ort-attention: each decoder layer's attention becomes one `ort.group_query_attention`.

Pattern (the convention `llm_graph` emits): q/k/v projections split into heads
(`core.reshape` to [B, S, N, D] + `core.transpose` 0,2,1,3), optional `llm.rotary_embedding` of q
and k with one constant cos/sin table, `core.concat(past, k/v, axis 2)` returned as the present
outputs, causal `llm.scaled_dot_product_attention` (no mask, no softmax_eps), and the merge of its
heads (transpose + reshape to [B, S, H*D]). Replacement: one `ort.group_query_attention` whose
results are the merged output and the two presents (do_rotary when there is rotary). When q, k
and v are plain projections of one activation by weights of one storage format (`core.matmul`,
no bias), they are packed: `core.matmul(x, core.concat(wq, wk, wv, axis 0))` feeds the op's
packed form, logged as instances of the proved merge-qkv-q/k/v rules.

Each op records the kernel that runs it (`attention_kernel`): `kernel = "llmir"` is llmir's own
attention from its onnxruntime custom-op library (ai.llmir GroupQueryAttention, the same node
interface over the same shared KV buffer: llmir_core/targets/onnxruntime/native/attention.c), taken when
`attention_kernel` is `auto` (the default) or `llmir` and the build's `cpu` option is
x86-64-v3 (the default; cpu=x86-64 refuses `llmir`), for head_dim a multiple of 8 up to 256 (f32 and int8
caches, sliding windows and softcaps included); otherwise the attribute is absent: onnxruntime's
com.microsoft GroupQueryAttention. `attention_kernel = llmir` on an op its kernel does not take
is an input error at the attention's position.

A packed projection with biases (Qwen2's q/k/v) adds their concatenation to the packed qkv. On
llmir's kernel that add is folded into the op (`qkv_bias = true`, the bias its last operand: the
kernel adds it as it reads each row, one onnxruntime node less per layer); on onnxruntime's it
stays a `core.add` before the op.

Invariant: the op's decomposition is the matched subgraph (same attributes), so translation
validation meets the original terms; presents keep their names and layout [B, Hkv, len, D].
Rejected candidates are reported with the reason (they keep concat attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from llmir_core.errors import Diagnostic, InputError
from llmir_core.ir.attrs import DenseAttr
from llmir_core.ir.core import Function, Module, Op, Value
from llmir_core.ir.types import DType
from llmir_core.passes.base import PassContext, erase_dead, scratch_builder, take_over
from llmir_core.rewrite.quant_rules import kv_codes_static, kv_dequant
from llmir_core.rewrite.rule import RuleInstance, value_loc
from llmir_core.rewrite.terms import Match, V, match
from llmir_core.targets.onnxruntime.dialect import gqa_llmir_unsupported
from llmir_core.targets.onnxruntime.lower_common import (
    GGUF_KERNEL,
    Evaluate,
    Graph,
    cache_args,
    declare_ort,
    gguf_exact_format,
    is_decoder,
    nbits_format,
    packed_src,
    parse_quant,
    static_evaluator,
    tt,
    weight_src,
)
from llmir_core.targets.onnxruntime.native.cpu import CPU, llmir_kernels, no_kernels


@dataclass
class _Attn:
    sdpa: Op
    claims: list[Op]
    q: Value  # [B, S, H*D] or [B, S, H, D]
    k: Value
    v: Value
    lin: bool  # q/k/v are the 3-D projections
    out: Value  # the value the op's [B, S, H*D] output stands for
    out_is_3d: bool
    past_k: Value
    past_v: Value
    present_k: Value
    present_v: Value
    heads: int
    kv_heads: int
    head_dim: int
    rope: Op | None = None
    kv_quant: str = "none"
    k_scale: Value | None = None
    v_scale: Value | None = None


@dataclass
class _Kv:
    """One cache entry of an attention: past input, the new block, the present output, the op
    that reads the new block, the ops replaced, and the static int8 scale (kv_quant) if any."""

    past: Value
    new: Value
    present: Value
    user: Op
    claims: list[Op]
    quant: str = "none"
    scale: Value | None = None


def _is_inverse(inv: Value, scale: Value) -> bool:
    """inv is a constant holding f32(1) / scale (scale a constant), element for element."""
    a, b = inv.owner, scale.owner
    if a is None or b is None or a.name != "core.constant" or b.name != "core.constant":
        return False
    x, s = a.attrs.get("value"), b.attrs.get("value")
    if not isinstance(x, DenseAttr) or not isinstance(s, DenseAttr):
        return False
    want = np.float32(1.0) / s.array.astype(np.float32)
    return (
        x.array.dtype == np.float32
        and x.array.shape == want.shape
        and bool(np.array_equal(x.array, want))
    )


def _cache_entry(g: Graph, fn: Function, sdpa: Op, val: Value, pasts: set[int]) -> _Kv | str:
    """The cache entry attention operand `val` reads: concat(past, new, axis 2) returned once as
    a present, or its int8 form f32(concat(past_i8, codes(new, s))) * s with a static scale s
    (kv-cache-int8{scales=calibrated}). A str: why it is not one."""
    not_found = "KV concat (axis 2) of a past input, returned once, not found"
    if any(u is not sdpa for u in g.uses(val)):
        return not_found
    claims: list[Op] = []
    quant, scale = "none", None
    present = val
    m = None
    if g.producer(val, "core.concat") is None:
        m = match(kv_dequant(V("q"), V("s")), val)
        if m is None:
            return not_found
        present, scale = m.values["q"], m.values["s"]
        if any(u is not m.ops[1] for u in g.uses(present)):
            return "the int8 cache entry is read other than through its dequantization"
        claims += m.ops
    c = g.producer(present, "core.concat")
    if (
        c is None
        or len(c.operands) != 2
        or c.attrs.get("axis") != 2
        or id(c.operands[0]) not in pasts
        or id(present) not in g.outputs
        or list(fn.outputs).count(present) != 1
    ):
        return not_found
    claims.append(c)
    past, new = c.operands
    user = c
    if m is not None:
        assert scale is not None
        m0 = Match(dict(m.values), dict(m.consts), dict(m.attrs), list(m.ops))
        m = match(kv_codes_static(V("new"), V("s")), new, m)
        if m is None:  # 1/s constant-folded: the constant must be f32(1) / s exactly
            m = match(kv_codes_static(V("new"), V("s"), V("inv")), new, m0)
            if m is not None and not _is_inverse(m.values["inv"], scale):
                m = None
        inner = m.ops[2:] if m is not None else []
        ids = {id(o) for o in inner}
        if m is None or any(
            id(u) not in ids for o in inner[1:] for r in o.results for u in g.uses(r)
        ):
            return "int8 codes of the new block (kv-cache-int8{scales=calibrated}) not found"
        if len(g.uses(new)) != 1:
            return "the int8 codes' source is used more than once"
        new = m.values["new"]
        user = next(o for o in inner if any(x is new for x in o.operands))
        st = tt(scale)
        if id(scale) not in g.static or st.dtype != DType.f32:
            return "the int8 cache scale is not a constant f32 tensor"
        pt = tt(past)
        if st.shape == (1,):
            quant = "per_tensor"
        elif st.shape == (1, pt.shape[1], 1, pt.shape[3]):
            quant = "per_channel"
        else:
            return (
                f"int8 cache scale of shape {list(st.shape)} is neither per tensor nor per channel"
            )
        claims += inner
        claims += [
            x.owner
            for o in inner
            for x in o.operands
            if x.owner is not None and x.owner.name == "core.constant" and x is not scale
        ]
    return _Kv(past, new, present, user, claims, quant, scale)


def _heads(
    g: Graph, v: Value, user: Op, n: int, d: int, claims: list[Op]
) -> tuple[Value, bool] | None:
    """v = transpose([B,S,n,D], perm 0,2,1,3): (the 3-D projection, True) or ([B,S,n,D], False)."""
    t = g.producer(v, "core.transpose")
    if t is None or tuple(t.attrs.get("perm") or ()) != (0, 2, 1, 3) or not g.only_use(v, user):
        return None
    x4 = t.operands[0]
    xt = tt(x4)
    if xt.rank != 4 or xt.shape[2:] != (n, d):
        return None
    claims.append(t)
    r = g.producer(x4, "core.reshape")
    if r is not None and g.only_use(x4, t) and tuple(r.attrs.get("shape") or ()) == (0, 0, n, d):
        lin = r.operands[0]
        lt = tt(lin)
        if lt.rank == 3 and lt.shape[2] == n * d and lt.shape[:2] == xt.shape[:2]:
            claims.append(r)
            return lin, True
    return x4, False


ATTENTION_KERNEL = ("auto", "llmir", "onnxruntime")  # the first is the default


def check_attention_kernel(kind: str) -> None:
    if kind not in ATTENTION_KERNEL:
        raise InputError(
            f"unknown attention_kernel '{kind}'",
            hint=f"use one of: {', '.join(ATTENTION_KERNEL)}",
        )


@dataclass(frozen=True)
class LowerOrtAttention:
    name: ClassVar[str] = "lower-ort-attention"
    summary: ClassVar[str] = (
        "decoder attention -> ort.group_query_attention over the KV buffer (packed QKV)"
    )
    quant: str = ""
    quant_block: int = 32
    attention_kernel: str = ATTENTION_KERNEL[0]
    gguf_kernels: str = GGUF_KERNEL  # GGUF tensors ort.matmul_gguf reads pack in one format only
    cpu: str = CPU  # x86-64-v3: llmir's kernel where it applies; x86-64: onnxruntime's op

    def _kernel(self, attrs: dict[str, object], head_dim: int, sdpa: Op) -> str | None:
        """`llmir` when the op runs on llmir's kernel, else None (com.microsoft's op)."""
        if self.attention_kernel == "onnxruntime":
            return None
        full = {"kv_quant": "none", "local_window_size": 0, **attrs}
        why = gqa_llmir_unsupported(full, head_dim)
        if why is not None:
            if self.attention_kernel == "llmir":
                msg = (
                    f"attention_kernel=llmir cannot run %{sdpa.results[0].name}: llmir's "
                    f"attention kernel does not take {why}"
                )
                raise InputError(
                    f"{sdpa.pos}: error: {msg}" if sdpa.pos else msg,
                    diagnostics=[Diagnostic("error", msg, sdpa.pos)],
                    hint="use attention_kernel=auto (onnxruntime's op where llmir's does not "
                    "apply) or attention_kernel=onnxruntime",
                )
            return None
        # auto or llmir: the cpu option decides (run refused llmir on x86-64); the runtime
        # checks that the machine has the kernels when the artifact opens
        return "llmir" if llmir_kernels(self.cpu) else None

    def run(self, module: Module, ctx: PassContext) -> bool:
        if not module.functions or not is_decoder(module):
            return False
        check_attention_kernel(self.attention_kernel)
        if self.attention_kernel == "llmir" and not llmir_kernels(self.cpu):
            raise no_kernels("attention_kernel=llmir", self.cpu)
        fn = module.main
        changed = False
        fmt = parse_quant(self.quant, self.quant_block)
        n_rejected = len(ctx.rejections)
        ev = static_evaluator(module)
        for sdpa in [op for op in fn.ops if op.name == "llm.scaled_dot_product_attention"]:
            g = Graph(fn)
            a = self._match(g, fn, sdpa, ctx)
            if a is None:
                continue
            self._rewrite(g, fn, a, ctx, fmt, ev)
            changed = True
        reasons: dict[str, int] = {}
        for r in ctx.rejections[n_rejected:]:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
        if reasons:  # the manifest reports why layers keep concat attention
            module.attrs["ort.not_fused"] = reasons
            changed = True
        if changed:
            declare_ort(module)
        return changed

    def _reject(self, ctx: PassContext, op: Op, why: str) -> None:
        ctx.rejected(self.name, op.results[0], why)

    def _match(self, g: Graph, fn: Function, op: Op, ctx: PassContext) -> _Attn | None:
        # long: the pattern read in order (mask, caches, rotary, head splits, output merge); each step claims ops or rejects with a reason
        at = op.attrs
        if (
            len(op.operands) != 3
            or not at.get("causal")
            or at.get("softmax_eps", 0.0)
            or at.get("verify_invariant")
        ):
            self._reject(
                ctx, op, "attention with a mask, non-causal, softmax_eps or verify_invariant"
            )
            return None
        q, k_all, v_all = op.operands
        qt, kt = tt(q), tt(k_all)
        if qt.dtype != DType.f32 or not all(
            isinstance(d, int) for d in (qt.shape[1], kt.shape[1], qt.shape[3])
        ):
            self._reject(ctx, op, "attention not f32 or with symbolic heads")
            return None
        heads, kv_heads, d = int(qt.shape[1]), int(kt.shape[1]), int(qt.shape[3])  # type: ignore[arg-type]
        claims: list[Op] = [op]
        pasts = {id(a) for a in cache_args(fn)}
        parts: list[_Kv] = []
        for val in (k_all, v_all):
            kv = _cache_entry(g, fn, op, val, pasts)
            if isinstance(kv, str):
                self._reject(ctx, op, kv)
                return None
            parts.append(kv)
        pk_, pv_ = parts
        if pk_.quant != pv_.quant:
            self._reject(ctx, op, "the K and V caches are quantized differently")
            return None
        claims += pk_.claims + pv_.claims
        past_k, k_new, past_v, v_new = pk_.past, pk_.new, pv_.past, pv_.new
        k_user, v_user = pk_.user, pv_.user
        rope_q = g.producer(q, "llm.rotary_embedding")
        rope_k = g.producer(k_new, "llm.rotary_embedding")
        if (rope_q is None) != (rope_k is None):
            self._reject(ctx, op, "rotary on only one of q and k")
            return None
        if rope_q is not None and rope_k is not None:
            same = rope_q.attrs == rope_k.attrs and all(
                x is y for x, y in zip(rope_q.operands[1:], rope_k.operands[1:])
            )
            if (
                not same
                or id(rope_q.operands[1]) not in g.static
                or not g.only_use(q, op)
                or not all(u is k_user for u in g.uses(k_new))
            ):
                self._reject(ctx, op, "rotary tables of q and k differ or are not constant")
                return None
            claims += [rope_q, rope_k]
            q_src, k_src, q_user, k_user = rope_q.operands[0], rope_k.operands[0], rope_q, rope_k
        else:
            q_src, k_src, q_user = q, k_new, op
        qh = _heads(g, q_src, q_user, heads, d, claims)
        kh = _heads(g, k_src, k_user, kv_heads, d, claims)
        vh = _heads(g, v_new, v_user, kv_heads, d, claims)
        if qh is None or kh is None or vh is None:
            self._reject(ctx, op, "q/k/v head split (reshape + transpose 0,2,1,3) not found")
            return None
        out, out_3d = op.results[0], False
        users = g.uses(out)
        if (
            len(users) == 1
            and users[0].name == "core.transpose"
            and id(out) not in g.outputs
            and tuple(users[0].attrs.get("perm") or ()) == (0, 2, 1, 3)
        ):
            t = users[0]
            tu = g.uses(t.results[0])
            if (
                len(tu) == 1
                and tu[0].name == "core.reshape"
                and id(t.results[0]) not in g.outputs
                and tuple(tu[0].attrs.get("shape") or ()) == (0, 0, heads * d)
            ):
                claims += [t, tu[0]]
                out, out_3d = tu[0].results[0], True
        lin = qh[1] and kh[1] and vh[1]
        return _Attn(
            op,
            claims,
            qh[0],
            kh[0],
            vh[0],
            lin,
            out,
            out_3d,
            past_k,
            past_v,
            pk_.present,
            pv_.present,
            heads,
            kv_heads,
            d,
            rope_q,
            pk_.quant,
            pk_.scale,
            pv_.scale,
        )

    def _projection(
        self, g: Graph, lin: Value
    ) -> tuple[Op, Value, Value, Value | None, list[Op]] | None:
        """lin = x @ W^T (+ bias) by a static weight: (matmul-like op, x, W, bias, ops replaced)."""
        if len(g.uses(lin)) != 1 or id(lin) in g.outputs or lin.owner is None:
            return None
        op = lin.owner
        bias = None
        claims = [op]
        if op.name == "core.add":
            mmv, bias = op.operands
            if id(mmv) in g.static:
                mmv, bias = bias, mmv
            if (
                id(bias) not in g.static
                or tt(bias).rank != 1
                or len(g.uses(mmv)) != 1
                or id(mmv) in g.outputs
                or mmv.owner is None
            ):
                return None
            op = mmv.owner
            claims.append(op)
        if (
            op.name == "core.matmul"
            and not op.attrs.get("transpose_a")
            and op.attrs.get("transpose_b")
        ):
            return op, op.operands[0], op.operands[1], bias, claims
        if (
            op.name == "llm.linear"
            and op.attrs.get("activation", "none") == "none"
            and op.attrs.get("transpose_b", True)
            and bias is None
        ):
            lb = op.operands[2] if len(op.operands) > 2 else None
            if lb is not None and id(lb) not in g.static:
                return None
            return op, op.operands[0], op.operands[1], lb, claims
        if (
            op.name == "llm.quantized_matmul"
            and op.attrs.get("transpose_b", True)
            and packed_src(g, op.operands[1], list(op.operands[2:])) is not None
        ):
            return (
                op,
                op.operands[0],
                op.operands[1],
                bias,
                claims,
            )  # W packed: dequantized when merged
        return None

    def _split_plus_bias(
        self, g: Graph, a: _Attn
    ) -> tuple[list[Op], list[Value], Value, list[Op]] | None:
        """q, k, v = split(p) + static biases (merge-qkv's output with biased projections):
        ([], biases, p, the adds and the split) -- packed as p + concat(biases)."""
        adds, biases, parts = [], [], []
        for lin in (a.q, a.k, a.v):
            op = lin.owner
            if op is None or op.name != "core.add" or len(g.uses(lin)) != 1 or id(lin) in g.outputs:
                return None
            x, bias = op.operands
            if id(x) in g.static:
                x, bias = bias, x
            if (
                id(bias) not in g.static
                or tt(bias).rank != 1
                or len(g.uses(x)) != 1
                or x.owner is None
            ):
                return None
            adds.append(op)
            biases.append(bias)
            parts.append(x)
        sp = parts[0].owner
        if (
            sp is None
            or sp.name != "core.split"
            or sp.attrs.get("axis") not in (-1, 2)
            or list(sp.results) != parts
        ):
            return None
        return [], biases, sp.operands[0], [*adds, sp]

    def _packable(
        self, g: Graph, a: _Attn, fmt: object, ev: Evaluate
    ) -> tuple[list[Op], list[Value], Value, list[Op]] | Value | None:
        """How q, k and v pack: the input of a split they already are (a Value), or (weights,
        biases, activation, ops replaced) when they are projections of one activation by weights
        of one storage format; None when they do not pack."""
        if not a.lin:
            return None
        sp = a.q.owner
        if (
            sp is not None
            and sp.name == "core.split"
            and sp.attrs.get("axis") in (-1, 2)
            and [a.q, a.k, a.v] == list(sp.results)
            and len(g.uses(a.q)) == 1
        ):
            return sp.operands[0]
        split_bias = self._split_plus_bias(g, a)
        if split_bias is not None:
            return split_bias
        projs = [self._projection(g, lin) for lin in (a.q, a.k, a.v)]
        if any(p is None for p in projs):
            return None
        x = projs[0][1]  # type: ignore[index]
        if any(p[1] is not x for p in projs):  # type: ignore[index]
            return None
        biases = [p[3] for p in projs if p[3] is not None]  # type: ignore[index]
        if biases and len(biases) != 3:
            return None
        ps = [p for p in projs if p is not None]
        ws = [p[2] for p in ps]
        srcs = [
            packed_src(g, p[0].operands[1], list(p[0].operands[2:]))
            if p[0].name == "llm.quantized_matmul"
            else weight_src(g, w)
            for p, w in zip(ps, ws)
        ]
        if any(s is None for s in srcs):
            return None
        fmts = {nbits_format(s, fmt, ev) for s in srcs if s is not None}  # type: ignore[arg-type]
        if len(fmts) != 1:
            return None
        exact = [gguf_exact_format(s, fmt, self.gguf_kernels) for s in srcs if s is not None]  # type: ignore[arg-type]
        if any(exact) and len(set(exact)) != 1:  # ort.matmul_gguf reads one format
            return None
        return [p[0] for p in projs], biases, x, [o for p in projs for o in p[4]]  # type: ignore[index,misc]

    def _rewrite(
        self, g: Graph, fn: Function, a: _Attn, ctx: PassContext, fmt: object, ev: Evaluate
    ) -> None:
        # long: one replacement in order (packed projection, attributes, the op, take-over); another helper is reworking this pass
        b, new_ops = scratch_builder(fn, a.sdpa.origin)
        pack = self._packable(g, a, fmt, ev)
        bias: Value | None = None  # the packed projection's bias (concatenated), if it has one
        if isinstance(pack, Value):  # already one projection, split: feed it whole
            ins = [pack]
            a.claims.append(a.q.owner)  # type: ignore[arg-type]
        elif pack is not None:
            mms, biases, x, replaced = pack
            ws = [
                b.op("llm.dequantize", *m.operands[1:], dtype=DType.f32)
                if m.name == "llm.quantized_matmul"
                else m.operands[1]
                for m in mms
            ]
            sizes = tuple(tt(w).shape[0] for w in ws)
            if mms:  # located where merge-qkv puts its merged projection: the q projection's origin
                o = mms[0].origin
                cat = b.create("core.concat", ws, {"axis": 0}, origin=o).result
                qkv = b.create("core.matmul", [x, cat], {"transpose_b": True}, origin=o).result
            else:  # already one projection, split and biased
                qkv = x
            if biases:  # validated differentially (no rule states the biased merge)
                bias = b.op("core.concat", *biases, axis=0)
            elif mms and all(o.name == "core.matmul" for o in replaced):
                for key, lin in zip("qkv", (a.q, a.k, a.v)):
                    ctx.instances.append(
                        RuleInstance(
                            f"merge-qkv-{key}",
                            lin.name,
                            lin.name,
                            {"x": x.name, "wq": ws[0].name, "wk": ws[1].name, "wv": ws[2].name},
                            {},
                            {"sizes": sizes},
                            value_loc(lin),
                        )
                    )
            ins = [qkv]
            a.claims += replaced
        else:
            ins = [a.q, a.k, a.v]
        ins += [a.past_k, a.past_v, a.rope.operands[3] if a.rope is not None else fn.args[1]]
        attrs: dict[str, object] = {"num_heads": a.heads, "kv_num_heads": a.kv_heads}
        at = a.sdpa.attrs
        if at.get("scale"):
            attrs["scale"] = float(at["scale"])
        if at.get("softcap"):
            attrs["softcap"] = float(at["softcap"])
        if at.get("sliding_window"):
            attrs["local_window_size"] = int(at["sliding_window"])
        if a.rope is not None:
            ins += [a.rope.operands[1], a.rope.operands[2]]
            attrs["do_rotary"] = True
            if a.rope.attrs.get("interleaved"):
                attrs["rotary_interleaved"] = True
            if a.rope.attrs.get("rotary_dim"):
                attrs["rotary_dim"] = int(a.rope.attrs["rotary_dim"])
        if pack is not None:
            attrs["packed"] = True
        if a.kv_quant != "none":
            assert a.k_scale is not None and a.v_scale is not None
            ins += [a.k_scale, a.v_scale]
            attrs["kv_quant"] = a.kv_quant
        kernel = self._kernel(attrs, a.head_dim, a.sdpa)
        if kernel:
            attrs["kernel"] = kernel
        if bias is not None and kernel == "llmir":  # llmir's kernel adds it as it reads qkv
            ins.append(bias)
            attrs["qkv_bias"] = True
        elif bias is not None:
            ins[0] = b.op("core.add", ins[0], bias)
        gqa = b.create("ort.group_query_attention", ins, attrs)
        out = gqa.results[0]
        if not a.out_is_3d:
            r = b.op("core.reshape", out, shape=(0, 0, a.heads, a.head_dim))
            out = b.op("core.transpose", r, perm=(0, 2, 1, 3))
        at_i = next(i for i, o in enumerate(fn.ops) if o is a.sdpa)
        fn.ops[at_i:at_i] = new_ops
        layer = a.present_k.name
        for old, new in (
            (a.out, out),
            (a.present_k, gqa.results[1]),
            (a.present_v, gqa.results[2]),
        ):
            take_over(fn, old, new)
        erase_dead(fn, a.claims)
        detail = (
            ("packed QKV, " if pack is not None else "")
            + ("rotary in the op" if a.rope is not None else "no rotary")
            + (f", int8 KV cache ({a.kv_quant} scales)" if a.kv_quant != "none" else "")
            + (", the QKV bias in the op" if attrs.get("qkv_bias") else "")
            + ("; llmir's kernel" if kernel else "")
        )
        ctx.applied("group-query-attention", gqa.results[0], f"{layer}: {detail}")
