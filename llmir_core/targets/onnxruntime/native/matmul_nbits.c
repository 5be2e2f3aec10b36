/* llmir's onnxruntime custom ops: f32 activations times 4-bit / 8-bit block-quantized weights.
 *
 * Domain `ai.llmir`, ops `MatMulNBitsQ4` and `MatMulNBitsQ8`: Y[..., N] = X[..., K] @ W^T with W
 * stored exactly as com.microsoft.MatMulNBits stores it for block_size 32 (the serializer writes
 * the same initializers): B uint8 [N, K/32, 32*bits/8] (4 bits: element 2i of a block in the low
 * nibble of byte i, 2i+1 in the high nibble), scales [N*K/32] f32 or f16 (read as they are: the
 * serializer's f16 scales need no Cast), optional zero points uint8 (4 bits: two per byte, low
 * nibble first, [N, ceil(K/64)]; 8 bits: [N, K/32]); absent: the midpoint 8 / 128. W[n, k] =
 * (code - zero) * scale. The weights are read in place from the session's initializers: no
 * prepacked copy, so no prepacking time at load and no second copy in memory.
 *
 * - M (rows of X) <= GEMV_ROWS = 16 (decode of one or several sequences): each row of X is
 *   quantized once per call to int8 in blocks of 32 with one f32 scale per block (max |x| / 127,
 *   round to nearest even: what MatMulNBits' accuracy_level 4 and llama.cpp's q8_0 do), and every
 *   weight block is a 32-element integer dot product, scaled by scale_w * scale_x and summed in
 *   f32. The zero point enters as -(zero - midpoint) * sum(x codes of the block). Rows of W are
 *   split over onnxruntime's intra-op pool in chunks of whole 16-row panels, and each weight row
 *   is read from memory once per call for all rows of X (register tiles over X rows, or a row
 *   group run for each X row while it is in L1). The instruction-set variant is llmir_isa()'s
 *   (isa.h), read once per call:
 *   - AVX-512 VNNI: vpdpbusd of the unsigned codes (8-bit bytes, 4-bit nibbles) and the signed x
 *     codes, starting from the midpoint's share; at M < ZP_ROWS one weight row x up to 4 X rows
 *     per tile (ztile: a pair of blocks per zmm); at M >= ZP_ROWS packed panels of 16 weight
 *     rows, one row per int32 lane (zpanels);
 *   - AVX2 (the fallback, LLMIR_KERNEL_ISA=avx2): vpmaddubsw + vpmaddwd (unsigned 4-bit codes
 *     times signed x directly; 8-bit codes with the sign trick); four weight rows per pass share
 *     the activation loads where rows are short, and each group of weight rows runs for every X
 *     row in turn.
 * - larger M (prefill), 4-bit blocks: X is quantized the same way, each
 *   panel of 16 weight rows is unpacked once into 4-code groups, and tiles of 4 X rows take
 *   int8 dot products per block (vpmaddubsw, int16 sums over a block, minus zero point x the
 *   block's x code sum) with one f32 FMA per block and 8 weight rows (q4_tile): ~1.6x the f32
 *   panel path on AVX2 (measured);
 * - larger M, 8-bit blocks (vpmaddubsw's int16 sums would saturate): for each panel of 16 weight rows and block of at most
 *   KC columns the weights are dequantized once into an f32 [KC][16] panel and multiplied into
 *   6-row blocks of X with llmir_micro_6x16 (f32_gemm.h): f32 activations and accumulation.
 *
 * - node attribute `epilogue = "swiglu"`: B holds [W_gate; W_up] (N = 2H rows) and Y [..., H] =
 *   silu(X W_gate^T) * (X W_up^T) (q8_act.h). Decode: each task takes a range of output
 *   columns, computes its gate rows and the matching up rows into a stack scratch and combines
 *   them; prefill: the [M, N] product into a scratch, then the rows combined in parallel.
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

#define QB 32 /* elements per block: the only block size these ops take */
#define GEMV_ROWS 16 /* X rows up to which the quantized-activation GEMV runs */
#define GEMM_PANELS 2 /* panels of NR rows per parallel task (GEMM) */
#ifndef GEMV_TASKS
#define GEMV_TASKS 32 /* parallel tasks per GEMV (decode) */
#endif
#ifndef NB_KC
#define NB_KC KC /* most columns per dequantized panel */
#endif

typedef OrtStatus *(*GetElementTypeFn)(const OrtShapeInfo *, int *);
enum { I_GetTensorElementType_ = 60 }; /* OrtApi index of GetTensorElementType */

typedef struct NbJob {
    const float *x;     /* [M, K] */
    const uint8_t *w;   /* [N, nb, QB*bits/8] */
    const void *scales; /* [N, nb] f32 or f16 */
    const uint8_t *zp;  /* NULL or packed zero points */
    float *y;           /* output (m, n) at y[m * ldy + n - y0] */
    int64_t M, N, K, nb, zrow; /* zrow: zero-point bytes per row */
    int64_t ldy, y0;
    int bits, f16, chunk, gemm; /* gemm: X quantized for the Q4 int8 GEMM (natural order) */
    /* GEMV: per X row m: xq [m*K..] (int8, Q4 blocks permuted, see quantize_rows), dx [m*nb..]
     * (scale of each x block), xs [m*nb..] (dx * sum of the block's codes), zx [m*nb*4..]
     * (Q4: per pair of blocks, 8 lanes of 8 * partial sums of codes) */
    int8_t *xq;
    float *dx, *xs;
    int32_t *zx;
    int *failed; /* set when a task cannot allocate its panel */
    /* the AVX-512 GEMV (avx512 set): per X row m, per pair of blocks p < nbp = ceil(nb/2), 64
     * codes xz [(m*nbp + p)*64..] as one zmm takes them, 16 int32 lanes bz (the midpoint's share:
     * -mid * the block's code sum, spread over the block's lanes) and 16 f32 lanes dz (the x
     * scale of each lane's block); a missing last block is zeros (see zquant_block) */
    int avx512, panels; /* panels: the AVX-512 16-row panels (xq in natural order, zx = -mid * sum) */
    int64_t nbp;
    int8_t *xz;
    int32_t *bz;
    float *dz;
} NbJob;

/* -- activation quantization (GEMV) ------------------------------------------------------- */

/* Block b of row m (codes q, their sum, scale d) in the AVX-512 layout: Q8, a pair's zmm is
 * [block 2p, block 2p+1] in order (lanes 0-7 and 8-15 belong to one block each); Q4, it is
 * [evens of 2p, evens of 2p+1, odds of 2p, odds of 2p+1] (16 codes each: lanes 0-3 and 8-11
 * belong to 2p), what [low nibbles; high nibbles] of the pair's 32 weight bytes line up with. */
static void zquant_block(NbJob *j, int64_t m, int64_t b, const int8_t *q, int sum, float d) {
    const int64_t p = b >> 1, h = b & 1, at = (m * j->nbp + p) * 16;
    int8_t *xz = j->xz + at * 4;
    if (j->bits == 8) {
        memcpy(xz + h * 32, q, QB);
        for (int i = 0; i < 8; i++) j->bz[at + h * 8 + i] = -16 * sum, j->dz[at + h * 8 + i] = d;
        return;
    }
    for (int i = 0; i < 16; i++) xz[h * 16 + i] = q[2 * i], xz[32 + h * 16 + i] = q[2 * i + 1];
    for (int i = 0; i < 4; i++) {
        j->bz[at + h * 4 + i] = j->bz[at + 8 + h * 4 + i] = -sum;
        j->dz[at + h * 4 + i] = j->dz[at + 8 + h * 4 + i] = d;
    }
}

