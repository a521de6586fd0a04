// ModelKernels: the GPT and LLaMA models' operations behind one interface, so the layer code is
// written once for CPU and CUDA. Its roles, their contracts (devices, streams, element types,
// gradients added) and the context they share are kernel_roles.h's ([Note: the kernels' roles]);
// here the operations that compose them and the factories. Implementations: CPU (float or bf16
// for training, double for finite-difference checks; OpenBLAS GEMMs) and CUDA (fp32 or bf16
// activations, fp32 accumulation; cuBLASLt GEMMs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerort/kernels/kernel_roles.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/rope.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/status.h"

namespace zerort {

// ModelKernels::MatmulResidual's precondition: out is not the residual.
inline Status CheckMatmulResidual(const void* out, const void* residual) {
  if (out != residual) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "MatmulResidual: out is the residual (it must be another buffer)");
}

// The model's operations: the five roles and their context (kernel_roles.h,
// [Note: the kernels' roles]) and the operations that compose roles, each with a default that
// runs the roles' operations one after another and that a backend overrides to fuse them.
class ModelKernels : public KernelContext,
                     public TokenKernels,
                     public NormKernels,
                     public LinearKernels,
                     public AttentionKernels,
                     public ElementKernels {
 public:
  ~ModelKernels() override = default;

  // The bytes Attention saves for its backward: attention_program's, by kernels/memory_facts.h.
  int64_t AttentionSavedBytes(int batch, int seq, int heads, int head_size) const {
    return zerort::AttentionSavedBytes(attention_program(batch, heads, head_size), batch, seq,
                                       heads, static_cast<int64_t>(act_size()));
  }

  // The residual connection and the LayerNorm after it: sum = a + b (sum may be a or b), out =
  // LayerNorm(sum). This default runs Add then LayerNorm; the CPU float kernels do both in one
  // pass over each row, with the same arithmetic, and the CUDA kernels in one launch.
  virtual Status AddLayerNorm(void* sum, void* out, void* mean, void* rstd, const void* a,
                              const void* b, const void* weight, const void* bias, int64_t rows,
                              int channels) {
    ZR_RETURN_IF_ERROR(Add(sum, a, b, rows * channels));
    return LayerNorm(out, mean, rstd, sum, weight, bias, rows, channels);
  }
  // sum = a + b (sum may be a or b), out = RmsNorm(sum): the residual connection and the norm
  // after it. This default runs Add then RmsNorm; the CUDA kernels do both in one launch.
  virtual Status AddRmsNorm(void* sum, void* out, void* rstd, const void* a, const void* b,
                            const void* weight, int64_t rows, int channels, float eps) {
    ZR_RETURN_IF_ERROR(Add(sum, a, b, rows * channels));
    return RmsNorm(out, rstd, sum, weight, rows, channels, eps);
  }

  // MatmulBackward with dinp [rows, in] written, not added (an input gradient nothing else adds
  // to first); dweight and dbias added as MatmulBackward adds them. This default zeroes dinp then
  // adds into it; the CUDA kernels run the input gradient's GEMM with beta 0 (no fill, no read).
  virtual Status MatmulBackwardWrite(void* dinp, void* dweight, void* dbias, const void* dout,
                                     const void* inp, const void* weight, int64_t rows, int in,
                                     int out_features) {
    const size_t bytes = static_cast<size_t>(rows) * in * act_size();
    ZR_RETURN_IF_ERROR(FillZero(dinp, device(), bytes, &stream()));
    return MatmulBackward(dinp, dweight, dbias, dout, inp, weight, rows, in, out_features);
  }
  // A linear layer into the residual stream: out = inp weight^T + bias + residual (out is not
  // residual). This default runs Matmul into out then Add; the CPU 16-bit kernels round out once
  // (the product and the sum in fp32), as the CUDA kernels' one cuBLASLt call does with the
  // residual as its C (beta 1): no Add pass, no product written and read back.
  virtual Status MatmulResidual(void* out, const void* inp, const void* weight, const void* bias,
                                const void* residual, int64_t rows, int in, int out_features) {
    ZR_RETURN_IF_ERROR(CheckMatmulResidual(out, residual));
    ZR_RETURN_IF_ERROR(Matmul(out, inp, weight, bias, rows, in, out_features));
    return Add(out, out, residual, rows * out_features);
  }
  // The MLP's first layer: pre = inp weight^T + bias (kept for the backward), out = gelu(pre).
  // This default runs Matmul then Gelu; the CPU float kernels fuse the bias and the GELU into one
  // pass after a bias-free GEMM, the CUDA 16-bit kernels make them cuBLASLt's epilogue.
  virtual Status MatmulGelu(void* pre, void* out, const void* inp, const void* weight,
                            const void* bias, int64_t rows, int in, int out_features) {
    ZR_RETURN_IF_ERROR(Matmul(pre, inp, weight, bias, rows, in, out_features));
    return Gelu(out, pre, rows * out_features);
  }
  // The backward of a linear layer whose input is act = gelu(pre) (the MLP's projection): dpre
  // [rows, in] = gelu'(pre) x (dout weight) (written, not added), dweight and dbias added as
  // MatmulBackward adds them. `scratch` holds rows x in act-dtype values. This default runs
  // MatmulBackward into the zeroed scratch then GeluBackward into the zeroed dpre; the CUDA
  // 16-bit kernels make GELU's derivative cuBLASLt's epilogue of the input gradient's GEMM.
  virtual Status GeluMatmulBackward(void* dpre, void* dweight, void* dbias, const void* dout,
                                    const void* act, const void* pre, const void* weight,
                                    void* scratch, int64_t rows, int in, int out_features) {
    const size_t bytes = static_cast<size_t>(rows) * in * act_size();
    ZR_RETURN_IF_ERROR(FillZero(scratch, device(), bytes, &stream()));
    ZR_RETURN_IF_ERROR(
        MatmulBackward(scratch, dweight, dbias, dout, act, weight, rows, in, out_features));
    ZR_RETURN_IF_ERROR(FillZero(dpre, device(), bytes, &stream()));
    return GeluBackward(dpre, pre, scratch, rows * in);
  }
};

