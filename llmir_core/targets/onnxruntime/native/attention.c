/* llmir's onnxruntime custom op: grouped-query attention over a shared KV buffer.
 *
 * Domain `ai.llmir`, op `GroupQueryAttention`: the inputs, attributes and outputs of
 * com.microsoft GroupQueryAttention as llmir emits it (llmir_core/targets/onnxruntime/serialize_decoder.py), so the
 * node only changes its domain:
 *   0 query [B, S, H*D] (or packed q|k|v [B, S, (H + 2 Hkv) * D] with key and value absent),
 *   1 key, 2 value [B, S, Hkv*D], 3 past_key, 4 past_value [B, Hkv, Lp, D],
 *   5 seqlens_k [B] int32 (total length - 1 per row), 6 total_sequence_length (int32 scalar),
 *   7 cos_cache, 8 sin_cache [positions, rotary_dim / 2] (do_rotary), 9 position_ids [B, S] int64;
 *   12 k_scale, 13 v_scale (int8 caches: per tensor [1] or per channel [1, Hkv, 1, D]);
 *   llmir's own: 14 qkv_bias [(H + 2 Hkv) * D] (packed form only), added to every packed row
 *   before anything reads it (the projection's bias, one node less than a separate Add);
 *   outputs: output [B, S, H*D], present_key, present_value [B, Hkv, max(Lp, total), D].
 * Caches are f32, or int8 codes (kv-cache-int8: the same op name with int8 past/present types;
 * new rows stored as sat(rint(x * (1/s))), attention over f32(code) * s, blocks dequantized into
 * L1 as they are read, as onnxruntime's kernel does).
 * Attributes num_heads, kv_num_heads, scale (0: 1/sqrt(D)), softcap, do_rotary,
 * rotary_interleaved, local_window_size (W > 0: a query sees its last W keys, its own included, as
 * onnxruntime 1.32's CPU kernel); smooth_softmax and qk_output are refused (the lowering never
 * emits them).
 *
 * Per batch row b the new tokens sit at past_b = seqlens_k[b] + 1 - S (0 for a first prompt,
 * S == total_sequence_length > 1) and query s sees keys [0, min(past_b + s + 1, seqlens_k[b] + 1)).
 * Pads (llmir's mixed prefill + decode steps): a row's leading negative position_ids (input 9,
 * read with or without do_rotary) are pads, its n_b real tokens the columns after them (pads
 * after a real token are refused). A pad is not rotated, not written to the cache and not
 * attended to, and its output row is zeros; the real tokens sit at seqlens_k[b] + 1 - n_b on
 * (no first-prompt rule when a row has pads) and query s still sees keys up to its own. A row of
 * pads only (seqlens_k -1 in llmir's graphs) does nothing; with separate present buffers its
 * past rows are copied whole.
 * When present and past are one buffer (llmir's runtime binds them so), only the new rows are
 * written, in place; otherwise the past rows are copied first (the rest zeroed).
 *
 * Kernel (AVX2 + FMA): the new K rows are rotated (rotary halves or interleaved pairs, at
 * position_ids, else past_b + s) and written with the V rows into present; each query vector is
 * rotated and multiplied by the scale once, then attends block by block over KB keys with an
 * online softmax (running max and sum, the accumulated output rescaled when the max grows, a
 * vectorized exp). All query heads sharing a KV head (GQA) go through each key block together,
 * so a K/V block is read from memory once and reused from L1. Work is split on onnxruntime's
 * intra-op pool (KernelContext_ParallelFor):
 * - decode (S = 1): tasks (batch, KV head, chunk of keys), enough chunks of DECODE_MIN_KEYS keys
 *   or more for DECODE_TASKS tasks; per block the scores of 8 keys at a time (8 accumulators,
 *   one hadd tree) and p * V in 8 accumulators; the chunks' partial (max, sum, output) are
 *   merged after the parallel loop. A step reads the layer's whole cache, usually from memory
 *   (the layer's weights evicted it): at 128-512 positions it runs at the read bandwidth;
 * - prefill: tasks (batch, KV head, block of about QV query vectors), the last (heaviest) blocks
 *   first; per key block the scores of all the task's query vectors are one GEMM against the
 *   block's keys transposed, and probabilities times values another (6x16 outer-product tiles),
 *   rows that see none of the block skipping it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "f32_gemm.h"
#include "ort_abi.h"

#define KB 64 /* keys per online-softmax block */
#define QV 48 /* query vectors (rows x heads of a KV head) per prefill task, about */
#define MAX_D 256 /* largest head_dim */
#define NIN 15 /* com.microsoft's 14 (attention_bias 10 and head_sink 11 refused), then 14 qkv_bias */
#define DECODE_TASKS 8 /* a decode step is split into this many tasks at least... */
#define DECODE_MIN_KEYS 64 /* ...of this many keys at least */
#define MAX_HEADS 65536 /* num_heads, kv_num_heads: bounded so (H + 2 Hkv) * D cannot overflow */

/* -- vector math ------------------------------------------------------------------------------ */

/* 8 dot products reduced to one vector: lane i = sum of the lanes of a[i] */
static inline __m256 reduce8(__m256 a[8]) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 l = _mm256_hadd_ps(h01, h23), h = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(l, h, 0x20), _mm256_permute2f128_ps(l, h, 0x31));
}

/* whether a NaN or +inf is among n scores: the softmax's result is NaN then (as the reference's
 * exp(inf - inf)), which the clamped vectorized exp and the max (dropping NaNs) would hide */
static inline int poisoned(const float *sc, int n) {
    for (int t = 0; t < n; t++)
        if (sc[t] != sc[t] || sc[t] == INFINITY) return 1;
    return 0;
}

/* out[t] = q . k[t] for t < n (k rows D apart, D a multiple of 8) */
static void scores(const float *q, const float *k, int64_t D, int n, float *out) {
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        const float *kt = k + t * D;
        for (int64_t d = 0; d < D; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            for (int i = 0; i < 8; i++)
                a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(kt + i * D + d), qv, a[i]);
        }
        _mm256_storeu_ps(out + t, reduce8(a));
    }
    for (; t < n; t++) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(k + t * D + d), _mm256_loadu_ps(q + d), a);
        out[t] = llmir_hsum(a);
    }
}

/* acc[0:D] = acc * corr + sum_t p[t] v[t] (v rows D apart): 64 columns at a time in 8
 * accumulators (8 independent FMA chains keep both FMA ports busy), then 32, then 8 */
