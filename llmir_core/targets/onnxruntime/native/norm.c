/* llmir's onnxruntime custom ops: RMS norms (AVX2), with and without the residual add.
 *
 * Domain `ai.llmir`, the node interfaces of com.microsoft's ops as llmir emits them
 * (llmir_core/targets/onnxruntime/serialize_decoder.py), so a node only changes its domain:
 * - `SimplifiedLayerNormalization`: inputs X [..., H], scale [H]; output Y [..., H]
 *   (onnxruntime's optional mean / inv_std_var outputs are refused: llmir never asks for them);
 * - `SkipSimplifiedLayerNormalization`: inputs X, skip (X's shape), gamma [H]; outputs Y, -, -,
 *   and the sum X + skip (output 3, optional; outputs 1 and 2, mean and inv_std_var, refused).
 * Per row of H values: s = x (+ skip), stored as the sum output; r = 1 / sqrt(sum(s^2) / H +
 * epsilon); y = s * r * gamma. The sum of squares runs in f32 over 4 x 8 lanes, then in double
 * across the lanes. Attribute `epsilon` (float, default 1e-5, onnxruntime's default).
 *
 * Rows run on onnxruntime's intra-op pool in blocks of NORM_ROWS (a decode step's single row
 * runs inline): each row is written by one thread, so the bits are the same at any thread
 * count. Built with the other sources of this folder into one library (llmir_core/targets/onnxruntime/native).
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "ort_abi.h"

#define NORM_ROWS 8 /* rows per parallel task */

typedef struct NormKernel {
    const OrtApi *api;
    float eps;
    int skip; /* SkipSimplifiedLayerNormalization */
} NormKernel;

typedef struct NormJob {
    const float *x, *skip, *gamma;
    float *y, *sum; /* sum: NULL when output 3 is absent */
    int64_t rows, H;
    float eps;
} NormJob;

/* sum of v[i]^2 in double: the rows whose f32 squares overflow (finite, |v| > ~1e19) */
static double sumsq_f64(const float *v, int64_t H) {
    double ss = 0.0;
    for (int64_t i = 0; i < H; i++) ss += (double)v[i] * (double)v[i];
    return ss;
}

/* one row: s = x (+ skip) into sum (when wanted), then y = s * rsqrt(mean(s^2) + eps) * gamma */
static void norm_row(const NormJob *j, int64_t r) {
    const int64_t H = j->H;
    const float *x = j->x + r * H, *k = j->skip ? j->skip + r * H : NULL;
    float *y = j->y + r * H, *s = j->sum ? j->sum + r * H : NULL;
    /* the summed row goes to `s` when it is an output, else through y (overwritten below) */
    float *t = s ? s : y;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= H; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        if (k) {
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(k + i));
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(k + i + 8));
            v2 = _mm256_add_ps(v2, _mm256_loadu_ps(k + i + 16));
            v3 = _mm256_add_ps(v3, _mm256_loadu_ps(k + i + 24));
        }
        if (k || s) {
            _mm256_storeu_ps(t + i, v0), _mm256_storeu_ps(t + i + 8, v1);
            _mm256_storeu_ps(t + i + 16, v2), _mm256_storeu_ps(t + i + 24, v3);
        }
        a0 = _mm256_fmadd_ps(v0, v0, a0), a1 = _mm256_fmadd_ps(v1, v1, a1);
        a2 = _mm256_fmadd_ps(v2, v2, a2), a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    double ss = (double)llmir_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < H; i++) {
        float v = k ? x[i] + k[i] : x[i];
        if (k || s) t[i] = v;
        ss += (double)v * (double)v;
    }
    if (isinf(ss)) ss = sumsq_f64(k || s ? t : x, H); /* |x| past ~1e19: f32 squares overflow */
    const float *src = (k || s) ? t : x;
    const float inv = (float)(1.0 / sqrt(ss / (double)H + (double)j->eps));
    const __m256 iv = _mm256_set1_ps(inv);
    for (i = 0; i + 8 <= H; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), iv),
                                              _mm256_loadu_ps(j->gamma + i)));
    for (; i < H; i++) y[i] = src[i] * inv * j->gamma[i];
}

static void norm_task(void *p, size_t b) {
    const NormJob *j = (const NormJob *)p;
    int64_t r0 = (int64_t)b * NORM_ROWS, r1 = r0 + NORM_ROWS < j->rows ? r0 + NORM_ROWS : j->rows;
    for (int64_t r = r0; r < r1; r++) norm_row(j, r);
}

/* -- the custom ops ------------------------------------------------------------------------- */

static void *norm_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info);

static OrtStatus *norm_bad(const OrtApi *api, const NormKernel *kn, const char *what) {
    char msg[200];
    strcpy(msg, kn->skip ? "ai.llmir SkipSimplifiedLayerNormalization: "
                         : "ai.llmir SimplifiedLayerNormalization: ");
    strncat(msg, what, sizeof(msg) - strlen(msg) - 1);
    return llmir_error(api, ORT_INVALID_ARGUMENT, msg);
}

