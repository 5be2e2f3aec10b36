/* llmir's onnxruntime custom op for f32 weights: ai.llmir MatMulF32, Y[..., N] = X[..., K] @ W^T.
 *
 * The weight is read in place from the session's mapped data file (no prepacked copy: the
 * session opens without repacking it). Two stored layouts, told apart by W's rank:
 *
 * - W [N, K] row-major (`ort.matmul_f32 {layout = "rows"}`, what a tied embedding table shares):
 *   the f32 instance of matmul16.c's kernels (a row-streaming GEMV, a packing GEMM);
 * - W [ceil(N/16), K, 16] (`layout = "panel16"`), attribute `N`: panel p holds rows 16p..16p+15
 *   of the logical weight transposed, W[p, k, c] = W_logical[16p + c, k], rows past N zero. This
 *   is the GEMM's panel layout, so
 *   - prefill (M > P16_GEMV_ROWS) multiplies blocks of KC_P16 panel rows (16 KiB, in L1) straight
 *     from the file with llmir_micro_6x16 (f32_gemm.h) into 6-row blocks of X (the 1..5 rows
 *     left over: micro_rx16, with only their accumulators): no packing, no transposing per
 *     call. Loops: X row blocks of at most MC_P16 rows, then K blocks, then the
 *     task's panels (so the X block, MC_P16 x KC_P16, stays in L2 across them), then 6-row
 *     blocks; the next panel block is prefetched while one is multiplied;
 *   - decode (M <= P16_GEMV_ROWS) streams each panel front to back once: one row of X by
 *     broadcast x[k] and 2 FMAs per 64-byte panel row, k unrolled by 4 into 8 independent
 *     accumulators; 2..8 rows through the micro-kernels (one pass of <= 6 rows, the rest from L2).
 *   Work is split into runs of whole panels on onnxruntime's intra-op pool (claimed dynamically,
 *   so the threads end together); each output element is summed by one thread in a fixed order:
 *   the same bits at any thread count.
 *
 * Node attribute `epilogue = "swiglu"` (q8_act.h): W is [W_gate; W_up] (N = 2H rows) and
 * Y [..., H] = silu(X W_gate^T) * (X W_up^T). In panels H is a multiple of 16 (else refused), so
 * gate panel p and up panel p + H/16 hold the same output columns: decode computes the gate half
 * into a scratch [M, H], then the up half, each task storing silu(gate) * up for its panels as
 * they finish (each half streamed front to back as the two unfused matmuls would read it: one
 * sequential stream per thread); prefill computes the [M, N] product into a scratch, then
 * combines the rows in parallel. Rows: matmul16.c's kernels.
 *
 * Built with the other sources of this folder into one library by
 * llmir_core/targets/onnxruntime/native/__init__.py; the serializer writes the panels
 * (llmir_core/targets/onnxruntime/serialize_decoder.py), benchmarks/f32_kernels.py times them against MLAS.
 */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "ort_abi.h"
#include "q8_act.h" /* the SwiGLU epilogue (llmir_epilogue_attr, llmir_swiglu) */

/* matmul16.c: the row-major f32 weight ([N, K], layout "rows"; swiglu: the epilogue) */
OrtStatus *llmir_matmul_rows_f32(const OrtApi *api, OrtKernelContext *ctx, const float *x,
                                 const float *w, float *y, int64_t M, int64_t N, int64_t K,
                                 int swiglu);

#define P16 16 /* weight rows per stored panel (== NR of llmir_micro_6x16) */
#define P16_GEMV_ROWS 8 /* X rows up to which the streaming (decode) split runs */
/* blocking and task counts (-D overrides them for benchmark variants; docs/perf.md has what was
 * measured: these are at MLAS's speed) */
#ifndef KC_P16
#define KC_P16 256 /* panel rows per K block: a 16 KiB panel block, with 6 X rows, in L1 */
#endif
#ifndef MC_P16
#define MC_P16 96 /* X rows per row block: 96 x 256 f32 = 96 KiB, in L2 */
#endif
#ifndef P16_TASKS
#define P16_TASKS 32 /* parallel tasks per call at most */
#endif

