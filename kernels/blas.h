// The CPU BLAS (OpenBLAS; oneDNN's sgemm instead with -DZR_ENABLE_DNNL=ON) behind the CPU GEMMs:
// its identity and its thread count, which is pinned per rank so that ranks sharing a node do
// not oversubscribe its cores.
#pragma once

#include <string>

namespace zerort {

std::string BlasVersion();  // OpenBLAS's configuration string
int BlasThreads();          // threads OpenBLAS will use
void SetBlasThreads(int threads);
// The library behind the CPU kernels' fp32 GEMMs: "oneDNN 2.6.3" or "OpenBLAS".
std::string CpuGemmLibrary();

}  // namespace zerort
