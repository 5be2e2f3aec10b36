/* llmir's onnxruntime custom ops: f32 activations times 16-bit (f16 or bf16) weights.
 *
 * Domain `ai.llmir`, ops `MatMulF16` and `MatMulBf16`: Y[..., N] = X[..., K] @ W^T, X and Y f32,
 * W [N, K] in float16 / bfloat16, widened to f32 in registers (F16C vcvtph2ps; bf16 is the top
 * half of an f32) and accumulated in f32 with FMA. onnxruntime 1.32's CPU provider has no 16-bit
 * GEMM on x86, so without this a 16-bit weight is widened to f32 when the session loads and every
 * decode step reads twice the bytes.
 *
 * - M (rows of X) <= GEMV_ROWS: a GEMV streaming each weight row once per call straight from its
 *   stored format, applied to up to 4 rows of X per pass (decode: bound by memory bandwidth);
 * - larger M (prefill): for each panel of 16 weight rows and block of KC columns, the block is
 *   widened once into an f32 [KC][16] panel and multiplied into 6-row blocks of X with a 6x16
 *   outer-product kernel (12 accumulators), so the conversion is paid once per M rows.
 * - the AVX-512 variant (isa.h: llmir_isa() is LLMIR_ISA_AVX512, checked once per call; 16-bit
 *   weights only) runs the GEMV to M <= GEMV512_ROWS (16) with 512-bit vectors and masked K tails:
 *   one or two rows of X stream each weight row once (dot_row512, dot2_512); from 3 rows the
 *   weight rows go 4 at a time through a register block of 4 weight rows x up to 6 X rows (24
 *   accumulators: each 16 weights widened once for every X row, each 16 X values loaded once for
 *   4 weight rows), in passes of at most 6 rows that take the block from L1 after the first, its
 *   range prefetched ahead (into L2) in address order. The weights are read from memory once per
 *   call at any M <= 16. Measured on Zen 4, one thread, the SmolLM2-135M shapes
 *   (benchmarks/matmul16_kernels.py --isa avx2,avx512): one row 1.2-1.4x the AVX2 GEMV's speed,
 *   8 rows cost 1.8x one row (AVX2: 2.1x), 16 rows 2.9x (AVX2, through the GEMM: 3.5x).
 * Work is split over weight-row chunks on onnxruntime's intra-op pool
 * (KernelContext_ParallelFor), so the session's thread count applies.
 *
 * Node attribute `epilogue = "swiglu"` (q8_act.h): W holds [W_gate; W_up] (N = 2H rows) and
 * Y [..., H] = silu(X W_gate^T) * (X W_up^T). Decode: the gate rows into a scratch [M, H], then
 * the up rows, each task combining its run of up rows with the matching gate products as they
 * finish (each half streamed front to back as the two unfused matmuls would read it: one
 * sequential stream per thread); prefill: the [M, 2H] product into a scratch, then the rows
 * combined in parallel. Each output is summed by one thread in a fixed order: the
 * same bits at any thread count.
 *
 * Built with the other sources of this folder into one library by
 * llmir_core/targets/onnxruntime/native/__init__.py (cc -O3 -mavx2 -mfma -mf16c -shared -fPIC); the
 * onnxruntime ABI is in ort_abi.h, the f32 GEMM micro-kernel in f32_gemm.h. The same kernels'
 * f32 instance serves ai.llmir MatMulF32 with a row-major weight (matmul_f32.c:
 * llmir_matmul_rows_f32).
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "isa.h"
#include "ort_abi.h"
#include "q8_act.h" /* the SwiGLU epilogue (llmir_epilogue_attr, llmir_swiglu) */

/* -- kernels ------------------------------------------------------------------------------ */

enum { W_F16 = 0, W_BF16 = 1, W_F32 = 2 };
#define GEMV_ROWS 8 /* X rows up to which the GEMV path runs (measured: below the GEMM to M=8) */
#define GEMV512_ROWS 16 /* the same for the AVX-512 variant (register-blocked over X rows) */
#define GEMV_TASKS 32 /* parallel tasks per GEMV call at most (claimed dynamically by threads) */
#define GEMV_MIN_ROWS 8 /* weight rows per GEMV task at least */
#define GEMM_PANELS 2 /* panels per parallel task (GEMM) */
#define SWIGLU_CHUNK 128 /* most output columns per GEMV task with the SwiGLU epilogue */

