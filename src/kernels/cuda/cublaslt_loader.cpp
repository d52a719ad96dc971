// cuBLASLt, opened the first time a GEMM needs it.
//
// Why: linking libcublasLt.so costs every process about 0.4 s before main() (its load-time
// initialisers fault in some 100 MB), whether or not it ever runs a GEMM. Every CPU run, every
// test process and every rank of a CPU launch paid it: a third of the CPU test suite's time.
// So the binary does not link the library; these definitions stand in for the entry points the
// project calls (same names and prototypes as <cublasLt.h>) and forward to the real library,
// dlopen'ed once on the first call. A machine without the library gets one clear error then,
// and only if it asked for a GPU GEMM.
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace {

void* cublaslt_library() {
  static void* const handle = [] {
    const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = dlerror();
      mt::fail("cannot load {} ({}): the GPU GEMMs need CUDA {}'s cuBLAS; install it (or add its folder to "
               "LD_LIBRARY_PATH), or run with --device cpu", name, why ? why : "not found", CUBLAS_VER_MAJOR);
    }
    return h;
  }();
  return handle;
}

void* cublaslt_symbol(const char* name) {
  void* fn = dlsym(cublaslt_library(), name);
  if (fn == nullptr) {
    mt::fail("libcublasLt.so.{} has no '{}': the cuBLAS installed is older than the one megatron.cpp was built with",
             CUBLAS_VER_MAJOR, name);
  }
  return fn;
}

}  // namespace

// Each entry point resolves its target once (a thread-safe local static), then forwards.
#define MT_CUBLASLT_FORWARD(NAME, ...)                                                     \
  static const auto target = reinterpret_cast<decltype(&::NAME)>(cublaslt_symbol(#NAME)); \
  return target(__VA_ARGS__)

// The three attribute setters share one shape: (object, attribute, value, its size).
#define MT_CUBLASLT_SET_ATTRIBUTE(NAME, OBJECT_T, ATTRIBUTE_T)                                     \
  cublasStatus_t CUBLASWINAPI NAME(OBJECT_T object, ATTRIBUTE_T attr, const void* buf, size_t bytes) { \
    MT_CUBLASLT_FORWARD(NAME, object, attr, buf, bytes);                                             \
  }

extern "C" {

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t* handle) { MT_CUBLASLT_FORWARD(cublasLtCreate, handle); }

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t handle) { MT_CUBLASLT_FORWARD(cublasLtDestroy, handle); }

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                           const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                                           cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                           cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                                           const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                                           cudaStream_t stream) {
  MT_CUBLASLT_FORWARD(cublasLtMatmul, handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo,
                      workspace, workspace_bytes, stream);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                                     cudaDataType_t scale) {
  MT_CUBLASLT_FORWARD(cublasLtMatmulDescCreate, desc, compute, scale);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  MT_CUBLASLT_FORWARD(cublasLtMatmulDescDestroy, desc);
}

MT_CUBLASLT_SET_ATTRIBUTE(cublasLtMatmulDescSetAttribute, cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t)

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld) {
  MT_CUBLASLT_FORWARD(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  MT_CUBLASLT_FORWARD(cublasLtMatrixLayoutDestroy, layout);
}

MT_CUBLASLT_SET_ATTRIBUTE(cublasLtMatrixLayoutSetAttribute, cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t)

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  MT_CUBLASLT_FORWARD(cublasLtMatmulPreferenceCreate, pref);
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  MT_CUBLASLT_FORWARD(cublasLtMatmulPreferenceDestroy, pref);
}

MT_CUBLASLT_SET_ATTRIBUTE(cublasLtMatmulPreferenceSetAttribute, cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t)

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t pref, int requested,
                                                           cublasLtMatmulHeuristicResult_t results[], int* returned) {
  MT_CUBLASLT_FORWARD(cublasLtMatmulAlgoGetHeuristic, handle, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested,
                      results, returned);
}

}  // extern "C"
