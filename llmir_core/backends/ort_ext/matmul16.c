/* llmir's onnxruntime custom ops: f32 activations times 16-bit (f16 or bf16) weights.
 *
 * Domain `ai.llmir`, ops `MatMulF16` and `MatMulBf16`: Y[..., N] = X[..., K] @ W^T, X and Y f32,
 * W [N, K] in float16 / bfloat16, widened to f32 in registers (F16C vcvtph2ps; bf16 is the top
 * half of an f32) and accumulated in f32 with FMA. onnxruntime 1.32's CPU provider has no 16-bit
 * GEMM on x86, so without this a 16-bit weight is widened to f32 when the session loads and every
 * decode step reads twice the bytes.
 *
 * - M (rows of X) <= GEMV_ROWS: a GEMV over groups of 4 weight rows, each read once per call
 *   straight from its 16-bit storage (decode: bound by memory bandwidth);
 * - larger M (prefill): for each panel of 16 weight rows and block of KC columns, the block is
 *   widened once into an f32 [KC][16] panel and multiplied into 6-row blocks of X with a 6x16
 *   outer-product kernel (12 accumulators), so the conversion is paid once per M rows.
 * Work is split over weight-row chunks on onnxruntime's intra-op pool
 * (KernelContext_ParallelFor), so the session's thread count applies.
 *
 * Built with the other sources of this folder into one library by
 * llmir_core/backends/ort_ext/__init__.py (cc -O3 -mavx2 -mfma -mf16c -shared -fPIC); the
 * onnxruntime ABI is in ort_abi.h, the f32 GEMM micro-kernel in f32_gemm.h.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "ort_abi.h"

/* -- kernels ------------------------------------------------------------------------------ */

enum { W_F16 = 0, W_BF16 = 1 };
#define GEMV_ROWS 4 /* X rows up to which the GEMV path runs */
#define GEMV_CHUNK 64 /* weight rows per parallel task (GEMV) */
#define GEMM_PANELS 2 /* panels per parallel task (GEMM) */

static inline __m256 load8(const uint16_t *p, int wt) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    if (wt == W_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

static inline float load1(const uint16_t *p, int wt) {
    if (wt == W_F16) return _cvtsh_ss(*p);
    uint32_t u = (uint32_t)(*p) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct Job {
    const float *x;
    const uint16_t *w;
    float *y;
    int64_t M, N, K;
    int wt;
} Job;

/* y[m, n0:n1] for every m < M (M small): each weight row is read once from memory */
static void gemv_rows(const Job *j, int64_t n0, int64_t n1) {
    const int64_t K = j->K, K8 = K & ~(int64_t)7;
    const int wt = j->wt;
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        const uint16_t *w0 = j->w + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        for (int64_t m = 0; m < j->M; m++) {
            const float *x = j->x + m * K;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t k = 0; k < K8; k += 8) {
                __m256 xv = _mm256_loadu_ps(x + k);
                a0 = _mm256_fmadd_ps(load8(w0 + k, wt), xv, a0);
                a1 = _mm256_fmadd_ps(load8(w1 + k, wt), xv, a1);
                a2 = _mm256_fmadd_ps(load8(w2 + k, wt), xv, a2);
                a3 = _mm256_fmadd_ps(load8(w3 + k, wt), xv, a3);
            }
            float s0 = llmir_hsum(a0), s1 = llmir_hsum(a1), s2 = llmir_hsum(a2), s3 = llmir_hsum(a3);
            for (int64_t k = K8; k < K; k++) {
                s0 += load1(w0 + k, wt) * x[k];
                s1 += load1(w1 + k, wt) * x[k];
                s2 += load1(w2 + k, wt) * x[k];
                s3 += load1(w3 + k, wt) * x[k];
            }
            float *y = j->y + m * j->N + n;
            y[0] = s0, y[1] = s1, y[2] = s2, y[3] = s3;
        }
    }
    for (; n < n1; n++) {
        const uint16_t *w0 = j->w + n * K;
        for (int64_t m = 0; m < j->M; m++) {
            const float *x = j->x + m * K;
            __m256 a0 = _mm256_setzero_ps();
            for (int64_t k = 0; k < K8; k += 8)
                a0 = _mm256_fmadd_ps(load8(w0 + k, wt), _mm256_loadu_ps(x + k), a0);
            float s0 = llmir_hsum(a0);
            for (int64_t k = K8; k < K; k++) s0 += load1(w0 + k, wt) * x[k];
            j->y[m * j->N + n] = s0;
        }
    }
}

static void gemv_task(void *p, size_t i) {
    const Job *j = (const Job *)p;
    int64_t n0 = (int64_t)i * GEMV_CHUNK, n1 = n0 + GEMV_CHUNK;
    gemv_rows(j, n0, n1 < j->N ? n1 : j->N);
}

