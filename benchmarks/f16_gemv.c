/* What a 16-bit weight kernel would gain at decode on an AVX2 CPU (not part of llmir's build).
 *
 * onnxruntime 1.32 has no f16/bf16 GEMM on x86 (benchmarks/precision_kernels.py): a `--dtype f16`
 * build computes in f32 and reads f32 weights. This measures the headroom a custom kernel would
 * have: batch-1 GEMVs over the SmolLM2-135M weight set (30 layers of packed QKV 960x576, o 576x576,
 * gate+up 3072x576, down 576x1536, and the 49152x576 lm_head), weights read as f32, as f16
 * (F16C vcvtph2ps) and as bf16 (shift into the top half of an f32), one thread, best of 7
 * interleaved passes. A GEMV this size is bound by memory bandwidth, so the ratio tracks the
 * bytes read.
 *
 *     cc -O2 -mavx2 -mfma -mf16c benchmarks/f16_gemv.c -o /tmp/f16_gemv && /tmp/f16_gemv
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static float hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_hadd_ps(s, s);
    s = _mm_hadd_ps(s, s);
    return _mm_cvtss_f32(s);
}

/* y[n] = sum_k W[n, k] x[k], W row-major [N, K], K a multiple of 16 */
static void gemv_f32(const float *W, const float *x, float *y, int N, int K) {
    for (int n = 0; n < N; n++) {
        const float *w = W + (size_t)n * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
        }
        y[n] = hsum(_mm256_add_ps(a0, a1));
    }
}

static void gemv_f16(const uint16_t *W, const float *x, float *y, int N, int K) {
    for (int n = 0; n < N; n++) {
        const uint16_t *w = W + (size_t)n * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 16) {
            __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k)));
            __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + k + 8)));
            a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + k + 8), a1);
        }
        y[n] = hsum(_mm256_add_ps(a0, a1));
    }
}

static void gemv_bf16(const uint16_t *W, const float *x, float *y, int N, int K) {
    for (int n = 0; n < N; n++) {
        const uint16_t *w = W + (size_t)n * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 16) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + k));
            __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(v));
            __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1));
            a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
                                 _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)),
                                 _mm256_loadu_ps(x + k + 8), a1);
        }
        y[n] = hsum(_mm256_add_ps(a0, a1));
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    enum { LAYERS = 30, HEAD_N = 49152, HEAD_K = 576 };
    static const int shapes[4][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
    size_t per = 0;
    for (int i = 0; i < 4; i++) per += (size_t)shapes[i][0] * shapes[i][1];
    size_t total = per * LAYERS + (size_t)HEAD_N * HEAD_K;
    float *w32 = aligned_alloc(64, total * 4);
    uint16_t *w16 = aligned_alloc(64, total * 2);
    if (!w32 || !w16) return 1;
    for (size_t i = 0; i < total; i++) {
        w32[i] = (float)((i * 2654435761u) % 1000) / 1000.f - 0.5f;
        w16[i] = _cvtss_sh(w32[i], 0);
    }
    static float x[3072], y[HEAD_N];
    for (int i = 0; i < 3072; i++) x[i] = 0.01f * (float)i;
    double best[3] = {1e9, 1e9, 1e9};
    for (int rep = 0; rep < 7; rep++) {
        for (int m = 0; m < 3; m++) {
            double t0 = now();
            size_t off = 0;
            for (int l = 0; l <= LAYERS; l++) {
                for (int i = 0; i < (l < LAYERS ? 4 : 1); i++) {
                    int N = l < LAYERS ? shapes[i][0] : HEAD_N, K = l < LAYERS ? shapes[i][1] : HEAD_K;
                    if (m == 0) gemv_f32(w32 + off, x, y, N, K);
                    else if (m == 1) gemv_f16(w16 + off, x, y, N, K);
                    else gemv_bf16(w16 + off, x, y, N, K);
                    off += (size_t)N * K;
                }
            }
            double dt = now() - t0;
            if (dt < best[m]) best[m] = dt;
        }
    }
    printf("%.1fM weights: f32 %.1f ms (%.1f GB/s), f16 %.1f ms, bf16 %.1f ms; "
           "16-bit speedup f16 %.2fx, bf16 %.2fx\n",
           total / 1e6, best[0] * 1e3, total * 4 / best[0] / 1e9, best[1] * 1e3, best[2] * 1e3,
           best[0] / best[1], best[0] / best[2]);
    return 0;
}