// `dtype` (one of ModelKernels' act_dtype, grad_dtype, stat_dtype) for a collective; an error
// naming `what` ("activations") when the kernels have none.
inline StatusOr<DType> CollectiveDType(std::optional<DType> dtype, std::string_view what) {
  if (dtype.has_value()) return *dtype;
  return absl::InvalidArgumentError(
      "the kernels' " + std::string(what) +
      " are fp64, which no collective carries: the double kernels (finite-difference checks) "
      "run on one rank, without tensor or pipeline parallelism");
}

// CPU kernels in float (act, grad and stat all fp32), bf16 or fp16 (activations and weights
// stored in 16 bits, fp32 math and weight gradients), or, for gradient checks, double. With a
// `stream` (the shard manager's compute stream; it must outlive the kernels) every operation is
// issued on it, as the CUDA kernels' are on theirs: on a queued CPU stream it runs later on the
// stream's thread ([Note: the asynchronous CPU device]) and the host reads synchronise it. Without
// one the kernels have an immediate stream of their own.
enum class CpuPrecision { kFloat, kBf16, kF16, kDouble };
std::unique_ptr<ModelKernels> MakeCpuModelKernels(CpuPrecision precision, Stream* stream = nullptr);

// CUDA kernels with activations/weights in `act` (kF32, kBF16 or kF16) and weight gradients in
// `grad` (kF32, or kBF16 with kBF16 activations); fp32 accumulation everywhere. Scratch memory
// (GEMM workspace, attention scores) comes from `workspace` (tagged kWorkspace). Fails when CUDA is
// not built or present. `attention`: the attention program asked for (model.attention_backend;
// `zerort bench attention`'s baseline asks for the materialised one), else AttentionProgramFor's
// choice by shape (kernels/memory_facts.h), which the memory model makes the same way. `tiles`:
// the flash kernels' block shapes (model.flash_attention; checked by each call, as
// CheckAttentionBackend checks a run's before it starts).
StatusOr<std::unique_ptr<ModelKernels>> MakeCudaModelKernels(
    DType act, DType grad, Stream& stream, Allocator& workspace,
    std::optional<AttentionProgram> attention = std::nullopt, const FlashTiles& tiles = {});

}  // namespace zerort
