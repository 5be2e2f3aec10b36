/* The part of onnxruntime's C ABI that llmir's custom ops use, declared by hand (no onnxruntime
 * headers ship with the Python wheel): the custom-op struct of API version 17 and the OrtApi
 * function table, whose entries are append-only, addressed by their index. Indices are those of
 * onnxruntime's onnxruntime_c_api.h (OrtApi member order). Shared by every op source in this
 * folder; each op source defines one `llmir_add_*` function that register.c calls.
 */
#ifndef LLMIR_ORT_ABI_H
#define LLMIR_ORT_ABI_H
#include <stddef.h>
#include <stdint.h>

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

/* ONNX TensorProto element types */
enum { T_FLOAT = 1, T_UINT8 = 2, T_INT8 = 3, T_INT32 = 6, T_INT64 = 7, T_FLOAT16 = 10, T_BFLOAT16 = 16 };
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
    I_KernelInfoGetAttribute_float = 85,
    I_KernelInfoGetAttribute_int64 = 86,
    I_ReleaseStatus = 93,
    I_KernelInfoGetAttribute_string = 87,
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
typedef OrtStatus *(*KernelInfoGetAttributeInt64Fn)(const OrtKernelInfo *, const char *, int64_t *);
typedef void (*ReleaseStatusFn)(OrtStatus *);
typedef OrtStatus *(*KernelInfoGetAttrStringFn)(const OrtKernelInfo *, const char *, char *, size_t *);
typedef OrtStatus *(*ParallelForFn)(const OrtKernelContext *, void (*)(void *, size_t), size_t,
                                    size_t, void *);

#define API(api, idx, T) ((T)(((void *const *)(api))[idx]))

typedef OrtStatus *(*AddOpsFn)(const OrtApi *, OrtCustomOpDomain *);
typedef OrtStatus *(*KernelInfoGetAttributeFloatFn)(const OrtKernelInfo *, const char *, float *);

/* the node's float attribute `name`, or dflt when it is absent */
static inline float llmir_attr_float(const OrtApi *api, const OrtKernelInfo *info, const char *name,
                                     float dflt) {
    float v = dflt;
    OrtStatus *st = API(api, I_KernelInfoGetAttribute_float, KernelInfoGetAttributeFloatFn)(
        info, name, &v);
    if (st) API(api, I_ReleaseStatus, ReleaseStatusFn)(st), v = dflt;
    return v;
}

/* the shape of v into dims (at most 8); returns the rank or -1 */
static inline int llmir_shape_of(const OrtApi *api, const OrtValue *v, int64_t *dims) {
    OrtShapeInfo *info = NULL;
    size_t rank = 0;
    if (API(api, I_GetTensorTypeAndShape, GetTensorTypeAndShapeFn)(v, &info)) return -1;
    int ok = !API(api, I_GetDimensionsCount, GetDimensionsCountFn)(info, &rank) && rank <= 8 &&
             !API(api, I_GetDimensions, GetDimensionsFn)(info, dims, rank);
    API(api, I_ReleaseTensorTypeAndShapeInfo, ReleaseShapeInfoFn)(info);
    return ok ? (int)rank : -1;
}

static inline OrtStatus *llmir_error(const OrtApi *api, int code, const char *msg) {
    return API(api, I_CreateStatus, CreateStatusFn)(code, msg);
}

/* -- per-call checks (every kernel validates its tensors on every call, before any memory is
 * touched: shapes can change between calls of one session) ----------------------------------- */

/* *out = a * b for a, b >= 0; 0 when a factor is negative or the product overflows int64 */
static inline int llmir_mul_ok(int64_t a, int64_t b, int64_t *out) {
    return a >= 0 && b >= 0 && !__builtin_mul_overflow(a, b, out);
}

/* the product of d[0..n) (the rows of X [..., K]: n = rank - 1), or -1 when it overflows int64
 * (possible only beside a zero dim: such a tensor holds no elements) */
static inline int64_t llmir_rows(const int64_t *d, int n) {
    int64_t m = 1;
    for (int i = 0; i < n; i++)
        if (!llmir_mul_ok(m, d[i], &m)) return -1;
    return m;
}

#endif
