// The GPT model's row-major matmuls as the column-major GEMMs cuBLAS and cuBLASLt compute: the
// parameters cuda/model_kernels.cu hands them, defined once and host-only, so the CPU tests
// (tests/kernels/gemm_map_test.cc) check every mapping against a column-major GEMM emulator and
// against plain row-major loops. Also the pointer alignment cuBLASLt's heuristic is told
// ([Note: cuBLASLt plans] in model_kernels.cu).
#pragma once

#include <cstdint>

namespace zerort::gemm {

// D [m, n] = alpha op(A) [m, k] x op(B) [k, n] + beta D, every matrix column-major with the given
// leading dimension (op(X) = X^T when trans_x). Which caller buffer is A, B and D is the mapping
// function's documented contract.
struct ColumnMajor {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
};

// The linear layer's forward: out [rows, out_features] = inp [rows, in] x W^T, W stored row-major
// [out_features, in] (as PyTorch's Linear). Column-major, out^T [out_features, rows] =
// W [out_features, in] x inp^T [in, rows]: A = weight, B = inp, D = out.
constexpr ColumnMajor LinearForward(int64_t rows, int64_t in, int64_t out_features) {
  return {true, false, out_features, rows, in, in, in, out_features};
}
// dinp [rows, in] (+)= dout [rows, out_features] x W: dinp^T [in, rows] = W^T [in, out] x
// dout^T [out, rows]: A = weight, B = dout, D = dinp.
constexpr ColumnMajor LinearBackwardInput(int64_t rows, int64_t in, int64_t out_features) {
  return {false, false, in, rows, out_features, in, out_features, in};
}
// dW [out_features, in] (+)= dout^T [out, rows] x inp [rows, in]: dW^T [in, out] = inp^T [in, rows]
// x dout [rows, out]: A = inp, B = dout, D = dweight.
constexpr ColumnMajor LinearBackwardWeight(int64_t rows, int64_t in, int64_t out_features) {
  return {false, true, in, out_features, rows, in, out_features, in};
}

// A row-major GEMM C [m, n] = op(A) [m, k] x op(B) [k, n] with row-major leading dimensions, as the
// column-major C^T [n, m] = op(B)^T [n, k] x op(A)^T [k, m]: the column-major call's A is the
// row-major B (and its B the row-major A), with the same transposes.
constexpr ColumnMajor RowMajor(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                               int64_t lda, int64_t ldb, int64_t ldc) {
  return {trans_b, trans_a, n, m, k, ldb, lda, ldc};
}

// The largest power of two, at most 256, that divides the address: the alignment cuBLASLt may
// assume for an operand (its heuristic assumes 256 bytes unless told less).
inline uint32_t PointerAlignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

}  // namespace zerort::gemm
