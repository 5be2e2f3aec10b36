/* Which instruction-set variant llmir's kernels run: chosen once per artifact open.
 *
 * The library is compiled for AVX2 + FMA + F16C (build.FLAGS); kernels that also have an
 * AVX-512 variant compile it with LLMIR_AVX512 (a per-function target attribute: the rest of the
 * library keeps running on AVX2-only CPUs) and call it when llmir_isa() says so:
 *
 * - LLMIR_ISA_AVX512: the CPU has AVX-512 F, BW, VL, DQ and VNNI (the OS saving the zmm state:
 *   __builtin_cpu_supports asks both) and `LLMIR_KERNEL_ISA` is unset, `auto` or `avx512`;
 * - LLMIR_ISA_AVX2: otherwise, or `LLMIR_KERNEL_ISA=avx2` (forces the fallback, for tests and
 *   for measuring it).
 *
 * RegisterCustomOps (register.c) calls llmir_isa_select() each time an artifact registers the
 * library: an unknown value, or `avx512` on a CPU without it, fails the registration with one
 * line. `llmir_kernel_variants()` (exported, read by native.kernel_variants through ctypes)
 * names the variant each op runs with, for `llmir bench`.
 */
#ifndef LLMIR_ISA_H
#define LLMIR_ISA_H

enum { LLMIR_ISA_AVX2 = 0, LLMIR_ISA_AVX512 = 1 };

/* the target attribute of an AVX-512 variant (AVX2 + FMA + F16C come from the build flags) */
#define LLMIR_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* the chosen variant (selects on first use when no registration did yet) */
int llmir_isa(void);
/* select from the CPU and LLMIR_KERNEL_ISA; NULL, or a one-line reason the choice is invalid */
const char *llmir_isa_select(void);
/* whether this CPU can run the AVX-512 variants */
int llmir_cpu_has_avx512(void);
/* "avx2" or "avx512-vnni": the chosen variant's name */
const char *llmir_kernel_isa(void);
/* "Op=variant,Op=variant,...": the variant each op family runs with under the chosen ISA */
const char *llmir_kernel_variants(void);

#endif
