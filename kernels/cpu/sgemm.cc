#include "zerort/kernels/cpu/sgemm.h"

#include <cblas.h>

#include <string>

#include "zerort/runtime/status.h"

#ifdef ZR_WITH_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

namespace zerort::cpu {

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#ifdef ZR_WITH_DNNL
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f,
                                          a, lda, b, ldb, beta, c, ldc);
  ZR_CHECK(status == dnnl_success) << "oneDNN sgemm " << m << " x " << n << " x " << k
                                   << " failed with status " << static_cast<int>(status);
#else
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
#endif
}

const char* SgemmLibrary() {
#ifdef ZR_WITH_DNNL
  static const std::string name = [] {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch);
  }();
  return name.c_str();
#else
  static const std::string name = std::string("OpenBLAS, ") + openblas_get_corename() + " kernels";
  return name.c_str();
#endif
}

bool SgemmSharesOpenMpPool() {
#ifdef ZR_WITH_DNNL
  return true;  // Debian's oneDNN runs on OpenMP
#else
  return openblas_get_parallel() == 2;
#endif
}

}  // namespace zerort::cpu