/* Every row of X quantized in blocks of 32. Q8: codes in order. Q4: a pair of blocks (2p, 2p+1)
 * is stored as [evens of 2p, evens of 2p+1, odds of 2p, odds of 2p+1] (16 codes each), a last odd
 * block as [evens, odds], so the low / high nibbles of the weight bytes line up with them; zx
 * holds 8 * the per-int32-lane sums of the codes (the midpoint's share of each lane). */
static void quantize_rows(NbJob *j) {
    const int64_t nb = j->nb;
    for (int64_t m = 0; m < j->M; m++) {
        const float *x = j->x + m * j->K;
        int8_t *xq = j->xq + m * j->K;
        for (int64_t b = 0; b < nb; b++) {
            int8_t q[QB];
            int sum;
            float d = llmir_quant32(x + b * QB, q, &sum);
            j->dx[m * nb + b] = d;
            j->xs[m * nb + b] = d * (float)sum;
            if (j->avx512) zquant_block(j, m, b, q, sum, d);
            if (j->bits == 8 || j->gemm || j->panels) {
                memcpy(xq + b * QB, q, QB);
                if (j->gemm) j->zx[m * nb + b] = sum; /* times the zero point (Q4 GEMM) */
                if (j->panels) j->zx[m * nb + b] = -(1 << (j->bits - 1)) * sum; /* the midpoint's share */
                continue;
            }
            int8_t *dst;
            int stride;
            if ((b & 1) == 0 && b + 1 < nb) dst = xq + b * QB, stride = 32; /* first of a pair */
            else if (b & 1) dst = xq + (b - 1) * QB + 16, stride = 32;      /* second of a pair */
            else dst = xq + b * QB, stride = 16;                             /* last, odd count */
            for (int i = 0; i < 16; i++) dst[i] = q[2 * i], dst[stride + i] = q[2 * i + 1];
        }
        if (j->bits == 4 && !j->gemm && !j->panels) {
            const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
            for (int64_t p = 0; p + 1 < nb; p += 2) {
                __m256i lo = _mm256_loadu_si256((const __m256i *)(xq + p * QB));
                __m256i hi = _mm256_loadu_si256((const __m256i *)(xq + p * QB + 32));
                __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(ones8, lo),
                                             _mm256_maddubs_epi16(ones8, hi));
                s = _mm256_slli_epi32(_mm256_madd_epi16(s, ones16), 3);
                _mm256_storeu_si256((__m256i *)(j->zx + (m * nb + p) * 4), s);
            }
        }
    }
}

/* -- GEMV kernels --------------------------------------------------------------------------- */

static inline float scale_at(const NbJob *j, int64_t i) {
    if (!j->f16) return ((const float *)j->scales)[i];
    return _cvtsh_ss(((const uint16_t *)j->scales)[i]);
}

static inline int zero_at(const NbJob *j, int64_t n, int64_t b) {
    const uint8_t *z = j->zp + n * j->zrow;
    if (j->bits == 8) return z[b];
    return (z[b >> 1] >> ((b & 1) * 4)) & 15;
}

/* -(zero - midpoint) * scale_w * xs summed over a row's blocks (zero points only) */
static float zero_correction(const NbJob *j, int64_t n, int64_t m) {
    if (!j->zp) return 0.0f;
    const int mid = 1 << (j->bits - 1);
    const uint8_t *z = j->zp + n * j->zrow;
    const float *xs = j->xs + m * j->nb;
    const __m128i m4 = _mm_set1_epi8(15);
    const __m256i midv = _mm256_set1_epi32(mid);
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= j->nb; b += 8) { /* 8 blocks: their zero points, scales and x sums */
        __m128i zb;
        if (j->bits == 4) {
            uint32_t u;
            memcpy(&u, z + b / 2, 4);
            __m128i v = _mm_cvtsi32_si128((int)u);
            zb = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        } else {
            zb = _mm_loadl_epi64((const __m128i *)(z + b));
        }
        __m256 zf = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(zb), midv));
        __m256 sw = j->f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)j->scales + n * j->nb + b)))
                           : _mm256_loadu_ps((const float *)j->scales + n * j->nb + b);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(zf, sw), _mm256_loadu_ps(xs + b), acc);
    }
    float c = -llmir_hsum(acc);
    for (; b < j->nb; b++)
        c -= (float)(zero_at(j, n, b) - mid) * scale_at(j, n * j->nb + b) * xs[b];
    return c;
}

#ifndef PF
#define PF 2048
#endif /* bytes of weights prefetched ahead of the loads */
#define ALWAYS static inline __attribute__((always_inline))

/* two consecutive scales [s0 x4, s1 x4]; f16 a constant where this is inlined */
ALWAYS __m256 scale_pair_t(const void *scales, int64_t i, int f16) {
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m128 s;
    if (f16) {
        uint32_t u;
        memcpy(&u, (const uint16_t *)scales + i, 4);
        s = _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
    } else {
        s = _mm_castpd_ps(_mm_load_sd((const double *)((const float *)scales + i)));
    }
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s), idx);
}

ALWAYS __m256 scale_bcast_t(const void *scales, int64_t i, int f16) {
    if (f16) return _mm256_set1_ps(_cvtsh_ss(((const uint16_t *)scales)[i]));
    return _mm256_broadcast_ss((const float *)scales + i);
}

/* int32 lanes of the Q4 dot products of a pair of blocks (4 lanes each) minus 8 * x sums */
ALWAYS __m256i q4_pair(const uint8_t *w, __m256i xl, __m256i xh, __m256i z) {
    const __m256i mask = _mm256_set1_epi8(15), ones16 = _mm256_set1_epi16(1);
    __m256i v = _mm256_loadu_si256((const __m256i *)w);
    __m256i lo = _mm256_and_si256(v, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
    return _mm256_sub_epi32(_mm256_madd_epi16(s, ones16), z);
}

/* int32 lanes of a Q8 block's dot product: (code - 128) * x with the sign trick */
ALWAYS __m256i q8_block(const uint8_t *w, __m256i x) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones16 = _mm256_set1_epi16(1);
    __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)w), flip);
    __m256i s = _mm256_maddubs_epi16(_mm256_abs_epi8(v), _mm256_sign_epi8(x, v));
    return _mm256_madd_epi16(s, ones16);
}

/* Q4, the last block of an odd count ([evens, odds] of x): the scaled dot product of row w */
static float q4_last(const NbJob *j, const uint8_t *w, int64_t n, int64_t b, int64_t m) {
    const int8_t *xq = j->xq + m * j->K + b * QB;
    __m128i xl = _mm_loadu_si128((const __m128i *)xq), xh = _mm_loadu_si128((const __m128i *)(xq + 16));
    const __m128i m4 = _mm_set1_epi8(15), o16 = _mm_set1_epi16(1), o8 = _mm_set1_epi8(1);
    __m128i zs = _mm_add_epi16(_mm_maddubs_epi16(o8, xl), _mm_maddubs_epi16(o8, xh));
    zs = _mm_slli_epi32(_mm_madd_epi16(zs, o16), 3);
    __m128i v = _mm_loadu_si128((const __m128i *)(w + b * 16));
    __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    __m128i s = _mm_add_epi16(_mm_maddubs_epi16(lo, xl), _mm_maddubs_epi16(hi, xh));
    s = _mm_sub_epi32(_mm_madd_epi16(s, o16), zs);
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return (float)_mm_cvtsi128_si32(s) * scale_at(j, n * j->nb + b) * j->dx[m * j->nb + b];
}

