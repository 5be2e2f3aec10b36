/* llmir's onnxruntime custom op for GGUF (ggml) block-quantized weights, read as stored.
 *
 * Domain `ai.llmir`, op `MatMulGGUF`: Y[..., N] = X[..., K] @ dequant(W)^T. Inputs: X f32
 * [..., K]; W uint8 [N, row_bytes], the GGUF tensor's rows exactly as the file holds them
 * (row_bytes = K / block_elems * block_bytes). String attribute `format` (the block format, a
 * llmir_core.quant.gguf_blocks scheme): q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k
 * iq4_nl iq4_xs; optional `epilogue = "swiglu"` (q8_act.h: W = [W_gate; W_up], Y [..., N/2]).
 * Every call checks its tensors (a format it does not know, W's row bytes not whole blocks, X's
 * K not W's: an onnxruntime error). The weights are read in place: no repacked copy.
 *
 * Each format has one `unpack` (a block -> its int8 codes in element order, one f32 scale and
 * one f32 min per 16 elements, x = scale * code - min); the scales and mins are the products
 * gguf.quants.dequantize forms (d * sub-scale, dmin * sub-min) in f32, so
 * - the exact dequantizer (`deq_block`: scale * code, then minus min, in f32) is bit-identical to
 *   gguf's: every product in it is exact in f32 (an f16 scale's 11 significant bits times at
 *   most 13 bits of sub-scale and code), so its one rounding is the subtraction's, and FMA
 *   contraction (-ffp-contract) cannot change a bit. Exported as `llmir_gguf_dequant`;
 * - every call quantizes each X row once to int8 per 32 elements (llmir_quant32: max |x| / 127,
 *   round half to even; what llama.cpp's q8 activations and MatMulNBits' accuracy_level 4 do);
 * - decode, 1-4 rows of X (M <= GEMV_ROWS): every weight block is unpacked once for the M rows
 *   and each 32 codes take an integer dot product (AVX-512 VNNI's vpdpbusd where llmir_isa()
 *   chose it, codes unsigned; else vpmaddubsw: unsigned codes straight, signed ones with the sign
 *   trick; vpmaddwd) scaled by [scale of the first 16, of the second 16] * d_x; the mins enter as
 *   min * d_x * (sum of the 16 or 32 x codes), and so do the fixed offsets of q4_0 / q5_0 / q3_k /
 *   q6_k (and VNNI's +128 of 8-bit codes), whose codes are taken unsigned. q4_k / q5_k / q6_k and
 *   the 32-element formats have their own loops with the codes in registers (gemv_row_k45,
 *   gemv_row_q6k, gemv_row32); q2_k / q3_k / iq4_xs go through unpack (gemv_row, AVX2 dots).
 * - batched decode (M <= BATCH_ROWS = 12, several sequences; not q4_k / q5_k): each weight row
 *   is unpacked once per call into an L1 buffer (codes, lane scales, mins with the offsets folded
 *   in) and used for every X row, in register blocks of 8 rows (AVX2) or 12 (AVX-512: 32
 *   registers); see "decode: batched rows".
 *   Numerically, both: X rounded to int8 per block times the exact weights, summed in f32 (the
 *   order differs from a dequantize-then-dot only by f32 rounding).
 * - prefill (larger M; q4_k / q5_k from 5 rows): panels of 16 weight rows unpacked once into unsigned int8 codes with
 *   their scales and mins, tiles of 4 X rows taking integer block dots (AVX-512 VNNI's vpdpbusd
 *   where llmir_isa() chose it, else vpmaddubsw / vpmaddwd; see "prefill: int8 activations"): decode's
 *   numerics, so a prompt prefilled at once and fed token by token agree up to f32 summation
 *   order. Measured (benchmarks/gguf_kernels.py, M = 128, 1 thread): ~2x the exact f32 panels
 *   it replaced with VNNI; on AVX2 1.1-1.4x, except q6_k (0.85x).
 * Rows (decode) and panels (prefill) are split over onnxruntime's intra-op pool; each output is
 * summed by one task in a fixed order: the same bits at any thread count. AVX2 + FMA + F16C;
 * the AVX-512 variants (LLMIR_AVX512 functions, isa.h) run where llmir_isa() says so, chosen per
 * call (LLMIR_KERNEL_ISA=avx2 forces the AVX2 ones).
 *
 * Built with the other sources of this folder into one library (llmir_core/targets/onnxruntime/native).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "isa.h"
#include "ort_abi.h"
#include "q8_act.h"

#define GEMV_ROWS 4   /* X rows up to which the register GEMV runs (more: batched) */
#define GEMV_TASKS 32 /* parallel tasks per GEMV */
#define GEMM_PANELS 2 /* panels of NR weight rows per parallel task (prefill) */
#define MAX_ELEMS 256 /* the largest block */

#define ALWAYS static inline __attribute__((always_inline))

enum {
    F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_Q8_0, F_Q2_K, F_Q3_K, F_Q4_K, F_Q5_K, F_Q6_K,
    F_IQ4_NL, F_IQ4_XS, F_COUNT, F_BAD = -1
};

/* per format: name, elements and bytes per block, whether it has mins, whether its codes are
 * all >= 0 (vpmaddubsw takes them as its unsigned operand directly) */
static const struct {
    const char *name;
    int elems, bytes, has_min, uns;
} FMT[F_COUNT] = {
    {"q4_0", 32, 18, 0, 0},   {"q4_1", 32, 20, 1, 1},    {"q5_0", 32, 22, 0, 0},
    {"q5_1", 32, 24, 1, 1},   {"q8_0", 32, 34, 0, 0},    {"q2_k", 256, 84, 1, 1},
    {"q3_k", 256, 110, 0, 0}, {"q4_k", 256, 144, 1, 1},  {"q5_k", 256, 176, 1, 1},
    {"q6_k", 256, 210, 0, 0}, {"iq4_nl", 32, 18, 0, 0},  {"iq4_xs", 256, 136, 0, 0},
};

static int format_index(const char *name) {
    for (int f = 0; f < F_COUNT; f++)
        if (strcmp(name, FMT[f].name) == 0) return f;
    return F_BAD;
}

/* -- unpacking one block ------------------------------------------------------------------- */

static inline float h2f(const uint8_t *p) {
    uint16_t u;
    memcpy(&u, p, 2);
    return _cvtsh_ss(u);
}

/* the non-linear 4-bit grid of iq4_nl / iq4_xs, in both 128-bit lanes (vpshufb) */
static inline __m256i iq4_grid(void) {
    return _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                            113, -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69,
                            89, 113);
}

/* 16 bytes -> 32 codes: the 16 low nibbles, then the 16 high nibbles */
ALWAYS __m256i nibbles16(const uint8_t *p) {
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

/* byte j = 0x10 where bit j of the little-endian u32 at p is set, else 0 */
ALWAYS __m256i bit16s(const uint8_t *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)u), pick);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit),
                            _mm256_set1_epi8(0x10));
}

static inline void store32(int8_t *q, __m256i c) { _mm256_store_si256((__m256i *)q, c); }

/* dst[0..16) = d * the 16 bytes of v (signed or unsigned) */
ALWAYS void store16f(float *dst, float d, __m128i v, const int is_signed) {
    __m256i a = is_signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
    __m256i b = is_signed ? _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)) : _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));
    _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(a)));
    _mm256_storeu_ps(dst + 8, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(b)));
}

/* q4_k / q5_k: the 12-byte field of 8 six-bit scales and 8 six-bit mins */
static inline void k_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63, *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Block s of format f -> codes q[elems] (aligned 32), per 16 elements sc[] and mn[] with
 * x = sc * q - mn (mn written only for the formats with mins). The f32 products are gguf's.
 * gemv: q3_k's codes taken unsigned (q + 4, 0..7) with mn = 4 * sc (the GEMV's form). */
