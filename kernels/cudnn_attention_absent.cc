// The cuDNN attention where the build has no cudnn-frontend ([Note: the cuDNN attention] in
// kernels/cudnn_attention.h): every use says how to build it.
#include "zerort/kernels/cudnn_attention.h"

namespace zerort::internal {

Status CudnnAttentionBuilt() {
  return absl::UnimplementedError(
      "model.attention_backend = \"cudnn\": this zerort was built without cuDNN's attention "
      "(configure a CUDA build with -DZR_CUDNN_FRONTEND=DIR, DIR holding NVIDIA's cudnn-frontend "
      "include/; or choose \"flash\", zerort's own kernels)");
}

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(Stream&) {
  return CudnnAttentionBuilt();
}

}  // namespace zerort::internal