typedef struct PJob {
    const float *x, *w;
    float *y;
    int64_t M, N, K, P;
    int64_t ppt; /* panels per task */
    float *out; /* decode with the SwiGLU epilogue: Y (y holds the gate product) */
    int64_t ldy; /* prefill: Y's row stride (N, or N + 16 for the epilogue's scratch) */
} PJob;

/* y[0:nr] = x[0:K] @ panel (K rows of 16): 4 panel rows per step into 8 accumulators */
static inline void gemv1_panel(const float *x, const float *w, int64_t K, float *y, int nr) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        const float *b = w + k * P16;
        __m256 x0 = _mm256_broadcast_ss(x + k), x1 = _mm256_broadcast_ss(x + k + 1);
        __m256 x2 = _mm256_broadcast_ss(x + k + 2), x3 = _mm256_broadcast_ss(x + k + 3);
        a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(b), a0);
        a1 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(b + 8), a1);
        a2 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(b + 16), a2);
        a3 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(b + 24), a3);
        a4 = _mm256_fmadd_ps(x2, _mm256_loadu_ps(b + 32), a4);
        a5 = _mm256_fmadd_ps(x2, _mm256_loadu_ps(b + 40), a5);
        a6 = _mm256_fmadd_ps(x3, _mm256_loadu_ps(b + 48), a6);
        a7 = _mm256_fmadd_ps(x3, _mm256_loadu_ps(b + 56), a7);
    }
    for (; k < K; k++) {
        __m256 x0 = _mm256_broadcast_ss(x + k);
        a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * P16), a0);
        a1 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * P16 + 8), a1);
    }
    __m256 lo = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a4, a6));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(a1, a3), _mm256_add_ps(a5, a7));
    if (nr == P16) {
        _mm256_storeu_ps(y, lo);
        _mm256_storeu_ps(y + 8, hi);
        return;
    }
    float t[P16];
    _mm256_storeu_ps(t, lo);
    _mm256_storeu_ps(t + 8, hi);
    for (int c = 0; c < nr; c++) y[c] = t[c];
}

/* Y[r, 0:nr] (+)= X[r, 0:kc] @ panel for r < R (R = 1..5, a compile-time constant at each call
 * site): the rows after the last whole 6-row block, with only their 2R accumulators (the 6x16
 * kernel would spend its 12 FMAs per k on them) */
static inline __attribute__((always_inline)) void micro_rx16(const float *x, int64_t ldx, float *y,
                                                             int64_t ldy, const float *panel,
                                                             int R, int nr, int kc, int acc) {
    __m256 c[5][2];
    for (int r = 0; r < R; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(panel + k * P16), b1 = _mm256_loadu_ps(panel + k * P16 + 8);
        for (int r = 0; r < R; r++) {
            __m256 a = _mm256_broadcast_ss(x + r * ldx + k);
            c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        float *yr = y + r * ldy;
        float t[P16];
        if (nr == P16) {
            if (acc) {
                c[r][0] = _mm256_add_ps(c[r][0], _mm256_loadu_ps(yr));
                c[r][1] = _mm256_add_ps(c[r][1], _mm256_loadu_ps(yr + 8));
            }
            _mm256_storeu_ps(yr, c[r][0]);
            _mm256_storeu_ps(yr + 8, c[r][1]);
            continue;
        }
        _mm256_storeu_ps(t, c[r][0]);
        _mm256_storeu_ps(t + 8, c[r][1]);
        for (int q = 0; q < nr; q++) yr[q] = acc ? yr[q] + t[q] : t[q];
    }
}

/* llmir_micro_6x16 for mr = 6, micro_rx16 for fewer rows */
static inline void micro(const float *x, int64_t ldx, float *y, int64_t ldy, const float *panel,
                         int mr, int nr, int kc, int acc) {
    switch (mr) {
        case 1: micro_rx16(x, ldx, y, ldy, panel, 1, nr, kc, acc); break;
        case 2: micro_rx16(x, ldx, y, ldy, panel, 2, nr, kc, acc); break;
        case 3: micro_rx16(x, ldx, y, ldy, panel, 3, nr, kc, acc); break;
        case 4: micro_rx16(x, ldx, y, ldy, panel, 4, nr, kc, acc); break;
        case 5: micro_rx16(x, ldx, y, ldy, panel, 5, nr, kc, acc); break;
        default: llmir_micro_6x16(x, ldx, y, ldy, panel, mr, nr, kc, acc);
    }
}

static inline int panel_rows(const PJob *j, int64_t p) {
    int64_t left = j->N - p * P16;
    return left < P16 ? (int)left : P16;
}

/* decode: each panel of the task read once, front to back */
static void gemv_task(void *vp, size_t i) {
    const PJob *j = (const PJob *)vp;
    int64_t p0 = (int64_t)i * j->ppt, p1 = p0 + j->ppt;
    if (p1 > j->P) p1 = j->P;
    const int64_t K = j->K, M = j->M;
    for (int64_t p = p0; p < p1; p++) {
        const float *w = j->w + p * K * P16;
        int nr = panel_rows(j, p);
        if (M == 1) {
            gemv1_panel(j->x, w, K, j->y + p * P16, nr);
            continue;
        }
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            int mr = M - m0 < MR ? (int)(M - m0) : MR;
            micro(j->x + m0 * K, K, j->y + m0 * j->N + p * P16, j->N, w, mr, nr,
                             (int)K, 0);
        }
    }
}