static void accumulate(float *acc, float corr, const float *p, const float *v, int64_t D, int n) {
    __m256 c = _mm256_set1_ps(corr);
    int64_t d = 0;
    for (; d + 64 <= D; d += 64) {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8 * i), c);
        for (int t = 0; t < n; t++) {
            const float *vt = v + t * D + d;
            __m256 pt = _mm256_broadcast_ss(p + t);
            for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * i), a[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + d + 8 * i, a[i]);
    }
    for (; d + 32 <= D; d += 32) {
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + d + 8 * i), c);
        for (int t = 0; t < n; t++) {
            const float *vt = v + t * D + d;
            __m256 pt = _mm256_broadcast_ss(p + t);
            for (int i = 0; i < 4; i++) a[i] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * i), a[i]);
        }
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(acc + d + 8 * i, a[i]);
    }
    for (; d < D; d += 8) {
        __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(acc + d), c);
        for (int t = 0; t < n; t++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), _mm256_loadu_ps(v + t * D + d), a0);
        _mm256_storeu_ps(acc + d, a0);
    }
}

/* max(m, x[0:n]) */
static inline float max_of(const float *x, int n, float m) {
    int t = 0;
    if (n >= 8) {
        __m256 v = _mm256_loadu_ps(x);
        for (t = 8; t + 8 <= n; t += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + t));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float f = _mm_cvtss_f32(h);
        m = f > m ? f : m;
    }
    for (; t < n; t++) m = x[t] > m ? x[t] : m;
    return m;
}

/* C[r][0:16] = (add ? C[r][0:16] : 0) + sum_k A[r][k] B[k][0:16] for r < MRV (<= 6): rows of
 * A lda apart, of B ldb apart, of C ldc apart; 12 accumulators, B's two vectors per k reused by
 * every row (an outer-product GEMM tile: scores against transposed keys, probabilities times
 * values) */
static inline __attribute__((always_inline)) void tile16(const float *A, int64_t lda,
                                                         const float *B, int64_t ldb, float *C,
                                                         int64_t ldc, int64_t K, int add,
                                                         const int MRV) {
    __m256 c[6][2];
    for (int r = 0; r < MRV; r++)
        for (int h = 0; h < 2; h++)
            c[r][h] = add ? _mm256_loadu_ps(C + r * ldc + 8 * h) : _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(B + k * ldb), b1 = _mm256_loadu_ps(B + k * ldb + 8);
        for (int r = 0; r < MRV; r++) {
            __m256 a = _mm256_broadcast_ss(A + r * lda + k);
            c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
        }
    }
    for (int r = 0; r < MRV; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(C + r * ldc + 8 * h, c[r][h]);
}

/* tile16 over rows [0, rows) of A and C, 6 at a time */
static void gemm16(const float *A, int64_t lda, const float *B, int64_t ldb, float *C,
                   int64_t ldc, int64_t rows, int64_t K, int add) {
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6) tile16(A + r * lda, lda, B, ldb, C + r * ldc, ldc, K, add, 6);
    switch (rows - r) {
        case 1: tile16(A + r * lda, lda, B, ldb, C + r * ldc, ldc, K, add, 1); break;
        case 2: tile16(A + r * lda, lda, B, ldb, C + r * ldc, ldc, K, add, 2); break;
        case 3: tile16(A + r * lda, lda, B, ldb, C + r * ldc, ldc, K, add, 3); break;
        case 4: tile16(A + r * lda, lda, B, ldb, C + r * ldc, ldc, K, add, 4); break;
        case 5: tile16(A + r * lda, lda, B, ldb, C + r * ldc, ldc, K, add, 5); break;
        default: break;
    }
}

/* -- the op ----------------------------------------------------------------------------------- */

typedef struct GqaKernel {
    const OrtApi *api;
    int64_t heads, kv_heads;
    float scale, softcap;
    int rotary, interleaved, kv8;
    int64_t window; /* local_window_size > 0: keys a query sees at most; else 0 */
    const char *err; /* an attribute the kernel refuses (reported by compute) */
} GqaKernel;

typedef struct GqaJob {
    const GqaKernel *kn;
    const float *q, *k, *v; /* first element of row (b=0, s=0) of each part, ld floats a row */
    int64_t ldq, ldkv;
    const void *pk_in, *pv_in; /* past buffers (Lp rows), NULL when absent */
    void *pk, *pv;             /* present buffers (P rows): f32, or int8 codes (kv8) */
    int kv8;                   /* int8 caches: x stored as sat(rint(x * (1/s))), read as code * s */
    const float *ks, *vs;      /* their scales: per channel [Hkv][D] or per tensor [1] */
    int64_t per_channel;
    float *out;
    const int32_t *seqlens;
    const float *cos, *sin; /* [rows, rd/2] */
    const int64_t *pos_ids; /* [B, S] or NULL */
    int64_t B, S, H, Hkv, G, D, Lp, P, rd, cos_rows;
    int first_prompt;
    int64_t chunks, chunk; /* decode: key chunks per (batch, KV head) and keys per chunk */
    float *parts;          /* decode with chunks > 1: [B * Hkv * chunks][G][2 + D] */
    int64_t qblocks, qrows; /* prefill: query blocks per (batch, KV head), rows per block */
    int *failed;    /* a task could not allocate its scratch / saw a bad position */
} GqaJob;

static inline int64_t past_len(const GqaJob *j, int64_t b) {
    return j->first_prompt ? 0 : (int64_t)j->seqlens[b] + 1 - j->S;
}

static inline int64_t total_len(const GqaJob *j, int64_t b) { return (int64_t)j->seqlens[b] + 1; }

/* the first key a query sees whose causal length (keys up to and with its own) is n: the last
 * `window` of them */
static inline int64_t first_key(const GqaJob *j, int64_t n) {
    int64_t w = j->kn->window;
    return w > 0 && n > w ? n - w : 0;
}

/* the first real (not pad) column of row b: its leading negative position_ids are pads */
static inline int64_t first_real(const GqaJob *j, int64_t b) {
    if (!j->pos_ids) return 0;
    const int64_t *p = j->pos_ids + b * j->S;
    int64_t s = 0;
    while (s < j->S && p[s] < 0) s++;
    return s;
}

