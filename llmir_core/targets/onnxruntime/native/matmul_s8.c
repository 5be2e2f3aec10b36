/* llmir's onnxruntime custom op: f32 activations times int8 weights, one f32 scale per row.
 *
 * Domain `ai.llmir`, op `MatMulS8`: inputs X f32 [..., K], W int8 [ceil(N/4), ceil(K/32), 4, 32],
 * S f32 [N]; output Y f32 [..., N] = X @ (codes * S[:, None])^T. llmir quantizes the weight at
 * build time, symmetric per output row (S = max|w[n, :]| / 127, codes in [-127, 127]) and stores
 * the codes with rows in groups of 4 interleaved by blocks of 32 columns, zero-padded
 * (llmir_core/quant/s8.py): one pass over 4 rows reads one contiguous stream. W is read in
 * place (no prepacking, no copy: the session maps it from the data file).
 *
 * - M (rows of X) <= S8_GEMV_ROWS (decode): each X row is rounded once per call to int8 in
 *   blocks of 32 columns (d = max|x_block| / 127, round half to even, like llama.cpp's q8_0),
 *   then every weight row is read once and dotted in int8: |q| as u8 times sign(q) * w as s8
 *   (vpsignb) with vpmaddubsw (a pair of products <= 2 * 127 * 127 < 32767: no saturation),
 *   vpmaddwd into int32, converted once per block and scaled by d with an FMA; four weight rows
 *   per pass (four accumulators), software prefetch ahead of the stream; groups of rows are
 *   split over onnxruntime's intra-op pool in tasks of S8_GEMV_CHUNK rows (claimed one by one,
 *   so the threads finish together). Y[m, n] = S[n] * sum_b d[m, b] * sum_{k in b} q[m, k] *
 *   codes[n, k].
 * - larger M (prefill): each X row is rounded once per call to 7-bit unsigned codes per block
 *   of 32 columns with a zero point (d = range / 127 over [min(x_b, 0), max(x_b, 0)]), so
 *   vpmaddubsw multiplies them by the signed weight codes directly (a pair of products <= 2 *
 *   127 * 127: no saturation, no sign trick); X codes are packed per 6 rows as [K/4][6][4], each
 *   16-row weight panel as [K/4][16][4] (8x8 transposes of 4-code lanes) with its per-block code
 *   sums; a 6x16 micro-kernel (12 int32 accumulators) sums one block, then rescales into an f32
 *   tile: f += d * acc - z * d * colsum. Y[m, n] = S[n] * sum_b d[m, b] * (sum_{k in b} q[m, k] *
 *   codes[n, k] - z[m, b] * sum_{k in b} codes[n, k]). Panels are the parallel tasks. Measured
 *   against dequantizing 16x384 weight blocks into f32 panels for llmir_micro_6x16 (f32_gemm.h):
 *   1.2-1.4x faster (docs/perf.md).
 * - node attribute `epilogue = "swiglu"`: W holds [W_gate; W_up] (N = 2H rows) and Y [..., H] =
 *   silu(X W_gate^T) * (X W_up^T) (q8_act.h): at decode each task computes 16 gate rows and the
 *   matching up rows, at prefill the [M, N] product goes to a scratch first.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "ort_abi.h"
#include "q8_act.h"

#define S8_GEMV_ROWS 4 /* X rows up to which the int8 GEMV path runs */
#define S8_GEMV_CHUNK 16 /* weight rows per parallel task (GEMV) */
#define S8_QB 32 /* activation block (columns per scale) */
#define S8_PREFETCH 1024 /* bytes ahead of the weight stream to prefetch (GEMV) */
#define S8_STACK 16384
#ifndef S8_PREFILL_I8
#define S8_PREFILL_I8 1
#endif /* activation buffers up to this size live on the stack (GEMV) */

typedef struct S8Job {
    const float *x;
    const int8_t *w;
    const float *s;
    float *y;
    int64_t M, N, K;
    /* GEMV: X rounded to int8 per 32-block: xa = |q| (u8), xs = q (for the sign), d = scales */
    const uint8_t *xa;
    const int8_t *xs;
    const float *d;
    int64_t kb; /* 32-blocks per row (K rounded up) */
} S8Job;

/* -- activation rounding (GEMV) ------------------------------------------------------------- */

