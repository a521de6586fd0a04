// The CPU kernels' fp32 GEMM (internal to kernels/): row-major C = A op(B) + beta C, as
// cblas_sgemm with CblasRowMajor and alpha 1. Through oneDNN's sgemm when zerort was built with
// it (Debian's libdnnl-dev; ZR_WITH_DNNL), else OpenBLAS: `make bench-gemm` measured oneDNN at
// 1.8-2x OpenBLAS 0.3.21 on every GEMM shape of the model on this project's AVX-512 machines
// (OpenBLAS picks its AVX2 kernels there; docs/benchmarks.md, "GEMM libraries").
#pragma once

#include <cstdint>

namespace zerort::cpu {

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// "oneDNN 2.6.3" or "OpenBLAS".
const char* SgemmLibrary();

// Whether Sgemm runs on the OpenMP thread pool (oneDNN, OpenBLAS's OpenMP build): called inside a
// parallel region it then runs on the calling thread, so the kernels may call it from theirs.
bool SgemmSharesOpenMpPool();

}  // namespace zerort::cpu
