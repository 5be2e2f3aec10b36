/* f32 building blocks shared by llmir's matmul custom ops (AVX2 + FMA).
 *
 * A prefill GEMM here is: for each panel of NR weight rows and block of at most KC columns, the
 * op widens/dequantizes the block once into an f32 panel laid out [kc][NR] (transpose8_store
 * helps), then llmir_micro_6x16 multiplies it into blocks of MR rows of X (12 accumulators). The
 * weight format only changes how a panel is packed.
 */
#ifndef LLMIR_F32_GEMM_H
#define LLMIR_F32_GEMM_H
#include <immintrin.h>
#include <stdint.h>

#define NR 16 /* weight rows per panel (GEMM) */
#define MR 6 /* X rows per micro-kernel (GEMM) */
#define KC 384 /* most columns per packed block (GEMM): a 24 KiB f32 panel, in L1 */

static inline float llmir_hsum(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* dst[c * stride + r] = r-th lane of row c, for an 8x8 block held in r[0..7] */
static inline void llmir_transpose8_store(__m256 r[8], float *dst, int stride) {
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

/* Y[r, 0:nr] (+)= X[r, 0:kc] @ panel for r < mr <= MR: x points at X[0, k0] (row stride ldx),
 * y at Y[0, n0] (row stride ldy); accumulate=0 stores, 1 adds to what Y holds. */
static inline void llmir_micro_6x16(const float *x, int64_t ldx, float *y, int64_t ldy,
                                    const float *panel, int mr, int nr, int kc, int accumulate) {
    const float *xr[MR];
    for (int r = 0; r < MR; r++) xr[r] = x + (r < mr ? r : mr - 1) * ldx;
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
        float *yr = y + r * ldy;
        __m256 a0 = acc[r][0], a1 = acc[r][1];
        if (nr == NR) {
            if (accumulate) {
                a0 = _mm256_add_ps(a0, _mm256_loadu_ps(yr));
                a1 = _mm256_add_ps(a1, _mm256_loadu_ps(yr + 8));
            }
            _mm256_storeu_ps(yr, a0);
            _mm256_storeu_ps(yr + 8, a1);
            continue;
        }
        float t[NR];
        _mm256_storeu_ps(t, a0);
        _mm256_storeu_ps(t + 8, a1);
        for (int c = 0; c < nr; c++) yr[c] = accumulate ? yr[c] + t[c] : t[c];
    }
}

/* e^x for x up to 88 (softmax scores minus their max, SiLU's e^-x): range reduction by ln 2 and a
 * degree-6 polynomial (relative error ~2 ulp); inputs below -87 give 0 */
static inline __m256 llmir_exp_ps(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

#endif