ALWAYS void unpack(const int f, const uint8_t *s, int8_t *q, float *sc, float *mn, const int gemv) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    switch (f) {
    case F_Q4_0:
    case F_Q4_1:
    case F_IQ4_NL: {
        __m256i c = nibbles16(s + (f == F_Q4_1 ? 4 : 2));
        if (f == F_Q4_0) c = _mm256_sub_epi8(c, _mm256_set1_epi8(8));
        if (f == F_IQ4_NL) c = _mm256_shuffle_epi8(iq4_grid(), c);
        store32(q, c);
        sc[0] = sc[1] = h2f(s);
        if (f == F_Q4_1) mn[0] = mn[1] = -h2f(s + 2); /* x = d * q + m */
        break;
    }
    case F_Q5_0:
    case F_Q5_1: {
        const int o = f == F_Q5_1 ? 4 : 2; /* qh, then qs */
        __m256i c = _mm256_or_si256(nibbles16(s + o + 4), bit16s(s + o));
        if (f == F_Q5_0) c = _mm256_sub_epi8(c, _mm256_set1_epi8(16));
        store32(q, c);
        sc[0] = sc[1] = h2f(s);
        if (f == F_Q5_1) mn[0] = mn[1] = -h2f(s + 2);
        break;
    }
    case F_Q8_0:
        store32(q, _mm256_loadu_si256((const __m256i *)(s + 2)));
        sc[0] = sc[1] = h2f(s);
        break;
    case F_Q2_K: { /* scales[16] | qs[64] | d | dmin; element 128h + 32t + l: qs[32h + l] >> 2t */
        const float d = h2f(s + 80), dmin = h2f(s + 82);
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(s + 16 + 32 * h));
            for (int t = 0; t < 4; t++)
                store32(q + 128 * h + 32 * t, _mm256_and_si256(_mm256_srli_epi16(v, 2 * t), m2));
        }
        const __m128i v = _mm_loadu_si128((const __m128i *)s), n4 = _mm_set1_epi8(15);
        store16f(sc, d, _mm_and_si128(v, n4), 0);
        store16f(mn, dmin, _mm_and_si128(_mm_srli_epi16(v, 4), n4), 0);
        break;
    }
    case F_Q3_K: { /* hmask[32] | qs[64] | scales[12] | d; element 32i + l: bit i of hmask[l] */
        const float d = h2f(s + 108);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)s);
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(s + 32 + 32 * h));
            for (int t = 0; t < 4; t++) {
                const int i = 4 * h + t;
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(v, 2 * t), m2);
                __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, i), one);
                /* a cleared hmask bit subtracts 4 */
                if (gemv) store32(q + 32 * i, _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)));
                else store32(q + 32 * i, _mm256_sub_epi8(lo, _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2)));
            }
        }
        /* 16 six-bit scales: low 4 bits j < 8: b[j] & 15, else b[j - 8] >> 4; high 2 bits: bits
         * 2 (j / 4) of b[8 + j % 4]; minus 32 */
        uint32_t a[4], t;
        memcpy(a, s + 96, 12);
        const uint32_t k4 = 0x0f0f0f0f, k2 = 0x03030303;
        t = a[2];
        a[2] = ((a[0] >> 4) & k4) | ((t >> 4) & k2) << 4;
        a[3] = ((a[1] >> 4) & k4) | ((t >> 6) & k2) << 4;
        a[0] = (a[0] & k4) | (t & k2) << 4;
        a[1] = (a[1] & k4) | ((t >> 2) & k2) << 4;
        store16f(sc, d, _mm_sub_epi8(_mm_loadu_si128((const __m128i *)a), _mm_set1_epi8(32)), 1);
        if (gemv)
            for (int i = 0; i < 16; i += 8)
                _mm256_storeu_ps(mn + i, _mm256_mul_ps(_mm256_set1_ps(4.0f), _mm256_loadu_ps(sc + i)));
        break;
    }
    case F_Q4_K:
    case F_Q5_K: { /* d | dmin | scales[12] | (q5_k: qh[32]) | qs[128] */
        const float d = h2f(s), dmin = h2f(s + 2);
        const uint8_t *qs = s + (f == F_Q5_K ? 48 : 16);
        __m256i qh = _mm256_setzero_si256();
        if (f == F_Q5_K) qh = _mm256_loadu_si256((const __m256i *)(s + 16));
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c, 2c+1: low, high nibbles of 32 bytes */
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (f == F_Q5_K) { /* bit i of qh[l]: the fifth bit of element l of sub-block i */
                __m256i b0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one);
                __m256i b1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one);
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(b0, 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(b1, 4));
            }
            store32(q + 64 * c, lo);
            store32(q + 64 * c + 32, hi);
        }
        for (int j = 0; j < 8; j++) {
            int scj, mj;
            k_scale_min(s + 4, j, &scj, &mj);
            sc[2 * j] = sc[2 * j + 1] = d * (float)scj;
            mn[2 * j] = mn[2 * j + 1] = dmin * (float)mj;
        }
        break;
    }
    case F_Q6_K: { /* ql[128] | qh[64] | scales:i8[16] | d; element 128h + 32k + l */
        const float d = h2f(s + 208);
        const __m256i off = _mm256_set1_epi8(32);
        for (int h = 0; h < 2; h++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(s + 64 * h));
            __m256i b = _mm256_loadu_si256((const __m256i *)(s + 64 * h + 32));
            __m256i hq = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * h));
            __m256i low[4] = {_mm256_and_si256(a, m4), _mm256_and_si256(b, m4),
                              _mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)};
            for (int k = 0; k < 4; k++) {
                __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 2 * k), m2), 4);
                store32(q + 128 * h + 32 * k, _mm256_sub_epi8(_mm256_or_si256(low[k], hi), off));
            }
        }
        for (int j = 0; j < 16; j++) sc[j] = d * (float)(int8_t)s[192 + j];
        break;
    }
    case F_IQ4_XS: { /* d | scales_h:u16 | scales_l[4] | qs[128]; sub-block j: qs[16j..16j+15] */
        const float d = h2f(s);
        uint16_t sh;
        memcpy(&sh, s + 2, 2);
        for (int p = 0; p < 4; p++) { /* sub-blocks 2p (bytes 0-15) and 2p+1 (bytes 16-31) */
            __m256i v = _mm256_loadu_si256((const __m256i *)(s + 8 + 32 * p));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            store32(q + 64 * p, _mm256_shuffle_epi8(iq4_grid(), _mm256_permute2x128_si256(lo, hi, 0x20)));
            store32(q + 64 * p + 32,
                    _mm256_shuffle_epi8(iq4_grid(), _mm256_permute2x128_si256(lo, hi, 0x31)));
        }
        for (int j = 0; j < 8; j++) {
            int ls = (s[4 + j / 2] >> (4 * (j % 2))) & 15, hs = (sh >> (2 * j)) & 3;
            sc[2 * j] = sc[2 * j + 1] = d * (float)((ls | hs << 4) - 32);
        }
        break;
    }
    }
}

/* -- the exact dequantizer ------------------------------------------------------------------- */

/* block s of format f -> dst[elems]: sc * q (exact), minus mn rounded to f32 (gguf's values) */
ALWAYS void deq_block(const int f, const uint8_t *s, float *dst) {
    int8_t q[MAX_ELEMS] __attribute__((aligned(32)));
    float sc[16], mn[16];
    unpack(f, s, q, sc, mn, 0);
    const int E = FMT[f].elems;
    for (int i = 0; i < E; i += 8) {
        __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
        __m256 x = _mm256_mul_ps(_mm256_set1_ps(sc[i / 16]), c);
        if (FMT[f].has_min) x = _mm256_sub_ps(x, _mm256_set1_ps(mn[i / 16]));
        _mm256_storeu_ps(dst + i, x);
    }
}

#define DEQ_ROW(F) \
    static void deq_##F(const uint8_t *s, int64_t blocks, float *dst) { \
        for (int64_t b = 0; b < blocks; b++) \
            deq_block(F, s + b * FMT[F].bytes, dst + b * FMT[F].elems); \
    }
DEQ_ROW(F_Q4_0) DEQ_ROW(F_Q4_1) DEQ_ROW(F_Q5_0) DEQ_ROW(F_Q5_1) DEQ_ROW(F_Q8_0)
DEQ_ROW(F_Q2_K) DEQ_ROW(F_Q3_K) DEQ_ROW(F_Q4_K) DEQ_ROW(F_Q5_K) DEQ_ROW(F_Q6_K)
DEQ_ROW(F_IQ4_NL) DEQ_ROW(F_IQ4_XS)

typedef void (*DeqRowFn)(const uint8_t *, int64_t, float *);
static const DeqRowFn DEQ[F_COUNT] = {
    deq_F_Q4_0, deq_F_Q4_1, deq_F_Q5_0, deq_F_Q5_1, deq_F_Q8_0, deq_F_Q2_K,
    deq_F_Q3_K, deq_F_Q4_K, deq_F_Q5_K, deq_F_Q6_K, deq_F_IQ4_NL, deq_F_IQ4_XS,
};

/* rows x cols weights of `format` (rows of cols / elems blocks, back to back) -> dst f32,
 * bit-identical to gguf.quants.dequantize. 0: done; 1: unknown format; 2: cols not whole blocks
 * (or a negative or overflowing size). */