/* Q4: y[m, n0..n0+R) for R = 4 (or 1): R weight rows share the activation loads */
ALWAYS void gemv_q4(const NbJob *j, int64_t n0, int64_t m, const int R, const int f16) {
    const int64_t nb = j->nb, rb = nb * 16; /* bytes per weight row */
    const int8_t *xq = j->xq + m * j->K;
    const float *dx = j->dx + m * nb;
    const int32_t *zx = j->zx + m * nb * 4;
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const uint8_t *w0 = j->w + n0 * rb, *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
    const int64_t s0 = n0 * nb;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        __m256i xl = _mm256_loadu_si256((const __m256i *)(xq + b * QB));
        __m256i xh = _mm256_loadu_si256((const __m256i *)(xq + b * QB + 32));
        __m256i z = _mm256_loadu_si256((const __m256i *)(zx + b * 4));
        __m256 dxv = _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(dx + b)))), idx);
        _mm_prefetch((const char *)(w0 + b * 16 + PF), _MM_HINT_T0);
        if ((b & 7) == 0) { /* the scales: one line per 8 pairs of blocks (f32) */
            const char *sp = (const char *)j->scales + (s0 + b) * (f16 ? 2 : 4) + PF / 4;
            _mm_prefetch(sp, _MM_HINT_T0);
            if (R >= 2) _mm_prefetch(sp + nb * (f16 ? 2 : 4), _MM_HINT_T0);
            if (R == 4) {
                _mm_prefetch(sp + 2 * nb * (f16 ? 2 : 4), _MM_HINT_T0);
                _mm_prefetch(sp + 3 * nb * (f16 ? 2 : 4), _MM_HINT_T0);
            }
        }
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_pair(w0 + b * 16, xl, xh, z)),
                             _mm256_mul_ps(scale_pair_t(j->scales, s0 + b, f16), dxv), a0);
        if (R >= 2) {
            _mm_prefetch((const char *)(w1 + b * 16 + PF), _MM_HINT_T0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_pair(w1 + b * 16, xl, xh, z)),
                                 _mm256_mul_ps(scale_pair_t(j->scales, s0 + nb + b, f16), dxv), a1);
        }
        if (R == 4) {
            _mm_prefetch((const char *)(w2 + b * 16 + PF), _MM_HINT_T0);
            _mm_prefetch((const char *)(w3 + b * 16 + PF), _MM_HINT_T0);
            a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_pair(w2 + b * 16, xl, xh, z)),
                                 _mm256_mul_ps(scale_pair_t(j->scales, s0 + 2 * nb + b, f16), dxv), a2);
            a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_pair(w3 + b * 16, xl, xh, z)),
                                 _mm256_mul_ps(scale_pair_t(j->scales, s0 + 3 * nb + b, f16), dxv), a3);
        }
    }
    float *y = j->y + m * j->ldy + n0 - j->y0;
    __m256 acc[4] = {a0, a1, a2, a3};
    const uint8_t *ws[4] = {w0, w1, w2, w3};
    for (int r = 0; r < R; r++)
        y[r] = llmir_hsum(acc[r]) + (b < nb ? q4_last(j, ws[r], n0 + r, b, m) : 0.0f) +
               zero_correction(j, n0 + r, m);
}

/* Q4, one weight row: two accumulators over alternate pairs of blocks (the FMA chain) */
ALWAYS void gemv_q4_one(const NbJob *j, int64_t n, int64_t m, const int f16) {
    const int64_t nb = j->nb;
    const int8_t *xq = j->xq + m * j->K;
    const float *dx = j->dx + m * nb;
    const int32_t *zx = j->zx + m * nb * 4;
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const uint8_t *w = j->w + n * nb * 16;
    const int64_t s0 = n * nb, ss = f16 ? 2 : 4;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t b = 0;
    for (; b + 3 < nb; b += 4) {
        _mm_prefetch((const char *)(w + b * 16 + PF), _MM_HINT_T0);
        if ((b & 15) == 0) _mm_prefetch((const char *)j->scales + (s0 + b) * ss + PF / 4, _MM_HINT_T0);
        __m256 d0 = _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(dx + b)))), idx);
        __m256 d1 = _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(dx + b + 2)))), idx);
        __m256i i0 = q4_pair(w + b * 16, _mm256_loadu_si256((const __m256i *)(xq + b * QB)),
                             _mm256_loadu_si256((const __m256i *)(xq + b * QB + 32)),
                             _mm256_loadu_si256((const __m256i *)(zx + b * 4)));
        __m256i i1 = q4_pair(w + b * 16 + 32, _mm256_loadu_si256((const __m256i *)(xq + b * QB + 64)),
                             _mm256_loadu_si256((const __m256i *)(xq + b * QB + 96)),
                             _mm256_loadu_si256((const __m256i *)(zx + b * 4 + 8)));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0),
                             _mm256_mul_ps(scale_pair_t(j->scales, s0 + b, f16), d0), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1),
                             _mm256_mul_ps(scale_pair_t(j->scales, s0 + b + 2, f16), d1), a1);
    }
    for (; b + 1 < nb; b += 2) {
        __m256 d0 = _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(dx + b)))), idx);
        __m256i i0 = q4_pair(w + b * 16, _mm256_loadu_si256((const __m256i *)(xq + b * QB)),
                             _mm256_loadu_si256((const __m256i *)(xq + b * QB + 32)),
                             _mm256_loadu_si256((const __m256i *)(zx + b * 4)));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0),
                             _mm256_mul_ps(scale_pair_t(j->scales, s0 + b, f16), d0), a0);
    }
    j->y[m * j->ldy + n - j->y0] = llmir_hsum(_mm256_add_ps(a0, a1)) +
                         (b < nb ? q4_last(j, w, n, b, m) : 0.0f) + zero_correction(j, n, m);
}

/* Q8: y[m, n0..n0+R) for R = 4 (or 1) */
ALWAYS void gemv_q8(const NbJob *j, int64_t n0, int64_t m, const int R, const int f16) {
    const int64_t nb = j->nb, rb = nb * 32;
    const int8_t *xq = j->xq + m * j->K;
    const float *dx = j->dx + m * nb;
    const uint8_t *w0 = j->w + n0 * rb, *w1 = w0 + rb, *w2 = w1 + rb, *w3 = w2 + rb;
    const int64_t s0 = n0 * nb;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t b = 0; b < nb; b++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + b * QB));
        __m256 d = _mm256_broadcast_ss(dx + b);
        _mm_prefetch((const char *)(w0 + b * 32 + PF), _MM_HINT_T0);
        if ((b & 15) == 0) { /* the scales: one line per 16 blocks (f32) */
            const char *sp = (const char *)j->scales + (s0 + b) * (f16 ? 2 : 4) + PF / 8;
            _mm_prefetch(sp, _MM_HINT_T0);
            if (R == 4) {
                _mm_prefetch(sp + nb * (f16 ? 2 : 4), _MM_HINT_T0);
                _mm_prefetch(sp + 2 * nb * (f16 ? 2 : 4), _MM_HINT_T0);
                _mm_prefetch(sp + 3 * nb * (f16 ? 2 : 4), _MM_HINT_T0);
            }
        }
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block(w0 + b * 32, x)),
                             _mm256_mul_ps(scale_bcast_t(j->scales, s0 + b, f16), d), a0);
        if (R == 4) {
            _mm_prefetch((const char *)(w1 + b * 32 + PF), _MM_HINT_T0);
            _mm_prefetch((const char *)(w2 + b * 32 + PF), _MM_HINT_T0);
            _mm_prefetch((const char *)(w3 + b * 32 + PF), _MM_HINT_T0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block(w1 + b * 32, x)),
                                 _mm256_mul_ps(scale_bcast_t(j->scales, s0 + nb + b, f16), d), a1);
            a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block(w2 + b * 32, x)),
                                 _mm256_mul_ps(scale_bcast_t(j->scales, s0 + 2 * nb + b, f16), d), a2);
            a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_block(w3 + b * 32, x)),
                                 _mm256_mul_ps(scale_bcast_t(j->scales, s0 + 3 * nb + b, f16), d), a3);
        }
    }
    float *y = j->y + m * j->ldy + n0 - j->y0;
    __m256 acc[4] = {a0, a1, a2, a3};
    for (int r = 0; r < R; r++) y[r] = llmir_hsum(acc[r]) + zero_correction(j, n0 + r, m);
}