/* decode with the SwiGLU epilogue, second pass (j->w: the H/16 up panels, j->y: the gate
 * product [M, H] from the first pass, j->out: Y [M, H]): each up panel into a scratch, then
 * Y[m, 16p:16p+16] = silu(gate) * up */
static void gemv_swiglu_task(void *vp, size_t i) {
    const PJob *j = (const PJob *)vp;
    int64_t p0 = (int64_t)i * j->ppt, p1 = p0 + j->ppt;
    if (p1 > j->P) p1 = j->P;
    const int64_t K = j->K, M = j->M, H = j->N;
    float t[P16_GEMV_ROWS * P16] __attribute__((aligned(32)));
    for (int64_t p = p0; p < p1; p++) {
        const float *w = j->w + p * K * P16;
        if (M == 1) {
            gemv1_panel(j->x, w, K, t, P16);
        } else {
            for (int64_t m0 = 0; m0 < M; m0 += MR) {
                int mr = M - m0 < MR ? (int)(M - m0) : MR;
                micro(j->x + m0 * K, K, t + m0 * P16, P16, w, mr, P16, (int)K, 0);
            }
        }
        for (int64_t m = 0; m < M; m++)
            llmir_swiglu(j->y + m * H + p * P16, t + m * P16, j->out + m * H + p * P16, P16);
    }
}