static void quantize_row(const float *x, int64_t K, int64_t kb, uint8_t *xa, int8_t *xs, float *d) {
    for (int64_t b = 0; b < kb; b++) {
        int64_t k0 = b * S8_QB, n = K - k0 < S8_QB ? K - k0 : S8_QB;
        const float *src = x + k0;
        float t[S8_QB];
        if (n < S8_QB) { /* the last, partial block: zero-padded (the weights are 0 there) */
            memset(t, 0, sizeof t);
            memcpy(t, src, (size_t)n * sizeof(float));
            src = t;
        }
        d[b] = llmir_quant32(src, xs + k0, NULL);
        __m256i q = _mm256_loadu_si256((const __m256i *)(xs + k0));
        _mm256_storeu_si256((__m256i *)(xa + k0), _mm256_sign_epi8(q, q));
    }
}

/* -- GEMV ------------------------------------------------------------------------------------ */

static inline __m256 block_dot(__m256i w, __m256i xa, __m256i xs, __m256i ones, __m256 d,
                               __m256 acc) {
    __m256i p = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(w, xs));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)), d, acc);
}

/* weight rows are stored interleaved by 4 (see the top): a pass over 4 rows reads one stream */
static inline const int8_t *w_at(const S8Job *j, int64_t r, int64_t k) {
    return j->w + ((r >> 2) * j->kb + (k >> 5)) * (4 * S8_QB) + (r & 3) * S8_QB + (k & 31);
}

/* rows [r0, r1) of Y into out[m * ldo + r - r0]: whole groups of 4 rows are computed */
static void gemv_rows(const S8Job *j, int64_t r0, int64_t r1, float *out, int64_t ldo) {
    const int64_t kb = j->kb;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t g = r0 / 4; g * 4 < r1; g++) {
        const int8_t *wg = j->w + g * kb * 4 * S8_QB;
        for (int64_t m = 0; m < j->M; m++) {
            const uint8_t *xa = j->xa + m * kb * S8_QB;
            const int8_t *xs = j->xs + m * kb * S8_QB;
            const float *d = j->d + m * kb;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t b = 0; b < kb; b++) {
                const int8_t *w = wg + b * 4 * S8_QB;
                if (m == 0) {
                    _mm_prefetch((const char *)(w + S8_PREFETCH), _MM_HINT_T0);
                    _mm_prefetch((const char *)(w + S8_PREFETCH + 64), _MM_HINT_T0);
                }
                __m256i va = _mm256_loadu_si256((const __m256i *)(xa + b * S8_QB));
                __m256i vs = _mm256_loadu_si256((const __m256i *)(xs + b * S8_QB));
                __m256 dv = _mm256_broadcast_ss(d + b);
                a0 = block_dot(_mm256_loadu_si256((const __m256i *)w), va, vs, ones, dv, a0);
                a1 = block_dot(_mm256_loadu_si256((const __m256i *)(w + 32)), va, vs, ones, dv, a1);
                a2 = block_dot(_mm256_loadu_si256((const __m256i *)(w + 64)), va, vs, ones, dv, a2);
                a3 = block_dot(_mm256_loadu_si256((const __m256i *)(w + 96)), va, vs, ones, dv, a3);
            }
            float r[4] = {llmir_hsum(a0), llmir_hsum(a1), llmir_hsum(a2), llmir_hsum(a3)};
            for (int c = 0; c < 4; c++) {
                int64_t n = g * 4 + c;
                if (n >= r0 && n < r1) out[m * ldo + n - r0] = r[c] * j->s[n];
            }
        }
    }
}

static void gemv_task(void *p, size_t i) {
    const S8Job *j = (const S8Job *)p;
    int64_t r0 = (int64_t)i * S8_GEMV_CHUNK, r1 = r0 + S8_GEMV_CHUNK < j->N ? r0 + S8_GEMV_CHUNK : j->N;
    gemv_rows(j, r0, r1, j->y + r0, j->N);
}

/* epilogue "swiglu" (W = [gate; up], H = N/2 outputs): gate rows r0..r1 and up rows H+r0..H+r1
 * into a scratch, then silu(gate) * up */
