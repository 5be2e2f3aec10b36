/* Shared by llmir's matmul ops (matmul_nbits.c, matmul_s8.c; the epilogue also matmul16.c,
 * matmul_f32.c), AVX2 + FMA:
 *
 * - llmir_quant32: 32 f32 activations -> int8 codes q = round(x / d), d = max|x| / 127 (round
 *   half to even: cvtps2dq under the default MXCSR), the q8_0 / accuracy_level 4 rounding both
 *   ops use at decode;
 * - the `epilogue` node attribute (a string) and the SwiGLU epilogue: an op whose weight is the
 *   row-concatenation [W_gate; W_up] (N = 2H rows) and `epilogue = "swiglu"` outputs
 *   Y[..., H] = silu(X W_gate^T) * (X W_up^T), silu(g) = g / (1 + exp(-g)) with a vectorized exp
 *   (relative error ~2e-7 over the clamped range);
 * - the OrtCustomOp boilerplate of an op with one f32 output on the CPU provider
 *   (LLMIR_QUANT_OP builds the struct from the op's own callbacks).
 */
#ifndef LLMIR_Q8_ACT_H
#define LLMIR_Q8_ACT_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "f32_gemm.h"
#include "ort_abi.h"

/* whether any of 32 floats (4 vectors) is NaN: max/min drop NaNs, so quantizers ask first */
static inline int llmir_has_nan32(const __m256 v[4]) {
    __m256 u = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v[0], v[0], _CMP_UNORD_Q), _mm256_cmp_ps(v[1], v[1], _CMP_UNORD_Q)),
                            _mm256_or_ps(_mm256_cmp_ps(v[2], v[2], _CMP_UNORD_Q), _mm256_cmp_ps(v[3], v[3], _CMP_UNORD_Q)));
    return _mm256_movemask_ps(u) != 0;
}

/* 32 floats -> 32 int8 codes in order; returns d, *sum = sum of the codes */
static inline float llmir_quant32(const float *x, int8_t *q, int *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    /* a NaN in the block (max drops it): d = NaN, so the block's products are NaN, as in the
     * reference, not the products of a NaN's int8 code */
    const __m256 all[4] = {v0, v1, v2, v3};
    if (llmir_has_nan32(all)) d = __builtin_nanf("");
    /* max |x| below 127 / FLT_MAX (denormals): 127 / max overflows to inf, and inf codes would
     * be -128 whatever their sign; such a block counts as zeros (|error| < 4e-37 * |w| * 32) */
    if (id > 3.4028234e38f) id = 0.0f;
    __m256 s = _mm256_set1_ps(id);
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, s)), i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, s));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, s)), i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, s));
    if (sum) {
        __m256i t = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
        __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
        t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
        *sum = _mm_cvtsi128_si32(t4);
    }
    __m256i p01 = _mm256_packs_epi32(i0, i1), p23 = _mm256_packs_epi32(i2, i3);
    __m256i p = _mm256_packs_epi16(p01, p23); /* the packs interleave 128-bit lanes: fix */
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    return d;
}

/* -- the SwiGLU epilogue ------------------------------------------------------------------- */

enum { EPI_NONE = 0, EPI_SWIGLU = 1, EPI_BAD = -1 };

/* the node's `epilogue` attribute: absent or "" -> EPI_NONE, "swiglu" -> EPI_SWIGLU, else EPI_BAD */
static inline int llmir_epilogue_attr(const OrtApi *api, const OrtKernelInfo *info) {
    char buf[16];
    size_t size = sizeof buf;
    OrtStatus *st = API(api, I_KernelInfoGetAttribute_string, KernelInfoGetAttrStringFn)(
        info, "epilogue", buf, &size);
    if (st) { /* absent (or longer than any epilogue name) */
        API(api, I_ReleaseStatus, ReleaseStatusFn)(st);
        return size > sizeof buf ? EPI_BAD : EPI_NONE;
    }
    if (size == 0 || buf[0] == 0) return EPI_NONE;
    return strcmp(buf, "swiglu") == 0 ? EPI_SWIGLU : EPI_BAD;
}

/* y[i] = silu(g[i]) * u[i] for i < n */
static inline void llmir_swiglu(const float *g, const float *u, float *y, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = llmir_exp_ps(_mm256_xor_ps(gv, sign));
        __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        float gt[8] = {0}, ut[8] = {0}, yt[8];
        memcpy(gt, g + i, (size_t)(n - i) * sizeof(float));
        memcpy(ut, u + i, (size_t)(n - i) * sizeof(float));
        llmir_swiglu(gt, ut, yt, 8);
        memcpy(y + i, yt, (size_t)(n - i) * sizeof(float));
    }
}

/* prefill: the full [M, 2H] product in `full`, then Y[m, :] = swiglu of its halves, rows split
 * over the pool */
typedef struct LlmirSwigluRows {
    const float *full;
    float *y;
    int64_t M, H;
    int64_t ld; /* the row stride of `full`; 0: 2H */
} LlmirSwigluRows;

static void llmir_swiglu_rows_task(void *p, size_t i) {
    const LlmirSwigluRows *r = (const LlmirSwigluRows *)p;
    const int64_t m = (int64_t)i;
    const float *f = r->full + m * (r->ld ? r->ld : 2 * r->H);
    llmir_swiglu(f, f + r->H, r->y + m * r->H, r->H);
}

/* -- the custom-op struct ------------------------------------------------------------------ */

static inline const char *llmir_cpu_provider(const OrtCustomOp *op) {
    (void)op;
    return "CPUExecutionProvider";
}
static inline size_t llmir_one(const OrtCustomOp *op) {
    (void)op;
    return 1;
}
static inline int llmir_f32_output(const OrtCustomOp *op, size_t i) {
    (void)op, (void)i;
    return T_FLOAT;
}
static inline int llmir_required(const OrtCustomOp *op, size_t i) {
    (void)op, (void)i;
    return 0; /* INPUT_OUTPUT_REQUIRED; also the default (CPU) memory type */
}
static inline int llmir_arity1(const OrtCustomOp *op) {
    (void)op;
    return 1;
}

/* an OrtCustomOp with one required f32 output, run by COMPUTE (KernelComputeV2) */
#define LLMIR_QUANT_OP(CREATE, NAME, INPUT_TYPE, N_INPUTS, INPUT_CHAR, DESTROY, COMPUTE)          \
    {LLMIR_ORT_API, CREATE, NAME, llmir_cpu_provider, INPUT_TYPE, N_INPUTS, llmir_f32_output,    \
     llmir_one, NULL, DESTROY, INPUT_CHAR, llmir_required, llmir_required, llmir_arity1,          \
     llmir_arity1, llmir_arity1, llmir_arity1, NULL, COMPUTE, NULL, NULL, NULL}

#endif