/* 8 weights at p (element offset already applied) widened to f32; wt is a compile-time constant
 * at every call site (the kernels below are instantiated per weight type) */
static inline __attribute__((always_inline)) __m256 load8(const void *p, int wt) {
    if (wt == W_F32) return _mm256_loadu_ps((const float *)p);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    if (wt == W_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

static inline __attribute__((always_inline)) float load1(const void *p, int wt) {
    if (wt == W_F32) return *(const float *)p;
    uint16_t h = *(const uint16_t *)p;
    if (wt == W_F16) return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bytes per weight of a weight type */
static inline __attribute__((always_inline)) int64_t wsize(int wt) { return wt == W_F32 ? 4 : 2; }

/* the address of W[n, k] */
static inline __attribute__((always_inline)) const void *wat(const void *w, int64_t i, int wt) {
    return (const char *)w + i * wsize(wt);
}

typedef struct Job {
    const float *x;
    const void *w;
    float *y;
    int64_t M, N, K;
    int wt;
    int64_t gemv_rows; /* weight rows per GEMV task (with the epilogue: output columns) */
    int64_t ldy, y0; /* weight row n of X row m goes to y[m * ldy + n - y0] (GEMM: y0 = 0) */
    const float *g; /* GEMV with the SwiGLU epilogue: the gate product [M, N/2] */
    int isa512; /* the GEMV runs its AVX-512 variant (llmir_isa()) */
} Job;

/* sum_k w[k] x[k]: one weight row streamed front to back, 64 columns per step into 8
 * independent accumulators, each cache line of a 16-bit row prefetched PF_AHEAD bytes early
 * (for f32 rows the software prefetch measured slower than the hardware's alone). One sequential
 * stream per thread is what the hardware prefetcher serves best: reading 2-4 rows side by side
 * measured 30-40% slower on Zen 3; 8 accumulators and the prefetch bring the f16 row read from
 * ~80% to ~90% of a plain read's bandwidth there (benchmarks/matmul16_kernels.py). */
#define PF_AHEAD 1024
static inline __attribute__((always_inline)) float dot_row(const void *w, const float *x,
                                                           int64_t K, int wt) {
    __m256 a[8];
    for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        if (wt != W_F32) /* f32 rows: the hardware prefetcher alone measured faster */
            for (int64_t b = 0; b < 128; b += 64)
                _mm_prefetch((const char *)wat(w, k, wt) + PF_AHEAD + b, _MM_HINT_T0);
        for (int i = 0; i < 8; i++)
            a[i] = _mm256_fmadd_ps(load8(wat(w, k + 8 * i, wt), wt), _mm256_loadu_ps(x + k + 8 * i),
                                   a[i]);
    }
    for (; k + 8 <= K; k += 8)
        a[0] = _mm256_fmadd_ps(load8(wat(w, k, wt), wt), _mm256_loadu_ps(x + k), a[0]);
    __m256 s4 = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
    __m256 t4 = _mm256_add_ps(_mm256_add_ps(a[4], a[5]), _mm256_add_ps(a[6], a[7]));
    float s = llmir_hsum(_mm256_add_ps(s4, t4));
    for (; k < K; k++) s += load1(wat(w, k, wt), wt) * x[k];
    return s;
}

/* y[r * ldy] = sum_k w[k] x[r * ldx + k] for r < MRV (2..4 rows of X): the weight row is widened
 * once per 8 columns and multiplied into every row (2 accumulators per row) */
static inline __attribute__((always_inline)) void dot_rows(const void *w, const float *x,
                                                           int64_t ldx, float *y, int64_t ldy,
                                                           int64_t K, int wt, int MRV) {
    __m256 a[4][2];
    for (int r = 0; r < MRV; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (wt != W_F32) _mm_prefetch((const char *)wat(w, k, wt) + PF_AHEAD, _MM_HINT_T0);
        __m256 w0 = load8(wat(w, k, wt), wt), w1 = load8(wat(w, k + 8, wt), wt);
        for (int r = 0; r < MRV; r++) {
            a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + k), a[r][0]);
            a[r][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * ldx + k + 8), a[r][1]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 w0 = load8(wat(w, k, wt), wt);
        for (int r = 0; r < MRV; r++)
            a[r][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * ldx + k), a[r][0]);
    }
    for (int r = 0; r < MRV; r++) {
        float s = llmir_hsum(_mm256_add_ps(a[r][0], a[r][1]));
        for (int64_t t = k; t < K; t++) s += load1(wat(w, t, wt), wt) * x[r * ldx + t];
        y[r * ldy] = s;
    }
}