static inline int64_t position(const GqaJob *j, int64_t b, int64_t s) {
    return j->pos_ids ? j->pos_ids[b * j->S + s] : past_len(j, b) + s;
}

/* dst = rotate(src) * mul at position pos (rotary off: a scaled copy) */
static void rotate(const GqaJob *j, const float *src, float *dst, int64_t pos, float mul) {
    const int64_t D = j->D;
    int64_t from = 0;
    if (j->kn->rotary) {
        const int64_t half = j->rd / 2;
        const float *c = j->cos + pos * half, *s = j->sin + pos * half;
        if (j->kn->interleaved) {
            for (int64_t i = 0; i < half; i++) {
                float x1 = src[2 * i], x2 = src[2 * i + 1];
                dst[2 * i] = (x1 * c[i] - x2 * s[i]) * mul;
                dst[2 * i + 1] = (x2 * c[i] + x1 * s[i]) * mul;
            }
        } else {
            int64_t i = 0;
            __m256 m = _mm256_set1_ps(mul);
            for (; i + 8 <= half; i += 8) {
                __m256 x1 = _mm256_loadu_ps(src + i), x2 = _mm256_loadu_ps(src + half + i);
                __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
                __m256 y1 = _mm256_sub_ps(_mm256_mul_ps(x1, cv), _mm256_mul_ps(x2, sv));
                __m256 y2 = _mm256_add_ps(_mm256_mul_ps(x2, cv), _mm256_mul_ps(x1, sv));
                _mm256_storeu_ps(dst + i, _mm256_mul_ps(y1, m));
                _mm256_storeu_ps(dst + half + i, _mm256_mul_ps(y2, m));
            }
            for (; i < half; i++) {
                float x1 = src[i], x2 = src[half + i];
                dst[i] = (x1 * c[i] - x2 * s[i]) * mul;
                dst[half + i] = (x2 * c[i] + x1 * s[i]) * mul;
            }
        }
        from = j->rd;
    }
    for (int64_t i = from; i < D; i++) dst[i] = src[i] * mul;
}

/* the scale of channel d of KV head kh (kv8) */
static inline float kv_scale(const GqaJob *j, const float *sc, int64_t kh, int64_t d) {
    return j->per_channel ? sc[kh * j->D + d] : sc[0];
}

/* row x (D floats) into the cache row dst: as is, or (kv8) as int8 codes x * (1/s) rounded half
 * to even and saturated (onnxruntime's int8 KV store) */
static void put_row(const GqaJob *j, const float *x, void *dst, const float *sc, int64_t kh) {
    if (!j->kv8) {
        memcpy(dst, x, (size_t)j->D * sizeof(float));
        return;
    }
    int8_t *c = (int8_t *)dst;
    for (int64_t d = 0; d < j->D; d++) {
        float q = nearbyintf(x[d] * (1.0f / kv_scale(j, sc, kh, d)));
        c[d] = (int8_t)(q < -128.0f ? -128 : q > 127.0f ? 127 : q);
    }
}

/* rows [k0, k0 + n) of a cache (base: the (b, kh) buffer) as f32: in place, or (kv8)
 * dequantized into tmp (codes * s) */
static const float *kv_rows(const GqaJob *j, const void *base, const float *sc, int64_t kh,
                            int64_t k0, int64_t n, float *tmp) {
    const int64_t D = j->D;
    if (!j->kv8) return (const float *)base + k0 * D;
    const int8_t *c = (const int8_t *)base + k0 * D;
    for (int64_t d = 0; d < D; d += 8) {
        __m256 s8 = j->per_channel ? _mm256_loadu_ps(sc + kh * D + d) : _mm256_set1_ps(sc[0]);
        for (int64_t t = 0; t < n; t++) {
            __m128i v = _mm_loadl_epi64((const __m128i *)(c + t * D + d));
            __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            _mm256_storeu_ps(tmp + t * D + d, _mm256_mul_ps(f, s8));
        }
    }
    return tmp;
}

/* the new K (rotated) and V rows of (b, KV head kh) into present, after the past rows when
 * present is its own buffer */
static void store_kv(const GqaJob *j, int64_t b, int64_t kh) {
    const int64_t D = j->D, S = j->S, P = j->P, past = past_len(j, b), off = first_real(j, b);
    const size_t es = j->kv8 ? 1 : sizeof(float), row = (size_t)D * es;
    char *pk = (char *)j->pk + (size_t)((b * j->Hkv + kh) * P) * row;
    char *pv = (char *)j->pv + (size_t)((b * j->Hkv + kh) * P) * row;
    int64_t kept = off == S ? j->Lp : past + off < j->Lp ? past + off : j->Lp; /* pads only: all */
    size_t keep = (size_t)kept * row;
    if (j->pk_in != j->pk) { /* separate buffers: the valid past rows, zeros after */
        if (j->pk_in)
            memcpy(pk, (const char *)j->pk_in + (size_t)((b * j->Hkv + kh) * j->Lp) * row, keep);
        memset(pk + keep, 0, (size_t)P * row - keep);
    }
    if (j->pv_in != j->pv) {
        if (j->pv_in)
            memcpy(pv, (const char *)j->pv_in + (size_t)((b * j->Hkv + kh) * j->Lp) * row, keep);
        memset(pv + keep, 0, (size_t)P * row - keep);
    }
    float tmp[MAX_D];
    for (int64_t s = off; s < S; s++) { /* the real tokens, not the pads before them */
        const float *ks = j->k + (b * S + s) * j->ldkv + kh * D;
        const float *vs = j->v + (b * S + s) * j->ldkv + kh * D;
        rotate(j, ks, tmp, position(j, b, s), 1.0f);
        put_row(j, tmp, pk + (size_t)(past + s) * row, j->ks, kh);
        put_row(j, vs, pv + (size_t)(past + s) * row, j->vs, kh);
    }
}

/* query rows [s0, s1) of batch b, query heads [g0, g1) of KV head kh, over the keys of
 * [key0, key1) they see: normalized into out, or (part != NULL) as partial results, per query
 * vector [running max, sum, unnormalized output (D)], for merge_parts */