__attribute__((visibility("default"))) int llmir_gguf_dequant(const char *format, const uint8_t *src,
                                                              int64_t rows, int64_t cols, float *dst) {
    const int f = format ? format_index(format) : F_BAD;
    if (f == F_BAD) return 1;
    int64_t total;
    if (rows < 0 || cols < 0 || cols % FMT[f].elems || !llmir_mul_ok(rows, cols, &total)) return 2;
    DEQ[f](src, total / FMT[f].elems, dst);
    return 0;
}

/* -- decode: int8 activations ---------------------------------------------------------------- */

typedef struct GgJob {
    const float *x;   /* [M, K] */
    const uint8_t *w; /* [N, rb] */
    float *y;         /* [M, ldy] */
    int64_t M, N, K, rb, ldy;
    int fmt, chunk;
    int8_t *xq; /* [M, K] codes */
    float *dx;  /* [M, K/32] the blocks' scales */
    float *xs;  /* [M, K/16] d_x * the sum of each 16 codes */
    float *xs32; /* [M, K/32] d_x * the sum of each 32 codes */
    int32_t *xi; /* [M, K/16] the sum of each 16 codes (prefill) */
    int vnni;    /* llmir_isa() chose AVX-512: VNNI's vpdpbusd for the block dots */
    int *failed; /* prefill: set when a task cannot allocate its panel */
    void *ubuf;  /* batched decode: each task's unpacked weight row (unpacked_bytes(K) each) */
} GgJob;

static void quantize_rows(GgJob *j) {
    const int64_t nb = j->K / 32;
    for (int64_t m = 0; m < j->M; m++)
        for (int64_t b = 0; b < nb; b++) {
            int8_t *q = j->xq + m * j->K + b * 32;
            float d = llmir_quant32(j->x + m * j->K + b * 32, q, NULL);
            int s0 = 0, s1 = 0;
            for (int i = 0; i < 16; i++) s0 += q[i], s1 += q[16 + i];
            j->dx[m * nb + b] = d;
            j->xs[(m * nb + b) * 2] = d * (float)s0;
            j->xs[(m * nb + b) * 2 + 1] = d * (float)s1;
            j->xs32[m * nb + b] = d * (float)(s0 + s1);
            j->xi[(m * nb + b) * 2] = s0;
            j->xi[(m * nb + b) * 2 + 1] = s1;
        }
}

/* c += the 4-code dot products of unsigned a and signed b per int32 lane (AVX-512 VNNI; as asm,
 * so AVX2 code may hold it: it runs only where llmir_isa() chose AVX-512) */
ALWAYS __m256i dpbusd(__m256i c, __m256i a, __m256i b) {
    __asm__("%{evex%} vpdpbusd %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
    return c;
}

/* int32 lanes of a 32-code dot product: lanes 0-3 the first 16 codes, 4-7 the second 16;
 * vnni: vpdpbusd (w unsigned) */
ALWAYS __m256i dot32(__m256i w, __m256i x, const int uns, const int vnni) {
    if (vnni) return dpbusd(_mm256_setzero_si256(), w, x);
    __m256i p = uns ? _mm256_maddubs_epi16(w, x)
                    : _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* whether format f's unpacked codes are signed (the rest are >= 0: vpmaddubsw's unsigned side) */
static inline int signed_codes(int f) { return f == F_Q8_0 || f == F_IQ4_NL || f == F_IQ4_XS; }

/* y[m, n] for the MM (= M) rows of X and weight row n of format f */
ALWAYS void gemv_row(const GgJob *j, int64_t n, const int f, const int MM) {
    const int q3 = f == F_Q3_K; /* unsigned codes, the offset as a min */
    const int E = FMT[f].elems, U = E / 32, S = E / 16, uns = FMT[f].uns || q3, hm = FMT[f].has_min || q3;
    const int64_t nb = j->K / 32, blocks = j->K / E;
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    int8_t q[MAX_ELEMS] __attribute__((aligned(32)));
    float sc[16], mn[16];
    __m256 acc[GEMV_ROWS], acc2[GEMV_ROWS], macc[GEMV_ROWS];
    for (int m = 0; m < MM; m++) acc[m] = acc2[m] = macc[m] = _mm256_setzero_ps();
    const uint8_t *w = j->w + n * j->rb;
    for (int64_t b = 0; b < blocks; b++) {
        unpack(f, w + b * FMT[f].bytes, q, sc, mn, 1);
        for (int u = 0; u < U; u++) {
            __m256i wv = _mm256_load_si256((const __m256i *)(q + 32 * u));
            /* [sc of the first 16 x4, of the second 16 x4] */
            __m256 s2 = _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(sc + 2 * u)))), idx);
            for (int m = 0; m < MM; m++) {
                const int64_t ub = m * nb + b * U + u;
                __m256i xv = _mm256_loadu_si256((const __m256i *)(j->xq + ub * 32));
                __m256 t = _mm256_mul_ps(s2, _mm256_broadcast_ss(j->dx + ub));
                if (u & 1) acc2[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(wv, xv, uns, 0)), t, acc2[m]);
                else acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(wv, xv, uns, 0)), t, acc[m]);
            }
        }
        if (hm) {
            for (int m = 0; m < MM; m++) {
                const float *xs = j->xs + m * nb * 2 + b * S;
                if (S == 16) {
                    macc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(mn), _mm256_loadu_ps(xs), macc[m]);
                    macc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(mn + 8), _mm256_loadu_ps(xs + 8), macc[m]);
                } else { /* one 32-block: its two halves in lane 0 */
                    __m256 a = _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)mn)));
                    __m256 x2 = _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)xs)));
                    macc[m] = _mm256_fmadd_ps(a, x2, macc[m]);
                }
            }
        }
    }
    for (int m = 0; m < MM; m++)
        j->y[m * j->ldy + n] = llmir_hsum(_mm256_add_ps(acc[m], acc2[m])) - (hm ? llmir_hsum(macc[m]) : 0.0f);
}

/* a 32-element block (q4_0 q4_1 q5_0 q5_1 q8_0 iq4_nl) as codes in a register, x = *d * q - *mn:
 * q4_0 / q5_0 taken unsigned with their offset as the min (8 d, 16 d) */
ALWAYS __m256i codes32(const int f, const uint8_t *s, float *d, float *mn) {
    *d = h2f(s);
    switch (f) {
    case F_Q4_0: *mn = 8.0f * *d; return nibbles16(s + 2);
    case F_Q4_1: *mn = -h2f(s + 2); return nibbles16(s + 4);
    case F_Q5_0: *mn = 16.0f * *d; return _mm256_or_si256(nibbles16(s + 6), bit16s(s + 2));
    case F_Q5_1: *mn = -h2f(s + 2); return _mm256_or_si256(nibbles16(s + 8), bit16s(s + 4));
    case F_IQ4_NL: *mn = 0.0f; return _mm256_shuffle_epi8(iq4_grid(), nibbles16(s + 2));
    default: *mn = 0.0f; return _mm256_loadu_si256((const __m256i *)(s + 2)); /* q8_0 */
    }
}

/* 32-element formats: blocks in pairs on two accumulators per X row (the FMA chain) */
ALWAYS void gemv_row32(const GgJob *j, int64_t n, const int f, const int MM, const int vnni) {
    const int64_t nb = j->K / 32, bytes = FMT[f].bytes;
    const int flip = vnni && signed_codes(f), mins = !signed_codes(f) || vnni; /* vnni: q8 + 128 */
    __m256 acc[2][GEMV_ROWS];
    __m128 macc[2][GEMV_ROWS];
    for (int m = 0; m < MM; m++)
        acc[0][m] = acc[1][m] = _mm256_setzero_ps(), macc[0][m] = macc[1][m] = _mm_setzero_ps();
    const uint8_t *w = j->w + n * j->rb;
    for (int64_t b = 0; b < nb; b += 2) {
        for (int h = 0; h < 2; h++) {
            if (h == 1 && b + 1 == nb) break;
            float d, mn;
            __m256i c = codes32(f, w + (b + h) * bytes, &d, &mn);
            if (flip) c = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80)), mn = 128.0f * d;
            for (int m = 0; m < MM; m++) {
                const int64_t ub = m * nb + b + h;
                __m256i x = _mm256_loadu_si256((const __m256i *)(j->xq + ub * 32));
                acc[h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(c, x, !signed_codes(f), vnni)),
                                            _mm256_set1_ps(d * j->dx[ub]), acc[h][m]);
                if (mins) macc[h][m] = _mm_fmadd_ss(_mm_set_ss(mn), _mm_set_ss(j->xs32[ub]), macc[h][m]);
            }
        }
    }
    for (int m = 0; m < MM; m++)
        j->y[m * j->ldy + n] = llmir_hsum(_mm256_add_ps(acc[0][m], acc[1][m])) -
                               (mins ? _mm_cvtss_f32(_mm_add_ss(macc[0][m], macc[1][m])) : 0.0f);
}