/* Q8, one weight row: two accumulators over alternate blocks (the FMA chain) */
ALWAYS void gemv_q8_one(const NbJob *j, int64_t n, int64_t m, const int f16) {
    const int64_t nb = j->nb;
    const int8_t *xq = j->xq + m * j->K;
    const float *dx = j->dx + m * nb;
    const uint8_t *w = j->w + n * nb * 32;
    const int64_t s0 = n * nb, ss = f16 ? 2 : 4;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        _mm_prefetch((const char *)(w + b * 32 + PF), _MM_HINT_T0);
        if ((b & 15) == 0) _mm_prefetch((const char *)j->scales + (s0 + b) * ss + PF / 8, _MM_HINT_T0);
        __m256i i0 = q8_block(w + b * 32, _mm256_loadu_si256((const __m256i *)(xq + b * QB)));
        __m256i i1 = q8_block(w + b * 32 + 32, _mm256_loadu_si256((const __m256i *)(xq + b * QB + 32)));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0),
                             _mm256_mul_ps(scale_bcast_t(j->scales, s0 + b, f16), _mm256_broadcast_ss(dx + b)), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1),
                             _mm256_mul_ps(scale_bcast_t(j->scales, s0 + b + 1, f16),
                                           _mm256_broadcast_ss(dx + b + 1)), a1);
    }
    if (b < nb) {
        __m256i i0 = q8_block(w + b * 32, _mm256_loadu_si256((const __m256i *)(xq + b * QB)));
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0),
                             _mm256_mul_ps(scale_bcast_t(j->scales, s0 + b, f16), _mm256_broadcast_ss(dx + b)), a0);
    }
    j->y[m * j->ldy + n - j->y0] = llmir_hsum(_mm256_add_ps(a0, a1)) + zero_correction(j, n, m);
}

/* -- AVX-512 VNNI GEMV: one weight row x up to ZM X rows per tile --------------------------- *
 * Per pair of blocks, the weight row's 64 unsigned codes (Q8: the bytes; Q4: the nibbles) take
 * one vpdpbusd with each X row's 64 int8 codes, starting from bz (the midpoint's share), so the
 * int32 lanes hold sum (code - mid) * x per block; one cvt and one FMA by scale_w * scale_x per
 * lane. The weight bytes are loaded once per tile for its ZM rows, and from L1 for the next
 * group of X rows (their codes stay in L1 too). One weight row at a time: one sequential stream
 * from memory (4 rows interleaved measured 2x slower at M = 1 on rows of 640 bytes). */

#define ZM 4 /* X rows per tile */

/* the 64 unsigned codes of pair p of weight row w (lanes as zquant_block lays out x); `last`:
 * the pair holds only block 2p (the rest zeros) */
LLMIR_AVX512 ALWAYS __m512i zcodes(const uint8_t *w, int64_t p, const int bits, const int last) {
    if (bits == 8) {
        if (last) return _mm512_maskz_loadu_epi8(0xFFFFFFFFull, w + p * 64);
        return _mm512_loadu_si512((const void *)(w + p * 64));
    }
    __m256i v = last ? _mm256_maskz_loadu_epi8(0xFFFFu, w + p * 32) : _mm256_loadu_si256((const __m256i *)(w + p * 32));
    __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    return _mm512_and_si512(c, _mm512_set1_epi8(15));
}

/* the weight scales of pair p laid out per lane (Q8: [s0 x8, s1 x8]; Q4: [s0 x4, s1 x4] twice);
 * `last`: s0 everywhere (the lanes of the missing block multiply zeros) */
LLMIR_AVX512 ALWAYS __m512 zscales(const void *scales, int64_t i, const int bits, const int f16, const int last) {
    if (last) return _mm512_set1_ps(f16 ? _cvtsh_ss(((const uint16_t *)scales)[i]) : ((const float *)scales)[i]);
    __m128 s;
    if (f16) {
        uint32_t u;
        memcpy(&u, (const uint16_t *)scales + i, 4);
        s = _mm_cvtph_ps(_mm_cvtsi32_si128((int)u));
    } else {
        s = _mm_castpd_ps(_mm_load_sd((const double *)((const float *)scales + i)));
    }
    const __m512i idx = bits == 8 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                  : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(s));
}

/* acc[m] += the products of pair p of the weight row and MB X rows */
#define ZSTEP(LAST)                                                                                  \
    {                                                                                                \
        _mm_prefetch((const char *)(w + p * 8 * bits + PF), _MM_HINT_T0);                            \
        const __m512i wc = zcodes(w, p, bits, LAST);                                                 \
        const __m512 sc = zscales(j->scales, s0 + 2 * p, bits, f16, LAST);                           \
        for (int m = 0; m < MB; m++) {                                                               \
            const int64_t at = ((m0 + m) * nbp + p) * 16;                                           \
            __m512i xv = _mm512_loadu_si512((const void *)(j->xz + at * 4));                        \
            __m512i bv = _mm512_loadu_si512((const void *)(j->bz + at));                            \
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bv, wc, xv)),            \
                                     _mm512_mul_ps(sc, _mm512_loadu_ps(j->dz + at)), acc[m]);        \
        }                                                                                            \
    }

/* y[m0..m0+MB, n] */
LLMIR_AVX512 ALWAYS void ztile(const NbJob *j, int64_t n, int64_t m0, const int MB, const int bits, const int f16) {
    const int64_t nb = j->nb, nbp = j->nbp, s0 = n * nb;
    const uint8_t *w = j->w + n * nb * QB * bits / 8;
    __m512 acc[ZM];
    for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p < nb / 2; p++) ZSTEP(0)
    if (nb & 1) ZSTEP(1)
    for (int m = 0; m < MB; m++)
        j->y[(m0 + m) * j->ldy + n - j->y0] = _mm512_reduce_add_ps(acc[m]) + zero_correction(j, n, m0 + m);
}
#undef ZSTEP

/* -- AVX-512 VNNI at M >= ZP_ROWS: panels of 16 weight rows -------------------------------- *
 * A task packs each panel of 16 weight rows once ([block][k/4][16 rows][4 codes], the Q4 GEMM's
 * layout, with the rows' scales [block][16]: q4_pack_panel for 4-bit blocks); then per block and
 * X row, 8 vpdpbusd (one weight row per int32 lane, 4 x codes broadcast, X in natural order)
 * from the midpoint's share -mid * the block's code sum,
 * one cvt and one FMA by scale_w * scale_x: the lanes hold 16 outputs, where the one-row tile's
 * hold one (a third of the vector work per X row, for a pack whose cost is shared by all rows). */

