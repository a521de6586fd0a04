// Kernel entry points of a build without CUDA.
#include "zerort/kernels/cast.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/lamb.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/kernels/onebit.h"
#include "zerort/kernels/optimizer.h"
#include "zerort/kernels/quantize.h"
#include "zerort/kernels/reduce.h"

namespace zerort::internal {

Status CudaCast(const void*, DType, void*, DType, int64_t, Stream*) {
  return absl::FailedPreconditionError("Cast on CUDA: zerort was built without CUDA");
}

namespace {
Status NoCuda(const char* what) {
  return absl::FailedPreconditionError(std::string(what) +
                                       " on CUDA: zerort was built without CUDA");
}
}  // namespace

Status CudaSgd(const SgdHyper&, float*, const float*, float*, void*, DType, int64_t, Stream*) {
  return NoCuda("SgdStep");
}
Status CudaAdamSegments(const AdamHyper&, std::span<const OptimizerSegment>, float*, const float*,
                        float*, float*, void*, DType, Stream*) {
  return NoCuda("AdamStepSegments");
}
Status CudaLambMoments(const LambHyper&, const float*, float*, float*, float*, float*, int64_t,
                       Stream*) {
  return NoCuda("LambMoments");
}
Status CudaLambApply(float, float*, const float*, void*, DType, int64_t, Stream*) {
  return NoCuda("LambApply");
}
Status CudaSumOfSquares(const void*, DType, int64_t, float*, Stream*) {
  return NoCuda("SumOfSquares");
}
Status CudaCountNonFinite(const void*, DType, int64_t, float*, Stream*) {
  return NoCuda("CountNonFinite");
}
Status CudaSum(const void*, DType, int64_t, float, float*, Stream*) { return NoCuda("Sum"); }
Status CudaScale(void*, DType, int64_t, float, Stream*) { return NoCuda("Scale"); }
Status CudaOneBitAdam(const OneBitAdamHyper&, OneBitPhase, float*, const float*, float*, float*,
                      void*, DType, int64_t, Stream*) {
  return NoCuda("OneBitAdamStep");
}
Status CudaZeroOneAdam(const OneBitAdamHyper&, float, ZeroOnePhase, float*, float*, const float*,
                       float*, void*, DType, int64_t, Stream*) {
  return NoCuda("ZeroOneAdamStep");
}
Status CudaOneBitLambMomentum(const OneBitAdamHyper&, float, const float*, const float*, float*,
                              int64_t, Stream*) {
  return NoCuda("OneBitLambMomentum");
}
Status CudaOneBitLambReconstruct(const OneBitAdamHyper&, float, const float*, const float*, float*,
                                 const float*, float*, float*, float*, int64_t, Stream*) {
  return NoCuda("OneBitLambReconstruct");
}
Status CudaSignCompress(float*, int64_t, float, const float*, float*, uint8_t*, int64_t, int64_t,
                        Stream*) {
  return NoCuda("SignCompress");
}
Status CudaSignDecode(const uint8_t*, int64_t, const float*, int64_t, int, float, bool, float*,
                      int64_t, Stream*) {
  return NoCuda("SignDecode");
}
Status CudaQuantizeInt8(const void*, DType, int64_t, int64_t, void*, Stream*) {
  return NoCuda("QuantizeInt8");
}
Status CudaDequantizeInt8(const void*, int64_t, int64_t, void*, DType, Stream*) {
  return NoCuda("DequantizeInt8");
}
Status CudaAccumulateInto(const void*, DType, float*, int64_t, Stream*) {
  return NoCuda("AccumulateInto");
}
Status CudaFlashAttentionForward(DType, const FlashAttentionShape&, void*, float*, const void*,
                                 Stream&, const FlashTiles&) {
  return NoCuda("FlashAttentionForward");
}
Status CudaFlashAttentionBackward(DType, const FlashAttentionShape&, void*, float*, const void*,
                                  const void*, const void*, const float*, Stream&,
                                  const FlashTiles&) {
  return NoCuda("FlashAttentionBackward");
}

}  // namespace zerort::internal

namespace zerort {
StatusOr<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(DType, DType, Stream&, Allocator&,
                                                             std::optional<AttentionProgram>,
                                                             const FlashTiles&) {
  return absl::FailedPreconditionError("the GPT model on CUDA: zerort was built without CUDA");
}
}  // namespace zerort