/* q4_k / q5_k, codes kept in registers: the 8 six-bit scales and mins unpacked as 4-byte words,
 * scale * d_x for the 8 sub-blocks as one vector, two accumulators per X row (the FMA chain) */
ALWAYS void gemv_row_k45(const GgJob *j, int64_t n, const int q5, const int MM, const int vnni) {
    const int64_t nb = j->K / 32, blocks = j->K / 256, bytes = q5 ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256 acc[GEMV_ROWS], acc2[GEMV_ROWS], macc[GEMV_ROWS];
    for (int m = 0; m < MM; m++) acc[m] = acc2[m] = macc[m] = _mm256_setzero_ps();
    const uint8_t *w = j->w + n * j->rb;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *s = w + b * bytes, *qs = s + (q5 ? 48 : 16);
        uint32_t u[3];
        memcpy(u, s + 4, 12);
        const uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
        uint64_t scs = (u[0] & k6) | (uint64_t)((u[2] & k4) | ((u[0] >> 6) & k2) << 4) << 32;
        uint64_t mns = (u[1] & k6) | (uint64_t)(((u[2] >> 4) & k4) | ((u[1] >> 6) & k2) << 4) << 32;
        __m256 sc8 = _mm256_mul_ps(_mm256_set1_ps(h2f(s)),
                                   _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)scs))));
        __m256 mn8 = _mm256_mul_ps(_mm256_set1_ps(h2f(s + 2)),
                                   _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mns))));
        __m256 sd[GEMV_ROWS];
        for (int m = 0; m < MM; m++) {
            sd[m] = _mm256_mul_ps(sc8, _mm256_loadu_ps(j->dx + m * nb + b * 8));
            macc[m] = _mm256_fmadd_ps(mn8, _mm256_loadu_ps(j->xs32 + m * nb + b * 8), macc[m]);
        }
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(s + 16)) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
            }
            for (int m = 0; m < MM; m++) {
                const int8_t *x = j->xq + m * j->K + b * 256 + 64 * c;
                __m256i p0 = dot32(lo, _mm256_loadu_si256((const __m256i *)x), 1, vnni);
                __m256i p1 = dot32(hi, _mm256_loadu_si256((const __m256i *)(x + 32)), 1, vnni);
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),
                                         _mm256_permutevar8x32_ps(sd[m], _mm256_set1_epi32(2 * c)), acc[m]);
                acc2[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),
                                          _mm256_permutevar8x32_ps(sd[m], _mm256_set1_epi32(2 * c + 1)), acc2[m]);
            }
        }
    }
    for (int m = 0; m < MM; m++)
        j->y[m * j->ldy + n] = llmir_hsum(_mm256_add_ps(acc[m], acc2[m])) - llmir_hsum(macc[m]);
}

/* q6_k, codes kept in registers and taken unsigned (0..63): x = sc * q - 32 * sc, the offset
 * entering as a min (32 * sc, times d_x * the sum of 16 x codes) */
ALWAYS void gemv_row_q6k(const GgJob *j, int64_t n, const int MM, const int vnni) {
    const int64_t nb = j->K / 32, blocks = j->K / 256;
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const __m256i lo_half = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), hi_half = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
    __m256 acc[GEMV_ROWS], acc2[GEMV_ROWS], macc[GEMV_ROWS];
    for (int m = 0; m < MM; m++) acc[m] = acc2[m] = macc[m] = _mm256_setzero_ps();
    const uint8_t *w = j->w + n * j->rb;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *s = w + b * 210;
        const __m256 d = _mm256_set1_ps(h2f(s + 208));
        __m256 sa = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + 192)))));
        __m256 sb = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + 200)))));
        __m256 sda[GEMV_ROWS], sdb[GEMV_ROWS]; /* per 16: scale * d_x of its 32-block */
        for (int m = 0; m < MM; m++) {
            __m256 dx = _mm256_loadu_ps(j->dx + m * nb + b * 8);
            sda[m] = _mm256_mul_ps(sa, _mm256_permutevar8x32_ps(dx, lo_half));
            sdb[m] = _mm256_mul_ps(sb, _mm256_permutevar8x32_ps(dx, hi_half));
            const float *xs = j->xs + (m * nb + b * 8) * 2;
            macc[m] = _mm256_fmadd_ps(sa, _mm256_loadu_ps(xs), macc[m]);
            macc[m] = _mm256_fmadd_ps(sb, _mm256_loadu_ps(xs + 8), macc[m]);
        }
        for (int h = 0; h < 2; h++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(s + 64 * h));
            __m256i bq = _mm256_loadu_si256((const __m256i *)(s + 64 * h + 32));
            __m256i hq = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * h));
            __m256i low[4] = {_mm256_and_si256(a, m4), _mm256_and_si256(bq, m4),
                              _mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(bq, 4), m4)};
            for (int k = 0; k < 4; k++) {
                const int u = 4 * h + k; /* the 32-block: scales 2u, 2u + 1 */
                __m256i c = _mm256_or_si256(low[k], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 2 * k), m2), 4));
                const __m256i pick = _mm256_setr_epi32(2 * (u % 4), 2 * (u % 4), 2 * (u % 4), 2 * (u % 4),
                                                       2 * (u % 4) + 1, 2 * (u % 4) + 1, 2 * (u % 4) + 1, 2 * (u % 4) + 1);
                for (int m = 0; m < MM; m++) {
                    __m256i x = _mm256_loadu_si256((const __m256i *)(j->xq + m * j->K + b * 256 + 32 * u));
                    __m256i p = dot32(c, x, 1, vnni);
                    __m256 sc2 = _mm256_permutevar8x32_ps(u < 4 ? sda[m] : sdb[m], pick);
                    if (k & 1) acc2[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc2, acc2[m]);
                    else acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc2, acc[m]);
                }
            }
        }
    }
    for (int m = 0; m < MM; m++)
        j->y[m * j->ldy + n] = llmir_hsum(_mm256_add_ps(acc[m], acc2[m])) - 32.0f * llmir_hsum(macc[m]);
}

#define ROW_KERNEL(F, MM, V)                                       \
    if (F == F_Q4_K) gemv_row_k45(j, n, 0, MM, V);                 \
    else if (F == F_Q5_K) gemv_row_k45(j, n, 1, MM, V);            \
    else if (F == F_Q6_K) gemv_row_q6k(j, n, MM, V);               \
    else if (FMT[F].elems == 32) gemv_row32(j, n, F, MM, V);       \
    else gemv_row(j, n, F, MM);

/* gemv_F (AVX2) and gemv_v_F (AVX-512 VNNI: the integer dots one vpdpbusd; q2_k / q3_k / iq4_xs
 * keep AVX2's) */
#define GEMV_FMT(F) \
    static void gemv_##F(const GgJob *j, int64_t n0, int64_t n1) { \
        for (int64_t n = n0; n < n1; n++) switch (j->M) { \
            case 1: ROW_KERNEL(F, 1, 0) break; \
            case 2: ROW_KERNEL(F, 2, 0) break; \
            case 3: ROW_KERNEL(F, 3, 0) break; \
            default: ROW_KERNEL(F, 4, 0) break; \
            } \
    } \
    static LLMIR_AVX512 void gemv_v_##F(const GgJob *j, int64_t n0, int64_t n1) { \
        for (int64_t n = n0; n < n1; n++) switch (j->M) { \
            case 1: ROW_KERNEL(F, 1, 1) break; \
            case 2: ROW_KERNEL(F, 2, 1) break; \
            case 3: ROW_KERNEL(F, 3, 1) break; \
            default: ROW_KERNEL(F, 4, 1) break; \
            } \
    }
GEMV_FMT(F_Q4_0) GEMV_FMT(F_Q4_1) GEMV_FMT(F_Q5_0) GEMV_FMT(F_Q5_1) GEMV_FMT(F_Q8_0)
GEMV_FMT(F_Q2_K) GEMV_FMT(F_Q3_K) GEMV_FMT(F_Q4_K) GEMV_FMT(F_Q5_K) GEMV_FMT(F_Q6_K)
GEMV_FMT(F_IQ4_NL) GEMV_FMT(F_IQ4_XS)

