"""Typed attribute values.

Attributes are plain Python values where that is unambiguous: `int`, `float`, `bool`, `str`,
`tuple` (arrays), `dict` (dictionaries, insertion-ordered), plus `DType`, dims (`SymDim`/`DYN`
for symbolic expressions), types (`TensorType`) and `DenseAttr` for small inline constants.
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np

from .dims import SymDim, _Dyn
from .types import DType, KVCacheType, QuantType, TensorType, dtype_from_numpy


class DenseAttr:
    """A small inline constant: `dense<[[1.0, 2.0]]> : tensor<1x2xf32>`."""

    __slots__ = ("array", "type")

    def __init__(self, array: np.ndarray, type_: TensorType | None = None) -> None:
        arr = np.asarray(array)
        self.array = arr
        self.type = type_ or TensorType(
            tuple(int(s) for s in arr.shape), dtype_from_numpy(arr.dtype)
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DenseAttr):
            return NotImplemented
        return (
            self.type == other.type
            and self.array.shape == other.array.shape
            and self.array.dtype == other.array.dtype
            and self.array.tobytes() == other.array.tobytes()
        )

    def __hash__(self) -> int:
        return hash((str(self.type), self.array.tobytes()))

    def __repr__(self) -> str:
        return f"DenseAttr({self.array!r})"


AttrValue = Union[
    int,
    float,
    bool,
    str,
    tuple[Any, ...],
    dict[str, Any],
    DType,
    SymDim,
    _Dyn,
    TensorType,
    KVCacheType,
    QuantType,
    DenseAttr,
    None,
]


def attr_equal(a: Any, b: Any) -> bool:
    """Equality that tells bool from int from float and compares NaN floats as equal."""
    if type(a) is not type(b):
        return False
    if isinstance(a, DType):
        return a is b
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(attr_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return set(a) == set(b) and all(attr_equal(a[k], b[k]) for k in a)
    return bool(a == b)