/* y[m, n0:n1] for every m < M (M <= GEMV_ROWS): each weight row is read from memory once; one
 * row of X streams it at full width (dot_row), more rows take it 4 at a time (dot_rows; rows
 * after the first 4 reuse it from L1) */
static inline __attribute__((always_inline)) void gemv_rows(const Job *j, int64_t n0, int64_t n1,
                                                            int wt) {
    const int64_t K = j->K, ldy = j->ldy, M = j->M;
    for (int64_t n = n0; n < n1; n++) {
        const void *w = wat(j->w, n * K, wt);
        if (M == 1) {
            j->y[n - j->y0] = dot_row(w, j->x, K, wt);
            continue;
        }
        for (int64_t m = 0; m < M; m += 4) {
            const float *x = j->x + m * K;
            float *y = j->y + m * ldy + n - j->y0;
            switch (M - m < 4 ? M - m : 4) {
                case 1: *y = dot_row(w, x, K, wt); break;
                case 2: dot_rows(w, x, K, y, ldy, K, wt, 2); break;
                case 3: dot_rows(w, x, K, y, ldy, K, wt, 3); break;
                default: dot_rows(w, x, K, y, ldy, K, wt, 4); break;
            }
        }
    }
}

/* -- AVX-512 variant (isa.h: run when llmir_isa() is LLMIR_ISA_AVX512) ------------------------ */

/* 16 weights at p widened to f32 (wt a compile-time constant, as for load8) */
static inline __attribute__((always_inline)) LLMIR_AVX512 __m512 load16(const void *p, int wt) {
    if (wt == W_F32) return _mm512_loadu_ps(p);
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    if (wt == W_F16) return _mm512_cvtph_ps(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* the first lanes of mask m of the 16 weights at p (zero in the others): a row's K tail */
static inline __attribute__((always_inline)) LLMIR_AVX512 __m512 load16_tail(const void *p, int wt,
                                                                            __mmask16 m) {
    if (wt == W_F32) return _mm512_maskz_loadu_ps(m, p);
    __m256i v = _mm256_maskz_loadu_epi16(m, p);
    if (wt == W_F16) return _mm512_cvtph_ps(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

/* dot_row with 512-bit vectors: 32 columns per step into 2 accumulators, the last < 32 through a
 * 16-column step and a mask; each step's line of a 16-bit row prefetched PF512_ROW bytes ahead
 * into L2 (_MM_HINT_T1): on Zen 4 this reads a row at ~10-20% more bandwidth than dot_row, whose
 * wider steps and L1 prefetch made the 512-bit loop slower than none */
#define PF512_ROW 4096
static inline __attribute__((always_inline)) LLMIR_AVX512 float dot_row512(const void *w,
                                                                          const float *x,
                                                                          int64_t K, int wt) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        if (wt != W_F32) _mm_prefetch((const char *)wat(w, k, wt) + PF512_ROW, _MM_HINT_T1);
        a0 = _mm512_fmadd_ps(load16(wat(w, k, wt), wt), _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(load16(wat(w, k + 16, wt), wt), _mm512_loadu_ps(x + k + 16), a1);
    }
    if (k + 16 <= K) {
        a0 = _mm512_fmadd_ps(load16(wat(w, k, wt), wt), _mm512_loadu_ps(x + k), a0);
        k += 16;
    }
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        a1 = _mm512_fmadd_ps(load16_tail(wat(w, k, wt), wt, m), _mm512_maskz_loadu_ps(m, x + k), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

/* dot_row512 for two rows of X (x, x + ldx): y[0] and y[ldy], the weight row streamed once
 * (M = 2: measured faster than the 4-row blocks, which win from M = 3) */
static inline __attribute__((always_inline)) LLMIR_AVX512 void dot2_512(const void *w, const float *x,
                                                                       int64_t ldx, float *y,
                                                                       int64_t ldy, int64_t K, int wt) {
    const float *x1 = x + ldx;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        if (wt != W_F32) _mm_prefetch((const char *)wat(w, k, wt) + PF512_ROW, _MM_HINT_T1);
        __m512 w0 = load16(wat(w, k, wt), wt), w1 = load16(wat(w, k + 16, wt), wt);
        a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), a0);
        a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k + 16), a1);
        b0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x1 + k), b0);
        b1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x1 + k + 16), b1);
    }
    if (k + 16 <= K) {
        __m512 w0 = load16(wat(w, k, wt), wt);
        a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k), a0);
        b0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x1 + k), b0);
        k += 16;
    }
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 w1 = load16_tail(wat(w, k, wt), wt, m);
        a1 = _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m, x + k), a1);
        b1 = _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m, x1 + k), b1);
    }
    y[0] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    y[ldy] = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1));
}