static OrtStatus *norm_compute(void *kp, OrtKernelContext *ctx) {
    const NormKernel *kn = (const NormKernel *)kp;
    const OrtApi *api = kn->api;
    GetInputFn get = API(api, I_KernelContext_GetInput, GetInputFn);
    GetTensorMutableDataFn data = API(api, I_GetTensorMutableData, GetTensorMutableDataFn);
    const OrtValue *xv = NULL, *kv = NULL, *gv = NULL;
    OrtStatus *st;
    int gi = kn->skip ? 2 : 1;
    if ((st = get(ctx, 0, &xv)) || (kn->skip && (st = get(ctx, 1, &kv))) ||
        (st = get(ctx, (size_t)gi, &gv)))
        return st;
    if (!xv || !gv || (kn->skip && !kv)) return norm_bad(api, kn, "missing input");
    int64_t xd[8], kd[8], gd[8];
    int xr = llmir_shape_of(api, xv, xd), gr = llmir_shape_of(api, gv, gd);
    if (xr < 1 || xr > 8 || gr != 1 || gd[0] != xd[xr - 1] || llmir_rows(xd, xr - 1) < 0)
        return norm_bad(api, kn, "the scale must be [H] for X [..., H]");
    if (kn->skip && (llmir_shape_of(api, kv, kd) != xr || memcmp(kd, xd, (size_t)xr * 8)))
        return norm_bad(api, kn, "skip must have X's shape");
    int64_t rows = 1;
    for (int i = 0; i < xr - 1; i++) rows *= xd[i];
    GetOutputFn out = API(api, I_KernelContext_GetOutput, GetOutputFn);
    OrtValue *yv = NULL, *sv = NULL;
    if ((st = out(ctx, 0, xd, (size_t)xr, &yv))) return st;
    if (kn->skip) { /* outputs 1 and 2 (mean, inv_std_var [..., 1]): refused when asked for */
        int64_t md[8];
        memcpy(md, xd, sizeof md);
        md[xr - 1] = 1;
        for (size_t o = 1; o < 3; o++) {
            OrtValue *mv = NULL;
            if ((st = out(ctx, o, md, (size_t)xr, &mv))) API(api, I_ReleaseStatus, ReleaseStatusFn)(st);
            else if (mv) return norm_bad(api, kn, "mean and inv_std_var outputs are not supported");
        }
    }
    if (kn->skip && (st = out(ctx, 3, xd, (size_t)xr, &sv))) { /* absent: not wanted */
        API(api, I_ReleaseStatus, ReleaseStatusFn)(st);
        sv = NULL;
    }
    void *x = NULL, *k = NULL, *g = NULL, *y = NULL, *s = NULL;
    if ((st = data((OrtValue *)xv, &x)) || (kv && (st = data((OrtValue *)kv, &k))) ||
        (st = data((OrtValue *)gv, &g)) || (st = data(yv, &y)) || (sv && (st = data(sv, &s))))
        return st;
    NormJob j = {(const float *)x, (const float *)k, (const float *)g, (float *)y, (float *)s,
                 rows, xd[xr - 1], kn->eps};
    if (rows == 0 || j.H == 0) return NULL;
    size_t tasks = (size_t)((rows + NORM_ROWS - 1) / NORM_ROWS);
    if (tasks == 1) {
        norm_task(&j, 0);
        return NULL;
    }
    return API(api, I_KernelContext_ParallelFor, ParallelForFn)(ctx, norm_task, tasks, 0, &j);
}

static void norm_destroy(void *k) { free(k); }
static const char *name_sln(const OrtCustomOp *op) { (void)op; return "SimplifiedLayerNormalization"; }
static const char *name_skip(const OrtCustomOp *op) {
    (void)op;
    return "SkipSimplifiedLayerNormalization";
}
static const char *norm_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int norm_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return T_FLOAT; }
static size_t sln_inputs(const OrtCustomOp *op) { (void)op; return 2; }
static size_t skip_inputs(const OrtCustomOp *op) { (void)op; return 3; }
static size_t sln_outputs(const OrtCustomOp *op) { (void)op; return 1; }
static size_t skip_outputs(const OrtCustomOp *op) { (void)op; return 4; }
static int norm_in_char(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
/* skip: Y required; mean, inv_std_var (refused when asked for: see create) and the sum optional */
static int skip_out_char(const OrtCustomOp *op, size_t i) { (void)op; return i ? 1 : 0; }
static int sln_out_char(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int norm_mem(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int norm_arity(const OrtCustomOp *op) { (void)op; return 1; }
static int norm_homog(const OrtCustomOp *op) { (void)op; return 1; }

#define OPNORM(NAME, NIN, NOUT, OUTC)                                                          \
    {LLMIR_ORT_API, norm_create, NAME, norm_provider, norm_type, NIN, norm_type, NOUT, NULL,  \
     norm_destroy, norm_in_char, OUTC, norm_mem, norm_arity, norm_homog, norm_arity,          \
     norm_homog, NULL, norm_compute, NULL, NULL, NULL}

static OrtCustomOp op_sln = OPNORM(name_sln, sln_inputs, sln_outputs, sln_out_char);
static OrtCustomOp op_skip = OPNORM(name_skip, skip_inputs, skip_outputs, skip_out_char);

static void *norm_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    NormKernel *k = (NormKernel *)calloc(1, sizeof(NormKernel));
    if (!k) return NULL;
    k->api = api, k->skip = op == &op_skip;
    k->eps = llmir_attr_float(api, info, "epsilon", 1e-5f);
    return k;
}

/* adds SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization to ai.llmir (register.c) */
OrtStatus *llmir_add_norm(const OrtApi *api, OrtCustomOpDomain *domain) {
    OrtStatus *st = API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_sln);
    if (st) return st;
    return API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_skip);
}