static void gemv_swiglu_task(void *p, size_t i) {
    const S8Job *j = (const S8Job *)p;
    const int64_t H = j->N / 2, r0 = (int64_t)i * S8_GEMV_CHUNK;
    const int64_t r1 = r0 + S8_GEMV_CHUNK < H ? r0 + S8_GEMV_CHUNK : H;
    float t[S8_GEMV_ROWS * 2 * S8_GEMV_CHUNK];
    gemv_rows(j, r0, r1, t, 2 * S8_GEMV_CHUNK);
    gemv_rows(j, H + r0, H + r1, t + S8_GEMV_CHUNK, 2 * S8_GEMV_CHUNK);
    for (int64_t m = 0; m < j->M; m++)
        llmir_swiglu(t + m * 2 * S8_GEMV_CHUNK, t + m * 2 * S8_GEMV_CHUNK + S8_GEMV_CHUNK,
                     j->y + m * H + r0, r1 - r0);
}

/* -- int8 GEMM (prefill) --------------------------------------------------------------------- */

/* X row -> 7-bit unsigned codes per block of 32 columns over [min(x_b, 0), max(x_b, 0)]:
 * q = clamp(round(x * 127 / range) + z, 0, 127), z = clamp(round(-min * 127 / range), 0, 127),
 * d = range / 127, zd = z * d (a zero block: d = zd = 0, codes 0); columns past K code 0. */
static void quantize_row_u7(const float *x, int64_t K, int64_t kb, uint8_t *q, float *d,
                            float *zd) {
    for (int64_t b = 0; b < kb; b++) {
        int64_t k0 = b * S8_QB, n = K - k0 < S8_QB ? K - k0 : S8_QB;
        float t[S8_QB] __attribute__((aligned(32)));
        memset(t, 0, sizeof t);
        memcpy(t, x + k0, (size_t)n * sizeof(float));
        __m256 v[4] = {_mm256_load_ps(t), _mm256_load_ps(t + 8), _mm256_load_ps(t + 16),
                       _mm256_load_ps(t + 24)};
        __m256 lo = _mm256_min_ps(_mm256_min_ps(v[0], v[1]), _mm256_min_ps(v[2], v[3]));
        __m256 hi = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
        float lo8[8], hi8[8], mn = 0.0f, mx = 0.0f;
        _mm256_storeu_ps(lo8, lo);
        _mm256_storeu_ps(hi8, hi);
        for (int e = 0; e < 8; e++) mn = lo8[e] < mn ? lo8[e] : mn, mx = hi8[e] > mx ? hi8[e] : mx;
        uint8_t *qb = q + k0;
        if (llmir_has_nan32(v)) { /* NaN in, NaN out (min and max above drop NaNs) */
            memset(qb, 0, S8_QB);
            d[b] = zd[b] = __builtin_nanf("");
            continue;
        }
        if (mx - mn <= 0.0f) {
            memset(qb, 0, S8_QB);
            d[b] = 0.0f, zd[b] = 0.0f;
            continue;
        }
        float inv = 127.0f / (mx - mn), db = (mx - mn) / 127.0f;
        int32_t z = _mm_cvtss_si32(_mm_set_ss(-mn * inv)); /* half to even */
        z = z < 0 ? 0 : (z > 127 ? 127 : z);
        const __m256 iv = _mm256_set1_ps(inv);
        const __m256i zv = _mm256_set1_epi32(z), lo7 = _mm256_setzero_si256(),
                      hi7 = _mm256_set1_epi32(127);
        __m256i c[4];
        for (int e = 0; e < 4; e++) {
            __m256i u = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[e], iv)), zv);
            c[e] = _mm256_min_epi32(_mm256_max_epi32(u, lo7), hi7);
        }
        __m256i p = _mm256_packus_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)qb, p);
        if (n < S8_QB) memset(qb + n, 0, (size_t)(S8_QB - n)); /* the weights are 0 there */
        d[b] = db, zd[b] = (float)z * db;
    }
}

#define I8_MR 6 /* X rows per int8 micro-tile */
#define I8_NR 16 /* weight rows per int8 panel */
#define I8_G (S8_QB / 4) /* 4-column groups per 32-column block */

typedef struct S8Gemm {
    const S8Job *j;
    const uint8_t *a; /* X codes packed per 6-row block: [M/6][kp/4][6][4] */
    const float *d, *zd; /* per 6-row block: [M/6][kb][6] */
} S8Gemm;

