// BLIS's row-major sgemm for gemm_compare.cc, in its own translation unit: blis.h and OpenBLAS's
// cblas.h declare the same CBLAS names and cannot share one.
#include <blis.h>

void BlisSetThreads(int threads) { bli_thread_set_num_threads(threads); }

// c[m, n] = a op(b) (+ beta c), row-major, as cblas_sgemm with CblasRowMajor.
void BlisSgemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  float one = 1.0f;
  bli_sgemm(trans_a ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
            trans_b ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m, n, k, &one, const_cast<float*>(a), lda,
            1, const_cast<float*>(b), ldb, 1, &beta, c, ldc, 1);
}
