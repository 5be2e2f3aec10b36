/* The instruction-set choice of isa.h: the CPU's features and LLMIR_KERNEL_ISA, read when an
 * artifact registers the library; the table of which op families have an AVX-512 variant. */
#include "isa.h"

#include <stdlib.h>
#include <string.h>

/* op families (onnxruntime op names) with an AVX-512 variant; every other op runs AVX2 */
static const char *const AVX512_OPS[] = {
    "MatMulGGUF",
    "MatMulNBitsQ4",
    "MatMulNBitsQ8",
    "MatMulF16", "MatMulBf16", /* matmul16.c: the decode GEMV (M <= 16) */
    NULL, /* (the table ends at NULL) */
};
/* every op family of the library, as bench reports them */
static const char *const ALL_OPS[] = {
    "MatMulNBitsQ4", "MatMulNBitsQ8", "MatMulGGUF", "MatMulS8", "MatMulF16", "MatMulBf16", "MatMulF32",
    "GroupQueryAttention", NULL,
};

static int chosen = -1;

int llmir_cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

const char *llmir_isa_select(void) {
    const char *want = getenv("LLMIR_KERNEL_ISA");
    int has = llmir_cpu_has_avx512();
    if (!want || !*want || !strcmp(want, "auto")) {
        chosen = has ? LLMIR_ISA_AVX512 : LLMIR_ISA_AVX2;
        return NULL;
    }
    if (!strcmp(want, "avx2")) {
        chosen = LLMIR_ISA_AVX2;
        return NULL;
    }
    if (!strcmp(want, "avx512")) {
        if (!has) return "LLMIR_KERNEL_ISA=avx512, and this CPU lacks AVX-512 F/BW/VL/DQ/VNNI";
        chosen = LLMIR_ISA_AVX512;
        return NULL;
    }
    return "LLMIR_KERNEL_ISA must be auto, avx2 or avx512";
}

int llmir_isa(void) {
    if (chosen < 0 && llmir_isa_select()) chosen = LLMIR_ISA_AVX2;
    return chosen;
}

const char *llmir_kernel_isa(void) { return llmir_isa() == LLMIR_ISA_AVX512 ? "avx512-vnni" : "avx2"; }

static int has_avx512_variant(const char *op) {
    for (int i = 0; AVX512_OPS[i]; i++)
        if (!strcmp(AVX512_OPS[i], op)) return 1;
    return 0;
}

const char *llmir_kernel_variants(void) {
    static char buf[512];
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; ALL_OPS[i]; i++) {
        const char *v = llmir_isa() == LLMIR_ISA_AVX512 && has_avx512_variant(ALL_OPS[i]) ? "avx512-vnni" : "avx2";
        size_t need = strlen(ALL_OPS[i]) + strlen(v) + 2;
        if (n + need >= sizeof(buf)) break;
        memcpy(buf + n, i ? "," : "", i ? 1 : 0);
        n += i ? 1 : 0;
        strcpy(buf + n, ALL_OPS[i]);
        n += strlen(ALL_OPS[i]);
        buf[n++] = '=';
        strcpy(buf + n, v);
        n += strlen(v);
    }
    return buf;
}
