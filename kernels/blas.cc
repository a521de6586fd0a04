// OpenBLAS identity and thread control.
#include "kernels/blas.h"

#include <cblas.h>

namespace zerort {

std::string BlasVersion() { return openblas_get_config(); }
int BlasThreads() { return openblas_get_num_threads(); }
void SetBlasThreads(int threads) { openblas_set_num_threads(threads); }

}  // namespace zerort