/* prefill: the task's panels against every row of X, blocked for L1 (panel block) and L2 (X) */
static void gemm_task(void *vp, size_t i) {
    const PJob *j = (const PJob *)vp;
    int64_t p0 = (int64_t)i * j->ppt, p1 = p0 + j->ppt;
    if (p1 > j->P) p1 = j->P;
    const int64_t K = j->K, ldy = j->ldy, M = j->M;
    /* K in equal blocks of at most KC_P16 rows, X in equal blocks of at most MC_P16 rows (a
     * multiple of MR but the last) */
    int64_t kb = (K + KC_P16 - 1) / KC_P16, step = (K + kb - 1) / kb;
    int64_t mb = (M + MC_P16 - 1) / MC_P16, mstep = ((M + mb - 1) / mb + MR - 1) / MR * MR;
    for (int64_t i0 = 0; i0 < M; i0 += mstep) {
        int64_t mc = M - i0 < mstep ? M - i0 : mstep;
        int64_t calls = (mc + MR - 1) / MR;
        for (int64_t k0 = 0; k0 < K; k0 += step) {
            int kc = K - k0 < step ? (int)(K - k0) : (int)step;
            for (int64_t p = p0; p < p1; p++) {
                const float *blk = j->w + (p * K + k0) * P16;
                int nr = panel_rows(j, p);
                /* the block multiplied next (this K block of the next panel, else the next K
                 * block's first panel), fetched while this one is used: kc lines of 64 bytes */
                const char *next = (const char *)(p + 1 < p1 ? blk + K * P16
                                                             : j->w + (p0 * K + k0 + kc) * P16);
                int64_t lines = (p + 1 < p1 || k0 + kc < K) ? kc : 0;
                int64_t per = (lines + calls - 1) / calls, t = 0;
                for (int64_t m0 = i0; m0 < i0 + mc; m0 += MR, t += per) {
                    int mr = i0 + mc - m0 < MR ? (int)(i0 + mc - m0) : MR;
                    for (int64_t l = t; l < t + per && l < lines; l++)
                        _mm_prefetch(next + l * 64, _MM_HINT_T0);
                    micro(j->x + m0 * K + k0, K, j->y + m0 * ldy + p * P16, ldy, blk, mr,
                                     nr, kc, k0 != 0);
                }
            }
        }
    }
}

/* -- the custom op ------------------------------------------------------------------------- */

typedef struct KernelF32 {
    const OrtApi *api;
    int64_t n; /* the `N` attribute (panel layout), -1 when absent */
    int epilogue; /* EPI_NONE / EPI_SWIGLU (the node's `epilogue`) / EPI_BAD */
} KernelF32;

static void *f32_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    (void)op;
    KernelF32 *k = (KernelF32 *)malloc(sizeof(KernelF32));
    if (!k) return NULL;
    k->api = api, k->n = -1, k->epilogue = llmir_epilogue_attr(api, info);
    int64_t n = -1;
    OrtStatus *st = API(api, I_KernelInfoGetAttribute_int64, KernelInfoGetAttributeInt64Fn)(
        info, "N", &n);
    if (st) API(api, I_ReleaseStatus, ReleaseStatusFn)(st); /* absent: the rows layout */
    else k->n = n;
    return k;
}

static void f32_destroy(void *k) { free(k); }

