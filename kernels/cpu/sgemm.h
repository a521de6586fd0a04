// The CPU kernels' fp32 GEMM (internal to kernels/): row-major C = A op(B) + beta C, as
// cblas_sgemm with CblasRowMajor and alpha 1. OpenBLAS by default; oneDNN's sgemm when built with
// -DZR_ENABLE_DNNL=ON (Debian's libdnnl-dev): `make bench-gemm` measured it within 7% of OpenBLAS
// 0.3.21's AVX-512 kernels on the model's shapes (1.8-2x its AVX2 kernels, which
// OPENBLAS_CORETYPE=Haswell forces), but Debian's oneDNN 2.6.3 corrupted the heap inside
// dnnl_sgemm in some runs (docs/cpu-performance.md), so it is opt-in.
#pragma once

#include <cstdint>

namespace zerort::cpu {

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// "oneDNN 2.6.3" or "OpenBLAS, Haswell kernels" (the kernel set OpenBLAS picked or was told).
const char* SgemmLibrary();

// Whether Sgemm runs on the OpenMP thread pool (oneDNN, OpenBLAS's OpenMP build): called inside a
// parallel region it then runs on the calling thread, so the kernels may call it from theirs.
bool SgemmSharesOpenMpPool();

}  // namespace zerort::cpu
