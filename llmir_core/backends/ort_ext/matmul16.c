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
 * Built by llmir_core/backends/ort_ext/__init__.py: cc -O3 -mavx2 -mfma -mf16c -shared -fPIC.
 * The onnxruntime C ABI used here is declared below by hand (no onnxruntime headers ship with
 * the Python wheel): the custom-op struct of API version 17 and the OrtApi function table, whose
 * entries are append-only, addressed by their index. Indices are those of onnxruntime's
 * onnxruntime_c_api.h (OrtApi member order).
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* -- the onnxruntime C ABI (the part this library uses) ---------------------------------- */

#define LLMIR_ORT_API 17 /* custom-op struct layout and OrtApi version requested (1.17+) */

typedef struct OrtStatus OrtStatus;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtApi OrtApi; /* opaque: read as a table of function pointers */

typedef struct OrtApiBase {
    const OrtApi *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

enum { T_FLOAT = 1, T_FLOAT16 = 10, T_BFLOAT16 = 16 }; /* ONNX TensorProto element types */
enum { ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2 };

typedef struct OrtCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const struct OrtCustomOp *, const OrtApi *, const OrtKernelInfo *);
    const char *(*GetName)(const struct OrtCustomOp *);
    const char *(*GetExecutionProviderType)(const struct OrtCustomOp *);
    int (*GetInputType)(const struct OrtCustomOp *, size_t);
    size_t (*GetInputTypeCount)(const struct OrtCustomOp *);
    int (*GetOutputType)(const struct OrtCustomOp *, size_t);
    size_t (*GetOutputTypeCount)(const struct OrtCustomOp *);
    void (*KernelCompute)(void *, OrtKernelContext *);
    void (*KernelDestroy)(void *);
    int (*GetInputCharacteristic)(const struct OrtCustomOp *, size_t);  /* v8 */
    int (*GetOutputCharacteristic)(const struct OrtCustomOp *, size_t); /* v8 */
    int (*GetInputMemoryType)(const struct OrtCustomOp *, size_t);      /* v13 */
    int (*GetVariadicInputMinArity)(const struct OrtCustomOp *);        /* v14 */
    int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *);
    int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *);
    int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *);
    void *CreateKernelV2; /* v16: NULL, CreateKernel is used */
    OrtStatus *(*KernelComputeV2)(void *, OrtKernelContext *); /* v16 */
    void *InferOutputShapeFn;
    void *GetStartVersion;     /* v17: NULL = since opset version 1 */
    void *GetEndVersion;
} OrtCustomOp;

/* OrtApi entries by index */
enum {
    I_CreateStatus = 0,
    I_CreateCustomOpDomain = 26,
    I_CustomOpDomain_Add = 27,
    I_AddCustomOpDomain = 28,
    I_GetTensorMutableData = 51,
    I_GetDimensionsCount = 61,
    I_GetDimensions = 62,
    I_GetTensorTypeAndShape = 65,
    I_KernelContext_GetInput = 90,
    I_KernelContext_GetOutput = 91,
    I_ReleaseTensorTypeAndShapeInfo = 99,
    I_KernelContext_ParallelFor = 274,
};

typedef OrtStatus *(*CreateStatusFn)(int, const char *);
typedef OrtStatus *(*CreateCustomOpDomainFn)(const char *, OrtCustomOpDomain **);
typedef OrtStatus *(*CustomOpDomainAddFn)(OrtCustomOpDomain *, const OrtCustomOp *);
typedef OrtStatus *(*AddCustomOpDomainFn)(OrtSessionOptions *, OrtCustomOpDomain *);
typedef OrtStatus *(*GetTensorMutableDataFn)(OrtValue *, void **);
typedef OrtStatus *(*GetDimensionsCountFn)(const OrtShapeInfo *, size_t *);
typedef OrtStatus *(*GetDimensionsFn)(const OrtShapeInfo *, int64_t *, size_t);
typedef OrtStatus *(*GetTensorTypeAndShapeFn)(const OrtValue *, OrtShapeInfo **);
typedef OrtStatus *(*GetInputFn)(const OrtKernelContext *, size_t, const OrtValue **);
typedef OrtStatus *(*GetOutputFn)(OrtKernelContext *, size_t, const int64_t *, size_t, OrtValue **);
typedef void (*ReleaseShapeInfoFn)(OrtShapeInfo *);
typedef OrtStatus *(*ParallelForFn)(const OrtKernelContext *, void (*)(void *, size_t), size_t,
                                    size_t, void *);

#define API(api, idx, T) ((T)(((void *const *)(api))[idx]))

/* -- kernels ------------------------------------------------------------------------------ */