static void attend(const GqaJob *j, int64_t b, int64_t kh, int64_t s0, int64_t s1, int64_t g0,
                   int64_t g1, int64_t key0, int64_t key1, float *part) {
    const int64_t D = j->D, G = g1 - g0, nv = (s1 - s0) * G, off = first_real(j, b);
    const int64_t past = past_len(j, b), total = total_len(j, b);
    float *buf = (float *)malloc((size_t)(2 * nv * D + 2 * nv + KB + 2 * KB * D) * sizeof(float));
    if (!buf) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *qs = buf, *acc = qs + nv * D, *mx = acc + nv * D, *sum = mx + nv, *sc = sum + nv;
    float *kbuf = sc + KB, *vbuf = kbuf + KB * D; /* a block of dequantized rows (kv8) */
    const float scale = j->kn->scale > 0.0f ? j->kn->scale : 1.0f / sqrtf((float)D);
    const float cap = j->kn->softcap;
    for (int64_t s = s0 > off ? s0 : off; s < s1; s++) /* pads: no query, zeros out */
        for (int64_t g = g0; g < g1; g++) {
            int64_t i = (s - s0) * G + (g - g0), h = kh * j->G + g;
            rotate(j, j->q + (b * j->S + s) * j->ldq + h * D, qs + i * D, position(j, b, s), scale);
        }
    memset(acc, 0, (size_t)(nv * D) * sizeof(float));
    for (int64_t i = 0; i < nv; i++) mx[i] = -INFINITY, sum[i] = 0.0f;
    const size_t es = j->kv8 ? 1 : sizeof(float);
    const void *K = (const char *)j->pk + (size_t)((b * j->Hkv + kh) * j->P * D) * es;
    const void *V = (const char *)j->pv + (size_t)((b * j->Hkv + kh) * j->P * D) * es;
    if (key1 > total) key1 = total;
    int64_t last = past + s1 < key1 ? past + s1 : key1; /* keys the last row sees */
    for (int64_t k0 = key0; k0 < last; k0 += KB) {
        int64_t nk = last - k0 < KB ? last - k0 : KB;
        const float *Kb = kv_rows(j, K, j->ks, kh, k0, nk, kbuf);
        const float *Vb = kv_rows(j, V, j->vs, kh, k0, nk, vbuf);
        for (int64_t s = s0 > off ? s0 : off; s < s1; s++) {
            int64_t hi = past + s + 1 < key1 ? past + s + 1 : key1;
            int64_t lo = first_key(j, past + s + 1) - k0; /* keys before it are out of the window */
            if (k0 >= hi) continue;
            int n = (int)(hi - k0 < KB ? hi - k0 : KB);
            if (lo >= n) continue;
            for (int64_t g = 0; g < G; g++) {
                int64_t i = (s - s0) * G + g;
                scores(qs + i * D, Kb, D, n, sc);
                int t = 0;
                if (cap > 0.0f) /* soft-capping of the scaled scores */
                    for (; t < n; t++) sc[t] = cap * tanhf(sc[t] / cap);
                for (t = 0; t < lo; t++) sc[t] = -INFINITY;
                if (poisoned(sc, n)) sum[i] = NAN; /* stays NaN: the row's output is NaN */
                float m = max_of(sc, n, mx[i]);
                __m256 mv = _mm256_set1_ps(m), tot = _mm256_setzero_ps();
                for (t = 0; t + 8 <= n; t += 8) {
                    __m256 e = llmir_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(sc + t), mv));
                    _mm256_storeu_ps(sc + t, e);
                    tot = _mm256_add_ps(tot, e);
                }
                float add = llmir_hsum(tot);
                for (; t < n; t++) {
                    sc[t] = expf(sc[t] - m);
                    add += sc[t];
                }
                float corr = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - m);
                sum[i] = sum[i] * corr + add;
                mx[i] = m;
                accumulate(acc + i * D, corr, sc, Vb, D, n);
            }
        }
    }
    for (int64_t s = s0; s < s1; s++)
        for (int64_t g = 0; g < G; g++) {
            int64_t i = (s - s0) * G + g, h = kh * j->G + g0 + g;
            if (part) {
                float *p = part + i * (D + 2);
                p[0] = mx[i], p[1] = sum[i];
                memcpy(p + 2, acc + i * D, (size_t)D * sizeof(float));
                continue;
            }
            float *o = j->out + (b * j->S + s) * j->H * D + h * D;
            __m256 r = _mm256_set1_ps(sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f);
            if (sum[i] != sum[i]) r = _mm256_set1_ps(NAN); /* a NaN or +inf score */
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(acc + i * D + d), r));
        }
    free(buf);
}

static void store_task(void *p, size_t i) {
    const GqaJob *j = (const GqaJob *)p;
    store_kv(j, (int64_t)i / j->Hkv, (int64_t)i % j->Hkv);
}

/* decode: task i = (batch, KV head, chunk of keys), all query heads of the KV head together
 * (each K/V row is read once); the chunks' partial results are merged by merge_parts */
static void decode_task(void *p, size_t i) {
    const GqaJob *j = (const GqaJob *)p;
    int64_t c = (int64_t)i % j->chunks, bk = (int64_t)i / j->chunks;
    float *part = j->parts ? j->parts + (int64_t)i * j->G * (j->D + 2) : NULL;
    attend(j, bk / j->Hkv, bk % j->Hkv, 0, 1, 0, j->G, c * j->chunk, (c + 1) * j->chunk, part);
}

/* out = the chunks' partial softmax results combined: sum_c e^(m_c - M) acc_c / sum_c
 * e^(m_c - M) l_c, M the largest running max */
static void merge_parts(const GqaJob *j) {
    const int64_t D = j->D, G = j->G, row = D + 2;
    for (int64_t bk = 0; bk < j->B * j->Hkv; bk++)
        for (int64_t g = 0; g < G; g++) {
            const float *p0 = j->parts + bk * j->chunks * G * row + g * row;
            float m = -INFINITY, l = 0.0f;
            for (int64_t c = 0; c < j->chunks; c++) m = p0[c * G * row] > m ? p0[c * G * row] : m;
            float *o = j->out + (bk / j->Hkv) * j->H * D + ((bk % j->Hkv) * G + g) * D;
            memset(o, 0, (size_t)D * sizeof(float));
            for (int64_t c = 0; c < j->chunks; c++) {
                const float *pc = p0 + c * G * row;
                if (pc[0] == -INFINITY) continue; /* a chunk past the keys */
                float w = expf(pc[0] - m);
                l += w * pc[1];
                __m256 wv = _mm256_set1_ps(w);
                for (int64_t d = 0; d < D; d += 8)
                    _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(pc + 2 + d),
                                                            _mm256_loadu_ps(o + d)));
            }
            __m256 r = _mm256_set1_ps(l > 0.0f ? 1.0f / l : 0.0f);
            if (l != l) r = _mm256_set1_ps(NAN); /* a chunk saw a NaN or +inf score */
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(o + d), r));
        }
}

