"""Random GGUF rows for the dequantization and kernel tests: random bits in every code and
sub-scale, and finite f16 scales of either sign (so that every value compares bit for bit)."""

from __future__ import annotations

import numpy as np

from llmir_core.quant import gguf_blocks

# byte offsets of the f16 fields (d, and dmin / m where the format has one) inside one block
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "q4_0": (0,),
    "q4_1": (0, 2),
    "q5_0": (0,),
    "q5_1": (0, 2),
    "q8_0": (0,),
    "q2_k": (80, 82),
    "q3_k": (108,),
    "q4_k": (0, 2),
    "q5_k": (0, 2),
    "q6_k": (208,),
    "iq4_nl": (0,),
    "iq4_xs": (0,),
}
# the bytes of the codes (not scales) of the formats with mins: zeroed, a block decodes to -min
CODE_BYTES: dict[str, slice] = {
    "q4_1": slice(4, 20),
    "q5_1": slice(4, 24),
    "q2_k": slice(16, 80),
    "q4_k": slice(16, 144),
    "q5_k": slice(16, 176),
}
FORMATS = tuple(gguf_blocks.BLOCKS)


def random_rows(rng: np.random.Generator, scheme: str, n: int, k: int) -> np.ndarray:
    """[n, k / elems * bytes] uint8: n rows of k weights as GGUF blocks."""
    elems, nbytes = gguf_blocks.BLOCKS[scheme]
    raw = rng.integers(0, 256, (n, k // elems, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[scheme]:
        d = (rng.standard_normal((n, k // elems)) * 0.01).astype(np.float16)
        raw[:, :, off : off + 2] = d.view(np.uint8).reshape(n, k // elems, 2)
    return raw.reshape(n, k // elems * nbytes)


def min_part(scheme: str, rows: np.ndarray, k: int) -> np.ndarray:
    """|min| of every weight ([n, k] f64; zeros for a format without mins): the size of the term
    a kernel subtracts apart from scale * code."""
    n = rows.shape[0]
    if scheme not in CODE_BYTES:
        return np.zeros((n, k))
    _, nbytes = gguf_blocks.BLOCKS[scheme]
    b = rows.reshape(n, -1, nbytes).copy()
    b[:, :, CODE_BYTES[scheme]] = 0
    return np.abs(gguf_blocks.dequantize(b, scheme, (n, k)).astype(np.float64))
