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
 *   contraction (-ffp-contract) cannot change a bit. Exported as `llmir_gguf_dequant`; the
 *   prefill uses it;
 * - decode (M <= GEMV_ROWS rows of X): each X row is quantized once per call to int8 per 32
 *   elements (llmir_quant32: max |x| / 127, round half to even; what llama.cpp's q8 activations
 *   and MatMulNBits' accuracy_level 4 do); every weight block is unpacked once for the M rows and
 *   each 32 codes take an integer dot product (vpmaddubsw: unsigned codes straight, signed ones
 *   with the sign trick; vpmaddwd) scaled by [scale of the first 16, of the second 16] * d_x; the
 *   mins enter as min * d_x * (sum of the 16 x codes). Numerically: X rounded to int8 per block
 *   times the exact weights, summed in f32.
 * - prefill (larger M): for each panel of 16 weight rows and 256 columns the rows are
 *   dequantized exactly (deq_block) and transposed into an f32 [256][16] panel multiplied into
 *   6-row blocks of X by llmir_micro_6x16 (f32_gemm.h): f32 activations and accumulation.
 * Rows (decode) and panels (prefill) are split over onnxruntime's intra-op pool; each output is
 * summed by one task in a fixed order: the same bits at any thread count. AVX2 + FMA + F16C.
 *
 * Built with the other sources of this folder into one library (llmir_core/backends/ort_ext).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "ort_abi.h"
#include "q8_act.h"

#define GEMV_ROWS 4   /* X rows up to which the int8-activation GEMV runs */
#define GEMV_TASKS 32 /* parallel tasks per GEMV */
#define GEMM_PANELS 2 /* panels of NR weight rows per parallel task (prefill) */
#define GK 256        /* columns per dequantized panel (prefill): a multiple of every block */
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
 * x = sc * q - mn (mn written only for the formats with mins). The f32 products are gguf's. */
ALWAYS void unpack(const int f, const uint8_t *s, int8_t *q, float *sc, float *mn) {
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
        for (int j = 0; j < 16; j++) {
            sc[j] = d * (float)(s[j] & 15);
            mn[j] = dmin * (float)(s[j] >> 4);
        }
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
                store32(q + 32 * i, _mm256_sub_epi8(lo, _mm256_slli_epi16(_mm256_xor_si256(hb, one), 2)));
            }
        }
        const uint8_t *b = s + 96;
        for (int j = 0; j < 16; j++) {
            int low = j < 8 ? b[j] & 15 : b[j - 8] >> 4;
            int high = (b[8 + j % 4] >> (2 * (j / 4))) & 3;
            sc[j] = d * (float)((low | high << 4) - 32);
        }
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
    unpack(f, s, q, sc, mn);
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
        }
}

/* int32 lanes of a 32-code dot product: lanes 0-3 the first 16 codes, 4-7 the second 16 */
ALWAYS __m256i dot32(__m256i w, __m256i x, const int uns) {
    __m256i p = uns ? _mm256_maddubs_epi16(w, x)
                    : _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* y[m, n] for the MM (= M) rows of X and weight row n of format f */
ALWAYS void gemv_row(const GgJob *j, int64_t n, const int f, const int MM) {
    const int E = FMT[f].elems, U = E / 32, S = E / 16, uns = FMT[f].uns, hm = FMT[f].has_min;
    const int64_t nb = j->K / 32, blocks = j->K / E;
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    int8_t q[MAX_ELEMS] __attribute__((aligned(32)));
    float sc[16], mn[16];
    __m256 acc[GEMV_ROWS], macc[GEMV_ROWS];
    for (int m = 0; m < MM; m++) acc[m] = macc[m] = _mm256_setzero_ps();
    const uint8_t *w = j->w + n * j->rb;
    for (int64_t b = 0; b < blocks; b++) {
        unpack(f, w + b * FMT[f].bytes, q, sc, mn);
        for (int u = 0; u < U; u++) {
            __m256i wv = _mm256_load_si256((const __m256i *)(q + 32 * u));
            /* [sc of the first 16 x4, of the second 16 x4] */
            __m256 s2 = _mm256_permutevar8x32_ps(
                _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(sc + 2 * u)))), idx);
            for (int m = 0; m < MM; m++) {
                const int64_t ub = m * nb + b * U + u;
                __m256i xv = _mm256_loadu_si256((const __m256i *)(j->xq + ub * 32));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(wv, xv, uns)),
                                         _mm256_mul_ps(s2, _mm256_broadcast_ss(j->dx + ub)), acc[m]);
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
        j->y[m * j->ldy + n] = llmir_hsum(acc[m]) - (hm ? llmir_hsum(macc[m]) : 0.0f);
}

#define GEMV_FMT(F) \
    static void gemv_##F(const GgJob *j, int64_t n0, int64_t n1) { \
        for (int64_t n = n0; n < n1; n++) switch (j->M) { \
            case 1: gemv_row(j, n, F, 1); break; \
            case 2: gemv_row(j, n, F, 2); break; \
            case 3: gemv_row(j, n, F, 3); break; \
            default: gemv_row(j, n, F, 4); break; \
            } \
    }