#define ZP_ROWS 4 /* X rows from which the panels run */
#define ZP_MB 8   /* X rows per pass over a packed panel */
#ifndef ZP_AHEAD
#define ZP_AHEAD 4 /* panels prefetched ahead (into L2: the packed panel keeps L1) */
#endif

static void q4_pack_panel(const NbJob *j, int64_t n0, int nr, uint8_t *pw, float *ps, int32_t *pz);

static void q8_pack_panel(const NbJob *j, int64_t n0, uint8_t *pw, float *ps) {
    const int64_t nb = j->nb;
    for (int64_t b = 0; b < nb; b++) {
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = _mm256_loadu_ps((const float *)(j->w + ((n0 + h * 8 + i) * nb + b) * QB));
            llmir_transpose8_store(r, (float *)(pw + b * 512 + h * 32), 16);
        }
        for (int c = 0; c < 16; c++) ps[b * 16 + c] = scale_at(j, (n0 + c) * nb + b);
    }
}

/* y[m0..m0+MB, n0..n0+16) from a packed panel */
LLMIR_AVX512 ALWAYS void zpanel_rows(const NbJob *j, const uint8_t *pw, const float *ps, int64_t n0, int64_t m0,
                                     const int MB) {
    const int64_t nb = j->nb, K = j->K;
    __m512 acc[ZP_MB];
    for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512i *wq = (const __m512i *)(pw + b * 512);
        __m512i w[8];
        for (int q = 0; q < 8; q++) w[q] = _mm512_load_si512((const void *)(wq + q));
        const __m512 sc = _mm512_load_ps(ps + b * 16);
        for (int m = 0; m < MB; m++) {
            const int8_t *x = j->xq + (m0 + m) * K + b * QB;
            __m512i s = _mm512_set1_epi32(j->zx[(m0 + m) * nb + b]);
            for (int q = 0; q < 8; q++) {
                int32_t v;
                memcpy(&v, x + q * 4, 4);
                s = _mm512_dpbusd_epi32(s, w[q], _mm512_set1_epi32(v));
            }
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, _mm512_set1_ps(j->dx[(m0 + m) * nb + b])),
                                     acc[m]);
        }
    }
    for (int m = 0; m < MB; m++) {
        float *y = j->y + (m0 + m) * j->ldy + n0 - j->y0;
        _mm512_storeu_ps(y, acc[m]);
        if (j->zp)
            for (int c = 0; c < 16; c++) y[c] += zero_correction(j, n0 + c, m0 + m);
    }
}

/* rows [n0, n1) of every X row, whole panels of 16 rows; returns where they end (the rest for
 * the one-row tiles; n1 when the panel cannot be allocated: failed is set) */
LLMIR_AVX512 static int64_t zpanels(const NbJob *j, int64_t n0, int64_t n1) {
    const int64_t nb = j->nb, rb = nb * QB * j->bits / 8, bytes = 16 * rb;
    if (n1 - n0 < 16) return n0;
    uint8_t *pw = (uint8_t *)aligned_alloc(64, (size_t)nb * (512 + 128));
    if (!pw) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return n1;
    }
    float *ps = (float *)(pw + nb * 512);
    int32_t *pz = (int32_t *)(ps + nb * 16); /* 4-bit zero points (unused: zero_correction) */
    /* packing reads the 16 rows' blocks across: too many short streams for the hardware
     * prefetcher, so the panel ZP_AHEAD on (this task's or the next one's) is fetched into L2
     * before this one is packed, and the first ones of the task now */
    const int64_t first = n0 + 16 * ZP_AHEAD < j->N ? n0 + 16 * ZP_AHEAD : j->N;
    for (int64_t i = n0 * rb; i < first * rb; i += 64) _mm_prefetch((const char *)j->w + i, _MM_HINT_T1);
    int64_t n = n0;
    for (; n + 16 <= n1; n += 16) {
        const int64_t ahead = n + 16 * ZP_AHEAD;
        if (ahead + 16 <= j->N)
            for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch((const char *)j->w + ahead * rb + i, _MM_HINT_T1);
        if (j->bits == 8) q8_pack_panel(j, n, pw, ps);
        else q4_pack_panel(j, n, 16, pw, ps, pz);
        for (int64_t m0 = 0; m0 < j->M; m0 += ZP_MB) {
            const int64_t mb = j->M - m0 < ZP_MB ? j->M - m0 : ZP_MB;
            switch (mb) {
            case 8: zpanel_rows(j, pw, ps, n, m0, 8); break;
            case 7: zpanel_rows(j, pw, ps, n, m0, 7); break;
            case 6: zpanel_rows(j, pw, ps, n, m0, 6); break;
            case 5: zpanel_rows(j, pw, ps, n, m0, 5); break;
            case 4: zpanel_rows(j, pw, ps, n, m0, 4); break;
            case 3: zpanel_rows(j, pw, ps, n, m0, 3); break;
            case 2: zpanel_rows(j, pw, ps, n, m0, 2); break;
            default: zpanel_rows(j, pw, ps, n, m0, 1); break;
            }
        }
    }
    free(pw);
    return n;
}

/* rows [n0, n1) of every X row: at M >= ZP_ROWS in panels, then each weight row for every group
 * of ZM X rows in turn */
#define ZRANGE(NAME, BITS, F16)                                                     \
    LLMIR_AVX512 static void NAME(const NbJob *j, int64_t n0, int64_t n1) {         \
        if (j->panels) n0 = zpanels(j, n0, n1);                                     \
        for (int64_t n = n0; n < n1; n++)                                           \
            for (int64_t m0 = 0; m0 < j->M; m0 += ZM) {                             \
                const int64_t mb = j->M - m0 < ZM ? j->M - m0 : ZM;                 \
                if (mb == 4) ztile(j, n, m0, 4, BITS, F16);                         \
                else if (mb == 3) ztile(j, n, m0, 3, BITS, F16);                    \
                else if (mb == 2) ztile(j, n, m0, 2, BITS, F16);                    \
                else ztile(j, n, m0, 1, BITS, F16);                                 \
            }                                                                       \
    }
ZRANGE(zgemv_q4_f32, 4, 0)
ZRANGE(zgemv_q4_f16, 4, 1)
ZRANGE(zgemv_q8_f32, 8, 0)
ZRANGE(zgemv_q8_f16, 8, 1)
#undef ZRANGE

/* rows per pass: 4 share the activation loads while their bytes are close together; longer rows
 * run one at a time (4 far-apart weight and scale streams per pass measured slower) */
#ifndef ROW_BYTES_4
#define ROW_BYTES_4 512
#endif

/* rows [n0, n1) of every X row (AVX2): a group of weight rows for each X row in turn, so the
 * group's bytes come from memory once (L1 for the other rows) */
#define GEMV_RANGE(NAME, KERNEL, ONE, F16)                                   \
    static void NAME(const NbJob *j, int64_t n0, int64_t n1) {               \
        int64_t n = n0;                                                      \
        if (j->nb * QB * j->bits / 8 <= ROW_BYTES_4)                         \
            for (; n + 4 <= n1; n += 4)                                      \
                for (int64_t m = 0; m < j->M; m++) KERNEL(j, n, m, 4, F16);  \
        for (; n < n1; n++)                                                  \
            for (int64_t m = 0; m < j->M; m++) ONE;                          \
    }
GEMV_RANGE(gemv_q4_f32, gemv_q4, gemv_q4_one(j, n, m, 0), 0)
GEMV_RANGE(gemv_q4_f16, gemv_q4, gemv_q4_one(j, n, m, 1), 1)
GEMV_RANGE(gemv_q8_f32, gemv_q8, gemv_q8_one(j, n, m, 0), 0)
GEMV_RANGE(gemv_q8_f16, gemv_q8, gemv_q8_one(j, n, m, 1), 1)