/* query rows [s0, s1) of batch b, all query heads of KV head kh (a prompt): as attend, with the
 * scores of a block of KB keys for all the rows' query vectors as one GEMM against the block's
 * keys transposed (kt [D][KB]) and the probabilities times the block's values as another, both
 * by tile16; rows that see none of a block skip it */
static void attend_tiles(const GqaJob *j, int64_t b, int64_t kh, int64_t s0, int64_t s1) {
    const int64_t D = j->D, G = j->G, nv = (s1 - s0) * G, off = first_real(j, b);
    const int64_t past = past_len(j, b), total = total_len(j, b);
    const int64_t sr = s0 > off ? s0 : off; /* the first real row (pads: no query, zeros out) */
    float *buf =
        (float *)malloc((size_t)(2 * nv * D + 2 * nv + nv * KB + 3 * D * KB) * sizeof(float));
    if (!buf) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    float *qs = buf, *acc = qs + nv * D, *mx = acc + nv * D, *sum = mx + nv, *sc = sum + nv;
    float *kt = sc + nv * KB, *kbuf = kt + D * KB, *vbuf = kbuf + D * KB;
    const float scale = j->kn->scale > 0.0f ? j->kn->scale : 1.0f / sqrtf((float)D);
    const float cap = j->kn->softcap;
    for (int64_t s = sr; s < s1; s++)
        for (int64_t g = 0; g < G; g++) {
            int64_t i = (s - s0) * G + g, h = kh * G + g;
            rotate(j, j->q + (b * j->S + s) * j->ldq + h * D, qs + i * D, position(j, b, s), scale);
        }
    memset(acc, 0, (size_t)(nv * D) * sizeof(float));
    for (int64_t i = 0; i < nv; i++) mx[i] = -INFINITY, sum[i] = 0.0f;
    const size_t es = j->kv8 ? 1 : sizeof(float);
    const void *Kc = (const char *)j->pk + (size_t)((b * j->Hkv + kh) * j->P * D) * es;
    const void *Vc = (const char *)j->pv + (size_t)((b * j->Hkv + kh) * j->P * D) * es;
    int64_t last = past + s1 < total ? past + s1 : total; /* keys the last row sees */
    for (int64_t k0 = 0; k0 < last; k0 += KB) {
        int64_t nk = last - k0 < KB ? last - k0 : KB, nk16 = (nk + 15) & ~(int64_t)15;
        int64_t first = k0 - past > sr ? k0 - past : sr; /* the first row that sees key k0 */
        if (first >= s1) break;
        if (k0 + nk <= first_key(j, past + sr + 1)) continue; /* out of every row's window */
        int64_t r0 = (first - s0) * G, rows = nv - r0;
        /* the block's rows (keys k0...) as f32 */
        const float *Kb = kv_rows(j, Kc, j->ks, kh, k0, nk, kbuf);
        const float *Vb = kv_rows(j, Vc, j->vs, kh, k0, nk, vbuf);
        for (int64_t t = 0; t < nk16; t += 8) /* kt[d][t] = K[k0 + t][d], zeros past nk */
            for (int64_t d = 0; d < D; d += 8) {
                __m256 r[8];
                for (int u = 0; u < 8; u++)
                    r[u] = t + u < nk ? _mm256_loadu_ps(Kb + (t + u) * D + d)
                                      : _mm256_setzero_ps();
                llmir_transpose8_store(r, kt + d * KB + t, KB);
            }
        for (int64_t c = 0; c < nk16; c += 16)
            gemm16(qs + r0 * D, D, kt + c, KB, sc + r0 * KB + c, KB, rows, D, 0);
        for (int64_t r = r0; r < nv; r++) {
            int64_t s = s0 + r / G, hi = past + s + 1 < total ? past + s + 1 : total;
            int n = (int)(hi - k0 < nk ? hi - k0 : nk), t = 0;
            int64_t lo = first_key(j, past + s + 1) - k0; /* keys before it are out of the window */
            float *row = sc + r * KB;
            if (lo >= n) { /* the block is out of this row's window */
                memset(row, 0, (size_t)nk16 * sizeof(float));
                continue;
            }
            if (cap > 0.0f) /* soft-capping of the scaled scores */
                for (; t < n; t++) row[t] = cap * tanhf(row[t] / cap);
            for (t = 0; t < lo; t++) row[t] = -INFINITY;
            if (poisoned(row, n)) sum[r] = NAN; /* stays NaN: the row's output is NaN */
            float m = max_of(row, n, mx[r]);
            __m256 mv = _mm256_set1_ps(m), tot = _mm256_setzero_ps();
            for (t = 0; t + 8 <= n; t += 8) {
                __m256 e = llmir_exp_ps(_mm256_sub_ps(_mm256_loadu_ps(row + t), mv));
                _mm256_storeu_ps(row + t, e);
                tot = _mm256_add_ps(tot, e);
            }
            float add = llmir_hsum(tot);
            for (; t < n; t++) {
                row[t] = expf(row[t] - m);
                add += row[t];
            }
            for (; t < nk16; t++) row[t] = 0.0f; /* keys this row does not see */
            float corr = mx[r] == -INFINITY ? 0.0f : expf(mx[r] - m);
            sum[r] = sum[r] * corr + add;
            mx[r] = m;
            if (corr != 1.0f) {
                __m256 cv = _mm256_set1_ps(corr);
                for (int64_t d = 0; d < D; d += 8)
                    _mm256_storeu_ps(acc + r * D + d,
                                     _mm256_mul_ps(_mm256_loadu_ps(acc + r * D + d), cv));
            }
        }
        for (int64_t d = 0; d < D; d += 16) /* D is a multiple of 8: the last 8 columns below */
            if (d + 16 <= D)
                gemm16(sc + r0 * KB, KB, Vb + d, D, acc + r0 * D + d, D, rows, nk, 1);
        if (D % 16) { /* the last 8 columns, one vector a row */
            int64_t d = D - 8;
            for (int64_t r = r0; r < nv; r++) {
                __m256 a = _mm256_loadu_ps(acc + r * D + d);
                for (int64_t t = 0; t < nk; t++)
                    a = _mm256_fmadd_ps(_mm256_broadcast_ss(sc + r * KB + t),
                                        _mm256_loadu_ps(Vb + t * D + d), a);
                _mm256_storeu_ps(acc + r * D + d, a);
            }
        }
    }
    for (int64_t s = s0; s < s1; s++)
        for (int64_t g = 0; g < G; g++) {
            int64_t i = (s - s0) * G + g, h = kh * G + g;
            float *o = j->out + (b * j->S + s) * j->H * D + h * D;
            __m256 r = _mm256_set1_ps(sum[i] > 0.0f ? 1.0f / sum[i] : 0.0f);
            if (sum[i] != sum[i]) r = _mm256_set1_ps(NAN); /* a NaN or +inf score */
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(acc + i * D + d), r));
        }
    free(buf);
}