/* f[r][c] += d[r] * (sum over the block's 32 columns of a[r] * b[c]) - zd[r] * colsum[c] */
static __attribute__((noinline)) void i8_block(const uint8_t *a, const int32_t *b, const float *d, const float *zd,
                            const float *colsum, float *f) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256i c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int g = 0; g < I8_G; g++) {
        __m256i b0 = _mm256_load_si256((const __m256i *)(b + g * I8_NR));
        __m256i b1 = _mm256_load_si256((const __m256i *)(b + g * I8_NR + 8));
        const uint8_t *ar = a + g * I8_MR * 4;
        __m256i x;
        int32_t v;
#define I8_ROW(i, C0, C1)                                                               \
    memcpy(&v, ar + 4 * (i), 4);                                                        \
    x = _mm256_set1_epi32(v);                                                           \
    C0 = _mm256_add_epi32(C0, _mm256_madd_epi16(_mm256_maddubs_epi16(x, b0), ones));    \
    C1 = _mm256_add_epi32(C1, _mm256_madd_epi16(_mm256_maddubs_epi16(x, b1), ones));    \
    __asm__("" : "+x"(C0), "+x"(C1)); /* keeps gcc from hoisting all 12 products (spills) */
        I8_ROW(0, c00, c01)
        I8_ROW(1, c10, c11)
        I8_ROW(2, c20, c21)
        I8_ROW(3, c30, c31)
        I8_ROW(4, c40, c41)
        I8_ROW(5, c50, c51)
#undef I8_ROW
    }
    __m256i acc[I8_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    __m256 cs0 = _mm256_load_ps(colsum), cs1 = _mm256_load_ps(colsum + 8);
    for (int r = 0; r < I8_MR; r++) {
        __m256 dv = _mm256_broadcast_ss(d + r), zv = _mm256_broadcast_ss(zd + r);
        __m256 f0 = _mm256_load_ps(f + r * I8_NR), f1 = _mm256_load_ps(f + r * I8_NR + 8);
        f0 = _mm256_fnmadd_ps(zv, cs0, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), dv, f0));
        f1 = _mm256_fnmadd_ps(zv, cs1, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][1]), dv, f1));
        _mm256_store_ps(f + r * I8_NR, f0);
        _mm256_store_ps(f + r * I8_NR + 8, f1);
    }
}

/* Y[:, n0:n0+16] for one panel of 16 weight rows */
static void gemm8_task(void *p, size_t i) {
    const S8Gemm *g = (const S8Gemm *)p;
    const S8Job *j = g->j;
    const int64_t kb = j->kb, groups = kb * I8_G;
    int64_t n0 = (int64_t)i * I8_NR;
    int nr = j->N - n0 < I8_NR ? (int)(j->N - n0) : I8_NR;
    /* panel [kp / 4][16] int32 (4 consecutive codes of each weight row), colsum [kb][16] */
    int32_t *panel = (int32_t *)aligned_alloc(32, (size_t)(groups + kb) * I8_NR * 4);
    if (!panel) return; /* ~16 * K bytes */
    float *colsum = (float *)(panel + groups * I8_NR);
    const __m256i u1 = _mm256_set1_epi8(1), w1 = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < kb; b++)
        for (int c0 = 0; c0 < I8_NR; c0 += 8) {
            __m256 r[8]; /* the block's 32 codes of 8 weight rows, as 8 lanes of 4 codes */
            for (int c = 0; c < 8; c++)
                r[c] = n0 + c0 + c < j->N ? _mm256_castsi256_ps(_mm256_loadu_si256(
                                                (const __m256i *)w_at(j, n0 + c0 + c, b * S8_QB)))
                                          : _mm256_setzero_ps();
            int32_t *dst = panel + b * I8_G * I8_NR + c0;
            llmir_transpose8_store(r, (float *)dst, I8_NR); /* dst[e * 16 + c] = lane e of row c */
            __m256i sum = _mm256_setzero_si256();
            for (int e = 0; e < I8_G; e++) {
                __m256i v = _mm256_load_si256((const __m256i *)(dst + e * I8_NR));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u1, v), w1));
            }
            _mm256_store_ps(colsum + b * I8_NR + c0, _mm256_cvtepi32_ps(sum));
        }
    float f[I8_MR * I8_NR] __attribute__((aligned(32)));
    for (int64_t m0 = 0, mb = 0; m0 < j->M; m0 += I8_MR, mb++) {
        const uint8_t *a = g->a + mb * groups * I8_MR * 4;
        const float *d = g->d + mb * kb * I8_MR, *zd = g->zd + mb * kb * I8_MR;
        memset(f, 0, sizeof f);
        for (int64_t b = 0; b < kb; b++)
            i8_block(a + b * I8_G * I8_MR * 4, panel + b * I8_G * I8_NR, d + b * I8_MR,
                     zd + b * I8_MR, colsum + b * I8_NR, f);
        int mr = j->M - m0 < I8_MR ? (int)(j->M - m0) : I8_MR;
        for (int r = 0; r < mr; r++) {
            float *y = j->y + (m0 + r) * j->N + n0;
            for (int c = 0; c < nr; c++) y[c] = f[r * I8_NR + c] * j->s[n0 + c];
        }
    }
    free(panel);
}

