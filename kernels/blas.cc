// The CPU BLAS identity and thread count.
#include "zerort/kernels/blas.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

#include "zerort/kernels/cpu/sgemm.h"
#include "zerort/kernels/cpu/vector_math.h"

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

// The loader's pick among a ZR_CPU_CLONES function's versions: GCC's resolver takes the first of
// x86-64-v4, x86-64-v3 and the default that __builtin_cpu_supports accepts, so the same test here
// names the same version.
std::string CpuLoopLevel() {
#if ZR_CPU_CLONES_BUILT
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "AVX-512 (x86-64-v4)";
  if (__builtin_cpu_supports("x86-64-v3")) return "AVX2 + FMA (x86-64-v3)";
  return "baseline x86-64";
#else
  return "baseline (the per-width versions are not built: ZR_CPU_DISPATCH=OFF)";
#endif
}

}  // namespace zerort