/* the sums of a0..a3 (16 lanes each), in that order */
static inline __attribute__((always_inline)) LLMIR_AVX512 __m128 hsum4_512(__m512 a0, __m512 a1,
                                                                          __m512 a2, __m512 a3) {
    /* halves added: [a0 lo+hi, a1 lo+hi] and [a2, a3] (8 lanes each) */
    __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
    __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
    /* quarters added: 128-bit lane i holds a_i's 4 partial sums */
    __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
    __m128 q0 = _mm512_castps512_ps128(u), q1 = _mm512_extractf32x4_ps(u, 1);
    __m128 q2 = _mm512_extractf32x4_ps(u, 2), q3 = _mm512_extractf32x4_ps(u, 3);
    return _mm_hadd_ps(_mm_hadd_ps(q0, q1), _mm_hadd_ps(q2, q3));
}

#define NW512 4 /* weight rows per register block (batched GEMV) */
#define MR512 6 /* X rows per register block (batched GEMV): NW512 x MR512 accumulators */
#define PF512 8192 /* bytes ahead the batched GEMV prefetches its weight block's range */

/* y[r * ldy + c] = W[c] . X[r] for the NW (1 or NW512) weight rows at w (stride K) and the MRV
 * (1..MR512) rows of X at x (stride ldx): each 16 columns of a weight row widened once and
 * multiplied into every X row, each 16 columns of an X row loaded once for every weight row.
 * The NW rows, one contiguous range, are prefetched pf * PF512 bytes ahead in address order (into
 * L2: measured faster than into L1 here, as for dot_row512): read
 * side by side they are NW short streams that the hardware prefetcher does not follow (measured
 * 1.5-2x slower at M = 2..8 without); pass p over the same rows takes pf = p + 1, so the reads
 * of what follows go on while the later passes multiply from L1 */
static inline __attribute__((always_inline)) LLMIR_AVX512 void block512(
    const void *w, int64_t K, const float *x, int64_t ldx, float *y, int64_t ldy, int wt, int NW,
    int MRV, int pf) {
    __m512 a[NW512][MR512], wv[NW512];
    for (int c = 0; c < NW; c++)
        for (int r = 0; r < MRV; r++) a[c][r] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        if (wt != W_F32) /* NW * 32 bytes a step: the step's share of the range */
            for (int64_t b = 0; b < NW * 16 * wsize(wt); b += 64)
                _mm_prefetch((const char *)w + k * wsize(wt) * NW + pf * PF512 + b, _MM_HINT_T1);
        for (int c = 0; c < NW; c++) wv[c] = load16(wat(w, c * K + k, wt), wt);
        for (int r = 0; r < MRV; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * ldx + k);
            for (int c = 0; c < NW; c++) a[c][r] = _mm512_fmadd_ps(wv[c], xv, a[c][r]);
        }
    }
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        for (int c = 0; c < NW; c++) wv[c] = load16_tail(wat(w, c * K + k, wt), wt, m);
        for (int r = 0; r < MRV; r++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, x + r * ldx + k);
            for (int c = 0; c < NW; c++) a[c][r] = _mm512_fmadd_ps(wv[c], xv, a[c][r]);
        }
    }
    for (int r = 0; r < MRV; r++) {
        if (NW == NW512)
            _mm_storeu_ps(y + r * ldy, hsum4_512(a[0][r], a[1][r], a[2][r], a[3][r]));
        else
            y[r * ldy] = _mm512_reduce_add_ps(a[0][r]);
    }
}

/* block512 over every X row for the weight rows at w: passes of at most MR512 rows, as even as
 * they go (M = 8: 4 + 4), the weight rows coming from L1 after the first pass */
