// LAMB (DeepSpeed's FusedLamb, You et al. 2019) in two passes over a range of one parameter, so
// a parameter split over shards gets its trust ratio from norms summed over every shard:
//   LambMoments:  m, v from the gradient (times grad_scale); update = m / (sqrt(v) + eps) +
//                 wd * p written over the gradient; sums[0] += sum(p^2), sums[1] += sum(update^2)
//                 (f32 on the buffers' device; the caller sums them over the shards);
//   LambCoefficient: ||p|| / ||update|| clamped to [min_coeff, max_coeff], 1 when either is 0;
//   LambApply:    p -= step_size x coeff x update, step_size = lr sqrt(1 - b2^t) / (1 - b1^t)
//                 (lr without bias correction); the compute copy written in the same pass.
// CPU (OpenMP, double partial sums; in the order of the stream given) and CUDA twins;
// tests/kernels/lamb_test.cc holds a textbook LAMB in double to check them against.
#pragma once

#include "zerort/runtime/device.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

struct LambHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // for this parameter (0 where it has no decay)
  int64_t step = 1;           // 1-based
  float grad_scale = 1.0f;    // multiplies the gradient first
  bool bias_correction = true;
  float max_coeff = 10.0f;  // DeepSpeed's defaults
  float min_coeff = 0.01f;
};

Status LambMoments(const LambHyper& h, const TensorView& master, const TensorView& grad,
                   const TensorView& exp_avg, const TensorView& exp_avg_sq, const TensorView& sums,
                   Stream* stream);
float LambCoefficient(const LambHyper& h, double param_sum_sq, double update_sum_sq);
Status LambApply(const LambHyper& h, float coeff, const TensorView& master,
                 const TensorView& update, const TensorView& compute_out, Stream* stream);

namespace internal {
Status CudaLambMoments(const LambHyper& h, const float* p, float* g, float* m, float* v,
                       float* sums, int64_t n, Stream* stream);
Status CudaLambApply(float step_coeff, float* p, const float* update, void* out, DType out_dtype,
                     int64_t n, Stream* stream);
}  // namespace internal

}  // namespace zerort