enum { W_F16 = 0, W_BF16 = 1 };
#define GEMV_ROWS 4 /* X rows up to which the GEMV path runs */
#define GEMV_CHUNK 64 /* weight rows per parallel task (GEMV) */
#define NR 16 /* weight rows per panel (GEMM) */
#define MR 6 /* X rows per micro-kernel (GEMM) */
#define KC 384 /* most columns per packed block (GEMM): a 24 KiB f32 panel, in L1 */
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

static inline float hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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
            float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
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
            float s0 = hsum(a0);
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

/* panel[k][c] = f32(W[n0 + c, k0 + k]) for c < nr (zero beyond), k < kc */
static inline void transpose8_store(__m256 r[8], float *dst, int stride) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst + 0 * stride, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + 1 * stride, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * stride, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * stride, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * stride, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * stride, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * stride, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * stride, _mm256_permute2f128_ps(u3, u7, 0x31));
}

static void pack_panel(const Job *j, int64_t n0, int nr, int64_t k0, int kc, float *panel) {
    if (nr == NR) { /* full panel: 8x8 blocks widened and transposed in registers */
        int k = 0;
        for (; k + 8 <= kc; k += 8)
            for (int c0 = 0; c0 < NR; c0 += 8) {
                __m256 r[8];
                for (int c = 0; c < 8; c++)
                    r[c] = load8(j->w + (n0 + c0 + c) * j->K + k0 + k, j->wt);
                transpose8_store(r, panel + k * NR + c0, NR);
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

/* Y[rows, n0:n0+nr] (+)= X[rows, k0:k0+kc] @ panel for up to MR rows (mr valid) */
static void micro(const Job *j, const float *panel, int64_t m0, int mr, int64_t n0, int nr,
                  int64_t k0, int kc) {
    const float *xr[MR];
    for (int r = 0; r < MR; r++) xr[r] = j->x + (m0 + (r < mr ? r : mr - 1)) * j->K + k0;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(panel + k * NR), b1 = _mm256_loadu_ps(panel + k * NR + 8);
        __m256 a;
        a = _mm256_broadcast_ss(xr[0] + k);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(xr[1] + k);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(xr[2] + k);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(xr[3] + k);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(xr[4] + k);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(xr[5] + k);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    for (int r = 0; r < mr; r++) {
        float *y = j->y + (m0 + r) * j->N + n0;
        __m256 a0 = acc[r][0], a1 = acc[r][1];
        if (nr == NR) {
            if (k0 != 0) {
                a0 = _mm256_add_ps(a0, _mm256_loadu_ps(y));
                a1 = _mm256_add_ps(a1, _mm256_loadu_ps(y + 8));
            }
            _mm256_storeu_ps(y, a0);
            _mm256_storeu_ps(y + 8, a1);
            continue;
        }
        float t[NR];
        _mm256_storeu_ps(t, a0);
        _mm256_storeu_ps(t + 8, a1);
        for (int c = 0; c < nr; c++) y[c] = k0 == 0 ? t[c] : y[c] + t[c];
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
                micro(j, panel, m0, mr, n0, nr, k0, kc);
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

/* the shape of v into dims (at most 8); returns the rank or -1 */
static int shape_of(const OrtApi *api, const OrtValue *v, int64_t *dims) {
    OrtShapeInfo *info = NULL;
    size_t rank = 0;
    if (API(api, I_GetTensorTypeAndShape, GetTensorTypeAndShapeFn)(v, &info)) return -1;
    int ok = !API(api, I_GetDimensionsCount, GetDimensionsCountFn)(info, &rank) && rank <= 8 &&
             !API(api, I_GetDimensions, GetDimensionsFn)(info, dims, rank);
    API(api, I_ReleaseTensorTypeAndShapeInfo, ReleaseShapeInfoFn)(info);
    return ok ? (int)rank : -1;
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
    int xr = shape_of(api, xv, xd), wr = shape_of(api, wv, wd);
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

/* The entry point SessionOptions.register_custom_ops_library calls. */
OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    const OrtApi *api = base->GetApi(LLMIR_ORT_API);
    if (!api) abort(); /* onnxruntime < 1.17: llmir checks the version before loading this */
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c"))
        return API(api, I_CreateStatus, CreateStatusFn)(
            ORT_FAIL, "llmir ai.llmir ops need a CPU with AVX2, FMA and F16C");
    OrtCustomOpDomain *domain = NULL;
    OrtStatus *st = API(api, I_CreateCustomOpDomain, CreateCustomOpDomainFn)("ai.llmir", &domain);
    if (st) return st;
    if ((st = API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_f16.op))) return st;
    if ((st = API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_bf16.op))) return st;
    return API(api, I_AddCustomOpDomain, AddCustomOpDomainFn)(options, domain);
}