static inline __attribute__((always_inline)) LLMIR_AVX512 void rows512(const Job *j, const void *w,
                                                                      float *y, int wt, int NW) {
    const int64_t K = j->K, ldy = j->ldy, passes = (j->M + MR512 - 1) / MR512;
    const int64_t per = (j->M + passes - 1) / passes;
    for (int64_t m = 0; m < j->M; m += per) {
        const float *x = j->x + m * K;
        float *ym = y + m * ldy;
        const int pf = (int)(m / per) + 1;
        switch (j->M - m < per ? j->M - m : per) {
            case 1: block512(w, K, x, K, ym, ldy, wt, NW, 1, pf); break;
            case 2: block512(w, K, x, K, ym, ldy, wt, NW, 2, pf); break;
            case 3: block512(w, K, x, K, ym, ldy, wt, NW, 3, pf); break;
            case 4: block512(w, K, x, K, ym, ldy, wt, NW, 4, pf); break;
            case 5: block512(w, K, x, K, ym, ldy, wt, NW, 5, pf); break;
            default: block512(w, K, x, K, ym, ldy, wt, NW, MR512, pf); break;
        }
    }
}

/* gemv_rows with 512-bit vectors: one or two X rows stream each weight row (dot_row512,
 * dot2_512); more rows (up to GEMV512_ROWS) take the weight rows NW512 at a time in register
 * blocks (rows512) */
static LLMIR_AVX512 void gemv_rows512(const Job *j, int64_t n0, int64_t n1, int wt) {
    if (j->M <= 2) {
        for (int64_t n = n0; n < n1; n++) {
            const void *w = wat(j->w, n * j->K, wt);
            if (j->M == 1) j->y[n - j->y0] = dot_row512(w, j->x, j->K, wt);
            else dot2_512(w, j->x, j->K, j->y + n - j->y0, j->ldy, j->K, wt);
        }
        return;
    }
    int64_t n = n0;
    for (; n + NW512 <= n1; n += NW512) rows512(j, wat(j->w, n * j->K, wt), j->y + n - j->y0, wt, NW512);
    for (; n < n1; n++) rows512(j, wat(j->w, n * j->K, wt), j->y + n - j->y0, wt, 1);
}

/* the weight rows n0..n1 of every X row, in the chosen variant */
static void gemv_any(const Job *j, int64_t n0, int64_t n1) {
    if (j->isa512) {
        if (j->wt == W_F16) gemv_rows512(j, n0, n1, W_F16);
        else if (j->wt == W_BF16) gemv_rows512(j, n0, n1, W_BF16);
        else gemv_rows512(j, n0, n1, W_F32);
    } else if (j->wt == W_F16) gemv_rows(j, n0, n1, W_F16);
    else if (j->wt == W_BF16) gemv_rows(j, n0, n1, W_BF16);
    else gemv_rows(j, n0, n1, W_F32);
}

static void gemv_task(void *p, size_t i) {
    const Job *j = (const Job *)p;
    int64_t n0 = (int64_t)i * j->gemv_rows, n1 = n0 + j->gemv_rows;
    if (n1 > j->N) n1 = j->N;
    gemv_any(j, n0, n1);
}

/* epilogue "swiglu", second pass (the gate rows' products in j->g [M, H] from the first): up
 * rows H+n0..H+n1 into a scratch on the stack, then y[m, n] = silu(gate) * up */
static void gemv_swiglu_task(void *p, size_t i) {
    const Job *j = (const Job *)p;
    const int64_t H = j->N / 2, n0 = (int64_t)i * j->gemv_rows;
    const int64_t n1 = n0 + j->gemv_rows < H ? n0 + j->gemv_rows : H;
    float t[GEMV512_ROWS * SWIGLU_CHUNK] __attribute__((aligned(32)));
    Job s = *j;
    s.y = t, s.ldy = SWIGLU_CHUNK, s.y0 = H + n0; /* up row H + n -> t[m][n - n0] */
    gemv_any(&s, H + n0, H + n1);
    for (int64_t m = 0; m < j->M; m++)
        llmir_swiglu(j->g + m * H + n0, t + m * SWIGLU_CHUNK, j->y + m * H + n0, n1 - n0);
}