/* prefill: task i = (batch, KV head, query block), the last (heaviest) blocks first */
static void prefill_task(void *p, size_t i) {
    const GqaJob *j = (const GqaJob *)p;
    int64_t n = (int64_t)i / j->qblocks, blk = j->qblocks - 1 - (int64_t)i % j->qblocks;
    int64_t s0 = blk * j->qrows, s1 = s0 + j->qrows < j->S ? s0 + j->qrows : j->S;
    attend_tiles(j, n / j->Hkv, n % j->Hkv, s0, s1);
}

/* a decode step's split: enough key chunks per (batch, KV head) for DECODE_TASKS tasks, each
 * of DECODE_MIN_KEYS keys at least, and the partial results' buffer when there are several;
 * -1 when it cannot be allocated */
static int plan_decode(GqaJob *j) {
    int64_t most = 0, bk = j->B * j->Hkv;
    for (int64_t b = 0; b < j->B; b++) most = total_len(j, b) > most ? total_len(j, b) : most;
    if (most < 1) most = 1; /* rows of pads only: no keys */
    j->chunks = (DECODE_TASKS + bk - 1) / bk;
    if (j->chunks > most / DECODE_MIN_KEYS) j->chunks = most / DECODE_MIN_KEYS;
    if (j->chunks < 1) j->chunks = 1;
    j->chunk = ((most + j->chunks - 1) / j->chunks + 7) & ~(int64_t)7;
    j->chunks = (most + j->chunk - 1) / j->chunk;
    j->parts = NULL;
    if (j->chunks <= 1) {
        j->chunks = 1, j->chunk = j->P;
        return 0;
    }
    j->parts = (float *)malloc((size_t)(bk * j->chunks * j->G * (j->D + 2)) * sizeof(float));
    return j->parts ? 0 : -1;
}

/* a prompt's split: blocks of about QV query vectors (rows x query heads of a KV head) */
static void plan_prefill(GqaJob *j) {
    j->qrows = QV / j->G < 1 ? 1 : QV / j->G;
    if (j->qrows > j->S) j->qrows = j->S;
    j->qblocks = (j->S + j->qrows - 1) / j->qrows;
}

typedef OrtStatus *(*AttrIntFn)(const OrtKernelInfo *, const char *, int64_t *);
typedef void (*ReleaseStatusFn)(OrtStatus *);

static int64_t attr_int(const OrtApi *api, const OrtKernelInfo *info, const char *name,
                        int64_t dflt) {
    int64_t v = dflt;
    OrtStatus *st = API(api, I_KernelInfoGetAttribute_int64, AttrIntFn)(info, name, &v);
    if (st) API(api, I_ReleaseStatus, ReleaseStatusFn)(st), v = dflt;
    return v;
}

static void *gqa_create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info) {
    GqaKernel *k = (GqaKernel *)calloc(1, sizeof(GqaKernel));
    if (!k) return NULL;
    k->api = api;
    k->heads = attr_int(api, info, "num_heads", 0);
    k->kv_heads = attr_int(api, info, "kv_num_heads", 0);
    k->scale = llmir_attr_float(api, info, "scale", 0.0f);
    k->softcap = llmir_attr_float(api, info, "softcap", 0.0f);
    k->rotary = attr_int(api, info, "do_rotary", 0) != 0;
    k->interleaved = attr_int(api, info, "rotary_interleaved", 0) != 0;
    k->kv8 = op->GetInputType(op, 3) == T_INT8;
    int64_t window = attr_int(api, info, "local_window_size", -1);
    k->window = window > 0 ? window : 0;
    if (k->heads <= 0 || k->kv_heads <= 0 || k->heads > MAX_HEADS || k->heads % k->kv_heads)
        k->err = "ai.llmir GroupQueryAttention: num_heads must be a positive multiple of "
                 "kv_num_heads, at most 65536";
    else if (attr_int(api, info, "smooth_softmax", 0) || attr_int(api, info, "qk_output", 0))
        k->err = "ai.llmir GroupQueryAttention: smooth_softmax and qk_output are not supported";
    else if (k->scale < 0.0f || k->softcap < 0.0f)
        k->err = "ai.llmir GroupQueryAttention: scale and softcap must be >= 0";
    return k;
}

static void gqa_destroy(void *k) { free(k); }

static OrtStatus *bad(const OrtApi *api, const char *msg) {
    return llmir_error(api, ORT_INVALID_ARGUMENT, msg);
}