/* X rows -> codes and scales packed per 6-row block (rows past M repeat the last) */
static OrtStatus *gemm8(const OrtApi *api, OrtKernelContext *ctx, ParallelForFn pfor, S8Job *j) {
    const int64_t kb = j->kb, kp = kb * S8_QB, mbs = (j->M + I8_MR - 1) / I8_MR;
    /* codes [M/6][kp/4][6][4], one row's codes, scales and zero * scale [M/6][kb][6] and one
     * row's */
    size_t bytes = (size_t)(mbs * I8_MR + 1) * (size_t)(kp + 8 * kb);
    uint8_t *buf = (uint8_t *)aligned_alloc(32, (bytes + 31) & ~(size_t)31);
    if (!buf) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulS8: out of memory");
    uint8_t *a = buf, *row = buf + mbs * I8_MR * kp;
    float *d = (float *)(row + kp), *zd = d + mbs * I8_MR * kb;
    float *rd = zd + mbs * I8_MR * kb, *rz = rd + kb;
    for (int64_t m = 0; m < mbs * I8_MR; m++) {
        int64_t mb = m / I8_MR, r = m % I8_MR, src = m < j->M ? m : j->M - 1;
        quantize_row_u7(j->x + src * j->K, j->K, kb, row, rd, rz);
        uint8_t *ab = a + mb * kp * I8_MR;
        for (int64_t kg = 0; kg < kp / 4; kg++) memcpy(ab + (kg * I8_MR + r) * 4, row + kg * 4, 4);
        for (int64_t b = 0; b < kb; b++)
            d[(mb * kb + b) * I8_MR + r] = rd[b], zd[(mb * kb + b) * I8_MR + r] = rz[b];
    }
    S8Gemm g = {j, a, d, zd};
    OrtStatus *st = pfor(ctx, gemm8_task, (size_t)((j->N + I8_NR - 1) / I8_NR), 0, &g);
    free(buf);
    return st;
}

/* -- the custom op ---------------------------------------------------------------------------- */

typedef struct S8Kernel {
    const OrtApi *api;
    int epilogue; /* EPI_NONE / EPI_SWIGLU (the node's `epilogue`) / EPI_BAD */
} S8Kernel;

static void *s8_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    (void)op;
    S8Kernel *k = (S8Kernel *)malloc(sizeof(S8Kernel));
    if (k) k->api = api, k->epilogue = llmir_epilogue_attr(api, info);
    return k;
}

static void s8_destroy(void *k) { free(k); }