static inline __attribute__((always_inline)) void pack_panel(const Job *j, int64_t n0, int nr,
                                                             int64_t k0, int kc, float *panel,
                                                             int wt) {
    const int64_t K = j->K;
    if (nr == NR) { /* full panel: 8x8 blocks widened and transposed in registers */
        int k = 0;
        for (; k + 8 <= kc; k += 8)
            for (int c0 = 0; c0 < NR; c0 += 8) {
                __m256 r[8];
                for (int c = 0; c < 8; c++)
                    r[c] = load8(wat(j->w, (n0 + c0 + c) * K + k0 + k, wt), wt);
                llmir_transpose8_store(r, panel + k * NR + c0, NR);
            }
        for (; k < kc; k++)
            for (int c = 0; c < NR; c++)
                panel[k * NR + c] = load1(wat(j->w, (n0 + c) * K + k0 + k, wt), wt);
        return;
    }
    for (int c = 0; c < NR; c++) {
        if (c >= nr) {
            for (int k = 0; k < kc; k++) panel[k * NR + c] = 0.0f;
            continue;
        }
        const void *w = wat(j->w, (n0 + c) * K + k0, wt);
        int k = 0;
        for (; k + 8 <= kc; k += 8) {
            float t[8];
            _mm256_storeu_ps(t, load8(wat(w, k, wt), wt));
            for (int e = 0; e < 8; e++) panel[(k + e) * NR + c] = t[e];
        }
        for (; k < kc; k++) panel[k * NR + c] = load1(wat(w, k, wt), wt);
    }
}

/* prefetch into L2 the lines [t0, t1) of the weight block the next pack_panel reads: rows n0.. of
 * W (up to NR), columns k0..k0+kc, lpr lines a row */
static inline __attribute__((always_inline)) void prefetch_block(const Job *j, int64_t n0, int64_t k0,
                                                                 int64_t lpr, int64_t t0,
                                                                 int64_t t1, int wt) {
    for (int64_t t = t0; t < t1; t++) {
        int64_t c = t / lpr, l = t % lpr;
        if (n0 + c >= j->N) return;
        _mm_prefetch((const char *)wat(j->w, (n0 + c) * j->K + k0, wt) + l * 64, _MM_HINT_T0);
    }
}

static inline __attribute__((always_inline)) void gemm_panels(const Job *j, size_t i, int wt) {
    float panel[KC * NR] __attribute__((aligned(32)));
    /* K in equal blocks of at most KC columns (a multiple of 8 but the last) */
    int64_t blocks = (j->K + KC - 1) / KC, step = ((j->K + blocks - 1) / blocks + 7) & ~7;
    int64_t mblocks = (j->M + MR - 1) / MR;
    for (int q = 0; q < GEMM_PANELS; q++) {
        int64_t n0 = ((int64_t)i * GEMM_PANELS + q) * NR;
        if (n0 >= j->N) return;
        int nr = j->N - n0 < NR ? (int)(j->N - n0) : NR;
        for (int64_t k0 = 0; k0 < j->K; k0 += step) {
            int kc = j->K - k0 < step ? (int)(j->K - k0) : (int)step;
            pack_panel(j, n0, nr, k0, kc, panel, wt);
            /* the block the next pack reads (the next K block, else the next panel's first),
             * fetched from memory while this one is multiplied: packing then reads L2 */
            int64_t pn = n0, pk = k0 + step;
            if (pk >= j->K) pn = n0 + NR, pk = 0;
            int64_t pkc = j->K - pk < step ? j->K - pk : step;
            int64_t lpr = (pkc * wsize(wt) + 63) / 64, lines = NR * lpr;
            int64_t per = (lines + mblocks - 1) / mblocks, t = 0;
            for (int64_t m0 = 0; m0 < j->M; m0 += MR, t += per) {
                int mr = j->M - m0 < MR ? (int)(j->M - m0) : MR;
                if (t < lines) prefetch_block(j, pn, pk, lpr, t, t + per < lines ? t + per : lines, wt);
                llmir_micro_6x16(j->x + m0 * j->K + k0, j->K, j->y + m0 * j->ldy + n0, j->ldy, panel,
                                 mr, nr, kc, k0 != 0);
            }
        }
    }
}

static void gemm_task(void *p, size_t i) {
    const Job *j = (const Job *)p;
    if (j->wt == W_F16) gemm_panels(j, i, W_F16);
    else if (j->wt == W_BF16) gemm_panels(j, i, W_BF16);
    else gemm_panels(j, i, W_F32);
}

