"""Shared pieces of the decoder-build tests: the reference decoder, parity runs, quantized weights."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from llmir_core.interp import Interpreter
from llmir_core.ir.core import Module, Op, Value
from llmir_core.ir.types import GGUF_QUANTS, DType, TensorType
from llmir_core.quant import gguf_blocks
from llmir_core.runtime.decoder import FunctionDecoder, cache_specs
from llmir_core.weights import load_weight


def ref_decoder(module: Module) -> FunctionDecoder:
    interp = Interpreter(module)
    return FunctionDecoder(lambda feeds: interp.run(feeds), cache_specs(module.main))


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a - ref| / max |ref| (the acceptance measure: fp32 <= 1e-4)."""
    return float(np.abs(a - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def parity(module: Module, dec: object, prompt: np.ndarray, steps: int = 16) -> float:
    """Worst relative logits difference over a prefill and `steps` greedy decode steps (the
    positions the decoder returns: all, or the last for a last-position-logits artifact)."""
    ref = ref_decoder(module)
    ref.reset(prompt.shape[0])
    dec.reset(prompt.shape[0])  # type: ignore[attr-defined]
    a, b = ref.forward(prompt), dec.forward(prompt)  # type: ignore[attr-defined]
    worst = rel(b, a[:, a.shape[1] - b.shape[1] :])
    for _ in range(steps):
        tok = a[:, -1].argmax(-1)[:, None]
        a, b = ref.forward(tok), dec.forward(tok)  # type: ignore[attr-defined]
        worst = max(worst, rel(b, a))
    return worst


def greedy(dec: object, prompt: list[int], n: int) -> list[int]:
    dec.reset(1)  # type: ignore[attr-defined]
    logits = dec.forward(np.asarray([prompt]))  # type: ignore[attr-defined]
    out = []
    for _ in range(n):
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        logits = dec.forward(np.asarray([[tok]]))  # type: ignore[attr-defined]
    return out


def random_blocks(scheme: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Valid random GGUF blocks (random bits, sane f16 scales) for formats llmir cannot quantize to."""
    elems, nbytes = gguf_blocks.BLOCKS[scheme]
    n = int(np.prod(shape)) // elems
    raw = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    d = lambda k: (rng.uniform(0.5, 1.5, (n, 1)) * k).astype(np.float16).view(np.uint8)  # noqa: E731
    if scheme == "q6_k":
        raw[:, 208:210] = d(2e-4)
        raw[:, 192:208] = rng.integers(-64, 64, (n, 16)).astype(np.int8).view(np.uint8)
    elif scheme == "q3_k":
        raw[:, 108:110] = d(2e-3)
    elif scheme in ("q4_k", "q5_k"):
        raw[:, 0:2], raw[:, 2:4] = d(1e-3), d(1e-3)
    elif scheme == "q2_k":
        raw[:, 80:82], raw[:, 82:84] = d(2e-3), d(2e-3)
    elif scheme in ("iq4_nl", "iq4_xs"):  # d * table value (up to 127; iq4_xs times up to 32)
        raw[:, 0:2] = d(2e-3 if scheme == "iq4_nl" else 1e-4)
    else:  # the 32-element formats start with d (and m for the _1 variants)
        raw[:, 0:2] = d(1e-2)
        if scheme in ("q4_1", "q5_1"):
            raw[:, 2:4] = d(1e-2)
    return raw.reshape(-1)


def quantize_weights(
    module: Module, blob: Path, pick: Callable[[str], str | None], seed: int = 0
) -> Module:
    """Replace the 2-D f32 weights `pick(name)` names a GGUF scheme for by that scheme's blocks
    (gguf-exact quantization where llmir has it, random blocks otherwise) + llm.dequantize."""
    fn = module.main
    base = str(Path(module.source).parent) if module.source else str(Path.cwd())
    rng = np.random.default_rng(seed)
    new_ops: list[Op] = []
    swap: dict[int, Value] = {}
    with open(blob, "wb") as fh:
        for op in fn.ops:
            op.operands = [swap.get(id(v), v) for v in op.operands]
            t = op.results[0].type if op.results else None
            scheme = pick(op.attrs["name"]) if op.name == "core.weight" else None
            if not scheme or not isinstance(t, TensorType) or t.dtype != DType.f32 or t.rank != 2:
                new_ops.append(op)
                continue
            shape = t.static_shape()
            assert shape is not None
            if scheme in gguf_blocks.QUANTIZABLE:
                data = gguf_blocks.quantize(load_weight(op.attrs, t, base), scheme)
            else:
                data = random_blocks(scheme, shape, rng)
            off = fh.tell()
            fh.write(data.tobytes())
            q = Op(
                "core.weight",
                [],
                [TensorType(shape, GGUF_QUANTS[scheme])],
                {
                    "file": str(blob),
                    "name": op.attrs["name"],
                    "offset": off,
                    "nbytes": int(data.size),
                },
                [op.results[0].name + "_q"],
                op.origin,
            )
            dq = Op(
                "llm.dequantize",
                [q.results[0]],
                [t],
                {"dtype": DType.f32},
                [op.results[0].name],
                op.origin,
            )
            swap[id(op.results[0])] = dq.results[0]
            new_ops += [q, dq]
    fn.ops = new_ops
    fn.outputs = [swap.get(id(v), v) for v in fn.outputs]
    return module


def same_decoding(a: object, b: object, tol: float = 1e-4) -> None:
    """Two decoders of one model agree: an 8-token prompt and 3 decode steps within `tol`
    relative logits, and 16 equal greedy tokens."""
    prompt = np.array([[1, 5, 9, 2, 7, 3, 11, 4]])
    a.reset(1)  # type: ignore[attr-defined]
    b.reset(1)  # type: ignore[attr-defined]
    assert rel(a.forward(prompt), b.forward(prompt)) <= tol  # type: ignore[attr-defined]
    for tok in (3, 17, 42):
        step = np.array([[tok]])
        assert rel(a.forward(step), b.forward(step)) <= tol  # type: ignore[attr-defined]
    assert greedy(a, [1, 5, 9], 16) == greedy(b, [1, 5, 9], 16)


def llmir_session(graph: Any, threads: int) -> Any:
    """An onnxruntime session of `graph` (nodes of ai.llmir and the default domain) with llmir's
    custom-op library registered."""
    import onnxruntime as ort
    from onnx import helper

    from llmir_core.targets.onnxruntime.native import DOMAIN, register

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    register(so, ["llmir_ops"])
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def edge_rows(x: np.ndarray) -> np.ndarray:
    """x [M, K] with, for M >= 5, row 1 all zero, row 2 tiny (1e-20) and row 3 huge (1e16): a
    per-row error must show at every row's own size."""
    if x.shape[0] >= 5:
        x[1] = 0.0
        x[2] *= 1e-20
        x[3] *= 1e16
    return x


def assert_dot_close(got: np.ndarray, want: np.ndarray, scale: np.ndarray, rtol: float) -> None:
    """|got - want| <= rtol * scale for every element, scale = |x| @ |w|^T (the size of a dot
    product's rounding error): a zero row must be exactly zero, a tiny row is held to its own
    size, and one wrong element cannot hide behind a global maximum."""
    assert not np.isnan(got).any(), "NaN in the kernel's output"
    excess = np.abs(got.astype(np.float64) - want) - rtol * scale
    i = np.unravel_index(int(np.argmax(excess)), excess.shape)
    assert excess[i] <= 0, f"element {i}: got {got[i]!r}, want {want[i]!r}, scale {scale[i]:.3g}"
