/* Why ai.llmir MatMulF16's GEMV streams one weight row at a time (not part of llmir's build).
 *
 * Batch-1 f16 GEMVs over the SmolLM2-135M weight set (30 layers of packed QKV 960x576, o 576x576,
 * gate+up 3072x576, down 576x1536, then the 49152x576 lm_head; 269 MB, more than the last-level
 * cache), each matrix split into equal halves of rows over T threads with a barrier after it
 * (as onnxruntime's ParallelFor does per node), best of 9 interleaved passes, in weight GB/s:
 *
 *   rows4     4 weight rows side by side, one accumulator each (the kernel before)
 *   row4acc   one row streamed front to back, 4 accumulators, 32 columns a step
 *   row8pf    one row, 8 accumulators, 64 columns a step, each line prefetched 1 KiB ahead
 *             (what llmir_core/targets/onnxruntime/native/matmul16.c does)
 *   read      a plain read of the same bytes (the ceiling)
 *
 *     cc -O3 -mavx2 -mfma -mf16c -pthread benchmarks/f16_gemv_access.c -o /tmp/f16_access
 *     /tmp/f16_access 2 && /tmp/f16_access 1
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline float hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 ld(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

typedef void (*Kernel)(const uint16_t *, const float *, float *, int, int, int);

static void rows4(const uint16_t *W, const float *x, float *y, int n0, int n1, int K) {
    for (int n = n0; n + 4 <= n1; n += 4) {
        const uint16_t *w0 = W + (size_t)n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < K; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + k);
            a0 = _mm256_fmadd_ps(ld(w0 + k), xv, a0);
            a1 = _mm256_fmadd_ps(ld(w1 + k), xv, a1);
            a2 = _mm256_fmadd_ps(ld(w2 + k), xv, a2);
            a3 = _mm256_fmadd_ps(ld(w3 + k), xv, a3);
        }
        y[n] = hsum(a0), y[n + 1] = hsum(a1), y[n + 2] = hsum(a2), y[n + 3] = hsum(a3);
    }
}

static void row4acc(const uint16_t *W, const float *x, float *y, int n0, int n1, int K) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *w = W + (size_t)n * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < K; k += 32) {
            a0 = _mm256_fmadd_ps(ld(w + k), _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(ld(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
            a2 = _mm256_fmadd_ps(ld(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
            a3 = _mm256_fmadd_ps(ld(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
        }
        y[n] = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    }
}

static void row8pf(const uint16_t *W, const float *x, float *y, int n0, int n1, int K) {
    for (int n = n0; n < n1; n++) {
        const uint16_t *w = W + (size_t)n * K;
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (int k = 0; k < K; k += 64) {
            _mm_prefetch((const char *)(w + k) + 1024, _MM_HINT_T0);
            _mm_prefetch((const char *)(w + k) + 1088, _MM_HINT_T0);
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_fmadd_ps(ld(w + k + 8 * i), _mm256_loadu_ps(x + k + 8 * i), a[i]);
        }
        for (int i = 1; i < 8; i++) a[0] = _mm256_add_ps(a[0], a[i]);
        y[n] = hsum(a[0]);
    }
}

static void readonly(const uint16_t *W, const float *x, float *y, int n0, int n1, int K) {
    (void)x;
    const __m256i *p = (const __m256i *)(W + (size_t)n0 * K), *e = (const __m256i *)(W + (size_t)n1 * K);
    __m256i a = _mm256_setzero_si256(), b = a;
    for (; p + 2 <= e; p += 2)
        a = _mm256_add_epi32(a, _mm256_loadu_si256(p)), b = _mm256_add_epi32(b, _mm256_loadu_si256(p + 1));
    y[n0] = (float)_mm256_extract_epi32(_mm256_add_epi32(a, b), 0);
}

enum { LAYERS = 30 };
static const int SHAPES[5][2] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}, {49152, 576}};
static uint16_t *weights;
static float xs[4096], ys[49152];
static int threads = 2;
static Kernel kernel;
static pthread_barrier_t barrier;

static void *worker(void *arg) {
    int t = (int)(intptr_t)arg;
    size_t off = 0;
    for (int l = 0; l <= LAYERS; l++)
        for (int i = l < LAYERS ? 0 : 4; i < (l < LAYERS ? 4 : 5); i++) {
            int N = SHAPES[i][0], K = SHAPES[i][1];
            int per = (N / 4 + threads - 1) / threads * 4; /* a multiple of 4 rows (rows4) */
            int n0 = t * per, n1 = n0 + per < N ? n0 + per : N;
            kernel(weights + off, xs, ys, n0, n1, K);
            pthread_barrier_wait(&barrier);
            off += (size_t)N * K;
        }
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > 8) return 2;
    size_t total = (size_t)SHAPES[4][0] * SHAPES[4][1];
    for (int i = 0; i < 4; i++) total += (size_t)SHAPES[i][0] * SHAPES[i][1] * LAYERS;
    weights = aligned_alloc(64, total * 2);
    if (!weights) return 1;
    for (size_t i = 0; i < total; i++)
        weights[i] = _cvtss_sh((float)((i * 2654435761u) % 1000) / 1000.f - 0.5f, 0);
    for (int i = 0; i < 4096; i++) xs[i] = 0.01f * (float)i;
    Kernel ks[] = {rows4, row4acc, row8pf, readonly};
    const char *names[] = {"rows4", "row4acc", "row8pf", "read"};
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    for (int rep = 0; rep < 9; rep++)
        for (int v = 0; v < 4; v++) {
            kernel = ks[v];
            pthread_t th[8];
            double t0 = now();
            for (int t = 1; t < threads; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
            worker((void *)0);
            for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
            double dt = now() - t0;
            if (dt < best[v]) best[v] = dt;
        }
    printf("%d thread(s), %.0f MB of f16 weights:\n", threads, total * 2 / 1e6);
    for (int v = 0; v < 4; v++)
        printf("  %-8s %6.1f ms %5.1f GB/s  %.2fx of read\n", names[v], best[v] * 1e3,
               total * 2 / best[v] / 1e9, best[3] / best[v]);
    return 0;
}