/* -- the custom ops ----------------------------------------------------------------------- */

typedef struct Kernel {
    const OrtApi *api;
    int wt;
    int epilogue; /* EPI_NONE / EPI_SWIGLU (the node's `epilogue`) / EPI_BAD */
} Kernel;

typedef struct Op16 {
    OrtCustomOp op;
    int wt;
} Op16;

static void *create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    Kernel *k = (Kernel *)malloc(sizeof(Kernel));
    if (k) k->api = api, k->wt = ((const Op16 *)op)->wt, k->epilogue = llmir_epilogue_attr(api, info);
    return k;
}

static void destroy_kernel(void *k) { free(k); }

/* Y = X @ W^T (with the SwiGLU epilogue: Y [M, N/2], N even) on onnxruntime's intra-op pool
 * (M, N, K > 0) */
static OrtStatus *run(const OrtApi *api, OrtKernelContext *ctx, const void *x, const void *w,
                      void *y, int64_t M, int64_t N, int64_t K, int wt, int swiglu) {
    /* f32 rows (MatMulF32's tied tables) keep the AVX2 kernels: isa.c reports MatMulF32 so */
    const int isa512 = wt != W_F32 && llmir_isa() == LLMIR_ISA_AVX512;
    Job j = {(const float *)x, w, (float *)y, M, N, K, wt, 0, N, 0, NULL, isa512};
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    if (M <= (isa512 ? GEMV512_ROWS : GEMV_ROWS)) { /* up to GEMV_TASKS equal row ranges, claimed
                                                     * by the threads in turn */
        const int64_t NO = swiglu ? N / 2 : N; /* with the epilogue: each half's rows */
        int64_t tasks = (NO + GEMV_MIN_ROWS - 1) / GEMV_MIN_ROWS;
        if (tasks > GEMV_TASKS) tasks = GEMV_TASKS;
        j.gemv_rows = (NO + tasks - 1) / tasks;
        if (isa512) j.gemv_rows = (j.gemv_rows + NW512 - 1) / NW512 * NW512; /* whole blocks */
        if (swiglu && j.gemv_rows > SWIGLU_CHUNK) j.gemv_rows = SWIGLU_CHUNK;
        const size_t n_tasks = (size_t)((NO + j.gemv_rows - 1) / j.gemv_rows);
        if (!swiglu) return pfor(ctx, gemv_task, n_tasks, 0, &j);
        /* the gate rows into a scratch [M, H], then the up rows with the epilogue: each half
         * streamed front to back, as the two unfused matmuls read them */
        float *g = (float *)malloc((size_t)(M * NO) * sizeof(float));
        if (!g) return llmir_error(api, ORT_FAIL, "ai.llmir matmul: out of memory");
        Job gate = j;
        gate.N = NO, gate.y = g, gate.ldy = NO;
        OrtStatus *st = pfor(ctx, gemv_task, n_tasks, 0, &gate);
        j.g = g;
        if (!st) st = pfor(ctx, gemv_swiglu_task, n_tasks, 0, &j);
        free(g);
        return st;
    }
    const size_t tasks = (size_t)((N + NR * GEMM_PANELS - 1) / (NR * GEMM_PANELS));
    if (!swiglu) return pfor(ctx, gemm_task, tasks, 0, &j);
    /* prefill with the epilogue: the [M, N] product first (rows padded by 16 floats: a stride
     * of a multiple of 4 KiB, e.g. N = 3072, puts a 6-row tile of Y in one L1 set), then the
     * rows combined */
    j.ldy = N + NR;
    float *full =
        (float *)aligned_alloc(32, ((size_t)(M * j.ldy) * sizeof(float) + 31) & ~(size_t)31);
    if (!full) return llmir_error(api, ORT_FAIL, "ai.llmir matmul: out of memory");
    j.y = full;
    OrtStatus *st = pfor(ctx, gemm_task, tasks, 0, &j);
    if (!st) {
        LlmirSwigluRows r = {full, (float *)y, M, N / 2, j.ldy};
        st = pfor(ctx, llmir_swiglu_rows_task, (size_t)M, 0, &r);
    }
    free(full);
    return st;
}