typedef void (*GemvRangeFn)(const NbJob *, int64_t, int64_t);

static GemvRangeFn gemv_range(const NbJob *j) {
    if (j->avx512)
        return j->bits == 4 ? (j->f16 ? zgemv_q4_f16 : zgemv_q4_f32) : (j->f16 ? zgemv_q8_f16 : zgemv_q8_f32);
    return j->bits == 4 ? (j->f16 ? gemv_q4_f16 : gemv_q4_f32) : (j->f16 ? gemv_q8_f16 : gemv_q8_f32);
}

static void gemv_task(void *p, size_t i) {
    const NbJob *j = (const NbJob *)p;
    int64_t n0 = (int64_t)i * j->chunk, n1 = n0 + j->chunk;
    if (n1 > j->N) n1 = j->N;
    gemv_range(j)(j, n0, n1);
}

#define SWIGLU_CHUNK 256 /* most output columns per task (GEMV with the SwiGLU epilogue) */

/* epilogue "swiglu": output columns [n0, n1) of the H = N/2: gate rows n0..n1 and up rows
 * H+n0..H+n1 into a scratch on the stack, then silu(gate) * up */
static void gemv_swiglu_task(void *p, size_t i) {
    const NbJob *j = (const NbJob *)p;
    const int64_t H = j->N / 2, n0 = (int64_t)i * j->chunk;
    const int64_t n1 = n0 + j->chunk < H ? n0 + j->chunk : H;
    float t[GEMV_ROWS * 2 * SWIGLU_CHUNK] __attribute__((aligned(32)));
    NbJob s = *j;
    s.y = t, s.ldy = 2 * SWIGLU_CHUNK;
    GemvRangeFn f = gemv_range(j);
    s.y0 = n0; /* gate row n -> t[m][n - n0] */
    f(&s, n0, n1);
    s.y0 = H + n0 - SWIGLU_CHUNK; /* up row H + n -> t[m][SWIGLU_CHUNK + n - n0] */
    f(&s, H + n0, H + n1);
    for (int64_t m = 0; m < j->M; m++) {
        const float *tm = t + m * 2 * SWIGLU_CHUNK;
        llmir_swiglu(tm, tm + SWIGLU_CHUNK, j->y + m * H + n0, n1 - n0);
    }
}

/* -- GEMM (prefill): dequantized f32 panels ------------------------------------------------- */

/* 8 weights of row n from column k (k % 8 == 0) as f32 */
static inline __m256 deq8(const NbJob *j, int64_t n, int64_t k) {
    const int64_t b = k / QB;
    float s = scale_at(j, n * j->nb + b);
    int z = j->zp ? zero_at(j, n, b) : 1 << (j->bits - 1);
    __m256i c;
    if (j->bits == 4) {
        uint32_t u;
        memcpy(&u, j->w + n * j->nb * 16 + b * 16 + (k % QB) / 2, 4);
        __m128i v = _mm_cvtsi32_si128((int)u), m4 = _mm_set1_epi8(15);
        __m128i il = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        c = _mm256_cvtepu8_epi32(il);
    } else {
        c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(j->w + n * j->K + k)));
    }
    c = _mm256_sub_epi32(c, _mm256_set1_epi32(z));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(c), _mm256_set1_ps(s));
}

static void pack_panel(const NbJob *j, int64_t n0, int nr, int64_t k0, int kc, float *panel) {
    /* kc is a multiple of 32 */
    for (int c0 = 0; c0 < NR; c0 += 8) {
        for (int k = 0; k < kc; k += 8) {
            __m256 r[8];
            for (int c = 0; c < 8; c++)
                r[c] = c0 + c < nr ? deq8(j, n0 + c0 + c, k0 + k) : _mm256_setzero_ps();
            llmir_transpose8_store(r, panel + k * NR + c0, NR);
        }
    }
}

static void gemm_task(void *p, size_t i) {
    const NbJob *j = (const NbJob *)p;
    float panel[NB_KC * NR] __attribute__((aligned(32)));
    for (int q = 0; q < GEMM_PANELS; q++) {
        int64_t n0 = ((int64_t)i * GEMM_PANELS + q) * NR;
        if (n0 >= j->N) return;
        int nr = j->N - n0 < NR ? (int)(j->N - n0) : NR;
        /* K in equal blocks of at most KC columns, whole quantization blocks */
        int64_t blocks = (j->K + NB_KC - 1) / NB_KC, step = ((j->K + blocks - 1) / blocks + QB - 1) / QB * QB;
        for (int64_t k0 = 0; k0 < j->K; k0 += step) {
            int kc = j->K - k0 < step ? (int)(j->K - k0) : (int)step;
            pack_panel(j, n0, nr, k0, kc, panel);
            for (int64_t m0 = 0; m0 < j->M; m0 += MR) {
                int mr = j->M - m0 < MR ? (int)(j->M - m0) : MR;
                llmir_micro_6x16(j->x + m0 * j->K + k0, j->K, j->y + m0 * j->ldy + n0, j->ldy, panel,
                                 mr, nr, kc, k0 != 0);
            }
        }
    }
}

/* -- Q4 prefill: int8 GEMM ---------------------------------------------------------------- *
 * X quantized per 32-block as for the GEMV (natural order; zx = 8 * the block's code sum). For
 * each panel of 16 weight rows the codes are unpacked once into [block][k/4][16 rows][4 codes]
 * (an 8x8 transpose of 4-byte groups) with the panel's scales [block][16]; a tile of 4 X rows
 * then takes, per block, 8 steps of vpmaddubsw (unsigned codes x signed x: |sum| <= 8 * 2 * 15 *
 * 127 fits int16), one vpmaddwd, minus the midpoint's share, and one f32 FMA by
 * scale_w * scale_x per 8 weight rows. */

#define Q4_MR 4 /* X rows per tile */

static void q4_pack_panel(const NbJob *j, int64_t n0, int nr, uint8_t *pw, float *ps, int32_t *pz) {
    const int64_t nb = j->nb;
    const __m128i m4 = _mm_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++) {
        for (int h = 0; h < 2; h++) {
            __m256 r[8];
            for (int i = 0; i < 8; i++) {
                int c = h * 8 + i;
                if (c >= nr) {
                    r[i] = _mm256_setzero_ps();
                    continue;
                }
                __m128i v = _mm_loadu_si128((const __m128i *)(j->w + ((n0 + c) * nb + b) * 16));
                __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                __m256i e = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
                r[i] = _mm256_castsi256_ps(e);
            }
            llmir_transpose8_store(r, (float *)(pw + b * 512 + h * 32), 16);
        }
        for (int c = 0; c < NR; c++) ps[b * NR + c] = c < nr ? scale_at(j, (n0 + c) * nb + b) : 0.0f;
        if (j->zp)
            for (int c = 0; c < NR; c++) pz[b * NR + c] = c < nr ? zero_at(j, n0 + c, b) : 8;
    }
}

