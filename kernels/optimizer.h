// Optimizer steps on one contiguous range of a shard, fused in one pass: the gradient is scaled
// (unscale x clip coefficient), the state updated, the fp32 master updated, and the
// compute-dtype copy of the new value written (when `compute_out` is non-empty). Formulas and
// their order follow PyTorch's torch.optim (AdamW, Adam with L2, SGD with momentum/Nesterov),
// in fp32. Three implementations: a scalar reference (CPU), a vectorised CPU one (OpenMP
// threads, SIMD, tiled so that each element is read and written once; run in the order of the
// stream given, RunOnHostInOrder) and a CUDA one.
#pragma once

#include <cstdint>
#include <span>

#include "zerort/runtime/device.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;    // for this range (0 where the parameter has no decay)
  bool decoupled = true;        // AdamW (p *= 1 - lr*wd) vs Adam (g += wd*p)
  int64_t step = 1;             // 1-based, for bias correction
  float grad_scale = 1.0f;      // multiplies the gradient first
  bool bias_correction = true;  // false: DeepSpeed's bias_correction off (no 1/(1-beta^t))
};

struct SgdHyper {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;  // L2, as torch.optim.SGD
  bool nesterov = false;
  int64_t step = 1;  // the momentum buffer is initialised to the gradient at step 1
  float grad_scale = 1.0f;
};

// master, grad, exp_avg, exp_avg_sq: fp32 views of equal length on one device; compute_out:
// a view with a null data pointer (no copy wanted), or one of the same length in f32/bf16/f16.
Status AdamStep(const AdamHyper& h, const TensorView& master, const TensorView& grad,
                const TensorView& exp_avg, const TensorView& exp_avg_sq,
                const TensorView& compute_out, Stream* stream);
Status SgdStep(const SgdHyper& h, const TensorView& master, const TensorView& grad,
               const TensorView& momentum_buffer, const TensorView& compute_out, Stream* stream);

// One range of a multi-range step: elements [begin, begin + count) of the views, with the weight
// decay of the parameter they belong to.
struct OptimizerSegment {
  int64_t begin = 0;
  int64_t count = 0;
  float weight_decay = 0.0f;
};
// AdamStep over several ranges of the same views at once, each as AdamStep with
// h.weight_decay = the segment's: elements outside the segments are not touched, and every
// element's result is bitwise AdamStep's. On CUDA one launch covers up to
// kAdamSegmentsPerLaunch segments (a shard's parameters: the per-parameter launches cost about
// 10 us each, 9% of a GPT-2 step on an H200, docs/gpu.md); on the CPU one queued item.
inline constexpr int kAdamSegmentsPerLaunch = 32;
Status AdamStepSegments(const AdamHyper& h, std::span<const OptimizerSegment> segments,
                        const TensorView& master, const TensorView& grad, const TensorView& exp_avg,
                        const TensorView& exp_avg_sq, const TensorView& compute_out,
                        Stream* stream);

// The scalar references (CPU views only).
Status AdamStepReference(const AdamHyper& h, const TensorView& master, const TensorView& grad,
                         const TensorView& exp_avg, const TensorView& exp_avg_sq,
                         const TensorView& compute_out);
Status SgdStepReference(const SgdHyper& h, const TensorView& master, const TensorView& grad,
                        const TensorView& momentum_buffer, const TensorView& compute_out);

namespace internal {
// Raw entry points behind AdamStep/SgdStep, on validated arguments; out may be null.
void CpuAdam(const AdamHyper& h, float* p, const float* g, float* m, float* v, void* out,
             DType out_dtype, int64_t n);
void CpuSgd(const SgdHyper& h, float* p, const float* g, float* buf, void* out, DType out_dtype,
            int64_t n);
Status CudaSgd(const SgdHyper& h, float* p, const float* g, float* buf, void* out, DType out_dtype,
               int64_t n, Stream* stream);
// Validated segments (each within the views); any number, launched kAdamSegmentsPerLaunch at a
// time.
Status CudaAdamSegments(const AdamHyper& h, std::span<const OptimizerSegment> segments, float* p,
                        const float* g, float* m, float* v, void* out, DType out_dtype,
                        Stream* stream);
}  // namespace internal

}  // namespace zerort