static OrtStatus *gqa_compute(void *kp, OrtKernelContext *ctx) {
    const GqaKernel *kn = (const GqaKernel *)kp;
    const OrtApi *api = kn->api;
    if (kn->err) return bad(api, kn->err);
    GetInputFn get = API(api, I_KernelContext_GetInput, GetInputFn);
    GetTensorMutableDataFn data = API(api, I_GetTensorMutableData, GetTensorMutableDataFn);
    const OrtValue *in[NIN] = {NULL};
    for (size_t i = 0; i < NIN; i++)
        if (get(ctx, i, &in[i])) in[i] = NULL; /* absent optional input */
    if (!in[0] || !in[5] || !in[6])
        return bad(api, "ai.llmir GroupQueryAttention: query, seqlens_k and "
                        "total_sequence_length are required");
    if (in[10] || in[11])
        return bad(api, "ai.llmir GroupQueryAttention: attention_bias and head_sink are not "
                        "supported");
    if (!in[12] != !in[13] || !in[12] != !kn->kv8)
        return bad(api, "ai.llmir GroupQueryAttention: k_scale and v_scale come with int8 "
                        "caches, and only with them");
    if (!in[1] != !in[2] || !in[3] != !in[4])
        return bad(api, "ai.llmir GroupQueryAttention: key/value and past_key/past_value come "
                        "in pairs");
    int64_t qd[8], pd[8], sd[8], td[8], cd[8];
    const int64_t H = kn->heads, Hkv = kn->kv_heads;
    const int packed = !in[1];
    if (llmir_shape_of(api, in[0], qd) != 3)
        return bad(api, "ai.llmir GroupQueryAttention: query must be [batch, seq, hidden]");
    const int64_t B = qd[0], S = qd[1], W = qd[2];
    int64_t D = packed ? W / (H + 2 * Hkv) : W / H, Lp = 0;
    if (in[3]) {
        if (llmir_shape_of(api, in[3], pd) != 4 || pd[0] != B || pd[1] != Hkv || pd[3] != D)
            return bad(api, "ai.llmir GroupQueryAttention: past_key must be [batch, kv_num_heads, "
                            "past, head_size]");
        int64_t vd[8];
        if (llmir_shape_of(api, in[4], vd) != 4 || memcmp(vd, pd, 4 * sizeof(int64_t)))
            return bad(api, "ai.llmir GroupQueryAttention: past_value's shape differs from "
                            "past_key's");
        Lp = pd[2];
    }
    if ((packed ? (H + 2 * Hkv) * D : H * D) != W || D % 8 || D <= 0 || D > MAX_D)
        return bad(api, "ai.llmir GroupQueryAttention: the hidden size is not num_heads (+ 2 "
                        "kv_num_heads when packed) times a head_size that is a multiple of 8 "
                        "up to 256");
    if (in[14]) {
        int64_t bd[8];
        if (!packed || llmir_shape_of(api, in[14], bd) != 1 || bd[0] != W)
            return bad(api, "ai.llmir GroupQueryAttention: qkv_bias must be [(num_heads + 2 "
                            "kv_num_heads) * head_size], with the packed query");
    }
    if (!packed) {
        int64_t kd[8], vd[8];
        if (llmir_shape_of(api, in[1], kd) != 3 || llmir_shape_of(api, in[2], vd) != 3 ||
            kd[0] != B || kd[1] != S || kd[2] != Hkv * D || memcmp(kd, vd, 3 * sizeof(int64_t)))
            return bad(api, "ai.llmir GroupQueryAttention: key and value must be [batch, seq, "
                            "kv_num_heads * head_size]");
    }
    int64_t per_channel = 0;
    if (kn->kv8) { /* per tensor [1] or per channel [1, Hkv, 1, D] */
        int64_t a[8], c[8];
        int ar = llmir_shape_of(api, in[12], a), cr = llmir_shape_of(api, in[13], c);
        int tensor = ar == 1 && a[0] == 1;
        int channel = ar == 4 && a[0] == 1 && a[1] == Hkv && a[2] == 1 && a[3] == D;
        if (ar != cr || memcmp(a, c, (size_t)(ar > 0 ? ar : 0) * sizeof(int64_t)) ||
            !(tensor || channel))
            return bad(api, "ai.llmir GroupQueryAttention: k_scale and v_scale must both be [1] "
                            "or [1, kv_num_heads, 1, head_size]");
        per_channel = channel;
    }
    int sr = llmir_shape_of(api, in[5], sd), tr = llmir_shape_of(api, in[6], td);
    if (sr != 1 || sd[0] != B || tr < 0 || tr > 1 || (tr == 1 && td[0] != 1))
        return bad(api, "ai.llmir GroupQueryAttention: seqlens_k must be [batch] and "
                        "total_sequence_length a scalar");
    void *p[NIN] = {NULL};
    for (int i = 0; i < NIN; i++)
        if (in[i] && data((OrtValue *)in[i], &p[i])) return bad(api, "no tensor data");
    const int32_t *seqlens = (const int32_t *)p[5];
    const int64_t total = *(const int32_t *)p[6];
    int64_t longest = 0; /* max(seqlens_k) + 1: what total_sequence_length means */
    for (int64_t b = 0; b < B; b++)
        longest = seqlens[b] + (int64_t)1 > longest ? seqlens[b] + (int64_t)1 : longest;
    if (total < 0 || total > longest)
        return bad(api, "ai.llmir GroupQueryAttention: total_sequence_length must be at most "
                        "max(seqlens_k) + 1");
    GqaJob j;
    memset(&j, 0, sizeof(j));
    j.kn = kn, j.B = B, j.S = S, j.H = H, j.Hkv = Hkv, j.G = H / Hkv, j.D = D, j.Lp = Lp;
    j.P = Lp > total ? Lp : total;
    j.seqlens = seqlens;
    j.kv8 = kn->kv8, j.per_channel = per_channel;
    j.ks = (const float *)p[12], j.vs = (const float *)p[13];
    if (in[9]) { /* position_ids: the rotary's positions, and pads (negative) in any case */
        int64_t id[8];
        if (llmir_shape_of(api, in[9], id) != 2 || id[0] != B || id[1] != S)
            return bad(api, "ai.llmir GroupQueryAttention: position_ids must be [batch, seq]");
        j.pos_ids = (const int64_t *)p[9];
    }
    int pads = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t off = first_real(&j, b);
        pads |= off > 0;
        for (int64_t s = off; j.pos_ids && s < S; s++)
            if (j.pos_ids[b * S + s] < 0)
                return bad(api, "ai.llmir GroupQueryAttention: a pad (negative position_id) "
                                "after a real token");
    }
    j.first_prompt = S > 1 && S == total && !pads;
    for (int64_t b = 0; b < B; b++) { /* the real tokens at past + off..., after past + off rows */
        int64_t off = first_real(&j, b), past = past_len(&j, b) + off, tot = total_len(&j, b);
        if (past < 0 || past > Lp || tot > j.P || past + S - off > j.P)
            return bad(api, "ai.llmir GroupQueryAttention: seqlens_k does not fit the sequence "
                            "length and the KV buffer");
    }
    if (kn->rotary) {
        if (!in[7] || !in[8] || llmir_shape_of(api, in[7], cd) != 2)
            return bad(api, "ai.llmir GroupQueryAttention: do_rotary needs cos_cache and "
                            "sin_cache [positions, rotary_dim / 2]");
        int64_t sd2[8];
        if (llmir_shape_of(api, in[8], sd2) != 2 || sd2[0] != cd[0] || sd2[1] != cd[1] ||
            2 * cd[1] > D)
            return bad(api, "ai.llmir GroupQueryAttention: sin_cache differs from cos_cache or "
                            "rotates more than head_size");
        j.rd = 2 * cd[1], j.cos_rows = cd[0];
        j.cos = (const float *)p[7], j.sin = (const float *)p[8];
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = first_real(&j, b); s < S; s++) { /* pads are not rotated */
                int64_t pos = position(&j, b, s);
                if (pos < 0 || pos >= j.cos_rows)
                    return bad(api, "ai.llmir GroupQueryAttention: a position is outside the "
                                    "cos/sin caches");
            }
    }
    OrtValue *ov[3];
    int64_t od[3] = {B, S, H * D}, kvd[4] = {B, Hkv, j.P, D};
    OrtStatus *st;
    GetOutputFn out = API(api, I_KernelContext_GetOutput, GetOutputFn);
    if ((st = out(ctx, 0, od, 3, &ov[0])) || (st = out(ctx, 1, kvd, 4, &ov[1])) ||
        (st = out(ctx, 2, kvd, 4, &ov[2])))
        return st;
    void *o[3];
    for (int i = 0; i < 3; i++)
        if ((st = data(ov[i], &o[i]))) return st;
    const float *q = (const float *)p[0];
    j.pk_in = p[3], j.pv_in = p[4], j.pk = o[1], j.pv = o[2];
    if (B * S == 0) { /* no new rows: present is still the past rows, zeros after */
        for (int64_t i = 0; i < B * Hkv; i++) store_task(&j, (size_t)i);
        return NULL;
    }
    float *biased = NULL; /* qkv_bias: the packed rows plus the bias */
    if (in[14]) {
        const float *bias = (const float *)p[14];
        biased = (float *)malloc((size_t)(B * S * W) * sizeof(float));
        if (!biased) return llmir_error(api, ORT_FAIL, "ai.llmir GroupQueryAttention: out of memory");
        for (int64_t r = 0; r < B * S; r++)
            for (int64_t i = 0; i < W; i++) biased[r * W + i] = q[r * W + i] + bias[i];
        q = biased;
    }
    j.q = q, j.ldq = W;
    if (packed)
        j.k = q + H * D, j.v = q + (H + Hkv) * D, j.ldkv = W;
    else
        j.k = (const float *)p[1], j.v = (const float *)p[2], j.ldkv = Hkv * D;
    j.pk_in = p[3], j.pv_in = p[4];
    j.out = (float *)o[0], j.pk = o[1], j.pv = o[2];
    int failed = 0;
    j.failed = &failed;
    ParallelForFn pfor = API(api, I_KernelContext_ParallelFor, ParallelForFn);
    if (S == 1) { /* decode: the new rows here, then (batch, KV head, key chunk) tasks */
        for (int64_t i = 0; i < B * Hkv; i++) store_task(&j, (size_t)i);
        if (plan_decode(&j)) {
            free(biased);
            return llmir_error(api, ORT_FAIL, "ai.llmir GroupQueryAttention: out of memory");
        }
        st = pfor(ctx, decode_task, (size_t)(B * Hkv * j.chunks), 0, &j);
        if (!st && j.parts && !__atomic_load_n(&failed, __ATOMIC_RELAXED)) merge_parts(&j);
        free(j.parts);
    } else if (!(st = pfor(ctx, store_task, (size_t)(B * Hkv), 0, &j))) {
        plan_prefill(&j);
        st = pfor(ctx, prefill_task, (size_t)(B * Hkv * j.qblocks), 0, &j);
    }
    free(biased);
    if (!st && __atomic_load_n(&failed, __ATOMIC_RELAXED))
        return llmir_error(api, ORT_FAIL, "ai.llmir GroupQueryAttention: out of memory");
    return st;
}