static OrtStatus *s8_compute(void *kern, OrtKernelContext *ctx) {
    const S8Kernel *kn = (const S8Kernel *)kern;
    const OrtApi *api = kn->api;
    const OrtValue *xv = NULL, *wv = NULL, *sv = NULL;
    OrtValue *yv = NULL;
    int64_t xd[8], wd[8], sd[8], yd[8];
    OrtStatus *st;
    if (kn->epilogue == EPI_BAD)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulS8: unknown epilogue (expected \"swiglu\" or none)");
    const int swiglu = kn->epilogue == EPI_SWIGLU;
    GetInputFn get = API(api, I_KernelContext_GetInput, GetInputFn);
    if ((st = get(ctx, 0, &xv)) || (st = get(ctx, 1, &wv)) || (st = get(ctx, 2, &sv))) return st;
    int xr = llmir_shape_of(api, xv, xd), wr = llmir_shape_of(api, wv, wd);
    int sr = llmir_shape_of(api, sv, sd);
    if (xr < 1 || sr != 1 || wr != 4 || llmir_rows(xd, xr - 1) < 0 || xd[xr - 1] > INT64_MAX - S8_QB)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulS8: X [..., K], W [N/4, K/32, 4, 32] and S [N] expected");
    int64_t M = 1, N = sd[0], K = xd[xr - 1], kb = (K + S8_QB - 1) / S8_QB;
    if (wd[0] != (N + 3) / 4 || wd[1] != kb || wd[2] != 4 || wd[3] != S8_QB)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulS8: W is not [ceil(N/4), ceil(K/32), 4, 32] for X [..., K] "
                           "and S [N]");
    if (swiglu && N % 2)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulS8: epilogue \"swiglu\" needs an even N ([gate; up])");
    const int64_t NO = swiglu ? N / 2 : N;
    for (int i = 0; i < xr - 1; i++) M *= xd[i], yd[i] = xd[i];
    yd[xr - 1] = NO;
    if ((st = API(api, I_KernelContext_GetOutput, GetOutputFn)(ctx, 0, yd, (size_t)xr, &yv)))
        return st;
    void *x = NULL, *w = NULL, *s = NULL, *y = NULL;
    GetTensorMutableDataFn data = API(api, I_GetTensorMutableData, GetTensorMutableDataFn);
    if ((st = data((OrtValue *)xv, &x)) || (st = data((OrtValue *)wv, &w)) ||
        (st = data((OrtValue *)sv, &s)) || (st = data(yv, &y)))
        return st;
    if (M == 0 || N == 0) return NULL;
    if (K == 0) {
        memset(y, 0, (size_t)(M * NO) * sizeof(float));
        return NULL;
    }
    S8Job j = {(const float *)x, (const int8_t *)w, (const float *)s, (float *)y, M, N, K,
               NULL, NULL, NULL, kb};
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    if (M > S8_GEMV_ROWS) {
        if (!swiglu) return gemm8(api, ctx, pfor, &j);
        /* prefill with the epilogue: the [M, N] product first */
        float *full = (float *)aligned_alloc(32, ((size_t)(M * N) * sizeof(float) + 31) & ~(size_t)31);
        if (!full) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulS8: out of memory");
        j.y = full;
        st = gemm8(api, ctx, pfor, &j);
        if (!st) {
            LlmirSwigluRows r = {full, (float *)y, M, NO};
            st = pfor(ctx, llmir_swiglu_rows_task, (size_t)M, 0, &r);
        }
        free(full);
        return st;
    }
    int64_t kp = kb * S8_QB;
    /* one buffer: |q| and q for every row, then the block scales */
    size_t bytes = (size_t)(((2 * kp + 4 * kb) * M + 63) & ~31);
    uint8_t local[S8_STACK] __attribute__((aligned(32)));
    uint8_t *buf = bytes <= S8_STACK ? local : (uint8_t *)aligned_alloc(32, bytes);
    if (!buf) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulS8: out of memory");
    uint8_t *xa = buf;
    int8_t *xs = (int8_t *)(buf + kp * M);
    float *d = (float *)(buf + 2 * kp * M);
    for (int64_t m = 0; m < M; m++)
        quantize_row(j.x + m * K, K, kb, xa + m * kp, xs + m * kp, d + m * kb);
    j.xa = xa, j.xs = xs, j.d = d;
    st = pfor(ctx, swiglu ? gemv_swiglu_task : gemv_task,
              (size_t)((NO + S8_GEMV_CHUNK - 1) / S8_GEMV_CHUNK), 0, &j);
    if (buf != local) free(buf);
    return st;
}

static const char *s8_name(const OrtCustomOp *op) { (void)op; return "MatMulS8"; }
static int s8_input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 1 ? T_INT8 : T_FLOAT;
}
static size_t s8_three(const OrtCustomOp *op) { (void)op; return 3; }

static OrtCustomOp op_s8 =
    LLMIR_QUANT_OP(s8_create, s8_name, s8_input_type, s8_three, llmir_required, s8_destroy, s8_compute);

/* adds MatMulS8 to the ai.llmir domain (register.c) */
OrtStatus *llmir_add_matmul_s8(const OrtApi *api, OrtCustomOpDomain *domain) {
    return API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_s8);
}