ALWAYS void q4_tile(const NbJob *j, const uint8_t *pw, const float *ps, const int32_t *pz,
                    int64_t m0, int mr, int64_t n0, int nr, const int has_z) {
    const int64_t nb = j->nb, K = j->K;
    const int8_t *x0 = j->xq + m0 * K, *x1 = x0 + (mr > 1 ? K : 0);
    const int8_t *x2 = x0 + (mr > 2 ? 2 * K : 0), *x3 = x0 + (mr > 3 ? 3 * K : 0);
    const int64_t r1 = mr > 1 ? 1 : 0, r2 = mr > 2 ? 2 : 0, r3 = mr > 3 ? 3 : 0;
    const float *dx = j->dx + m0 * nb;
    const int32_t *zs = j->zx + m0 * nb;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 f00 = _mm256_setzero_ps(), f01 = f00, f10 = f00, f11 = f00;
    __m256 f20 = f00, f21 = f00, f30 = f00, f31 = f00;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = pw + b * 512;
        __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00;
        __m256i c20 = c00, c21 = c00, c30 = c00, c31 = c00;
#pragma GCC unroll 2 /* fully unrolled, gcc sums the products as a tree through the stack */
        for (int q = 0; q < 8; q++) {
            __m256i w0 = _mm256_load_si256((const __m256i *)(wb + q * 64));
            __m256i w1 = _mm256_load_si256((const __m256i *)(wb + q * 64 + 32));
            int32_t v;
            __m256i xb;
#define STEP(X, C0, C1)                                                    \
    memcpy(&v, X + b * QB + q * 4, 4);                                     \
    xb = _mm256_set1_epi32(v);                                             \
    C0 = _mm256_add_epi16(C0, _mm256_maddubs_epi16(w0, xb));               \
    C1 = _mm256_add_epi16(C1, _mm256_maddubs_epi16(w1, xb));
            STEP(x0, c00, c01)
            STEP(x1, c10, c11)
            STEP(x2, c20, c21)
            STEP(x3, c30, c31)
#undef STEP
        }
        __m256 s0 = _mm256_load_ps(ps + b * NR), s1 = _mm256_load_ps(ps + b * NR + 8);
        __m256i zp0 = _mm256_set1_epi32(8), zp1 = zp0; /* the rows' zero points */
        if (has_z) {
            zp0 = _mm256_load_si256((const __m256i *)(pz + b * NR));
            zp1 = _mm256_load_si256((const __m256i *)(pz + b * NR + 8));
        }
#define FIN(R, C0, C1, F0, F1)                                                                 \
    {                                                                                          \
        __m256i xs = _mm256_set1_epi32(zs[R * nb + b]), z0, z1;                               \
        if (has_z)                                                                             \
            z0 = _mm256_mullo_epi32(zp0, xs), z1 = _mm256_mullo_epi32(zp1, xs);                \
        else                                                                                   \
            z0 = z1 = _mm256_slli_epi32(xs, 3);                                                \
        __m256 d = _mm256_set1_ps(dx[R * nb + b]);                                             \
        __m256i i0 = _mm256_sub_epi32(_mm256_madd_epi16(C0, ones), z0);                        \
        __m256i i1 = _mm256_sub_epi32(_mm256_madd_epi16(C1, ones), z1);                        \
        F0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(s0, d), F0);                \
        F1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(s1, d), F1);                \
    }
        FIN(0, c00, c01, f00, f01)
        FIN(r1, c10, c11, f10, f11)
        FIN(r2, c20, c21, f20, f21)
        FIN(r3, c30, c31, f30, f31)
#undef FIN
    }
    __m256 acc[Q4_MR][2] = {{f00, f01}, {f10, f11}, {f20, f21}, {f30, f31}};
    for (int r = 0; r < mr; r++) {
        float *y = j->y + (m0 + r) * j->ldy + n0 - j->y0;
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

static void q4_gemm_task(void *p, size_t i) {
    const NbJob *j = (const NbJob *)p;
    const int64_t nb = j->nb;
    uint8_t *pw = (uint8_t *)aligned_alloc(32, (size_t)nb * (512 + NR * 8));
    if (!pw) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *ps = (float *)(pw + nb * 512);
    int32_t *pz = (int32_t *)(ps + nb * NR);
    for (int q = 0; q < GEMM_PANELS; q++) {
        int64_t n0 = ((int64_t)i * GEMM_PANELS + q) * NR;
        if (n0 >= j->N) break;
        int nr = j->N - n0 < NR ? (int)(j->N - n0) : NR;
        q4_pack_panel(j, n0, nr, pw, ps, pz);
        for (int64_t m0 = 0; m0 < j->M; m0 += Q4_MR) {
            int mr = j->M - m0 < Q4_MR ? (int)(j->M - m0) : Q4_MR;
            if (j->zp) q4_tile(j, pw, ps, pz, m0, mr, n0, nr, 1);
            else q4_tile(j, pw, ps, pz, m0, mr, n0, nr, 0);
        }
    }
    free(pw);
}

/* -- the custom ops ------------------------------------------------------------------------- */

typedef struct NbKernel {
    const OrtApi *api;
    int bits, epilogue; /* EPI_NONE / EPI_SWIGLU (the node's `epilogue`) / EPI_BAD */
} NbKernel;

/* what one call's B, scales and zero points say (check_weights): never kept across calls, since
 * nothing makes B an initializer (a graph may slice it, a caller feed it) */
typedef struct NbShape {
    int64_t N, nb, K, zrow; /* K = nb * 32; zrow: zero-point bytes per row */
    int f16;
} NbShape;

typedef struct OpNb {
    OrtCustomOp op;
    int bits;
} OpNb;

static void *nb_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    NbKernel *k = (NbKernel *)malloc(sizeof(NbKernel));
    if (k) memset(k, 0, sizeof(*k)), k->api = api, k->bits = ((const OpNb *)op)->bits;
    if (k) k->epilogue = llmir_epilogue_attr(api, info);
    return k;
}

static void nb_destroy(void *k) { free(k); }

static int elem_type(const OrtApi *api, const OrtValue *v) {
    OrtShapeInfo *info = NULL;
    int t = -1;
    if (API(api, I_GetTensorTypeAndShape, GetTensorTypeAndShapeFn)(v, &info)) return -1;
    if (API(api, I_GetTensorElementType_, GetElementTypeFn)(info, &t)) t = -1;
    API(api, I_ReleaseTensorTypeAndShapeInfo, ReleaseShapeInfoFn)(info);
    return t;
}

/* B [N, K/32, 32*bits/8], scales (f32 or f16, N*K/32) and zero points (N * zero bytes per row)
 * of this call, into *o */
static OrtStatus *check_weights(const NbKernel *kn, const OrtValue *wv, const OrtValue *sv,
                                const OrtValue *zv, NbShape *o) {
    const OrtApi *api = kn->api;
    int64_t wd[8], sd[8], zd[8], nw = 0, nz = 0;
    int wr = llmir_shape_of(api, wv, wd), sr = llmir_shape_of(api, sv, sd);
    int zr = zv ? llmir_shape_of(api, zv, zd) : 0, stype = elem_type(api, sv);
    if (wr != 3 || wd[2] != QB * kn->bits / 8 || !llmir_mul_ok(wd[0], wd[1], &nw) ||
        !llmir_mul_ok(wd[1], QB, &o->K))
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulNBits: B must be [N, K/32, 32*bits/8] uint8");
    o->N = wd[0], o->nb = wd[1], o->f16 = stype == T_FLOAT16;
    o->zrow = kn->bits == 8 ? wd[1] : wd[1] / 2 + wd[1] % 2;
    if (sr < 1 || zr < 0 || llmir_rows(sd, sr) != nw || (stype != T_FLOAT && stype != T_FLOAT16) ||
        (zv && (!llmir_mul_ok(wd[0], o->zrow, &nz) || llmir_rows(zd, zr) != nz)))
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulNBits: scales (f32 or f16, N*K/32) or zero points do not "
                           "match B");
    return NULL;
}

