// cuBLAS and cuBLASLt, loaded when the first CUDA model kernels are made rather than when a
// program starts. Linked normally, the two libraries cost every zerort process about 0.35 s of
// start-up (their initialisers and relocations; measured on the 2-core CI machine), CPU runs,
// `zerort estimate` and every refused config included; loaded here, a program that never multiplies
// on a GPU never maps them, and one on a machine without them runs on the CPU. Internal: includes
// CUDA's headers, usable from .cu files.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "zerort/runtime/status.h"

namespace zerort::internal {

// The entry points zerort calls, resolved by name from the loaded libraries.
struct CublasApi {
  // libcublas
  decltype(&::cublasCreate_v2) Create;
  decltype(&::cublasDestroy_v2) Destroy;
  decltype(&::cublasSetStream_v2) SetStream;
  decltype(&::cublasSetMathMode) SetMathMode;
  // (C++ overloads it with a cudaDataType compute type: the one taking cublasComputeType_t)
  cublasStatus_t (*GemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void*, cudaDataType, int,
                                         long long, const void*, cudaDataType, int, long long,
                                         const void*, void*, cudaDataType, int, long long, int,
                                         cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&::cublasGetStatusName) GetStatusName;
  decltype(&::cublasGetStatusString) GetStatusString;
  // libcublasLt
  decltype(&::cublasLtCreate) LtCreate;
  decltype(&::cublasLtDestroy) LtDestroy;
  decltype(&::cublasLtMatmulDescCreate) LtMatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) LtMatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) LtMatmulDescSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) LtMatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) LtMatrixLayoutDestroy;
  decltype(&::cublasLtMatmulPreferenceCreate) LtMatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) LtMatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) LtMatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) LtMatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmul) LtMatmul;
};

// The API, loading the libraries on the first call (thread-safe; later calls return the same
// table or the same error). The libraries are looked up by soname (LD_LIBRARY_PATH, the caller's
// run path, the system's), then in the CUDA Toolkit zerort was built against; the error names
// each library tried and dlopen's reason. The handles stay open until the process ends.
StatusOr<const CublasApi*> LoadCublas();

}  // namespace zerort::internal