typedef void (*GemvFn)(const GgJob *, int64_t, int64_t);
static const GemvFn GEMV[2][F_COUNT] = {
    {gemv_F_Q4_0, gemv_F_Q4_1, gemv_F_Q5_0, gemv_F_Q5_1, gemv_F_Q8_0, gemv_F_Q2_K,
     gemv_F_Q3_K, gemv_F_Q4_K, gemv_F_Q5_K, gemv_F_Q6_K, gemv_F_IQ4_NL, gemv_F_IQ4_XS},
    {gemv_v_F_Q4_0, gemv_v_F_Q4_1, gemv_v_F_Q5_0, gemv_v_F_Q5_1, gemv_v_F_Q8_0, gemv_v_F_Q2_K,
     gemv_v_F_Q3_K, gemv_v_F_Q4_K, gemv_v_F_Q5_K, gemv_v_F_Q6_K, gemv_v_F_IQ4_NL, gemv_v_F_IQ4_XS},
};

static void gemv_task(void *p, size_t i) {
    const GgJob *j = (const GgJob *)p;
    int64_t n0 = (int64_t)i * j->chunk, n1 = n0 + j->chunk;
    GEMV[j->vnni][j->fmt](j, n0, n1 < j->N ? n1 : j->N);
}

/* -- decode: batched rows (M <= BATCH_ROWS) -------------------------------------------------- *
 * Each task takes a run of weight rows; each weight row is unpacked once per call (unpack_row:
 * codes in element order, the scale of every int32 lane of a 32-code dot, and per 16 elements
 * the min x = scale * code - min, the fixed code offsets of q4_0 / q5_0 / q3_k / q6_k, and
 * AVX-512's +128 for 8-bit codes, folded into it) into an L1 buffer, then every X row takes it
 * in register blocks of RB rows (the last block shorter): per 32 codes one integer dot per row
 * (vpdpbusd with AVX-512 VNNI; else vpmaddubsw, with the sign trick for 8-bit codes, and
 * vpmaddwd), converted and FMA'd with the lane scales times d_x; the mins enter once per row as
 * min . (d_x * the sum of 16 x codes). The X codes of all rows stay in L1 across weight rows.
 * Numerically decode's int8 GEMV: X rounded to int8 per block times the exact weights. */

#define BATCH_ROWS 12 /* X rows up to which a call runs the batched GEMV (more: prefill) */
#define RB_AVX2 8     /* X rows per register block: AVX2 (16 ymm registers) */
#define RB_AVX512 12  /* AVX-512 (32) */

/* the most X rows format f runs through the register or batched GEMV. q4_k / q5_k: the register
 * GEMV only (benchmarks/gguf_kernels.py --decode: their prefill tiles beat the batched GEMV from
 * 5 rows, the other formats' from about 12 rows) */
static inline int64_t gemv_max_rows(int f) { return f == F_Q4_K || f == F_Q5_K ? GEMV_ROWS : BATCH_ROWS; }


/* one weight row, unpacked: q [K] codes; s8 [K/32][8] the scale of each int32 lane of a 32-code
 * dot (lanes 0-3 the first 16 codes, 4-7 the second); mn [K/16] the min of each 16 */
typedef struct {
    int8_t *q;
    float *s8, *mn;
} Unpacked;

static inline int64_t unpacked_bytes(int64_t K) { return 2 * K + ((K / 4 + 31) & ~(int64_t)31); }

/* q6_k super-block s -> u at element 256 * sb: codes 0..63, the offset 32 as the min 32 * sc */
ALWAYS void unpack_q6k(const uint8_t *s, const Unpacked *u, int64_t sb) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    const __m256 d = _mm256_set1_ps(h2f(s + 208));
    const __m256 sa = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + 192)))));
    const __m256 sb8 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(s + 200)))));
    for (int h = 0; h < 2; h++) { /* element 128h + 32k + l */
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + 64 * h));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + 64 * h + 32));
        __m256i hq = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * h));
        __m256i low[4] = {_mm256_and_si256(a, m4), _mm256_and_si256(b, m4),
                          _mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi16(b, 4), m4)};
        for (int k = 0; k < 4; k++) {
            const int i = 4 * h + k; /* the 32-block: scales 2i, 2i + 1 */
            __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hq, 2 * k), m2), 4);
            store32(u->q + 256 * sb + 32 * i, _mm256_or_si256(low[k], hi));
            const __m256i pick = _mm256_setr_epi32(2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1);
            _mm256_store_ps(u->s8 + 64 * sb + 8 * i, _mm256_permutevar8x32_ps(h ? sb8 : sa, pick));
        }
    }
    _mm256_storeu_ps(u->mn + 16 * sb, _mm256_mul_ps(_mm256_set1_ps(32.0f), sa));
    _mm256_storeu_ps(u->mn + 16 * sb + 8, _mm256_mul_ps(_mm256_set1_ps(32.0f), sb8));
}

/* weight row w of format f (K elements) -> u; vnni: 8-bit codes + 128 (unsigned), the min
 * 128 * scale */
ALWAYS void unpack_row(const int f, const uint8_t *w, int64_t K, const int vnni, const Unpacked *u) {
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    if (FMT[f].elems == 32) {
        for (int64_t b = 0; b < K / 32; b++) {
            float d, mn;
            __m256i c = codes32(f, w + b * FMT[f].bytes, &d, &mn);
            if (vnni && signed_codes(f)) c = _mm256_xor_si256(c, flip), mn = 128.0f * d;
            store32(u->q + 32 * b, c);
            _mm256_store_ps(u->s8 + 8 * b, _mm256_set1_ps(d));
            u->mn[2 * b] = u->mn[2 * b + 1] = mn;
        }
        return;
    }
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    for (int64_t sb = 0; sb < K / 256; sb++) {
        const uint8_t *s = w + sb * FMT[f].bytes;
        if (f == F_Q6_K) {
            unpack_q6k(s, u, sb);
            continue;
        }
        float sc[16], mn[16]; /* q2_k, q3_k (codes 0..7, the min 4 * sc), q4_k, q5_k, iq4_xs */
        int8_t *q = u->q + 256 * sb;
        unpack(f, s, q, sc, mn, 1);
        if (vnni && signed_codes(f))
            for (int i = 0; i < 8; i++) {
                store32(q + 32 * i, _mm256_xor_si256(_mm256_load_si256((const __m256i *)(q + 32 * i)), flip));
                mn[2 * i] = 128.0f * sc[2 * i], mn[2 * i + 1] = 128.0f * sc[2 * i + 1];
            }
        for (int i = 0; i < 8; i++)
            _mm256_store_ps(u->s8 + 64 * sb + 8 * i, _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(sc + 2 * i)))), idx));
        if (FMT[f].has_min || f == F_Q3_K || (vnni && signed_codes(f))) memcpy(u->mn + 16 * sb, mn, sizeof mn);
    }
}

/* whether format f's unpacked row has mins (own, offsets, or AVX-512's +128) */
static inline int batch_has_min(int f, int vnni) { return !signed_codes(f) || vnni; }

#define UNPACK_ROW(F) \
    static void unpack_##F(const uint8_t *w, int64_t K, int vnni, const Unpacked *u) { \
        if (vnni) unpack_row(F, w, K, 1, u); \
        else unpack_row(F, w, K, 0, u); \
    }
UNPACK_ROW(F_Q4_0) UNPACK_ROW(F_Q4_1) UNPACK_ROW(F_Q5_0) UNPACK_ROW(F_Q5_1) UNPACK_ROW(F_Q8_0)
UNPACK_ROW(F_Q2_K) UNPACK_ROW(F_Q3_K) UNPACK_ROW(F_Q4_K) UNPACK_ROW(F_Q5_K) UNPACK_ROW(F_Q6_K)
UNPACK_ROW(F_IQ4_NL) UNPACK_ROW(F_IQ4_XS)

typedef void (*UnpackFn)(const uint8_t *, int64_t, int, const Unpacked *);
static const UnpackFn UNPACK[F_COUNT] = {
    unpack_F_Q4_0, unpack_F_Q4_1, unpack_F_Q5_0, unpack_F_Q5_1, unpack_F_Q8_0, unpack_F_Q2_K,
    unpack_F_Q3_K, unpack_F_Q4_K, unpack_F_Q5_K, unpack_F_Q6_K, unpack_F_IQ4_NL, unpack_F_IQ4_XS,
};

enum { D_UNSIGNED, D_SIGNED, D_VNNI }; /* how a 32-code dot is taken */

