// The CPU BLAS identity and thread count.
#include "zerort/kernels/blas.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

#include "zerort/kernels/cpu/sgemm.h"

namespace zerort {

std::string BlasVersion() { return openblas_get_config(); }
int BlasThreads() { return openblas_get_num_threads(); }
std::string CpuGemmLibrary() { return cpu::SgemmLibrary(); }

std::string BlasCoreWarning() {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced == nullptr || std::strstr(cpu::SgemmLibrary(), "OpenBLAS") == nullptr) return "";
  const std::string core = openblas_get_corename();
  const bool avx512_core = core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx512_cpu = __builtin_cpu_supports("avx512f") != 0;
#else
  const bool avx512_cpu = false;
#endif
  if (!avx512_cpu || avx512_core) return "";
  return "OPENBLAS_CORETYPE=" + std::string(forced) + " holds OpenBLAS to its " + core +
         " kernels on a CPU with AVX-512; without it OpenBLAS picks its AVX-512 kernels (the CPU "
         "training step 1.6-1.7x faster on zerort's test machines, docs/benchmarks.md)";
}

}  // namespace zerort