GEMV_FMT(F_Q4_0) GEMV_FMT(F_Q4_1) GEMV_FMT(F_Q5_0) GEMV_FMT(F_Q5_1) GEMV_FMT(F_Q8_0)
GEMV_FMT(F_Q2_K) GEMV_FMT(F_Q3_K) GEMV_FMT(F_Q4_K) GEMV_FMT(F_Q5_K) GEMV_FMT(F_Q6_K)
GEMV_FMT(F_IQ4_NL) GEMV_FMT(F_IQ4_XS)

typedef void (*GemvFn)(const GgJob *, int64_t, int64_t);
static const GemvFn GEMV[F_COUNT] = {
    gemv_F_Q4_0, gemv_F_Q4_1, gemv_F_Q5_0, gemv_F_Q5_1, gemv_F_Q8_0, gemv_F_Q2_K,
    gemv_F_Q3_K, gemv_F_Q4_K, gemv_F_Q5_K, gemv_F_Q6_K, gemv_F_IQ4_NL, gemv_F_IQ4_XS,
};

static void gemv_task(void *p, size_t i) {
    const GgJob *j = (const GgJob *)p;
    int64_t n0 = (int64_t)i * j->chunk, n1 = n0 + j->chunk;
    GEMV[j->fmt](j, n0, n1 < j->N ? n1 : j->N);
}

/* -- prefill: exact f32 panels ---------------------------------------------------------------- */

static void gemm_task(void *p, size_t i) {
    const GgJob *j = (const GgJob *)p;
    const int E = FMT[j->fmt].elems, B = FMT[j->fmt].bytes;
    float rows[NR][GK] __attribute__((aligned(32)));
    float panel[GK * NR] __attribute__((aligned(32)));
    for (int q = 0; q < GEMM_PANELS; q++) {
        const int64_t n0 = ((int64_t)i * GEMM_PANELS + q) * NR;
        if (n0 >= j->N) return;
        const int nr = j->N - n0 < NR ? (int)(j->N - n0) : NR;
        for (int64_t k0 = 0; k0 < j->K; k0 += GK) {
            const int kc = j->K - k0 < GK ? (int)(j->K - k0) : GK; /* whole blocks */
            for (int r = 0; r < NR; r++) {
                if (r < nr) DEQ[j->fmt](j->w + (n0 + r) * j->rb + k0 / E * B, kc / E, rows[r]);
                else memset(rows[r], 0, sizeof rows[r]);
            }
            for (int c0 = 0; c0 < NR; c0 += 8)
                for (int k = 0; k < kc; k += 8) {
                    __m256 r8[8];
                    for (int c = 0; c < 8; c++) r8[c] = _mm256_load_ps(rows[c0 + c] + k);
                    llmir_transpose8_store(r8, panel + k * NR + c0, NR);
                }
            for (int64_t m0 = 0; m0 < j->M; m0 += MR) {
                const int mr = j->M - m0 < MR ? (int)(j->M - m0) : MR;
                llmir_micro_6x16(j->x + m0 * j->K + k0, j->K, j->y + m0 * j->ldy + n0, j->ldy, panel,
                                 mr, nr, kc, k0 != 0);
            }
        }
    }
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
               NULL, NULL, NULL};
    float *full = NULL; /* the epilogue: the [M, N] product first */
    if (swiglu) {
        full = (float *)aligned_alloc(32, ((size_t)(M * N) * sizeof(float) + 31) & ~(size_t)31);
        if (!full) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulGGUF: out of memory");
        j.y = full;
    }
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    if (M > GEMV_ROWS) {
        st = pfor(ctx, gemm_task, (size_t)((N + NR * GEMM_PANELS - 1) / (NR * GEMM_PANELS)), 0, &j);
    } else {
        /* one buffer: xq (M*K bytes), dx (M*K/32 floats), xs (M*K/16 floats) */
        size_t xq_bytes = ((size_t)(M * K) + 31) & ~(size_t)31;
        char *buf = (char *)aligned_alloc(32, xq_bytes + (((size_t)(M * K) / 32 * 12 + 31) & ~(size_t)31));
        if (!buf) {
            free(full);
            return llmir_error(api, ORT_FAIL, "ai.llmir MatMulGGUF: out of memory");
        }
        j.xq = (int8_t *)buf;
        j.dx = (float *)(buf + xq_bytes);
        j.xs = j.dx + M * K / 32;
        quantize_rows(&j);
        int64_t chunk = ((N + GEMV_TASKS - 1) / GEMV_TASKS + 3) & ~(int64_t)3;
        j.chunk = (int)(chunk < 16 ? 16 : chunk);
        st = pfor(ctx, gemv_task, (size_t)((N + j.chunk - 1) / j.chunk), 0, &j);
        free(buf);
    }
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