/* acc[r] += the dot of 32-block b of the unpacked row with X row r, times lane scale * d_x */
ALWAYS void dot_block(const GgJob *j, const Unpacked *u, const int8_t *xq, const float *dx, int64_t b,
                      const int MM, const int mode, __m256 *acc) {
    const int64_t K = j->K, nb = K / 32;
    const __m256i w = _mm256_load_si256((const __m256i *)(u->q + 32 * b));
    const __m256i wa = mode == D_SIGNED ? _mm256_abs_epi8(w) : w;
    const __m256 s = _mm256_load_ps(u->s8 + 8 * b);
    _Pragma("GCC unroll 32") for (int r = 0; r < MM; r++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)(xq + r * K + 32 * b));
        __m256i p;
        if (mode == D_VNNI) p = dpbusd(_mm256_setzero_si256(), w, x);
        else p = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, mode == D_SIGNED ? _mm256_sign_epi8(x, w) : x),
                                   _mm256_set1_epi16(1));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(s, _mm256_broadcast_ss(dx + r * nb + b)), acc[r]);
    }
}

/* y[m0 + r, n] for the MM rows from m0 and weight row n, unpacked in u */
ALWAYS void dot_rows(const GgJob *j, const Unpacked *u, int64_t n, int64_t m0, const int MM, const int mode,
                     int hm) {
    const int64_t K = j->K, nb = K / 32, S = K / 16;
    const int8_t *xq = j->xq + m0 * K;
    const float *dx = j->dx + m0 * nb, *xs = j->xs + m0 * S;
    /* two accumulators per row (the FMA chain) where the registers allow: AVX-512's one block of
     * up to 8 rows. (AVX2 runs 5+ rows: enough chains; and every row of a call sums in the same
     * order wherever it sits, so a row's bits do not depend on its place in the batch.) */
    const int two = mode == D_VNNI && MM <= 8;
    __m256 acc[2 * RB_AVX512];
    _Pragma("GCC unroll 32") for (int r = 0; r < 2 * MM; r++) acc[r] = _mm256_setzero_ps();
    int64_t b = 0;
    if (two)
        for (; b + 1 < nb; b += 2) {
            dot_block(j, u, xq, dx, b, MM, mode, acc);
            dot_block(j, u, xq, dx, b + 1, MM, mode, acc + MM);
        }
    for (; b < nb; b++) dot_block(j, u, xq, dx, b, MM, mode, acc);
    if (hm) {
        int64_t i = 0;
        for (; i + 8 <= S; i += 8) {
            const __m256 mv = _mm256_loadu_ps(u->mn + i);
            _Pragma("GCC unroll 32") for (int r = 0; r < MM; r++) acc[r] = _mm256_fnmadd_ps(mv, _mm256_loadu_ps(xs + r * S + i), acc[r]);
        }
        for (; i < S; i += 2) { /* S is even */
            const __m256 mv = _mm256_zextps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(u->mn + i))));
            _Pragma("GCC unroll 32") for (int r = 0; r < MM; r++)
                acc[r] = _mm256_fnmadd_ps(
                    mv, _mm256_zextps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(xs + r * S + i)))), acc[r]);
        }
    }
    _Pragma("GCC unroll 32") for (int r = 0; r < MM; r++)
        j->y[(m0 + r) * j->ldy + n] = llmir_hsum(two ? _mm256_add_ps(acc[r], acc[MM + r]) : acc[r]);
}

typedef void (*DotRowsFn)(const GgJob *, const Unpacked *, int64_t, int64_t, int);
#define NO_TARGET
#define DOT_ROWS(NAME, ATTR, MM, MODE) \
    static ATTR void NAME(const GgJob *j, const Unpacked *u, int64_t n, int64_t m0, int hm) { \
        dot_rows(j, u, n, m0, MM, MODE, hm); \
    }
