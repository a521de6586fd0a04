// The CPU BLAS identity and thread control.
#include "kernels/blas.h"

#include <cblas.h>
#include <omp.h>

#include "kernels/cpu/sgemm.h"

namespace zerort {

std::string BlasVersion() { return openblas_get_config(); }
int BlasThreads() { return openblas_get_num_threads(); }
// OpenBLAS's own count and OpenMP's (the kernels' loops and oneDNN's GEMMs run on its pool).
void SetBlasThreads(int threads) {
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
}
std::string CpuGemmLibrary() { return cpu::SgemmLibrary(); }

}  // namespace zerort
