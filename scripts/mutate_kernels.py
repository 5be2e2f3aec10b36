"""Mutation testing of llmir's kernels: every listed source mutant must be killed by its tests.

Each mutant is (file, an exact source snippet found once in it, its replacement, the kernel tests
that must fail). The script copies the package and its tests into a temporary folder per mutant
(the tree here is never edited), applies the mutant there, compiles the C library of that copy into
a fresh cache folder (`LLMIR_EXT_CACHE`; the library is compiled from the copy's own sources,
llmir_core/targets/onnxruntime/native/__init__.py) and runs the named tests in the copy (PYTHONPATH and the
working folder are the copy; Triton kernels run under TRITON_INTERPRET=1, tests/triton/conftest.py).
A mutant is killed when a test fails (or the run crashes or times out), survives when they all
pass. Before the mutants, the unmutated copy runs every selected test with CI=true (no test may
skip) and must pass, so a kill means the mutant, not a broken setup. A snippet that is missing or
not unique, or a mutant whose C copy does not compile, is an error (exit 2).

    python scripts/mutate_kernels.py                     # every mutant (about 10 minutes on 2 cores)
    python scripts/mutate_kernels.py --subset            # the CI subset (tests/decoder/test_kernel_mutants.py)
    python scripts/mutate_kernels.py --only norm-drop-eps --only triton-rotary-swap-halves
    python scripts/mutate_kernels.py --format json --output benchmarks/results/kernel_mutants.json
    python scripts/mutate_kernels.py --list              # the mutants, their files and tests

Exit 0: every mutant killed; 1: some survived; 2: an error (snippet, compile, baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("llmir_core", "llmir_cli", "tests", "pyproject.toml")
C_DIR = "llmir_core/targets/onnxruntime/native/"
T_DIR = "llmir_core/targets/triton/kernels/"

# test selections (pytest node ids, relative to the repository root)
_NORM = "tests/decoder/test_norm_kernel.py::"
NORM = (
    _NORM + "test_edge_rows_match_float64",
    _NORM + "test_default_epsilon",
    _NORM + "test_matches_onnxruntime",
)
_ATT = "tests/decoder/test_attention_kernel.py::"
ATTN = (  # the cases with every attribute first: -x stops at the first failure
    _ATT + "test_partial_rotary_matches_onnxruntime",
    _ATT + "test_matches_onnxruntime",
    _ATT + "test_int8_caches_match_onnxruntime",
    _ATT + "test_rotary_scalar_tail_matches_numpy",
)
PADS = ("tests/decoder/test_attention_pads.py::test_pads_match_numpy",)
NBITS = ("tests/decoder/test_nbits_kernel.py::test_kernel_matches_numpy",)
_NBB = "tests/kernels/test_nbits_batched.py::"
NB512 = (_NBB + "test_rows_match_numpy",)  # the AVX-512 variant (skips without AVX-512 VNNI)
NB_AVX2 = (_NBB + "test_rows_match_numpy_avx2",)  # the AVX2 fallback, forced
GGUF = (
    "tests/kernels/test_gguf_kernel.py::test_kernel_matches_numpy",
    "tests/quant/test_gguf_dequant.py::test_kernel_dequant_matches_gguf",
)
GGUF_AVX2 = ("tests/kernels/test_gguf_kernel.py::test_avx2_prefill_matches_numpy",)
_GB = "tests/kernels/test_gguf_batched.py::"
GGUF_BATCH = (_GB + "test_every_format_every_m", _GB + "test_rows_are_independent")
S8 = ("tests/decoder/test_int8_llmir.py::test_kernel_matches_reference",)
F32 = ("tests/decoder/test_matmul_f32.py::test_panel_kernel_matches_numpy",)
_M16B = "tests/kernels/test_matmul16_batched.py::"
M16B = (_M16B + "test_rows_match_numpy", _M16B + "test_swiglu_epilogue_matches_numpy")
# the AVX2 GEMV of 16-bit weights runs where AVX-512 is absent or LLMIR_KERNEL_ISA=avx2 (M16B's
# avx2 cases), the rest of matmul16.c at every M (and for f32 rows) in test_matmul16.py
M16 = ("tests/decoder/test_matmul16.py::test_kernel_matches_reference", M16B[0])
_SW = "tests/decoder/test_swiglu_epilogue.py::"
SWIGLU = (
    _SW + "test_nbits_epilogue_matches_unfused",
    _SW + "test_s8_epilogue_matches_unfused",
    _SW + "test_float_epilogue_matches_unfused",
)
_TK = "tests/triton/test_kernels.py::"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    find: str  # found exactly once in the file
    replace: str
    tests: tuple[str, ...]
    what: str
    subset: bool = False  # in the CI subset


# fmt: off
M = Mutant
MUTANTS: tuple[Mutant, ...] = (
    # -- norm.c ------------------------------------------------------------------------------
    M("norm-drop-eps", C_DIR + "norm.c",
      "sqrt(ss / (double)H + (double)j->eps)", "sqrt(ss / (double)H)",
      NORM, "drop + eps in the rsqrt", subset=True),
    M("norm-eps-tenth", C_DIR + "norm.c",
      "sqrt(ss / (double)H + (double)j->eps)", "sqrt(ss / (double)H + 0.1 * (double)j->eps)",
      NORM, "eps scaled by 0.1"),
    M("norm-mean-over-h-minus-1", C_DIR + "norm.c",
      "sqrt(ss / (double)H + ", "sqrt(ss / (double)(H - 1) + ",
      NORM, "mean of squares over H - 1"),
    M("norm-tail-off-by-one", C_DIR + "norm.c",
      "for (; i < H; i++) y[i] = src[i] * inv * j->gamma[i];",
      "for (; i + 1 < H; i++) y[i] = src[i] * inv * j->gamma[i];",
      NORM, "the last element of a row not written"),
    M("norm-skip-tail-not-summed", C_DIR + "norm.c",
      "if (k || s) t[i] = v;", "if (s) t[i] = v;",
      NORM, "skip without the sum output: the tail's x + skip not stored"),
    M("norm-default-eps", C_DIR + "norm.c",
      '"epsilon", 1e-5f)', '"epsilon", 1e-6f)',
      NORM, "the default epsilon 1e-6 instead of onnxruntime's 1e-5"),
    # -- attention.c --------------------------------------------------------------------------
    M("attn-decode-softcap", C_DIR + "attention.c",
      "sc[t] = cap * tanhf(sc[t] / cap);", "sc[t] = cap * tanhf(sc[t]);",
      ATTN, "decode soft-cap without the division by cap", subset=True),
    M("attn-prefill-softcap", C_DIR + "attention.c",
      "row[t] = cap * tanhf(row[t] / cap);", "row[t] = tanhf(row[t] / cap);",
      ATTN, "prefill soft-cap without the factor cap"),
    M("attn-window-edge", C_DIR + "attention.c",
      "return w > 0 && n > w ? n - w : 0;", "return w > 0 && n > w ? n - w + 1 : 0;",
      ATTN, "sliding window one key short"),
    M("attn-decode-scale-ignored", C_DIR + "attention.c",
      "const float scale = j->kn->scale > 0.0f ? j->kn->scale : 1.0f / sqrtf((float)D);\n"
      "    const float cap = j->kn->softcap;\n    for (int64_t s = s0 > off ? s0 : off; s < s1;",
      "const float scale = 1.0f / sqrtf((float)D);\n"
      "    const float cap = j->kn->softcap;\n    for (int64_t s = s0 > off ? s0 : off; s < s1;",
      ATTN, "decode ignores the scale attribute"),
    M("attn-prefill-default-scale", C_DIR + "attention.c",
      "const float scale = j->kn->scale > 0.0f ? j->kn->scale : 1.0f / sqrtf((float)D);\n"
      "    const float cap = j->kn->softcap;\n    for (int64_t s = sr; s < s1; s++)",
      "const float scale = j->kn->scale > 0.0f ? j->kn->scale : 1.0f / sqrtf((float)(D + 8));\n"
      "    const float cap = j->kn->softcap;\n    for (int64_t s = sr; s < s1; s++)",
      ATTN, "prefill default scale 1/sqrt(D + 8)"),
    M("attn-rotary-swap-halves", C_DIR + "attention.c",
      "x1 = _mm256_loadu_ps(src + i), x2 = _mm256_loadu_ps(src + half + i);",
      "x1 = _mm256_loadu_ps(src + half + i), x2 = _mm256_loadu_ps(src + i);",
      ATTN, "rotary halves swapped (vector part)"),
    M("attn-rotary-tail-swap-halves", C_DIR + "attention.c",
      "float x1 = src[i], x2 = src[half + i];", "float x1 = src[half + i], x2 = src[i];",
      ATTN, "rotary halves swapped (scalar tail of a half not a multiple of 8)"),
    M("attn-rotary-interleaved-sign", C_DIR + "attention.c",
      "dst[2 * i + 1] = (x2 * c[i] + x1 * s[i]) * mul;",
      "dst[2 * i + 1] = (x2 * c[i] - x1 * s[i]) * mul;",
      ATTN, "interleaved rotary: wrong sign of the odd element"),
    M("attn-decode-gqa-heads", C_DIR + "attention.c",
      "int64_t i = (s - s0) * G + (g - g0), h = kh * j->G + g;",
      "int64_t i = (s - s0) * G + (g - g0), h = g * j->Hkv + kh;",
      ATTN, "decode: query heads mapped to KV heads interleaved, not grouped"),
    M("attn-prefill-gqa-heads", C_DIR + "attention.c",
      "int64_t i = (s - s0) * G + g, h = kh * G + g;\n            rotate(",
      "int64_t i = (s - s0) * G + g, h = g * j->Hkv + kh;\n            rotate(",
      ATTN, "prefill: query heads mapped to KV heads interleaved, not grouped"),
    M("attn-decode-no-rescale", C_DIR + "attention.c",
      "float corr = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m);",
      "float corr = mx[i] == -INFINITY ? 0.0f : 1.0f;",
      ATTN, "online softmax: the running sum not rescaled when the max grows"),
    M("attn-merge-weights", C_DIR + "attention.c",
      "l += w * pc[1];", "l += pc[1];",
      ATTN, "split decode: chunk sums merged without their weights"),
    M("attn-causal-edge", C_DIR + "attention.c",
      "hi = past + s + 1 < total ? past + s + 1 : total;",
      "hi = past + s + 2 < total ? past + s + 2 : total;",
      ATTN, "prefill: a query sees the next (future) key"),
    M("attn-pads-stored", C_DIR + "attention.c",
      "for (int64_t s = off; s < S; s++) {", "for (int64_t s = 0; s < S; s++) {",
      PADS, "pads (negative positions) written to the KV buffer"),
    M("attn-pads-first-prompt", C_DIR + "attention.c",
      "S == total && !pads;", "S == total;",
      PADS, "a left-padded step with S == total taken for a first prompt"),
    M("attn-kv8-truncate", C_DIR + "attention.c",
      "float q = nearbyintf(x[d] *", "float q = truncf(x[d] *",
      ATTN, "int8 cache codes truncated, not rounded"),
    M("attn-kv8-saturation", C_DIR + "attention.c",
      "q < -128.0f ? -128 :", "q < -127.0f ? -127 :",
      ATTN, "int8 cache codes saturated at -127"),
    M("attn-kv8-channel-head", C_DIR + "attention.c",
      "_mm256_loadu_ps(sc + kh * D + d)", "_mm256_loadu_ps(sc + d)",
      ATTN, "per-channel int8 scales of KV head 0 for every head"),
    # -- f32_gemm.h / q8_act.h ---------------------------------------------------------------
    M("gemm-partial-panel-overwrite", C_DIR + "f32_gemm.h",
      "yr[c] = accumulate ? yr[c] + t[c] : t[c];", "yr[c] = t[c];",
      M16 + F32, "a partial panel's later K blocks overwrite instead of accumulating"),
    M("exp-drop-ln2-low", C_DIR + "f32_gemm.h",
      "r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);", "",
      SWIGLU + ATTN, "exp: the low part of ln 2 dropped (wrong epilogue constant)"),
    M("q8-scale-128", C_DIR + "q8_act.h",
      "float d = amax / 127.0f,", "float d = amax / 128.0f,",
      NBITS + S8, "activation block scale max|x| / 128"),
    M("q8-truncate", C_DIR + "q8_act.h",
      "__m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, s))",
      "__m256i i0 = _mm256_cvttps_epi32(_mm256_mul_ps(v0, s))",
      NBITS + S8, "activation codes truncated, not rounded (first 8 of a block)"),
    M("swiglu-exp-sign", C_DIR + "q8_act.h",
      "llmir_exp_ps(_mm256_xor_ps(gv, sign))", "llmir_exp_ps(gv)",
      SWIGLU, "SwiGLU: silu with e^g instead of e^-g", subset=True),
    M("swiglu-tail-short", C_DIR + "q8_act.h",
      "memcpy(y + i, yt, (size_t)(n - i) * sizeof(float));",
      "memcpy(y + i, yt, (size_t)(n - i - 1) * sizeof(float));",
      SWIGLU, "SwiGLU: the last output of a ragged row not written"),
    # -- matmul_nbits.c -----------------------------------------------------------------------
    M("nbits-zero-nibble-order", C_DIR + "matmul_nbits.c",
      "return (z[b >> 1] >> ((b & 1) * 4)) & 15;", "return (z[b >> 1] >> ((~b & 1) * 4)) & 15;",
      NBITS, "4-bit zero points: high nibble first (scalar)", subset=True),
    M("nbits-zero-vector-nibble-order", C_DIR + "matmul_nbits.c",
      "zb = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));",
      "zb = _mm_unpacklo_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));",
      NBITS, "4-bit zero points: high nibble first (8 blocks at a time)"),
    M("nbits-midpoint", C_DIR + "matmul_nbits.c",
      "const int mid = 1 << (j->bits - 1);", "const int mid = (1 << (j->bits - 1)) - 1;",
      NBITS, "zero-point correction against midpoint 7 / 127"),
    M("nbits-q4-high-nibble", C_DIR + "matmul_nbits.c",
      "__m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);",
      "__m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 3), mask);",
      NB_AVX2, "4-bit decode: high nibble shifted by 3"),
    M("nbits-q8-sign-flip", C_DIR + "matmul_nbits.c",
      "_mm256_set1_epi8((char)0x80), ones16", "_mm256_set1_epi8((char)0x7F), ones16",
      NB_AVX2, "8-bit decode: wrong zero point (sign trick)"),
    M("nbits-odd-block-midpoint", C_DIR + "matmul_nbits.c",
      "zs = _mm_slli_epi32(_mm_madd_epi16(zs, o16), 3);",
      "zs = _mm_slli_epi32(_mm_madd_epi16(zs, o16), 2);",
      NB_AVX2, "4-bit decode, last of an odd block count: midpoint 4"),
    M("nbits-gemm-midpoint", C_DIR + "matmul_nbits.c",
      "z0 = z1 = _mm256_slli_epi32(xs, 3);", "z0 = z1 = _mm256_slli_epi32(xs, 2);",
      NBITS, "4-bit prefill without zero points: midpoint 4"),
    M("nbits-deq8-block-index", C_DIR + "matmul_nbits.c",
      "const int64_t b = k / QB;", "const int64_t b = k / QB / 2;",
      NBITS, "8-bit prefill: the scale of the wrong block"),
    M("nbits-zero-point-dropped", C_DIR + "matmul_nbits.c",
      "if (!j->zp) return 0.0f;", "return 0.0f;",
      NB_AVX2, "decode: the zero points' correction dropped"),
    M("nbits-avx2-last-row", C_DIR + "matmul_nbits.c",
      "for (int64_t m = 0; m < j->M; m++) ONE;", "for (int64_t m = 0; m + 1 < j->M; m++) ONE;",
      NB_AVX2, "AVX2 batched decode, one weight row a pass: the last X row not computed"),
    M("nbits-avx2-x-row", C_DIR + "matmul_nbits.c",
      "for (int64_t m = 0; m < j->M; m++) KERNEL(j, n, m, 4, F16);",
      "for (int64_t m = 0; m < j->M; m++) KERNEL(j, n, m / 2, 4, F16);",
      NB_AVX2, "AVX2 batched decode, 4 weight rows a pass: the wrong X row"),
    M("nbits-z-drop-weight-scale", C_DIR + "matmul_nbits.c",
      "_mm512_mul_ps(sc, _mm512_loadu_ps(j->dz + at))", "_mm512_loadu_ps(j->dz + at)",
      NB512, "AVX-512 decode: the weight scales dropped"),
    M("nbits-z-q8-midpoint", C_DIR + "matmul_nbits.c",
      "= -16 * sum,", "= -15 * sum,",
      NB512, "AVX-512 decode, 8-bit: midpoint 120"),
    M("nbits-z-q4-midpoint", C_DIR + "matmul_nbits.c",
      "j->bz[at + 8 + h * 4 + i] = -sum;", "j->bz[at + 8 + h * 4 + i] = 1 - sum;",
      NB512, "AVX-512 decode, 4-bit: a midpoint share off by one"),
    M("nbits-z-q4-nibble-order", C_DIR + "matmul_nbits.c",
      "xz[h * 16 + i] = q[2 * i], xz[32 + h * 16 + i] = q[2 * i + 1];",
      "xz[h * 16 + i] = q[2 * i + 1], xz[32 + h * 16 + i] = q[2 * i];",
      NB512, "AVX-512 decode, 4-bit: x evens against the high nibbles"),
    M("nbits-z-x-row-stride", C_DIR + "matmul_nbits.c",
      "const int64_t at = ((m0 + m) * nbp + p) * 16;", "const int64_t at = (m0 * nbp + p) * 16;",
      NB512 + (_NBB + "test_rows_are_independent",), "AVX-512 decode: every X row of a tile is its first"),
    M("nbits-z-w-row-stride", C_DIR + "matmul_nbits.c",
      "const uint8_t *w = j->w + n * nb * QB * bits / 8;",
      "const uint8_t *w = j->w + n * (nb - 1) * QB * bits / 8;",
      NB512, "AVX-512 decode: the weight row stride one block short"),
    M("nbits-z-odd-tail", C_DIR + "matmul_nbits.c",
      "if (nb & 1) ZSTEP(1)", "",
      NB512, "AVX-512 decode: the last block of an odd count dropped"),
    M("nbits-z-last-scale", C_DIR + "matmul_nbits.c",
      "if (last) return _mm512_set1_ps(f16 ?", "if (last) return _mm512_set1_ps(1 ? 1.0f : f16 ?",
      NB512, "AVX-512 decode: the last block of an odd count without its scale"),
    M("nbits-zp-midpoint", C_DIR + "matmul_nbits.c",
      "j->zx[m * nb + b] = -(1 << (j->bits - 1)) * sum;",
      "j->zx[m * nb + b] = -((1 << (j->bits - 1)) - 1) * sum;",
      NB512, "AVX-512 panels: midpoint 127 / 7"),
    M("nbits-zp-drop-weight-scale", C_DIR + "matmul_nbits.c",
      "_mm512_mul_ps(sc, _mm512_set1_ps(j->dx[(m0 + m) * nb + b]))",
      "_mm512_set1_ps(j->dx[(m0 + m) * nb + b])",
      NB512, "AVX-512 panels: the weight scales dropped"),
    M("nbits-zp-row-order", C_DIR + "matmul_nbits.c",
      "(j->w + ((n0 + h * 8 + i) * nb + b) * QB)", "(j->w + ((n0 + h * 8 + (i ^ 1)) * nb + b) * QB)",
      NB512, "AVX-512 8-bit panels: neighbouring weight rows swapped in the pack"),
    M("nbits-zp-scale-block", C_DIR + "matmul_nbits.c",
      "ps[b * 16 + c] = scale_at(j, (n0 + c) * nb + b);", "ps[b * 16 + c] = scale_at(j, (n0 + c) * nb);",
      NB512, "AVX-512 8-bit panels: every block takes the row's first scale"),
    M("nbits-zp-zero-points", C_DIR + "matmul_nbits.c",
      "y[c] += zero_correction(j, n0 + c, m0 + m);", "y[c] += 0.0f;",
      NB512, "AVX-512 panels: the zero points' correction dropped"),
    # -- matmul_gguf.c ------------------------------------------------------------------------
    M("gguf-k45-drop-mins", C_DIR + "matmul_gguf.c",
      "llmir_hsum(_mm256_add_ps(acc[m], acc2[m])) - llmir_hsum(macc[m]);",
      "llmir_hsum(_mm256_add_ps(acc[m], acc2[m]));",
      GGUF, "q4_k / q5_k decode: the super-block mins dropped"),
    M("gguf-k45-high-scale", C_DIR + "matmul_gguf.c",
      "_mm256_set1_epi32(2 * c + 1)), acc2[m]);", "_mm256_set1_epi32(2 * c)), acc2[m]);",
      GGUF, "q4_k / q5_k decode: the high-nibble sub-block takes the low one's scale"),
    M("gguf-q6k-offset", C_DIR + "matmul_gguf.c",
      "- 32.0f * llmir_hsum(macc[m]);", "- 31.0f * llmir_hsum(macc[m]);",
      GGUF, "q6_k decode: codes offset by 31, not 32"),
    M("gguf-q6k-scales-unsigned", C_DIR + "matmul_gguf.c",
      "sc[j] = d * (float)(int8_t)s[192 + j];", "sc[j] = d * (float)s[192 + j];",
      GGUF, "q6_k dequantizer: the int8 sub-scales read unsigned"),
    M("gguf-iq4-grid", C_DIR + "matmul_gguf.c",
      "89, 113);", "89, 112);",
      GGUF, "iq4_nl / iq4_xs: one entry of the non-linear grid (high lane) off by one"),
    M("gguf-q5-fifth-bit", C_DIR + "matmul_gguf.c",
      "_mm256_set1_epi8(0x10));", "_mm256_set1_epi8(0x08));",
      GGUF, "q5_0 / q5_1: the fifth bit worth 8"),
    M("gguf-row32-odd-blocks", C_DIR + "matmul_gguf.c",
      "if (h == 1 && b + 1 == nb) break;", "if (h == 1) break;",
      GGUF, "32-element decode: every second block skipped"),
    M("gguf-prefill-offset-half", C_DIR + "matmul_gguf.c",
      "off * (s16 ? xi[h] : xi[0] + xi[1])", "off * (s16 ? xi[h] : xi[0])",
      GGUF, "int8 prefill: the code offset times the first 16 x codes' sum only"),
    M("gguf-prefill-drop-mins", C_DIR + "matmul_gguf.c",
      "acc[r][1] = _mm256_fnmadd_ps(_mm256_loadu_ps(mp + 8), xs, acc[r][1]);", "",
      GGUF, "int8 prefill: the mins of rows 8-15 of a panel dropped"),
    M("gguf-prefill-avx2-no-sign-trick", C_DIR + "matmul_gguf.c",
      "wide ? _mm256_abs_epi8(w0) : w0", "w0",
      GGUF_AVX2, "int8 prefill on AVX2: 8-bit codes taken unsigned"),
    M("gguf-batch-drop-mins", C_DIR + "matmul_gguf.c",
      "acc[r] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(xs + r * S + i), acc[r]);", ";",
      GGUF_BATCH, "batched decode: the mins (and code offsets) of the first 8k of each 16 dropped"),
    M("gguf-batch-mins-tail", C_DIR + "matmul_gguf.c",
      "for (; i < S; i += 2) { /* S is even */", "for (; i + 2 < S; i += 2) { /* S is even */",
      GGUF_BATCH, "batched decode: the last two mins of a row dropped"),
    M("gguf-batch-x-row-stride", C_DIR + "matmul_gguf.c",
      "(const __m256i *)(xq + r * K + 32 * b)", "(const __m256i *)(xq + (r & ~1) * K + 32 * b)",
      GGUF_BATCH, "batched decode: odd X rows read their even neighbour's codes"),
    M("gguf-batch-dx-stride", C_DIR + "matmul_gguf.c",
      "_mm256_broadcast_ss(dx + r * nb + b)", "_mm256_broadcast_ss(dx + b)",
      GGUF_BATCH, "batched decode: every row scaled by the first row's d_x"),
    M("gguf-batch-q6k-offset", C_DIR + "matmul_gguf.c",
      "_mm256_mul_ps(_mm256_set1_ps(32.0f), sb8)", "_mm256_mul_ps(_mm256_set1_ps(31.0f), sb8)",
      GGUF_BATCH, "batched q6_k: the second half's codes offset by 31"),
    M("gguf-batch-vnni-q8-offset", C_DIR + "matmul_gguf.c",
      "c = _mm256_xor_si256(c, flip), mn = 128.0f * d;", "c = _mm256_xor_si256(c, flip), mn = 127.0f * d;",
      GGUF_BATCH, "batched decode, AVX-512: 8-bit codes + 128 with the offset taken as 127"),
    M("gguf-batch-avx2-no-sign-trick", C_DIR + "matmul_gguf.c",
      "const __m256i wa = mode == D_SIGNED ? _mm256_abs_epi8(w) : w;", "const __m256i wa = w;",
      GGUF_BATCH, "batched decode, AVX2: 8-bit codes taken unsigned"),
    M("gguf-gemv-vnni-no-flip", C_DIR + "matmul_gguf.c",
      "if (flip) c = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80)), mn = 128.0f * d;",
      "if (flip) mn = 128.0f * d;",
      GGUF_BATCH, "register GEMV, AVX-512: q8_0 / iq4_nl codes not made unsigned for vpdpbusd"),
    M("gguf-batch-q6k-scale-half", C_DIR + "matmul_gguf.c",
      "_mm256_permutevar8x32_ps(h ? sb8 : sa, pick)", "_mm256_permutevar8x32_ps(sa, pick)",
      GGUF_BATCH, "batched q6_k: the second half's 32-blocks take the first half's scales"),
    # -- matmul_s8.c --------------------------------------------------------------------------
    M("s8-row-interleave", C_DIR + "matmul_s8.c",
      "+ (r & 3) * S8_QB + (k & 31);", "+ (r & 1) * S8_QB + (k & 31);",
      S8, "prefill panel: rows of a group of 4 read interleaved by 2"),
    M("s8-u7-zero-point", C_DIR + "matmul_s8.c",
      "_mm_set_ss(-mn * inv)", "_mm_set_ss(-mn * inv + 1.0f)",
      S8, "prefill: activation zero point one too high"),
    M("s8-drop-zero-correction", C_DIR + "matmul_s8.c",
      "f0 = _mm256_fnmadd_ps(zv, cs0, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), dv, f0));",
      "f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), dv, f0);",
      S8, "prefill: zero-point correction dropped for 8 of 16 columns"),
    M("s8-row-scale", C_DIR + "matmul_s8.c",
      "out[m * ldo + n - r0] = r[c] * j->s[n];", "out[m * ldo + n - r0] = r[c] * j->s[g * 4];",
      S8, "decode: every row of a group scaled by the group's first scale"),
    M("s8-partial-block", C_DIR + "matmul_s8.c",
      "memcpy(t, src, (size_t)n * sizeof(float));",
      "memcpy(t, src, (size_t)(n - 1) * sizeof(float));",
      S8, "decode: the last column of a partial block dropped"),
    # -- matmul_f32.c -------------------------------------------------------------------------
    M("f32-gemv-tail", C_DIR + "matmul_f32.c",
      "    for (; k < K; k++) {\n        __m256 x0 = _mm256_broadcast_ss(x + k);",
      "    for (; k + 1 < K; k++) {\n        __m256 x0 = _mm256_broadcast_ss(x + k);",
      F32, "decode: the last column of K dropped (K % 4 != 0)"),
    M("f32-gemv-sum", C_DIR + "matmul_f32.c",
      "_mm256_add_ps(_mm256_add_ps(a1, a3), _mm256_add_ps(a5, a7))",
      "_mm256_add_ps(_mm256_add_ps(a1, a3), _mm256_add_ps(a5, a5))",
      F32, "decode: one accumulator summed twice, another not at all"),
    M("f32-gemm-k-block-flag", C_DIR + "matmul_f32.c",
      "nr, kc, k0 != 0);", "nr, kc, k0 > step);",
      F32, "prefill: the second K block overwrites the first"),
    M("f32-rx16-overwrite", C_DIR + "matmul_f32.c",
      "yr[q] = acc ? yr[q] + t[q] : t[q];", "yr[q] = t[q];",
      F32, "prefill, 1-5 row tail of a partial panel: K blocks overwrite"),
    M("f32-swiglu-up-panels", C_DIR + "matmul_f32.c",
      "j.w = (const float *)w + j.P * K * P16;", "j.w = (const float *)w + (j.P - 1) * K * P16;",
      SWIGLU, "decode SwiGLU: the up half starts one panel early"),
    # -- matmul16.c ---------------------------------------------------------------------------
    M("m16-bf16-shift", C_DIR + "matmul16.c",
      "_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)",
      "_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 15)",
      M16, "bf16 widened with a shift of 15 (vector)"),
    M("m16-bf16-scalar-shift", C_DIR + "matmul16.c",
      "uint32_t u = (uint32_t)h << 16;", "uint32_t u = (uint32_t)h << 8;",
      M16, "bf16 widened with a shift of 8 (scalar tail)"),
    M("m16-rows-tail", C_DIR + "matmul16.c",
      "for (int64_t t = k; t < K; t++) s +=", "for (int64_t t = k; t + 1 < K; t++) s +=",
      M16, "decode, 2-4 rows: the last column of K dropped"),
    M("m16-pack-tail", C_DIR + "matmul16.c",
      "load1(wat(j->w, (n0 + c) * K + k0 + k, wt), wt);",
      "load1(wat(j->w, (n0 + c) * K + k0 + k - 1, wt), wt);",
      M16, "prefill packing of a full panel: the K tail one column early"),
    M("m16-swiglu-gate-up", C_DIR + "matmul16.c",
      "llmir_swiglu(j->g + m * H + n0, t + m * SWIGLU_CHUNK,",
      "llmir_swiglu(t + m * SWIGLU_CHUNK, j->g + m * H + n0,",
      SWIGLU, "decode SwiGLU: silu(up) * gate"),
    M("m16-512-row-tail", C_DIR + "matmul16.c",
      "a1 = _mm512_fmadd_ps(load16_tail(wat(w, k, wt), wt, m), _mm512_maskz_loadu_ps(m, x + k), a1);",
      "a1 = _mm512_fmadd_ps(load16_tail(wat(w, k, wt), wt, m >> 1), _mm512_maskz_loadu_ps(m, x + k), a1);",
      M16B, "AVX-512 decode, 1 row: the last column of the masked K tail dropped"),
    M("m16-512-block-tail", C_DIR + "matmul16.c",
      "for (int c = 0; c < NW; c++) wv[c] = load16_tail(wat(w, c * K + k, wt), wt, m);",
      "for (int c = 0; c < NW; c++) wv[c] = load16_tail(wat(w, c * K + k, wt), wt, m >> 1);",
      M16B, "AVX-512 batched decode: the last column of the masked K tail dropped"),
    M("m16-512-y-stride", C_DIR + "matmul16.c",
      "_mm_storeu_ps(y + r * ldy, hsum4_512(", "_mm_storeu_ps(y + r * (ldy - 1), hsum4_512(",
      M16B, "AVX-512 batched decode: output rows stored one column short of their stride"),
    M("m16-512-hsum-swap", C_DIR + "matmul16.c",
      "_mm_hadd_ps(_mm_hadd_ps(q0, q1), _mm_hadd_ps(q2, q3))",
      "_mm_hadd_ps(_mm_hadd_ps(q1, q0), _mm_hadd_ps(q2, q3))",
      M16B, "AVX-512 batched decode: two weight rows' sums swapped"),
    M("m16-512-last-row", C_DIR + "matmul16.c",
      "for (; n < n1; n++) rows512(", "for (; n + 1 < n1; n++) rows512(",
      M16B, "AVX-512 batched decode: a task's last weight row past its 4-row blocks not computed"),
    M("m16-512-two-rows-stride", C_DIR + "matmul16.c",
      "const float *x1 = x + ldx;", "const float *x1 = x + ldx - 1;",
      M16B, "AVX-512 decode, 2 rows: the second row of X read one column early"),
    M("m16-512-bf16-shift", C_DIR + "matmul16.c",
      "__m256i v = _mm256_loadu_si256((const __m256i *)p);\n    if (wt == W_F16) return _mm512_cvtph_ps(v);\n"
      "    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));",
      "__m256i v = _mm256_loadu_si256((const __m256i *)p);\n    if (wt == W_F16) return _mm512_cvtph_ps(v);\n"
      "    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 15));",
      M16B, "AVX-512: bf16 widened with a shift of 15"),
    # -- Triton -------------------------------------------------------------------------------
    M("triton-rms-drop-eps", T_DIR + "norm.py",
      "inv = 1.0 / tl.sqrt(ms + eps)", "inv = 1.0 / tl.sqrt(ms)",
      (_TK + "test_rms_norm", _TK + "test_rms_norm_edge_rows"),
      "rms_norm: drop + eps", subset=True),
    M("triton-rms-drop-offset", T_DIR + "norm.py",
      ".to(tl.float32) + offset", ".to(tl.float32)",
      (_TK + "test_rms_norm", _TK + "test_rms_norm_edge_rows"), "rms_norm: Gemma's offset dropped"),
    M("triton-rotary-swap-halves", T_DIR + "rotary.py",
      "i1 = i\n        i2 = i + half", "i1 = i + half\n        i2 = i",
      (_TK + "test_rotary",), "rotary: halves swapped", subset=True),
    M("triton-rotary-interleaved-pairs", T_DIR + "rotary.py",
      "i1 = 2 * i\n        i2 = 2 * i + 1", "i1 = 2 * i + 1\n        i2 = 2 * i",
      (_TK + "test_rotary",), "rotary: interleaved pairs swapped"),
    M("triton-rotary-tail", T_DIR + "rotary.py",
      "mt = (d >= 2 * half) & (d < head_dim)", "mt = (d > 2 * half) & (d < head_dim)",
      (_TK + "test_rotary",), "rotary: the first element past rotary_dim not copied"),
    M("triton-decode-softcap", T_DIR + "decode_attention.py",
      "s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))",
      "s = softcap * (1.0 - 2.0 / (tl.exp(z) + 1.0))",
      (_TK + "test_decode_attention",), "decode attention: tanh(z / 2) soft-cap"),
    M("triton-decode-window-edge", T_DIR + "decode_attention.py",
      "valid = valid & (j > p - window)", "valid = valid & (j >= p - window)",
      (_TK + "test_decode_attention",), "decode attention: the window one key too wide"),
    M("triton-decode-gqa-heads", T_DIR + "decode_attention.py",
      "qh = kvh * group + g", "qh = g * kv_heads + kvh",
      (_TK + "test_decode_attention",), "decode attention: GQA heads interleaved"),
    M("triton-prefill-window-edge", T_DIR + "prefill_attention.py",
      "keep = keep & (j[None, :] > p[:, None] - window)",
      "keep = keep & (j[None, :] >= p[:, None] - window)",
      (_TK + "test_prefill_attention",), "prefill attention: the window one key too wide"),
    M("triton-prefill-gqa-heads", T_DIR + "prefill_attention.py",
      "kvh = h // group", "kvh = h % (q_heads // group)",
      (_TK + "test_prefill_attention",), "prefill attention: GQA heads interleaved"),
    M("triton-prefill-scale", T_DIR + "prefill_attention.py",
      "s = s * sm_scale", "s = s * sm_scale * 1.01",
      (_TK + "test_prefill_attention",), "prefill attention: scale off by 1%"),
    M("triton-quant-nibble-order", T_DIR + "quant_matmul.py",
      "shift = (k % 2) * 4", "shift = ((k + 1) % 2) * 4",
      (_TK + "test_nbits_quant_matmul",), "nbits 4-bit: nibble order swapped"),
    M("triton-quant-zero-point", T_DIR + "quant_matmul.py",
      "& 15).to(tl.float32) - 8.0", "& 15).to(tl.float32) - 7.0",
      (_TK + "test_nbits_quant_matmul", _TK + "test_gguf_quant_matmul"),
      "4-bit zero point 7"),
    M("triton-quant-block-index", T_DIR + "quant_matmul.py",
      "s_ptr + n64 * stride_sn + k // QBLOCK", "s_ptr + n64 * stride_sn + k // (2 * QBLOCK)",
      (_TK + "test_nbits_quant_matmul", _TK + "test_gguf_quant_matmul"),
      "the scale of the wrong block"),
    M("triton-kv-half-even", T_DIR + "kv_cache.py",
      "r = tl.where(((r - y) == 0.5) & odd, r - 1.0, r)", "r = r",
      (_TK + "test_kv_append", _TK + "test_kv_append_rounds_half_to_even"),
      "int8 KV append: halves rounded up, not to even"),
    M("triton-gelu-tanh-constant", T_DIR + "matmul.py",
      "y + 0.044715 * y * y * y", "y + 0.0447 * y * y * y",
      (_TK + "test_matmul", _TK + "test_matmul_activations_per_element"),
      "gelu_tanh: cubic coefficient 0.0447"),
)
del M
# fmt: on


def select(names: Sequence[str] | None, subset: bool) -> list[Mutant]:
    if names:
        known = {m.name: m for m in MUTANTS}
        missing = [n for n in names if n not in known]
        if missing:
            raise SystemExit(f"error: unknown mutant(s): {', '.join(missing)} (see --list)")
        return [known[n] for n in names]
    return [m for m in MUTANTS if m.subset or not subset]


def snippet_problems(mutants: Sequence[Mutant], root: Path = ROOT) -> list[str]:
    """Every snippet must be found exactly once in its file (else the list is out of date)."""
    out = []
    for m in mutants:
        path = root / m.file
        if not path.is_file():
            out.append(f"{m.name}: no file {m.file}")
            continue
        n = path.read_text().count(m.find)
        if n != 1:
            out.append(f"{m.name}: snippet found {n} times in {m.file} (must be once): {m.find!r}")
    return out


def _copy(dst: Path) -> None:
    # not the library an editable install built in place: the copy compiles its own sources
    ignore = shutil.ignore_patterns(
        "__pycache__", "*.pyc", ".pytest_cache", "libllmir_ops.so", "_build.json"
    )
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(src, dst / name)


def _env(copy: Path, cache: Path, ci: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("CI", None)
    if ci:
        env["CI"] = "true"  # the baseline: a test that would skip fails instead
    env.update(
        PYTHONPATH=str(copy),
        LLMIR_EXT_CACHE=str(cache),
        PYTHONDONTWRITEBYTECODE="1",
        TRITON_INTERPRET="1",
    )
    env.pop("LLMIR_NO_CUSTOM_OPS", None)
    return env


def _build_library(copy: Path, env: dict[str, str], timeout: float) -> str | None:
    """Compile the copy's C library into its fresh cache; None when it worked, else why not."""
    code = (
        "import llmir_core.targets.onnxruntime.native as e, os, sys\n"
        f"assert e.__file__.startswith({str(copy)!r}), e.__file__\n"
        "p = e.library_path()\n"
        "assert p.startswith(os.environ['LLMIR_EXT_CACHE']), p\n"
    )
    try:
        r = subprocess.run(
            [sys.executable, "-c", code],
            cwd=copy,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "compiling the library timed out"
    if r.returncode:
        lines = (r.stderr or r.stdout).strip().splitlines() or ["(no output)"]
        return lines[-1]
    return None


def _pytest(
    copy: Path, tests: Sequence[str], env: dict[str, str], timeout: float
) -> tuple[int | None, str]:
    """(pytest's exit code or None on timeout, the tail of its output)."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0"]
    try:
        r = subprocess.run(
            [*cmd, *tests], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, "timed out"
    lines = (r.stdout + r.stderr).strip().splitlines()
    first = [x for x in lines if x.startswith(("FAILED ", "ERROR "))][:1]
    return r.returncode, "\n".join(lines[-6:] + first)


@dataclass
class Result:
    name: str
    file: str
    what: str
    tests: list[str]
    status: str  # killed | survived | error
    detail: str
    seconds: float


def run_one(m: Mutant, work: Path, timeout: float) -> Result:
    t0 = time.monotonic()
    copy = work / m.name
    _copy(copy)
    path = copy / m.file
    text = path.read_text()
    path.write_text(text.replace(m.find, m.replace, 1))
    cache = work / (m.name + ".cache")
    env = _env(copy, cache, ci=False)

    def done(status: str, detail: str) -> Result:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        dt = round(time.monotonic() - t0, 1)
        return Result(m.name, m.file, m.what, list(m.tests), status, detail, dt)

    if m.file.startswith(C_DIR):
        why = _build_library(copy, env, timeout)
        if why is not None:
            return done("error", f"the mutant does not build: {why}")
    rc, tail = _pytest(copy, m.tests, env, timeout)
    if rc is None:
        return done("killed", "the tests timed out")
    if rc == 0:
        return done("survived", "every test passed")
    if rc == 1 or rc < 0:
        last = tail.splitlines()[-1] if tail else ""
        return done("killed", last if rc == 1 else f"the test run crashed (signal {-rc})")
    return done("error", f"pytest exit {rc}: {tail}")


def baseline(mutants: Sequence[Mutant], work: Path, timeout: float) -> str | None:
    """The unmutated copy passes every selected test with CI=true (nothing skipped)."""
    copy, cache = work / "_baseline", work / "_baseline.cache"
    _copy(copy)
    env = _env(copy, cache, ci=True)
    why = _build_library(copy, env, timeout)
    if why is not None:
        return f"the unmutated library does not build here: {why}"
    tests = sorted({t for m in mutants for t in m.tests})
    rc, tail = _pytest(copy, tests, env, timeout * 2)
    shutil.rmtree(copy, ignore_errors=True)
    if rc != 0:
        return f"the unmutated tests do not pass (exit {rc}):\n{tail}"
    return None


def summary(results: Sequence[Result]) -> dict[str, object]:
    by_file: dict[str, dict[str, int]] = {}
    for r in results:
        f = by_file.setdefault(r.file, {"killed": 0, "total": 0})
        f["total"] += 1
        f["killed"] += r.status == "killed"
    count = {s: sum(r.status == s for r in results) for s in ("killed", "survived", "error")}
    return {
        "total": len(results),
        **count,
        "kill_rate": f"{count['killed']}/{len(results)}",
        "by_file": dict(sorted(by_file.items())),
        "mutants": [asdict(r) for r in results],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--subset", action="store_true", help="only the CI subset")
    p.add_argument("--only", action="append", metavar="NAME", help="only this mutant (repeatable)")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--output", type=Path, help="also write the JSON report here")
    p.add_argument(
        "--merge",
        action="store_true",
        help="with --output: keep the report's other mutants, replace those run now",
    )
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's tests")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    a = p.parse_args(argv)
    mutants = select(a.only, a.subset)
    if a.list:
        for m in mutants:
            star = " [subset]" if m.subset else ""
            print(f"{m.name}{star}: {m.file}: {m.what}\n    tests: {' '.join(m.tests)}")
        return 0
    problems = snippet_problems(mutants)
    if problems:
        print("\n".join(f"error: {x}" for x in problems), file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmir-mutants-") as tmp:
        work = Path(tmp)
        if not a.no_baseline:
            why = baseline(mutants, work, a.timeout)
            if why is not None:
                print(f"error: {why}", file=sys.stderr)
                return 2
        with ThreadPoolExecutor(max(1, a.jobs)) as pool:
            futures = [pool.submit(run_one, m, work, a.timeout) for m in mutants]
            results = []
            for f in futures:
                r = f.result()
                results.append(r)
                if a.format == "text":
                    print(f"{r.status:8} {r.name} ({r.seconds:.0f} s): {r.detail}", flush=True)
    seconds = round(time.monotonic() - t0, 1)
    if a.merge and a.output and a.output.is_file():
        ran = {r.name for r in results}
        old = json.loads(a.output.read_text())
        kept = [Result(**m) for m in old["mutants"] if m["name"] not in ran]
        seconds += float(old.get("seconds", 0.0))
        order = {m.name: i for i, m in enumerate(MUTANTS)}
        results = sorted(kept + results, key=lambda r: order.get(r.name, len(order)))
    report = summary(results)
    report["seconds"] = round(seconds, 1)
    text = json.dumps(report, indent=2) + "\n"
    if a.output:
        a.output.write_text(text)
    if a.format == "json":
        sys.stdout.write(text)
    else:
        print(f"killed {report['kill_rate']} mutants in {report['seconds']:.0f} s")
        by_file: dict[str, dict[str, int]] = report["by_file"]  # type: ignore[assignment]
        for name, c in by_file.items():
            print(f"  {name}: {c['killed']}/{c['total']}")
    if report["error"]:
        return 2
    return 1 if report["survived"] else 0


if __name__ == "__main__":
    sys.exit(main())