#define DOT_ROWS8(P, ATTR, MODE) \
    DOT_ROWS(P##1, ATTR, 1, MODE) DOT_ROWS(P##2, ATTR, 2, MODE) DOT_ROWS(P##3, ATTR, 3, MODE) \
    DOT_ROWS(P##4, ATTR, 4, MODE) DOT_ROWS(P##5, ATTR, 5, MODE) DOT_ROWS(P##6, ATTR, 6, MODE) \
    DOT_ROWS(P##7, ATTR, 7, MODE) DOT_ROWS(P##8, ATTR, 8, MODE)
DOT_ROWS8(dot_u, NO_TARGET, D_UNSIGNED)
DOT_ROWS8(dot_s, NO_TARGET, D_SIGNED)
DOT_ROWS8(dot_v, LLMIR_AVX512, D_VNNI)
DOT_ROWS(dot_v9, LLMIR_AVX512, 9, D_VNNI) DOT_ROWS(dot_v10, LLMIR_AVX512, 10, D_VNNI)
DOT_ROWS(dot_v11, LLMIR_AVX512, 11, D_VNNI) DOT_ROWS(dot_v12, LLMIR_AVX512, 12, D_VNNI)

static const DotRowsFn DOT_U[RB_AVX2] = {dot_u1, dot_u2, dot_u3, dot_u4, dot_u5, dot_u6, dot_u7, dot_u8};
static const DotRowsFn DOT_S[RB_AVX2] = {dot_s1, dot_s2, dot_s3, dot_s4, dot_s5, dot_s6, dot_s7, dot_s8};
static const DotRowsFn DOT_V[RB_AVX512] = {dot_v1, dot_v2, dot_v3, dot_v4, dot_v5, dot_v6, dot_v7, dot_v8,
                                           dot_v9, dot_v10, dot_v11, dot_v12};

static void batch_task(void *p, size_t i) {
    const GgJob *j = (const GgJob *)p;
    const int f = j->fmt, vnni = j->vnni, hm = batch_has_min(f, vnni), rb = vnni ? RB_AVX512 : RB_AVX2;
    const DotRowsFn *dots = vnni ? DOT_V : signed_codes(f) ? DOT_S : DOT_U;
    const int64_t n0 = (int64_t)i * j->chunk, n1 = n0 + j->chunk < j->N ? n0 + j->chunk : j->N;
    int8_t *base = (int8_t *)j->ubuf + (int64_t)i * unpacked_bytes(j->K);
    const Unpacked u = {base, (float *)(base + j->K), (float *)(base + 2 * j->K)};
    for (int64_t n = n0; n < n1; n++) {
        UNPACK[f](j->w + n * j->rb, j->K, vnni, &u);
        for (int64_t m0 = 0; m0 < j->M; m0 += rb)
            dots[(j->M - m0 < rb ? j->M - m0 : rb) - 1](j, &u, n, m0, hm);
    }
}

/* -- prefill: int8 activations ------------------------------------------------------------- *
 * X is quantized as for decode (llmir_quant32 per 32-block; the code sums per 16 kept as
 * integers). For each panel of 16 weight rows (the whole of K) the blocks are unpacked once into
 * unsigned codes u = q + off (off: the format's fixed offset, 0 for the formats with mins) laid
 * out [32-block][8 groups of 4][16 rows][4 codes], with the panel's f32 scales and mins per 16
 * elements [32-block][2][16]. A tile of 4 X rows then takes, per 32-block (or per 16 where the
 * scales are per 16), integer dots of the broadcast 4 x codes with the 16 rows' codes:
 * - with AVX-512 VNNI (llmir_isa()), vpdpbusd straight into int32;
 * - else vpmaddubsw summed in int16 over as many groups as cannot saturate (8 for codes < 16,
 *   4 for < 32, 2 for < 64), then vpmaddwd to int32; 8-bit codes (q8_0, iq4) stay signed and
 *   take the sign trick, one group at a time (|sum| <= 2 * 128 * 127);
 * minus off * (the x code sum), times scale_w * d_x in one f32 FMA per 8 rows, minus
 * min_w * d_x * (the x code sum) for the formats with mins: decode's numerics, summed in another
 * order. Panels are split over the pool; each output is one task's, in a fixed order. */

#define I8_MR 4 /* X rows per tile */

/* the offset that makes format f's codes unsigned for vpmaddubsw / vpdpbusd */
static int code_offset(int f, int vnni) {
    switch (f) {
    case F_Q4_0: return 8;
    case F_Q5_0: return 16;
    case F_Q3_K: return 4;
    case F_Q6_K: return 32;
    case F_Q8_0:
    case F_IQ4_NL:
    case F_IQ4_XS: return vnni ? 128 : 0; /* AVX2: signed codes, the sign trick */
    default: return 0;
    }
}

/* rows n0 .. n0 + nr of W -> the panel: pw codes, ps scales, pm mins (see above) */
static void i8_pack_panel(const GgJob *j, int64_t n0, int nr, int off, uint8_t *pw, float *ps, float *pm) {
    const int f = j->fmt, E = FMT[f].elems, B = FMT[f].bytes, U = E / 32, hm = FMT[f].has_min;
    const int64_t blocks = j->K / E;
    int8_t q[NR][MAX_ELEMS] __attribute__((aligned(32)));
    float sc[NR][16], mn[NR][16];
    const __m256i o = _mm256_set1_epi8((char)off);
    for (int64_t wb = 0; wb < blocks; wb++) {
        for (int r = 0; r < NR; r++) {
            if (r < nr) {
                unpack(f, j->w + (n0 + r) * j->rb + wb * B, q[r], sc[r], mn[r], 0);
            } else {
                memset(q[r], 0, (size_t)E);
                memset(sc[r], 0, sizeof sc[r]);
                memset(mn[r], 0, sizeof mn[r]);
            }
        }
        for (int u = 0; u < U; u++) {
            const int64_t b = wb * U + u;
            for (int h = 0; h < 2; h++) {
                __m256 r8[8];
                for (int i = 0; i < 8; i++)
                    r8[i] = _mm256_castsi256_ps(
                        _mm256_add_epi8(_mm256_load_si256((const __m256i *)(q[h * 8 + i] + 32 * u)), o));
                llmir_transpose8_store(r8, (float *)(pw + b * 512 + h * 32), 16);
            }
            for (int r = 0; r < NR; r++) {
                ps[b * 32 + r] = sc[r][2 * u], ps[b * 32 + 16 + r] = sc[r][2 * u + 1];
                if (hm) pm[b * 32 + r] = mn[r][2 * u], pm[b * 32 + 16 + r] = mn[r][2 * u + 1];
            }
        }
    }
}

/* Y[m0 .. m0 + mr, n0 .. n0 + nr] from the panel */
ALWAYS void i8_tile(const GgJob *j, const uint8_t *pw, const float *ps, const float *pm, int64_t m0,
                    int mr, int64_t n0, int nr, const int f, const int vnni) {
    const int64_t nb = j->K / 32, K = j->K;
    const int s16 = f == F_Q2_K || f == F_Q3_K || f == F_Q6_K, hm = FMT[f].has_min;
    const int wide = !vnni && (f == F_Q8_0 || f == F_IQ4_NL || f == F_IQ4_XS);
    const int span = wide ? 1 : f == F_Q6_K ? 2 : (f == F_Q5_0 || f == F_Q5_1 || f == F_Q5_K) ? 4 : 8;
    const int off = code_offset(f, vnni);
    int64_t ri[I8_MR]; /* the X rows (past mr: row m0 again, not stored) */
    for (int r = 0; r < I8_MR; r++) ri[r] = m0 + (r < mr ? r : 0);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[I8_MR][2];
    for (int r = 0; r < I8_MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = pw + b * 512;
        for (int h = 0; h < (s16 ? 2 : 1); h++) {
            const int g0 = s16 ? 4 * h : 0, g1 = s16 ? g0 + 4 : 8;
            __m256i c[I8_MR][2];
            for (int r = 0; r < I8_MR; r++) c[r][0] = c[r][1] = _mm256_setzero_si256();
            for (int gs = g0; gs < g1; gs += (vnni ? 8 : span)) {
                __m256i t[I8_MR][2];
                for (int r = 0; r < I8_MR; r++) t[r][0] = t[r][1] = _mm256_setzero_si256();
                const int ge = vnni || gs + span > g1 ? g1 : gs + span;
                for (int g = gs; g < ge; g++) {
                    __m256i w0 = _mm256_load_si256((const __m256i *)(wb + g * 64));
                    __m256i w1 = _mm256_load_si256((const __m256i *)(wb + g * 64 + 32));
                    __m256i a0 = wide ? _mm256_abs_epi8(w0) : w0, a1 = wide ? _mm256_abs_epi8(w1) : w1;
                    for (int r = 0; r < I8_MR; r++) {
                        int32_t v;
                        memcpy(&v, j->xq + ri[r] * K + b * 32 + g * 4, 4);
                        __m256i xb = _mm256_set1_epi32(v);
                        if (vnni) {
                            c[r][0] = dpbusd(c[r][0], w0, xb);
                            c[r][1] = dpbusd(c[r][1], w1, xb);
                        } else if (wide) {
                            t[r][0] = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0));
                            t[r][1] = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1));
                        } else {
                            t[r][0] = _mm256_add_epi16(t[r][0], _mm256_maddubs_epi16(w0, xb));
                            t[r][1] = _mm256_add_epi16(t[r][1], _mm256_maddubs_epi16(w1, xb));
                        }
                    }
                }
                if (!vnni)
                    for (int r = 0; r < I8_MR; r++) {
                        c[r][0] = _mm256_add_epi32(c[r][0], _mm256_madd_epi16(t[r][0], ones));
                        c[r][1] = _mm256_add_epi32(c[r][1], _mm256_madd_epi16(t[r][1], ones));
                    }
            }
            const float *sp = ps + b * 32 + 16 * h, *mp = pm + b * 32 + 16 * h;
            const __m256 s0 = _mm256_loadu_ps(sp), s1 = _mm256_loadu_ps(sp + 8);
            for (int r = 0; r < I8_MR; r++) {
                const int32_t *xi = j->xi + (ri[r] * nb + b) * 2;
                if (off) {
                    __m256i z = _mm256_set1_epi32(off * (s16 ? xi[h] : xi[0] + xi[1]));
                    c[r][0] = _mm256_sub_epi32(c[r][0], z);
                    c[r][1] = _mm256_sub_epi32(c[r][1], z);
                }
                const __m256 d = _mm256_set1_ps(j->dx[ri[r] * nb + b]);
                acc[r][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[r][0]), _mm256_mul_ps(s0, d), acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[r][1]), _mm256_mul_ps(s1, d), acc[r][1]);
                if (hm) {
                    const __m256 xs = _mm256_set1_ps(s16 ? j->xs[(ri[r] * nb + b) * 2 + h] : j->xs32[ri[r] * nb + b]);
                    acc[r][0] = _mm256_fnmadd_ps(_mm256_loadu_ps(mp), xs, acc[r][0]);
                    acc[r][1] = _mm256_fnmadd_ps(_mm256_loadu_ps(mp + 8), xs, acc[r][1]);
                }
            }
        }
    }
    for (int r = 0; r < mr; r++) {
        float *y = j->y + (m0 + r) * j->ldy + n0;
        if (nr == NR) {
            _mm256_storeu_ps(y, acc[r][0]);
            _mm256_storeu_ps(y + 8, acc[r][1]);
            continue;
        }
        float t[NR];
        _mm256_storeu_ps(t, acc[r][0]);
        _mm256_storeu_ps(t + 8, acc[r][1]);
        for (int c = 0; c < nr; c++) y[c] = t[c];
    }
}

#define I8_TILES(F)                                                                                \
    static void i8_tiles_##F(const GgJob *j, const uint8_t *pw, const float *ps, const float *pm, \
                             int64_t n0, int nr) {                                                 \
        for (int64_t m0 = 0; m0 < j->M; m0 += I8_MR) {                                             \
            const int mr = j->M - m0 < I8_MR ? (int)(j->M - m0) : I8_MR;                          \
            if (j->vnni) i8_tile(j, pw, ps, pm, m0, mr, n0, nr, F, 1);                             \
            else i8_tile(j, pw, ps, pm, m0, mr, n0, nr, F, 0);                                     \
        }                                                                                          \
    }
I8_TILES(F_Q4_0) I8_TILES(F_Q4_1) I8_TILES(F_Q5_0) I8_TILES(F_Q5_1) I8_TILES(F_Q8_0)
I8_TILES(F_Q2_K) I8_TILES(F_Q3_K) I8_TILES(F_Q4_K) I8_TILES(F_Q5_K) I8_TILES(F_Q6_K)
I8_TILES(F_IQ4_NL) I8_TILES(F_IQ4_XS)

typedef void (*I8TilesFn)(const GgJob *, const uint8_t *, const float *, const float *, int64_t, int);
static const I8TilesFn I8_TILES_OF[F_COUNT] = {
    i8_tiles_F_Q4_0, i8_tiles_F_Q4_1, i8_tiles_F_Q5_0, i8_tiles_F_Q5_1, i8_tiles_F_Q8_0, i8_tiles_F_Q2_K,
    i8_tiles_F_Q3_K, i8_tiles_F_Q4_K, i8_tiles_F_Q5_K, i8_tiles_F_Q6_K, i8_tiles_F_IQ4_NL, i8_tiles_F_IQ4_XS,
};

