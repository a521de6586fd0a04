// Kernel entry points of a build without CUDA.
#include "kernels/cast.h"

namespace zerort::internal {

Status CudaCast(const void*, DType, void*, DType, int64_t, Stream*) {
  return absl::FailedPreconditionError("Cast on CUDA: zerort was built without CUDA");
}

}  // namespace zerort::internal
