"""Shared test helpers: the reference semantics of llmir ops, tolerances per dtype."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.conftest import import_or_skip

torch = import_or_skip("torch", "the triton kernels need torch (pip install 'llmir[gpu]')")
import_or_skip("triton", "the triton kernels need triton (pip install 'llmir[gpu]')")

from llmir_core.dialects.registry import get_op  # noqa: E402

TOL = {"f32": 2e-5, "f16": 2e-3, "bf16": 2e-2}
TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def ref(op: str, args: list[Any], **attrs: Any) -> Any:
    """The numpy reference of an llmir op (attributes defaulted as the declaration says)."""
    d = get_op(op)
    assert d is not None and d.reference is not None
    return d.reference(args, d.with_defaults(attrs))


def np32(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert not np.isnan(got).any(), "NaN in the kernel's output"
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def max_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: the worst element (a Frobenius norm would spread one bad
    element or row over the whole tensor)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert not np.isnan(got).any(), "NaN in the kernel's output"
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))


def assert_elementwise(got: Any, want: Any, rtol: float, atol: Any = 0.0) -> None:
    """|got - want| <= atol + rtol |want| for every element (atol a number or an array)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert not np.isnan(got).any(), "NaN in the kernel's output"
    excess = np.abs(got - want) - (atol + rtol * np.abs(want))
    i = np.unravel_index(int(np.argmax(excess)), excess.shape)
    assert excess[i] <= 0, f"element {i}: got {got[i]!r}, want {want[i]!r}"


def rand(shape: tuple[int, ...], dtype: str = "f32", seed: int = 0, scale: float = 1.0) -> Any:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(TORCH[dtype])