static void i8_gemm_task(void *p, size_t i) {
    const GgJob *j = (const GgJob *)p;
    const int64_t nb = j->K / 32;
    uint8_t *pw = (uint8_t *)aligned_alloc(32, (size_t)nb * (512 + 2 * 32 * sizeof(float)));
    if (!pw) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *ps = (float *)(pw + nb * 512), *pm = ps + nb * 32;
    for (int q = 0; q < GEMM_PANELS; q++) {
        const int64_t n0 = ((int64_t)i * GEMM_PANELS + q) * NR;
        if (n0 >= j->N) break;
        const int nr = j->N - n0 < NR ? (int)(j->N - n0) : NR;
        i8_pack_panel(j, n0, nr, code_offset(j->fmt, j->vnni), pw, ps, pm);
        I8_TILES_OF[j->fmt](j, pw, ps, pm, n0, nr);
    }
    free(pw);
}

/* -- the custom op ---------------------------------------------------------------------------- */

typedef struct GgKernel {
    const OrtApi *api;
    int fmt, epilogue; /* fmt: F_BAD when the attribute is absent or unknown */
} GgKernel;

static void *gg_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    (void)op;
    GgKernel *k = (GgKernel *)malloc(sizeof(GgKernel));
    if (!k) return NULL;
    k->api = api, k->fmt = F_BAD, k->epilogue = llmir_epilogue_attr(api, info);
    char buf[16];
    size_t size = sizeof buf;
    OrtStatus *st = API(api, I_KernelInfoGetAttribute_string, KernelInfoGetAttrStringFn)(
        info, "format", buf, &size);
    if (st) API(api, I_ReleaseStatus, ReleaseStatusFn)(st); /* absent or too long: F_BAD */
    else k->fmt = format_index(buf);
    return k;
}

static void gg_destroy(void *k) { free(k); }

static OrtStatus *gg_error(const OrtApi *api, const char *msg) {
    return llmir_error(api, ORT_INVALID_ARGUMENT, msg);
}

static OrtStatus *gg_compute(void *kp, OrtKernelContext *ctx) {
    GgKernel *kn = (GgKernel *)kp;
    const OrtApi *api = kn->api;
    if (kn->fmt == F_BAD)
        return gg_error(api, "ai.llmir MatMulGGUF: attribute format must be one of q4_0 q4_1 q5_0 "
                             "q5_1 q8_0 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs");
    if (kn->epilogue == EPI_BAD)
        return gg_error(api, "ai.llmir MatMulGGUF: unknown epilogue (expected \"swiglu\" or none)");
    const OrtValue *xv = NULL, *wv = NULL;
    OrtValue *yv = NULL;
    OrtStatus *st;
    GetInputFn get = API(api, I_KernelContext_GetInput, GetInputFn);
    if ((st = get(ctx, 0, &xv)) || (st = get(ctx, 1, &wv))) return st;
    const int f = kn->fmt, swiglu = kn->epilogue == EPI_SWIGLU;
    int64_t xd[8], wd[8], yd[8], K;
    int xr = llmir_shape_of(api, xv, xd), wr = llmir_shape_of(api, wv, wd);
    if (wr != 2 || wd[1] % FMT[f].bytes || !llmir_mul_ok(wd[1] / FMT[f].bytes, FMT[f].elems, &K))
        return gg_error(api, "ai.llmir MatMulGGUF: W must be uint8 [N, row_bytes] with row_bytes "
                             "whole blocks of its format");
    if (xr < 1 || xd[xr - 1] != K || llmir_rows(xd, xr - 1) < 0)
        return gg_error(api, "ai.llmir MatMulGGUF: X [..., K] does not match W [N, K / block "
                             "elements * block bytes]");
    const int64_t M = llmir_rows(xd, xr - 1), N = wd[0], NO = swiglu ? N / 2 : N;
    if (swiglu && N % 2)
        return gg_error(api, "ai.llmir MatMulGGUF: epilogue \"swiglu\" needs an even N ([gate; up])");
    for (int i = 0; i < xr - 1; i++) yd[i] = xd[i];
    yd[xr - 1] = NO;
    if ((st = API(api, I_KernelContext_GetOutput, GetOutputFn)(ctx, 0, yd, (size_t)xr, &yv)))
        return st;
    void *x = NULL, *w = NULL, *y = NULL;
    GetTensorMutableDataFn data = API(api, I_GetTensorMutableData, GetTensorMutableDataFn);
    if ((st = data((OrtValue *)xv, &x)) || (st = data((OrtValue *)wv, &w)) || (st = data(yv, &y)))
        return st;
    if (M == 0 || NO == 0) return NULL;
    if (K == 0) {
        memset(y, 0, (size_t)(M * NO) * sizeof(float));
        return NULL;
    }
    int64_t bytes;
    if (!llmir_mul_ok(M, N, &bytes) || !llmir_mul_ok(bytes, 4, &bytes) ||
        !llmir_mul_ok(M, K, &bytes) || !llmir_mul_ok(bytes, 4, &bytes))
        return gg_error(api, "ai.llmir MatMulGGUF: X and W are too large");
    GgJob j = {(const float *)x, (const uint8_t *)w, (float *)y, M, N, K, wd[1], N, f, 0,
               NULL, NULL, NULL, NULL, NULL, 0, NULL, NULL};
    float *full = NULL; /* the epilogue: the [M, N] product first */
    if (swiglu) {
        full = (float *)aligned_alloc(32, ((size_t)(M * N) * sizeof(float) + 31) & ~(size_t)31);
        if (!full) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulGGUF: out of memory");
        j.y = full;
    }
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    /* one buffer: xq (M*K bytes), dx (M*K/32 floats), xs (M*K/16), xs32 (M*K/32), xi (M*K/16
     * int32) */
    size_t xq_bytes = ((size_t)(M * K) + 31) & ~(size_t)31;
    char *buf = (char *)aligned_alloc(32, xq_bytes + (((size_t)(M * K) / 32 * 24 + 31) & ~(size_t)31));
    if (!buf) {
        free(full);
        return llmir_error(api, ORT_FAIL, "ai.llmir MatMulGGUF: out of memory");
    }
    j.xq = (int8_t *)buf;
    j.dx = (float *)(buf + xq_bytes);
    j.xs = j.dx + M * K / 32;
    j.xs32 = j.xs + M * K / 16;
    j.xi = (int32_t *)(j.xs32 + M * K / 32);
    quantize_rows(&j);
    int failed = 0;
    j.vnni = llmir_isa() == LLMIR_ISA_AVX512, j.failed = &failed;
    if (M > gemv_max_rows(f)) {
        st = pfor(ctx, i8_gemm_task, (size_t)((N + NR * GEMM_PANELS - 1) / (NR * GEMM_PANELS)), 0, &j);
    } else if (M <= GEMV_ROWS) {
        int64_t chunk = ((N + GEMV_TASKS - 1) / GEMV_TASKS + 3) & ~(int64_t)3;
        j.chunk = (int)(chunk < 16 ? 16 : chunk);
        st = pfor(ctx, gemv_task, (size_t)((N + j.chunk - 1) / j.chunk), 0, &j);
    } else {
        int64_t chunk = ((N + GEMV_TASKS - 1) / GEMV_TASKS + 3) & ~(int64_t)3;
        j.chunk = (int)(chunk < 16 ? 16 : chunk);
        const size_t tasks = (size_t)((N + j.chunk - 1) / j.chunk);
        j.ubuf = aligned_alloc(32, tasks * (size_t)unpacked_bytes(K));
        if (!j.ubuf) failed = 1;
        else st = pfor(ctx, batch_task, tasks, 0, &j);
        free(j.ubuf);
    }
    free(buf);
    if (!st && failed) st = llmir_error(api, ORT_FAIL, "ai.llmir MatMulGGUF: out of memory");
    if (!st && full) {
        LlmirSwigluRows r = {full, (float *)y, M, NO, 0};
        st = pfor(ctx, llmir_swiglu_rows_task, (size_t)M, 0, &r);
    }
    free(full);
    return st;
}

static const char *gg_name(const OrtCustomOp *op) { (void)op; return "MatMulGGUF"; }
static int gg_input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? T_FLOAT : T_UINT8; }
static size_t gg_inputs(const OrtCustomOp *op) { (void)op; return 2; }

static OrtCustomOp op_gguf =
    LLMIR_QUANT_OP(gg_create, gg_name, gg_input_type, gg_inputs, llmir_required, gg_destroy, gg_compute);

/* adds MatMulGGUF to the ai.llmir domain (register.c) */
OrtStatus *llmir_add_matmul_gguf(const OrtApi *api, OrtCustomOpDomain *domain) {
    return API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_gguf);
}
