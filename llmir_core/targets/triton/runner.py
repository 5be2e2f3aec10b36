"""Running a triton artifact: `TritonDecoder` implements the Decoder protocol
(llmir_core.runtime.generate: reset, forward, length, max_context; plus reserve).

torch tensors hold the device memory: the build-time values (weights in the kernels' layouts,
rotary tables) are uploaded once; each cache entry is one preallocated buffer
[batch, kv_heads, capacity, head_dim] (int8 + f32 scales [batch, kv_heads, capacity] when built
with --kv-cache int8) that triton.kv_append writes in place. Each step walks the lowered
function's per-step ops: triton.* ops launch their kernels with the op's launch parameters,
glue ops (views, elementwise) run as torch ops. On CUDA the one-token decode step is captured in
a CUDA graph once per batch size and cache capacity, and replayed (inputs copied into static
buffers); on the CPU (TRITON_INTERPRET=1, tests) it runs eagerly.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmir_core.errors import InputError
from llmir_core.runtime.kv_slots import KVSlots, UsesKVSlots, context_limit

NO_GPU = "this artifact needs a CUDA GPU (none found)"


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def pick_device(device: str | None = None) -> str:
    """ "cuda" when a CUDA device is visible, "cpu" under TRITON_INTERPRET=1; otherwise exit 2."""
    try:
        import torch
    except ImportError:
        raise InputError(
            "the triton target needs torch and triton", hint="pip install 'llmir[gpu]'"
        ) from None
    if device not in (None, "cuda", "cpu"):
        raise InputError(f"device must be cuda or cpu, got {device!r}")
    if device != "cpu" and torch.cuda.is_available():
        return "cuda"
    if _interpreting():
        return "cpu"
    raise InputError(
        NO_GPU, hint="run it on a machine with an NVIDIA GPU, or build with --target onnxruntime"
    )


@dataclass
class KVView:
    """A cache entry after kv_append: its buffer, scales (int8) and the rows now valid."""

    buf: Any
    scales: Any
    length: int

    def dense(self) -> Any:
        rows = self.buf[:, :, : self.length]
        if self.scales is None:
            return rows
        return rows.float() * self.scales[:, :, : self.length, None]


class TritonDecoder(UsesKVSlots):
    def __init__(
        self,
        art_dir: str,
        manifest: dict[str, Any],
        device: str | None = None,
        max_context: int | None = None,
        graphs: bool = True,
    ) -> None:
        from llmir_core.artifact_check import decoder_section

        dec = decoder_section(art_dir, manifest)
        self.device = pick_device(device)
        import torch

        from llmir_core.ir.parser import parse_module
        from llmir_core.targets.triton.kernels import (
            decode_attention,
            embedding,
            kv_cache,
            matmul,
            norm,
            prefill_attention,
            quant_matmul,
            rotary,
        )
        from llmir_core.targets.triton.plan import split_static

        self.torch = torch
        if self.device == "cuda":
            major, minor = torch.cuda.get_device_capability()
            arch = f"sm_{major}{minor}"
            built = manifest.get("archs") or []
            if arch not in built:
                print(
                    f"note: {art_dir} has no kernels compiled ahead of time for {arch} (it has "
                    f"{', '.join(built) or 'none'}); compiling them at load (cached by Triton)",
                    file=sys.stderr,
                )
        self.k = {
            "embedding": embedding,
            "norm": norm,
            "rotary": rotary,
            "matmul": matmul,
            "quant": quant_matmul,
            "kv": kv_cache,
            "decode": decode_attention,
            "prefill": prefill_attention,
        }
        self.art_dir = art_dir
        self.manifest = manifest
        self.decoder = dec
        with open(
            os.path.join(art_dir, manifest.get("model", "model.llmir")), encoding="utf-8"
        ) as fh:
            self.module = parse_module(fh.read(), os.path.join(art_dir, "model.llmir"))
        self.fn = self.module.main
        _, self.step_ops = split_static(self.fn)
        self.max_context = context_limit(dec.get("max_len"), max_context)
        self.values = self._load_weights()
        self.cache_args = [a for a in self.fn.args[2:]]
        self.kv_i8 = {
            op.operands[0].name
            for op in self.step_ops
            if op.name == "triton.kv_append" and op.attrs.get("cache_dtype") == "i8"
        }
        self.buffers: dict[str, tuple[Any, Any]] = {}  # cache input -> (rows, int8 scales)
        self.kv = KVSlots(self.max_context, self._make_buffers, self._bind_buffers)
        # graphs replay a step whose one-token attention reads positions on the device: only the
        # causal decode kernel does (a non-causal one-token attention would bake kv_len in)
        causal = all(
            op.attrs.get("causal") for op in self.step_ops if op.name == "triton.attention"
        )
        self.graphs = graphs and self.device == "cuda" and causal
        self.threads = 0  # CPU intra-op threads: not used (the bench fingerprint reads it)
        self._graph: dict[int, Any] = {}

    @property
    def vocab(self) -> int:
        return int(self.decoder["vocab"])

    def _load_weights(self) -> dict[str, Any]:
        torch = self.torch
        path = os.path.join(self.art_dir, self.manifest.get("weights", "weights.bin"))
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        out: dict[str, Any] = {}

        def get(e: dict[str, Any]) -> Any:
            a = (
                np.frombuffer(
                    raw,
                    dtype=np.dtype(e["dtype"]),
                    count=int(np.prod(e["shape"], dtype=np.int64)),
                    offset=e["offset"],
                )
                .reshape(e["shape"])
                .copy()
            )
            return torch.from_numpy(a).to(self.device)

        for name, e in self.manifest["weight_index"].items():
            if "quant" in e:
                out[name] = {
                    "quant": e["quant"],
                    "codes": get(e["codes"]),
                    "scales": get(e["scales"]) if "scales" in e else None,
                }
            else:
                out[name] = get(e)
        return out

    # -- the Decoder protocol -----------------------------------------------------------------------

    def reset(self, batch: int = 1) -> None:
        self.kv.reset(batch)

    def _make_buffers(self, batch: int, capacity: int) -> list[Any]:
        """One (rows, scales) pair per cache input: int8 rows + f32 scales for an int8 cache."""
        torch = self.torch
        from llmir_core.targets.triton.kernels.common import NAME_TO_TORCH

        out: list[Any] = []
        for a in self.cache_args:
            shape = a.type.shape  # type: ignore[union-attr]
            rows = (batch, shape[1], capacity, shape[3])
            if a.name in self.kv_i8:
                out.append(
                    (
                        torch.zeros(rows, dtype=torch.int8, device=self.device),
                        torch.ones(rows[:3], dtype=torch.float32, device=self.device),
                    )
                )
            else:
                dt = NAME_TO_TORCH.get(str(a.type.dtype), torch.float32)  # type: ignore[union-attr]
                out.append((torch.zeros(rows, dtype=dt, device=self.device), None))
        return out

    def _bind_buffers(self, buffers: list[Any]) -> None:
        self.buffers = {a.name: b for a, b in zip(self.cache_args, buffers)}
        self._graph = {}  # captured graphs read the old buffers

    def forward(self, ids: np.ndarray) -> np.ndarray:
        """Run ids [batch, seq] after what is cached; return logits [batch, seq, vocab] (f32)."""
        torch = self.torch
        ids = self.kv.check(ids)
        batch, seq = ids.shape
        if not self.batch:
            self.reset(batch)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            raise InputError(
                f"token id out of range [0, {self.vocab}): min {int(ids.min())}, max {int(ids.max())}"
            )
        self.kv.grow(self.length + seq)
        pos = np.ascontiguousarray(
            np.broadcast_to(np.arange(self.length, self.length + seq, dtype=np.int64), (batch, seq))
        )
        if seq == 1 and self.graphs:
            logits = self._graph_step(ids, pos)
        else:
            logits = self._run(
                torch.tensor(ids, device=self.device),
                torch.tensor(pos, device=self.device),
                self.length + seq,
            )
        self.kv.advance(seq)
        return logits.float().cpu().numpy()

    def _graph_step(self, ids: np.ndarray, pos: np.ndarray) -> Any:
        torch = self.torch
        g = self._graph.get(ids.shape[0])
        if g is None:
            sid = torch.tensor(ids, device=self.device)
            spos = torch.tensor(pos, device=self.device)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up (compiles the kernels) outside the capture
                self._run(sid, spos, 0)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._run(sid, spos, 0)
            g = self._graph[ids.shape[0]] = (graph, sid, spos, out)
        graph, sid, spos, out = g
        sid.copy_(torch.tensor(ids))
        spos.copy_(torch.tensor(pos))
        graph.replay()
        return out

    # -- one step -----------------------------------------------------------------------------------

    def _run(self, ids: Any, pos: Any, kv_len: int) -> Any:
        """The per-step ops; kv_len (rows valid after this step) matters only for multi-token
        steps (a one-token step reads positions on the device, so a graph replays it)."""
        env: dict[str, Any] = dict(self.values)
        env["input_ids"], env["positions"] = ids, pos
        for a in self.cache_args:
            env[a.name] = self.buffers[a.name]
        for op in self.step_ops:
            outs = self._op(op, [env[v.name] for v in op.operands], pos, kv_len)
            for r, o in zip(op.results, outs):
                env[r.name] = o
        out = env[self.fn.outputs[0].name]
        return out.dense() if isinstance(out, KVView) else out

    def _op(self, op: Any, a: list[Any], pos: Any, kv_len: int) -> list[Any]:
        k = self.k
        at = op.attrs
        n = op.name
        if n == "triton.kv_append":
            buf, sc = a[0]
            k["kv"].kv_append(a[1], pos, buf, sc, num_warps=at.get("num_warps", 1))
            return [KVView(buf, sc, kv_len)]
        a = [x.dense() if isinstance(x, KVView) and n != "triton.attention" else x for x in a]
        w = at.get("num_warps", 4)
        if n == "triton.embedding":
            return [k["embedding"].embedding(a[0], a[1], block=at.get("block_h"), num_warps=w)]
        if n == "triton.rms_norm":
            return [
                k["norm"].rms_norm(
                    a[0], a[1], eps=at.get("eps", 1e-6), offset=at.get("offset", 0.0), num_warps=w
                )[0]
            ]
        if n == "triton.add_rms_norm":
            y, s = k["norm"].rms_norm(
                a[0], a[2], a[1], eps=at.get("eps", 1e-6), offset=at.get("offset", 0.0), num_warps=w
            )
            return [y, s]
        if n == "triton.rotary":
            return [
                k["rotary"].rotary(
                    a[0],
                    a[1],
                    a[2],
                    a[3],
                    interleaved=at.get("interleaved", False),
                    rotary_dim=at.get("rotary_dim", 0),
                    num_warps=at.get("num_warps", 1),
                )
            ]
        if n in ("triton.matmul", "triton.gated_matmul", "triton.q_matmul"):
            return [self._matmul(op, a, w)]
        if n == "triton.attention":
            return [self._attention(op, a, pos, kv_len)]
        if n == "core.split":  # -O2's merged q/k/v projection: one matmul, then views of it
            return self._split(op, a[0])
        return [self._glue(n, at, a)]

    def _matmul(self, op: Any, a: list[Any], w: int) -> Any:
        """triton.matmul (optional bias), triton.gated_matmul, triton.q_matmul (packed codes)."""
        k, at, n = self.k, op.attrs, op.name
        blocks = {
            b: at[b]
            for b in ("block_m", "block_n", "block_k", "gemv_block_n", "gemv_block_k")
            if b in at
        }
        if n == "triton.gated_matmul":
            return k["matmul"].matmul(
                a[0],
                a[1],
                w_up=a[2],
                activation=at.get("activation", "silu"),
                num_warps=w,
                **blocks,
            )
        if n == "triton.q_matmul":
            q = a[1]
            qt = op.operands[1].type.dtype
            gguf = q["quant"] in ("q8_0", "q4_0")
            return k["quant"].q_matmul(
                a[0],
                q["codes"],
                q["scales"] if gguf else a[2],
                bits=qt.bits,
                qblock=32 if gguf else qt.block,
                gguf_order=gguf,
                num_warps=w,
                **blocks,
            )
        return k["matmul"].matmul(
            a[0],
            a[1],
            a[2] if len(a) > 2 else None,
            activation=at.get("activation", "none"),
            num_warps=w,
            **blocks,
        )

    def _split(self, op: Any, x: Any) -> list[Any]:
        """core.split as views: `sizes`, or num_outputs parts of ceil(dim / num_outputs)."""
        at = op.attrs
        axis = at.get("axis", 0)
        sizes = list(at.get("sizes") or ())
        if not sizes:  # the last part is the smaller one
            parts = at.get("num_outputs") or len(op.results)
            sizes = -(-x.shape[axis] // parts)  # type: ignore[assignment]
        return list(self.torch.split(x, sizes, dim=axis))

    def _attention(self, op: Any, a: list[Any], pos: Any, kv_len: int) -> Any:
        q, kk, vv = a
        at = op.attrs
        common = {
            "scale": at.get("scale", 0.0),
            "softcap": at.get("softcap", 0.0),
            "window": at.get("sliding_window", 0),
            "num_warps": at.get("num_warps", 4),
        }
        if isinstance(kk, KVView) and isinstance(vv, KVView):
            if q.shape[2] == 1 and at.get("causal", False):
                return self.k["decode"].decode_attention(
                    q,
                    kk.buf,
                    vv.buf,
                    pos[:, :1],
                    k_scales=kk.scales,
                    v_scales=vv.scales,
                    split_k=at.get("split_k", 0),
                    block_n=at.get("decode_block_n", 0),
                    **common,
                )
            return self.k["prefill"].prefill_attention(
                q,
                kk.buf,
                vv.buf,
                kk.length,
                k_scales=kk.scales,
                v_scales=vv.scales,
                causal=at.get("causal", False),
                block_m=at.get("block_m", 32),
                block_n=at.get("block_n", 32),
                **common,
            )
        kk = kk.dense() if isinstance(kk, KVView) else kk
        vv = vv.dense() if isinstance(vv, KVView) else vv
        return self.k["prefill"].prefill_attention(
            q,
            kk,
            vv,
            causal=at.get("causal", False),
            block_m=at.get("block_m", 32),
            block_n=at.get("block_n", 32),
            **common,
        )

    def _glue(self, n: str, at: dict[str, Any], a: list[Any]) -> Any:
        torch = self.torch
        F = torch.nn.functional
        x = a[0]
        if n == "core.reshape":
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(at["shape"])]
            return x.reshape(shape)
        if n == "core.transpose":
            return x.permute(*at["perm"])
        if n in ("core.add", "core.sub", "core.mul", "core.div"):
            f = {
                "core.add": torch.add,
                "core.sub": torch.sub,
                "core.mul": torch.mul,
                "core.div": torch.div,
            }[n]
            return f(x, a[1])
        if n == "core.cast":
            from llmir_core.targets.triton.kernels.common import NAME_TO_TORCH

            to = str(at["to"])
            if to not in NAME_TO_TORCH:
                raise InputError(f"core.cast to {to} has no triton glue")
            return x.to(NAME_TO_TORCH[to])
        if n == "core.silu":
            return F.silu(x)
        if n == "core.gelu":
            return F.gelu(x, approximate="tanh" if at.get("approximate") == "tanh" else "none")
        if n == "core.tanh":
            return torch.tanh(x)
        if n == "core.neg":
            return -x
        if n == "core.exp":
            return torch.exp(x)
        if n == "llm.silu_mul":
            return F.silu(x) * a[1]
        if n == "core.concat":
            return torch.cat(a, dim=at["axis"])
        if n == "core.unsqueeze":
            for ax in sorted(at["axes"]):
                x = x.unsqueeze(ax)
            return x
        if n == "core.squeeze":
            axes = at.get("axes") or [i for i, d in enumerate(x.shape) if d == 1]
            for ax in sorted((ax % x.dim() for ax in axes), reverse=True):
                x = x.squeeze(ax)
            return x
        if n == "core.slice":
            axes = at.get("axes") or list(range(len(at["starts"])))
            steps = at.get("steps") or [1] * len(axes)
            idx: list[Any] = [slice(None)] * x.dim()
            for ax, s, e, st in zip(axes, at["starts"], at["ends"], steps):
                if st < 0:
                    raise InputError("core.slice with a negative step has no triton glue")
                idx[ax] = slice(s, e, st)
            return x[tuple(idx)]
        raise InputError(f"op '{n}' has no triton kernel or glue")


def open_decoder(
    art_dir: str,
    device: str | None = None,
    max_context: int | None = None,
    graphs: bool = True,
    **_: Any,
) -> TritonDecoder:
    """The decoder in a triton artifact folder, ready for `reset` and `forward`."""
    path = os.path.join(art_dir, "manifest.json")
    if not os.path.isfile(path):
        raise InputError(f"{art_dir}: no manifest.json (not an artifact built by `llmir build`)")
    with open(path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    if manifest.get("target") != "triton":
        raise InputError(f"{art_dir}: built for target {manifest.get('target')!r}, not triton")
    return TritonDecoder(art_dir, manifest, device=device, max_context=max_context, graphs=graphs)


__all__ = ["TritonDecoder", "open_decoder", "pick_device", "NO_GPU"]