static OrtStatus *compute(void *kp, OrtKernelContext *ctx) {
    const Kernel *kn = (const Kernel *)kp;
    const OrtApi *api = kn->api;
    const OrtValue *xv = NULL, *wv = NULL;
    OrtValue *yv = NULL;
    int64_t xd[8], wd[8], yd[8];
    OrtStatus *st;
    if ((st = API(api, I_KernelContext_GetInput, GetInputFn)(ctx, 0, &xv)) ||
        (st = API(api, I_KernelContext_GetInput, GetInputFn)(ctx, 1, &wv)))
        return st;
    if (kn->epilogue == EPI_BAD)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir matmul: unknown epilogue (expected \"swiglu\" or none)");
    const int swiglu = kn->epilogue == EPI_SWIGLU;
    int xr = llmir_shape_of(api, xv, xd), wr = llmir_shape_of(api, wv, wd);
    if (xr < 1 || wr != 2 || xd[xr - 1] != wd[1] || llmir_rows(xd, xr - 1) < 0)
        return API(api, I_CreateStatus, CreateStatusFn)(
            ORT_INVALID_ARGUMENT, "ai.llmir matmul: X [..., K] and W [N, K] do not match");
    if (swiglu && wd[0] % 2)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir matmul: epilogue \"swiglu\" needs an even N ([gate; up])");
    int64_t M = 1, N = wd[0], K = wd[1], NO = swiglu ? N / 2 : N;
    for (int i = 0; i < xr - 1; i++) M *= xd[i], yd[i] = xd[i];
    yd[xr - 1] = NO;
    if ((st = API(api, I_KernelContext_GetOutput, GetOutputFn)(ctx, 0, yd, (size_t)xr, &yv)))
        return st;
    void *x = NULL, *w = NULL, *y = NULL;
    if ((st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)xv, &x)) ||
        (st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)wv, &w)) ||
        (st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)(yv, &y)))
        return st;
    if (M == 0 || N == 0) return NULL;
    if (K == 0) { /* silu(0) * 0 = 0 too */
        memset(y, 0, (size_t)(M * NO) * sizeof(float));
        return NULL;
    }
    return run(api, ctx, x, w, y, M, N, K, kn->wt, swiglu);
}

/* MatMulF32 (matmul_f32.c) with a row-major [N, K] weight: these kernels, f32 instance (swiglu:
 * the epilogue, N even, Y [M, N/2]) */
OrtStatus *llmir_matmul_rows_f32(const OrtApi *api, OrtKernelContext *ctx, const float *x,
                                 const float *w, float *y, int64_t M, int64_t N, int64_t K,
                                 int swiglu) {
    if (M == 0 || N == 0) return NULL;
    if (K == 0) {
        memset(y, 0, (size_t)(M * (swiglu ? N / 2 : N)) * sizeof(float));
        return NULL;
    }
    return run(api, ctx, x, w, y, M, N, K, W_F32, swiglu);
}

static const char *name_f16(const OrtCustomOp *op) { (void)op; return "MatMulF16"; }
static const char *name_bf16(const OrtCustomOp *op) { (void)op; return "MatMulBf16"; }
static const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const OrtCustomOp *op, size_t i) {
    static const int types[] = {T_FLOAT16, T_BFLOAT16};
    return i == 0 ? T_FLOAT : types[((const Op16 *)op)->wt];
}
static size_t two(const OrtCustomOp *op) { (void)op; return 2; }
static size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static int output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return T_FLOAT; }
static int required(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int mem_default(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int arity1(const OrtCustomOp *op) { (void)op; return 1; }
static int homogeneous(const OrtCustomOp *op) { (void)op; return 1; }

#define OP16(NAME, WT)                                                                      \
    {{LLMIR_ORT_API, create_kernel, NAME, provider, input_type, two, output_type, one,      \
      NULL, destroy_kernel, required, required, mem_default, arity1, homogeneous,           \
      arity1, homogeneous, NULL, compute, NULL, NULL, NULL},                                \
     WT}

static Op16 op_f16 = OP16(name_f16, W_F16);
static Op16 op_bf16 = OP16(name_bf16, W_BF16);

/* adds MatMulF16 and MatMulBf16 to the ai.llmir domain (register.c) */
OrtStatus *llmir_add_matmul16(const OrtApi *api, OrtCustomOpDomain *domain) {
    Op16 *ops[] = {&op_f16, &op_bf16};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        OrtStatus *st = API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &ops[i]->op);
        if (st) return st;
    }
    return NULL;
}
