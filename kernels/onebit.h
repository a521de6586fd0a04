// DeepSpeed's 1-bit Adam on one device: the optimizer's element arithmetic in its three phases
// (and 0/1 Adam's and 1-bit LAMB's),
// and the scaled-sign compression of its compressed all-reduce (sharding/compressed_allreduce.h,
// [Note: 1-bit Adam]). CPU and CUDA twins; every operation rounded on its own
// (kernels/rounded_math.h), so the element math is bitwise the same on both devices (the sums of
// squares that set a scale are reduced in each device's order).
#pragma once

#include <cstdint>

#include "zerort/runtime/device.h"
#include "zerort/runtime/status.h"
#include "zerort/runtime/tensor.h"

namespace zerort {

struct OneBitAdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // for this range (0 where the parameter has no decay)
  float grad_scale = 1.0f;    // multiplies the gradient first
};

// Which part of DeepSpeed's OnebitAdam.step runs (no bias correction in any):
//   kWarmup:   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g g;  then kApply.
//   kMomentum: m = b1 m + (1-b1) g   (v frozen; the parameters untouched).
//   kApply:    p = p - lr (m / (sqrt(v) + eps) + wd p)   (wd p only when wd > 0).
// g is the gradient times grad_scale. kApply and kWarmup write `compute_out` (when its data is
// not null) with the new parameter in its dtype.
enum class OneBitPhase { kWarmup, kMomentum, kApply };

// master, grad, exp_avg, exp_avg_sq: fp32 views of equal length on one device (grad unread by
// kApply; master and compute_out unread by kMomentum).
Status OneBitAdamStep(const OneBitAdamHyper& h, OneBitPhase phase, const TensorView& master,
                      const TensorView& grad, const TensorView& exp_avg,
                      const TensorView& exp_avg_sq, const TensorView& compute_out, Stream* stream);

// DeepSpeed's 0/1 Adam's steps after var_freeze_step ([Note: 0/1 Adam],
// sharding/compressed_allreduce.h), on fp32 views of one length (`accumulator`: the summed local
// steps; `compute_out` as OneBitAdamStep's, written by kLocalStep and kSyncIn):
//   kLocalStep: t = -lr (m / (sqrt(v) + eps) + wd p); p += t; acc += t.
//   kSyncOut:   p -= acc; acc x= sqrt(v) + eps          (before acc's compressed mean)
//   kSyncIn:    m = -acc / lrs; p += acc / (sqrt(v) + eps); acc = 0   (after it)
enum class ZeroOnePhase { kLocalStep, kSyncOut, kSyncIn };
Status ZeroOneAdamStep(const OneBitAdamHyper& h, float lrs, ZeroOnePhase phase,
                       const TensorView& master, const TensorView& exp_avg,
                       const TensorView& exp_avg_sq, const TensorView& accumulator,
                       const TensorView& compute_out, Stream* stream);

// DeepSpeed's 1-bit LAMB after freeze_step ([Note: 1-bit LAMB], sharding/compressed_allreduce.h),
// on fp32 views of one length and device (h.lr unused; g is the gradient times h.grad_scale):
//   OneBitLambMomentum:    fused = (b1 m + (1-b1) g) x scaling; m unchanged (the reconstruction
//                          reads it as the last step's momentum).
//   OneBitLambReconstruct: after fused's compressed mean, m' = fused / scaling,
//                          r = (m' - b1 m) / (1-b1), v_fresh = b2 v_fresh + (1-b2) r r, m = m',
//                          u0 = m' / (sqrt(v) + eps), u = u0 + wd p (wd > 0) written to
//                          `update_out`; `stats` (3 fp32 on the device) gets sum u0^2 and sum u^2
//                          added and the largest (sqrt(v) + eps) / (sqrt(v_fresh) + eps) maxed in.
Status OneBitLambMomentum(const OneBitAdamHyper& h, float scaling, const TensorView& grad,
                          const TensorView& exp_avg, const TensorView& fused, Stream* stream);
Status OneBitLambReconstruct(const OneBitAdamHyper& h, float scaling, const TensorView& master,
                             const TensorView& fused, const TensorView& exp_avg,
                             const TensorView& exp_avg_sq, const TensorView& exp_avg_sq_fresh,
                             const TensorView& update_out, const TensorView& stats, Stream* stream);

// Scaled-sign compression with error feedback, in place: `buffer` (fp32, n elements, a multiple
// of 8) holds b = value + error; `sum_sq` (one fp32 on buffer's device) holds sum(b^2). Writes the
// scale s = sqrt(sum_sq) / sqrt(n) to `scale` (one fp32 on that device), the signs to `bits`, and
// leaves the new error b - s sign(b) in `buffer`. A sign is 1 where b >= 0 (-0 and NaN too, as
// DeepSpeed's sign().add_(1).bool()); the buffer is cut in chunks of `chunk` elements (a multiple
// of 8 dividing n), chunk c's signs written from bits + c x chunk_stride, element j of a chunk
// at bit 7 - j % 8 of its byte j / 8 (so the chunks bound for different ranks land in their own
// messages).
Status SignCompress(const TensorView& buffer, const float* sum_sq, float* scale, uint8_t* bits,
                    int64_t chunk, int64_t chunk_stride, Stream* stream);

// out[j] = sum over w < sources of (bit_w(j) ? 1 : -1) x (scale_w x factor), summed from w = 0,
// then + out[j] when `accumulate`; j < out.numel(). Source w's bits start at
// bits + w x bits_stride (bytes, element 0 at its bit 7), its scale at scales[w x scale_stride].
Status SignDecode(const uint8_t* bits, int64_t bits_stride, const float* scales,
                  int64_t scale_stride, int sources, float factor, bool accumulate,
                  const TensorView& out, Stream* stream);

namespace internal {
Status CudaOneBitAdam(const OneBitAdamHyper& h, OneBitPhase phase, float* p, const float* g,
                      float* m, float* v, void* out, DType out_dtype, int64_t n, Stream* stream);
Status CudaZeroOneAdam(const OneBitAdamHyper& h, float lrs, ZeroOnePhase phase, float* p, float* m,
                       const float* v, float* acc, void* out, DType out_dtype, int64_t n,
                       Stream* stream);
Status CudaOneBitLambMomentum(const OneBitAdamHyper& h, float scaling, const float* g,
                              const float* m, float* fused, int64_t n, Stream* stream);
Status CudaOneBitLambReconstruct(const OneBitAdamHyper& h, float scaling, const float* p,
                                 const float* fused, float* m, const float* v, float* v_fresh,
                                 float* update, float* stats, int64_t n, Stream* stream);
Status CudaSignCompress(float* buffer, int64_t n, float sqrt_n, const float* sum_sq, float* scale,
                        uint8_t* bits, int64_t chunk, int64_t chunk_stride, Stream* stream);
Status CudaSignDecode(const uint8_t* bits, int64_t bits_stride, const float* scales,
                      int64_t scale_stride, int sources, float factor, bool accumulate, float* out,
                      int64_t n, Stream* stream);
}  // namespace internal

}  // namespace zerort
