// CUDA and cuBLAS return codes as Status, naming the call that failed. Internal: includes CUDA.
// Usable from .cu files.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "zerort/runtime/status.h"

namespace zerort::internal {

// Defined in cuda_device.cc so that nvcc-compiled files need no formatting library.
Status CudaError(std::string_view call, cudaError_t err);
Status CublasError(std::string_view call, cublasStatus_t err);
// The result of cudaEventQuery or cudaStreamQuery: true when the work is done, false while it
// runs. The runtime also records cudaErrorNotReady as the thread's last error; it is cleared here,
// or the next cudaGetLastError (a kernel launch's check) would report it as that launch's failure.
StatusOr<bool> CudaQueryResult(std::string_view call, cudaError_t err);

}  // namespace zerort::internal

#define ZR_CUDA_RETURN_IF_ERROR(call)                                     \
  do {                                                                    \
    if (cudaError_t zr_cuda_err_ = (call); zr_cuda_err_ != cudaSuccess) { \
      return ::zerort::internal::CudaError(#call, zr_cuda_err_);          \
    }                                                                     \
  } while (false)

#define ZR_CUBLAS_RETURN_IF_ERROR(call)                                                    \
  do {                                                                                     \
    if (cublasStatus_t zr_cublas_err_ = (call); zr_cublas_err_ != CUBLAS_STATUS_SUCCESS) { \
      return ::zerort::internal::CublasError(#call, zr_cublas_err_);                       \
    }                                                                                      \
  } while (false)