static OrtStatus *f32_compute(void *kp, OrtKernelContext *ctx) {
    const KernelF32 *kn = (const KernelF32 *)kp;
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
                           "ai.llmir MatMulF32: unknown epilogue (expected \"swiglu\" or none)");
    const int swiglu = kn->epilogue == EPI_SWIGLU;
    int xr = llmir_shape_of(api, xv, xd), wr = llmir_shape_of(api, wv, wd);
    int64_t N, K;
    if (wr == 2) {
        N = wd[0], K = wd[1];
    } else if (wr == 3 && wd[2] == P16 && kn->n >= 0 && kn->n / P16 + (kn->n % P16 != 0) == wd[0]) {
        N = kn->n, K = wd[1];
    } else {
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulF32: W is neither [N, K] nor [ceil(N/16), K, 16] with "
                           "attribute N");
    }
    if (xr < 1 || xd[xr - 1] != K || llmir_rows(xd, xr - 1) < 0)
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           "ai.llmir MatMulF32: X [..., K] and W do not match");
    if (swiglu && N % (wr == 2 ? 2 : 2 * P16))
        return llmir_error(api, ORT_INVALID_ARGUMENT,
                           wr == 2 ? "ai.llmir MatMulF32: epilogue \"swiglu\" needs an even N "
                                     "([gate; up])"
                                   : "ai.llmir MatMulF32: epilogue \"swiglu\" in panels needs "
                                     "N = 2H with H a multiple of 16");
    int64_t M = 1, NO = swiglu ? N / 2 : N;
    for (int i = 0; i < xr - 1; i++) M *= xd[i], yd[i] = xd[i];
    yd[xr - 1] = NO;
    if ((st = API(api, I_KernelContext_GetOutput, GetOutputFn)(ctx, 0, yd, (size_t)xr, &yv)))
        return st;
    void *x = NULL, *w = NULL, *y = NULL;
    if ((st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)xv, &x)) ||
        (st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)((OrtValue *)wv, &w)) ||
        (st = API(api, I_GetTensorMutableData, GetTensorMutableDataFn)(yv, &y)))
        return st;
    if (wr == 2) return llmir_matmul_rows_f32(api, ctx, x, w, y, M, N, K, swiglu);
    if (M == 0 || N == 0) return NULL;
    if (K == 0) { /* silu(0) * 0 = 0 too */
        memset(y, 0, (size_t)(M * NO) * sizeof(float));
        return NULL;
    }
    PJob j = {(const float *)x, (const float *)w, (float *)y, M, N, K, wd[0], 0, NULL, N};
    const int decode = M <= P16_GEMV_ROWS;
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    if (swiglu && decode) {
        /* the gate half (panels 0..H/16) into a scratch [M, H], then the up half with the
         * epilogue: each half streamed front to back, as the two unfused matmuls read them */
        float *g = (float *)malloc((size_t)(M * NO) * sizeof(float));
        if (!g) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulF32: out of memory");
        j.N = NO, j.P = wd[0] / 2, j.y = g, j.out = (float *)y;
        int64_t tasks = j.P < P16_TASKS ? j.P : P16_TASKS;
        j.ppt = (j.P + tasks - 1) / tasks;
        const size_t runs = (size_t)((j.P + j.ppt - 1) / j.ppt);
        st = pfor(ctx, gemv_task, runs, 0, &j);
        if (!st) {
            j.w = (const float *)w + j.P * K * P16;
            st = pfor(ctx, gemv_swiglu_task, runs, 0, &j);
        }
        free(g);
        return st;
    }
    int64_t tasks = j.P < P16_TASKS ? j.P : P16_TASKS;
    j.ppt = (j.P + tasks - 1) / tasks;
    const size_t runs = (size_t)((j.P + j.ppt - 1) / j.ppt);
    if (!swiglu) return pfor(ctx, decode ? gemv_task : gemm_task, runs, 0, &j);
    /* prefill with the epilogue: the [M, N] product first (rows padded by 16 floats: a stride
     * of a multiple of 4 KiB, e.g. N = 3072, puts a 6-row tile of Y in one L1 set), then the
     * rows combined */
    j.ldy = N + P16;
    float *full = (float *)aligned_alloc(32, ((size_t)(M * j.ldy) * sizeof(float) + 31) & ~(size_t)31);
    if (!full) return llmir_error(api, ORT_FAIL, "ai.llmir MatMulF32: out of memory");
    j.y = full;
    st = pfor(ctx, gemm_task, runs, 0, &j);
    if (!st) {
        LlmirSwigluRows r = {full, (float *)y, M, NO, j.ldy};
        st = pfor(ctx, llmir_swiglu_rows_task, (size_t)M, 0, &r);
    }
    free(full);
    return st;
}

static const char *f32_name(const OrtCustomOp *op) { (void)op; return "MatMulF32"; }
static const char *f32_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int f32_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return T_FLOAT; }
static size_t f32_two(const OrtCustomOp *op) { (void)op; return 2; }
static size_t f32_one(const OrtCustomOp *op) { (void)op; return 1; }
static int f32_required(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int f32_mem(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int f32_arity(const OrtCustomOp *op) { (void)op; return 1; }
static int f32_homog(const OrtCustomOp *op) { (void)op; return 1; }

static OrtCustomOp op_f32 = {LLMIR_ORT_API, f32_create, f32_name, f32_provider, f32_type,
                             f32_two, f32_type, f32_one, NULL, f32_destroy, f32_required,
                             f32_required, f32_mem, f32_arity, f32_homog, f32_arity, f32_homog,
                             NULL, f32_compute, NULL, NULL, NULL};

/* adds MatMulF32 to the ai.llmir domain (register.c) */
OrtStatus *llmir_add_matmul_f32(const OrtApi *api, OrtCustomOpDomain *domain) {
    return API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_f32);
}