static void pack_panel(const Job *j, int64_t n0, int nr, int64_t k0, int kc, float *panel) {
    if (nr == NR) { /* full panel: 8x8 blocks widened and transposed in registers */
        int k = 0;
        for (; k + 8 <= kc; k += 8)
            for (int c0 = 0; c0 < NR; c0 += 8) {
                __m256 r[8];
                for (int c = 0; c < 8; c++)
                    r[c] = load8(j->w + (n0 + c0 + c) * j->K + k0 + k, j->wt);
                llmir_transpose8_store(r, panel + k * NR + c0, NR);
            }
        for (; k < kc; k++)
            for (int c = 0; c < NR; c++)
                panel[k * NR + c] = load1(j->w + (n0 + c) * j->K + k0 + k, j->wt);
        return;
    }
    for (int c = 0; c < NR; c++) {
        if (c >= nr) {
            for (int k = 0; k < kc; k++) panel[k * NR + c] = 0.0f;
            continue;
        }
        const uint16_t *w = j->w + (n0 + c) * j->K + k0;
        int k = 0;
        for (; k + 8 <= kc; k += 8) {
            float t[8];
            _mm256_storeu_ps(t, load8(w + k, j->wt));
            for (int e = 0; e < 8; e++) panel[(k + e) * NR + c] = t[e];
        }
        for (; k < kc; k++) panel[k * NR + c] = load1(w + k, j->wt);
    }
}

static void gemm_task(void *p, size_t i) {
    const Job *j = (const Job *)p;
    float panel[KC * NR] __attribute__((aligned(32)));
    for (int q = 0; q < GEMM_PANELS; q++) {
        int64_t n0 = ((int64_t)i * GEMM_PANELS + q) * NR;
        if (n0 >= j->N) return;
        int nr = j->N - n0 < NR ? (int)(j->N - n0) : NR;
        /* K in equal blocks of at most KC columns (a multiple of 8 but the last) */
        int64_t blocks = (j->K + KC - 1) / KC, step = ((j->K + blocks - 1) / blocks + 7) & ~7;
        for (int64_t k0 = 0; k0 < j->K; k0 += step) {
            int kc = j->K - k0 < step ? (int)(j->K - k0) : (int)step;
            pack_panel(j, n0, nr, k0, kc, panel);
            for (int64_t m0 = 0; m0 < j->M; m0 += MR) {
                int mr = j->M - m0 < MR ? (int)(j->M - m0) : MR;
                llmir_micro_6x16(j->x + m0 * j->K + k0, j->K, j->y + m0 * j->N + n0, j->N, panel,
                                 mr, nr, kc, k0 != 0);
            }
        }
    }
}

/* -- the custom ops ----------------------------------------------------------------------- */

typedef struct Kernel {
    const OrtApi *api;
    int wt;
} Kernel;

typedef struct Op16 {
    OrtCustomOp op;
    int wt;
} Op16;

static void *create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    (void)info;
    Kernel *k = (Kernel *)malloc(sizeof(Kernel));
    if (k) k->api = api, k->wt = ((const Op16 *)op)->wt;
    return k;
}

static void destroy_kernel(void *k) { free(k); }

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
    int xr = llmir_shape_of(api, xv, xd), wr = llmir_shape_of(api, wv, wd);
    if (xr < 1 || wr != 2 || xd[xr - 1] != wd[1])
        return API(api, I_CreateStatus, CreateStatusFn)(
            ORT_INVALID_ARGUMENT, "ai.llmir 16-bit matmul: X [..., K] and W [N, K] do not match");
    int64_t M = 1, N = wd[0], K = wd[1];
    for (int i = 0; i < xr - 1; i++) M *= xd[i], yd[i] = xd[i];
    yd[xr - 1] = N;
    if ((st = API(api, I_KernelContext_GetOutput, GetOutputFn)(ctx, 0, yd, (size_t)xr, &yv)))
        return st;
    void *x = NULL, *w = NULL, *y = NULL;
    if ((st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)xv, &x)) ||
        (st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)wv, &w)) ||
        (st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)(yv, &y)))
        return st;
    if (M == 0 || N == 0) return NULL;
    if (K == 0) {
        memset(y, 0, (size_t)(M * N) * sizeof(float));
        return NULL;
    }
    Job j = {(const float *)x, (const uint16_t *)w, (float *)y, M, N, K, kn->wt};
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    if (M <= GEMV_ROWS)
        return pfor(ctx, gemv_task, (size_t)((N + GEMV_CHUNK - 1) / GEMV_CHUNK), 0, &j);
    return pfor(ctx, gemm_task, (size_t)((N + NR * GEMM_PANELS - 1) / (NR * GEMM_PANELS)), 0, &j);
}

static const char *name_f16(const OrtCustomOp *op) { (void)op; return "MatMulF16"; }
static const char *name_bf16(const OrtCustomOp *op) { (void)op; return "MatMulBf16"; }
static const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const OrtCustomOp *op, size_t i) {
    return i == 0 ? T_FLOAT : (((const Op16 *)op)->wt == W_F16 ? T_FLOAT16 : T_BFLOAT16);
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
    OrtStatus *st = API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_f16.op);
    if (st) return st;
    return API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_bf16.op);
}
