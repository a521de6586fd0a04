// The row-major-to-column-major GEMM mappings cuda/model_kernels.cu hands cuBLAS and cuBLASLt
// (kernels/gemm_map.h), run through a small column-major GEMM emulator with cuBLAS's semantics and
// compared with the CPU reference operations (model_ops.h) and with row-major loops. A wrong
// transpose, swapped operand or leading dimension fails here, on the CPU, before any GPU run.
#include "zerort/kernels/gemm_map.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/random_floats.h"
#include "zerort/kernels/model_ops.h"

namespace zerort::gemm {
namespace {

// cuBLAS's column-major GEMM: D[i + j ldd] = sum_p op(A)(i, p) op(B)(p, j) + beta D, where
// op(X)(r, c) = X[c + r ldx] when X is transposed, X[r + c ldx] otherwise.
void EmulateColumnMajor(const ColumnMajor& g, const double* a, const double* b, double* d,
                        double beta) {
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double av = g.trans_a ? a[p + i * g.lda] : a[i + p * g.lda];
        const double bv = g.trans_b ? b[j + p * g.ldb] : b[p + j * g.ldb];
        sum += av * bv;
      }
      d[i + j * g.ldd] = sum + beta * d[i + j * g.ldd];
    }
  }
}

std::vector<double> Random(size_t n, uint32_t seed) {
  return testing::RandomNormal<double>(n, seed, 1.0);
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-12 * (1 + std::abs(want[i]))) << what << " element " << i;
  }
}

// Odd sizes, so a swapped dimension or leading dimension reads the wrong elements.
constexpr int64_t kRows = 7, kIn = 5, kOut = 3;

TEST(GemmMapTest, LinearForwardIsTheReferenceMatmul) {
  const std::vector<double> inp = Random(kRows * kIn, 1), weight = Random(kOut * kIn, 2);
  std::vector<double> want(kRows * kOut), got(kRows * kOut, 99.0);
  cpu::MatmulForward<double>(want.data(), inp.data(), weight.data(), nullptr, kRows, kIn, kOut);
  EmulateColumnMajor(LinearForward(kRows, kIn, kOut), weight.data(), inp.data(), got.data(), 0.0);
  ExpectNear(got, want, "out");
}

TEST(GemmMapTest, LinearBackwardIsTheReferenceBackward) {
  const std::vector<double> inp = Random(kRows * kIn, 3), weight = Random(kOut * kIn, 4),
                            dout = Random(kRows * kOut, 5);
  // Both sides accumulate (beta 1) into the same nonzero starting gradients.
  std::vector<double> dinp_want = Random(kRows * kIn, 6), dweight_want = Random(kOut * kIn, 7);
  std::vector<double> dinp_got = dinp_want, dweight_got = dweight_want;
  cpu::MatmulBackward<double>(dinp_want.data(), dweight_want.data(), nullptr, dout.data(),
                              inp.data(), weight.data(), kRows, kIn, kOut);
  EmulateColumnMajor(LinearBackwardInput(kRows, kIn, kOut), weight.data(), dout.data(),
                     dinp_got.data(), 1.0);
  EmulateColumnMajor(LinearBackwardWeight(kRows, kIn, kOut), inp.data(), dout.data(),
                     dweight_got.data(), 1.0);
  ExpectNear(dinp_got, dinp_want, "dinp");
  ExpectNear(dweight_got, dweight_want, "dweight");
}

// The attention's batched GEMMs: row-major C = op(A) op(B) with padded leading dimensions, every
// transpose combination, against row-major loops.
TEST(GemmMapTest, RowMajorMatchesRowMajorLoops) {
  constexpr int64_t m = 4, n = 6, k = 3;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      // Stored shapes: A is [m, k] (or [k, m] when transposed), B [k, n] (or [n, k]); each row
      // padded by 2 elements.
      const int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 2, ldc = n + 2;
      const std::vector<double> a = Random((ta ? k : m) * lda, 8),
                                b = Random((tb ? n : k) * ldb, 9);
      std::vector<double> want(m * ldc, 0.0), got(m * ldc, 0.0);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (int64_t p = 0; p < k; ++p) {
            sum += (ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
          }
          want[i * ldc + j] = sum;
        }
      }
      // The column-major call's A is the row-major B (model_kernels.cu's BatchedGemm).
      EmulateColumnMajor(RowMajor(ta, tb, m, n, k, lda, ldb, ldc), b.data(), a.data(), got.data(),
                         0.0);
      SCOPED_TRACE(::testing::Message() << "trans_a " << ta << " trans_b " << tb);
      ExpectNear(got, want, "c");
    }
  }
}

TEST(GemmMapTest, PointerAlignmentIsTheLargestPowerOfTwoUpTo256) {
  alignas(512) static unsigned char buffer[1024];
  EXPECT_EQ(PointerAlignment(buffer), 256u);
  EXPECT_EQ(PointerAlignment(buffer + 256), 256u);
  EXPECT_EQ(PointerAlignment(buffer + 32), 32u);  // a bf16 sub-view of a flat buffer
  EXPECT_EQ(PointerAlignment(buffer + 96), 32u);
  EXPECT_EQ(PointerAlignment(buffer + 2), 2u);
  EXPECT_EQ(PointerAlignment(buffer + 1), 1u);
  EXPECT_EQ(PointerAlignment(buffer + 384), 128u);
}

}  // namespace
}  // namespace zerort::gemm