static OrtStatus *nb_compute(void *kp, OrtKernelContext *ctx) {
    NbKernel *kn = (NbKernel *)kp;
    const OrtApi *api = kn->api;
    const OrtValue *xv = NULL, *wv = NULL, *sv = NULL, *zv = NULL;
    OrtValue *yv = NULL;
    int64_t xd[8], yd[8];
    OrtStatus *st;
    if (kn->epilogue == EPI_BAD)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulNBits: unknown epilogue (expected \"swiglu\" or none)");
    GetInputFn get = API(api, I_KernelContext_GetInput, GetInputFn);
    if ((st = get(ctx, 0, &xv)) || (st = get(ctx, 1, &wv)) || (st = get(ctx, 2, &sv))) return st;
    if (get(ctx, 3, &zv)) zv = NULL; /* absent optional input: NULL */
    NbShape sh = {0, 0, 0, 0, 0};
    if ((st = check_weights(kn, wv, sv, zv, &sh))) return st;
    const int bits = kn->bits, swiglu = kn->epilogue == EPI_SWIGLU;
    int xr = llmir_shape_of(api, xv, xd);
    if (xr < 1 || xd[xr - 1] != sh.K || llmir_rows(xd, xr - 1) < 0)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulNBits: X [..., K] and B [N, K/32, 32*bits/8] do not match");
    if (swiglu && sh.N % 2)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulNBits: epilogue \"swiglu\" needs an even N ([gate; up])");
    int64_t M = 1, N = sh.N, K = xd[xr - 1], nb = sh.nb, NO = swiglu ? N / 2 : N;
    int64_t zrow = sh.zrow;
    for (int i = 0; i < xr - 1; i++) M *= xd[i], yd[i] = xd[i];
    yd[xr - 1] = NO;
    if ((st = API(api, I_KernelContext_GetOutput, GetOutputFn)(ctx, 0, yd, (size_t)xr, &yv)))
        return st;
    void *x = NULL, *w = NULL, *s = NULL, *z = NULL, *y = NULL;
    GetTensorMutableDataFn data = API(api, I_GetTensorMutableData, GetTensorMutableDataFn);
    if ((st = data((OrtValue *)xv, &x)) || (st = data((OrtValue *)wv, &w)) ||
        (st = data((OrtValue *)sv, &s)) || (zv && (st = data((OrtValue *)zv, &z))) ||
        (st = data(yv, &y)))
        return st;
    if (M == 0 || N == 0) return NULL;
    if (K == 0) {
        memset(y, 0, (size_t)(M * NO) * sizeof(float));
        return NULL;
    }
    NbJob j = {(const float *)x, (const uint8_t *)w, s, (const uint8_t *)z, (float *)y,
               M, N, K, nb, zrow, N, 0, bits, sh.f16, 0, 0, NULL, NULL, NULL, NULL, NULL,
               0, 0, 0, NULL, NULL, NULL};
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    const size_t panels = (size_t)((N + NR * GEMM_PANELS - 1) / (NR * GEMM_PANELS));
    float *full = NULL; /* prefill with the epilogue: the [M, N] product first */
    if (swiglu && M > GEMV_ROWS) {
        full = (float *)aligned_alloc(32, ((size_t)(M * N) * sizeof(float) + 31) & ~(size_t)31);
        if (!full) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulNBits: out of memory");
        j.y = full;
    }
    int failed = 0;
    j.failed = &failed;
    char *buf = NULL;
    if (M > GEMV_ROWS && bits == 8) { /* f32 panels */
        st = pfor(ctx, gemm_task, panels, 0, &j);
    } else {
        j.gemm = M > GEMV_ROWS;
        j.avx512 = !j.gemm && llmir_isa() == LLMIR_ISA_AVX512;
        j.panels = j.avx512 && M >= ZP_ROWS;
        j.nbp = (nb + 1) / 2;
        /* one buffer: xq (M*K + 64 bytes), dx, xs (M*nb floats each), zx (M*nb*4 int32); the
         * AVX-512 GEMV's xz, bz, dz (M*nbp*64 bytes each, zeroed: a missing last block) */
        size_t xq_bytes = (size_t)(M * K + 64 + 63) & ~(size_t)63;
        size_t rest = ((size_t)(M * nb) * 24 + 63) & ~(size_t)63, zb = (size_t)(M * j.nbp) * 64;
        buf = (char *)aligned_alloc(64, xq_bytes + rest + (j.avx512 ? 3 * zb : 0));
        if (!buf) {
            free(full);
            return llmir_error(api, ORT_FAIL, "ai.llmir MatMulNBits: out of memory");
        }
        j.xq = (int8_t *)buf;
        j.dx = (float *)(buf + xq_bytes);
        j.xs = j.dx + M * nb;
        j.zx = (int32_t *)(j.xs + M * nb);
        if (j.avx512) {
            j.xz = (int8_t *)(buf + xq_bytes + rest);
            j.bz = (int32_t *)(j.xz + zb);
            j.dz = (float *)(j.xz + 2 * zb);
            memset(j.xz, 0, 3 * zb);
        }
        quantize_rows(&j);
        if (j.gemm) {
            st = pfor(ctx, q4_gemm_task, panels, 0, &j);
        } else {
            /* chunks of whole panels (16 rows): about 8 per thread of a 2-4 thread pool (with
             * the epilogue: output columns, each reading a gate and an up row) */
            int64_t chunk = ((NO + GEMV_TASKS - 1) / GEMV_TASKS + 15) & ~(int64_t)15;
            chunk = chunk < 16 ? 16 : chunk;
            j.chunk = (int)(swiglu && chunk > SWIGLU_CHUNK ? SWIGLU_CHUNK : chunk);
            st = pfor(ctx, swiglu ? gemv_swiglu_task : gemv_task,
                      (size_t)((NO + j.chunk - 1) / j.chunk), 0, &j);
        }
    }
    free(buf);
    if (!st && __atomic_load_n(&failed, __ATOMIC_RELAXED))
        st = llmir_error(api, ORT_FAIL, "ai.llmir MatMulNBits: out of memory");
    if (!st && full) {
        LlmirSwigluRows r = {full, (float *)y, M, NO};
        st = pfor(ctx, llmir_swiglu_rows_task, (size_t)M, 0, &r);
    }
    free(full);
    return st;
}

static const char *name_q4(const OrtCustomOp *op) { (void)op; return "MatMulNBitsQ4"; }
static const char *name_q8(const OrtCustomOp *op) { (void)op; return "MatMulNBitsQ8"; }
static int nb_input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 0 ? T_FLOAT : i == 2 ? 0 /* undefined: f32 or f16 */ : T_UINT8;
}
static size_t nb_inputs(const OrtCustomOp *op) { (void)op; return 4; }
static int nb_in_char(const OrtCustomOp *op, size_t i) { (void)op; return i == 3 ? 1 : 0; }

#define OPNB(NAME, BITS) \
    {LLMIR_QUANT_OP(nb_create, NAME, nb_input_type, nb_inputs, nb_in_char, nb_destroy, nb_compute), BITS}

static OpNb op_q4 = OPNB(name_q4, 4);
static OpNb op_q8 = OPNB(name_q8, 8);

/* adds MatMulNBitsQ4 and MatMulNBitsQ8 to the ai.llmir domain (register.c) */
OrtStatus *llmir_add_matmul_nbits(const OrtApi *api, OrtCustomOpDomain *domain) {
    OrtStatus *st = API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_q4.op);
    if (st) return st;
    return API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_q8.op);
}