static const char *gqa_name(const OrtCustomOp *op) { (void)op; return "GroupQueryAttention"; }
static const char *gqa_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static int gqa_input_type(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 5 || i == 6 ? T_INT32 : i == 9 ? T_INT64 : T_FLOAT;
}
/* the int8-cache form: past_key/past_value and the presents int8 (k_scale, v_scale f32) */
static int gqa8_input_type(const OrtCustomOp *op, size_t i) {
    return i == 3 || i == 4 ? T_INT8 : gqa_input_type(op, i);
}
static size_t gqa_inputs(const OrtCustomOp *op) { (void)op; return NIN; }
static size_t gqa_outputs(const OrtCustomOp *op) { (void)op; return 3; }
static int gqa_output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return T_FLOAT; }
static int gqa8_output_type(const OrtCustomOp *op, size_t i) { (void)op; return i ? T_INT8 : T_FLOAT; }
/* required: query, seqlens_k, total_sequence_length; the rest optional */
static int gqa_in_char(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 0 || i == 5 || i == 6 ? 0 : 1;
}
static int gqa_out_char(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int gqa_mem(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
static int gqa_arity1(const OrtCustomOp *op) { (void)op; return 1; }
static int gqa_homog(const OrtCustomOp *op) { (void)op; return 1; }

#define OPGQA(IN, OUT)                                                                      \
    {LLMIR_ORT_API, gqa_create, gqa_name, gqa_provider, IN, gqa_inputs, OUT, gqa_outputs, NULL, \
     gqa_destroy, gqa_in_char, gqa_out_char, gqa_mem, gqa_arity1, gqa_homog, gqa_arity1,       \
     gqa_homog, NULL, gqa_compute, NULL, NULL, NULL}

static OrtCustomOp op_gqa = OPGQA(gqa_input_type, gqa_output_type);
static OrtCustomOp op_gqa8 = OPGQA(gqa8_input_type, gqa8_output_type);

/* adds GroupQueryAttention (f32 and int8 caches: one op name, two type signatures, onnxruntime
 * picks by the past_key type) to the ai.llmir domain (register.c) */
OrtStatus *llmir_add_attention(const OrtApi *api, OrtCustomOpDomain *domain) {
    OrtStatus *st = API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_gqa);
    if (st) return st;
    return API(api, I_CustomOpDomain_Add, CustomOpDomainAddFn)(domain, &op_gqa8);
}
