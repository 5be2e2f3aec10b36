/* The entry point of llmir's onnxruntime custom-op library (domain `ai.llmir`):
 * SessionOptions.register_custom_ops_library calls RegisterCustomOps, which checks the CPU and
 * selects the kernels' instruction-set variant (isa.h: AVX-512 VNNI where the CPU has it, else
 * AVX2; LLMIR_KERNEL_ISA=avx2 forces the fallback) and adds every op source's kernels (one `llmir_add_*` function per source file) to one domain.
 */
#include <stdlib.h>

#include "isa.h"
#include "ort_abi.h"

OrtStatus *llmir_add_matmul16(const OrtApi *api, OrtCustomOpDomain *domain);
OrtStatus *llmir_add_matmul_nbits(const OrtApi *api, OrtCustomOpDomain *domain);
OrtStatus *llmir_add_matmul_s8(const OrtApi *api, OrtCustomOpDomain *domain);
OrtStatus *llmir_add_attention(const OrtApi *api, OrtCustomOpDomain *domain);
OrtStatus *llmir_add_matmul_f32(const OrtApi *api, OrtCustomOpDomain *domain);
OrtStatus *llmir_add_norm(const OrtApi *api, OrtCustomOpDomain *domain);
OrtStatus *llmir_add_matmul_gguf(const OrtApi *api, OrtCustomOpDomain *domain);

static const AddOpsFn ADDERS[] = {
    llmir_add_matmul16,
    llmir_add_matmul_nbits,
    llmir_add_matmul_s8,
    llmir_add_attention,
    llmir_add_matmul_f32,
    llmir_add_norm,
    llmir_add_matmul_gguf,
};

OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    const OrtApi *api = base->GetApi(LLMIR_ORT_API);
    if (!api) abort(); /* onnxruntime < 1.17: llmir checks the version before loading this */
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c"))
        return llmir_error(api, ORT_FAIL, "llmir ai.llmir ops need a CPU with AVX2, FMA and F16C");
    const char *why = llmir_isa_select();
    if (why) return llmir_error(api, ORT_FAIL, why);
    OrtCustomOpDomain *domain = NULL;
    OrtStatus *st = API(api, I_CreateCustomOpDomain, CreateCustomOpDomainFn)("ai.llmir", &domain);
    if (st) return st;
    for (size_t i = 0; i < sizeof(ADDERS) / sizeof(ADDERS[0]); i++)
        if ((st = ADDERS[i](api, domain))) return st;
    return API(api, I_AddCustomOpDomain, AddCustomOpDomainFn)(options, domain);
}
