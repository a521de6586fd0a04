// LAMB on the CPU (two OpenMP passes, the norms' sums in fixed chunks) and the validating entries
// shared with CUDA.
#include "zerort/kernels/lamb.h"

#include <algorithm>
#include <cmath>

#include "zerort/kernels/cpu/vector_math.h"
#include "zerort/kernels/optimizer_math.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

Status CheckLambF32(const TensorView& v, int64_t n, const char* what, Device device) {
  if (v.dtype() != DType::kF32 || v.numel() != n || v.device() != device ||
      (n > 0 && v.data() == nullptr)) {
    return absl::InvalidArgumentError(
        StrCat("LAMB: ", what, " must be ", n, " f32 values on ", device.ToString()));
  }
  return absl::OkStatus();
}

double StepSize(const LambHyper& h) {
  if (!h.bias_correction) return h.lr;
  const double t = static_cast<double>(h.step);
  return h.lr * std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)) /
         (1.0 - std::pow(static_cast<double>(h.beta1), t));
}

// One chunk of the moments pass: each element's update written over its gradient, and the
// chunk's sums of squares of the parameters and of the updates, in eight double lanes each
// ([Note: sums in written-out lanes], kernels/cpu/vector_math.h). Both passes are built per
// vector width with their scalars in registers, as AdamW's are ([Note: the host update's vector
// width], optimizer.cc): the same bits in every version (element-wise, the lanes written out).
ZR_CPU_CLONES std::pair<double, double> MomentsChunk(const math::LambScalars& scalars,
                                                     const float* p, float* g, float* m, float* v,
                                                     int64_t begin, int64_t end) {
  const math::LambScalars a = scalars;  // in registers
  cpu::Lanes<double, 8> w, u;
  cpu::ForLanes<8>(end - begin, [&](int64_t k, int j) {
    const int64_t i = begin + k;
    const float update = math::LambUpdate(a, p[i], g[i], m[i], v[i]);
    g[i] = update;
    w.lane[j] += static_cast<double>(p[i]) * p[i];
    u.lane[j] += static_cast<double>(update) * update;
  });
  return {w.Total(), u.Total()};
}

template <typename Out>
[[gnu::always_inline]] inline void ApplyBody(float step_coeff, float* __restrict p,
                                             const float* __restrict u, Out* __restrict out,
                                             int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    const float np = math::LambApplyElement(step_coeff, p[i], u[i]);
    p[i] = np;
    cpu::StoreAs(out, i, np);
  }
}

// Elements [i0, i1) of the second pass, the compute copy written as `out_dtype` (none when out
// is null).
ZR_CPU_CLONES void ApplyRange(float step_coeff, float* p, const float* u, void* out,
                              DType out_dtype, int64_t i0, int64_t i1) {
  if (out == nullptr) return ApplyBody<void>(step_coeff, p, u, nullptr, i0, i1);
  switch (out_dtype) {
    case DType::kBF16:
      return ApplyBody(step_coeff, p, u, static_cast<BFloat16*>(out), i0, i1);
    case DType::kF16:
      return ApplyBody(step_coeff, p, u, static_cast<Half*>(out), i0, i1);
    default:
      return ApplyBody(step_coeff, p, u, static_cast<float*>(out), i0, i1);
  }
}

}  // namespace

Status LambMoments(const LambHyper& h, const TensorView& master, const TensorView& grad,
                   const TensorView& exp_avg, const TensorView& exp_avg_sq, const TensorView& sums,
                   Stream* stream) {
  const int64_t n = master.numel();
  const Device d = master.device();
  ZR_RETURN_IF_ERROR(CheckLambF32(master, n, "master", d));
  ZR_RETURN_IF_ERROR(CheckLambF32(grad, n, "grad", d));
  ZR_RETURN_IF_ERROR(CheckLambF32(exp_avg, n, "exp_avg", d));
  ZR_RETURN_IF_ERROR(CheckLambF32(exp_avg_sq, n, "exp_avg_sq", d));
  ZR_RETURN_IF_ERROR(CheckLambF32(sums, 2, "sums", d));
  if (h.step < 1) return absl::InvalidArgumentError(StrCat("LAMB step ", h.step, " is below 1"));
  const float* p = master.data_as<float>();
  float* g = grad.data_as<float>();
  float* m = exp_avg.data_as<float>();
  float* v = exp_avg_sq.data_as<float>();
  if (d.is_cuda()) {
    return internal::CudaLambMoments(h, p, g, m, v, sums.data_as<float>(), n, stream);
  }
  float* s = sums.data_as<float>();
  return RunOnHostInOrder(stream, [=] {
    const math::LambScalars a = math::MakeLambScalars(h);
    double w = 0, u = 0;  // the chunks' sums in chunk order: the same bits at any thread count
    for (const auto& [cw, cu] : cpu::ChunkResults(n, kReduceChunk, [&](int64_t b, int64_t e) {
           return MomentsChunk(a, p, g, m, v, b, e);
         })) {
      w += cw;
      u += cu;
    }
    s[0] += static_cast<float>(w);
    s[1] += static_cast<float>(u);
    return absl::OkStatus();
  });
}

float LambCoefficient(const LambHyper& h, double param_sum_sq, double update_sum_sq) {
  const double w = std::sqrt(param_sum_sq), u = std::sqrt(update_sum_sq);
  if (w == 0 || u == 0) return 1.0f;
  return static_cast<float>(
      std::clamp(w / u, static_cast<double>(h.min_coeff), static_cast<double>(h.max_coeff)));
}

Status LambApply(const LambHyper& h, float coeff, const TensorView& master,
                 const TensorView& update, const TensorView& out, Stream* stream) {
  const int64_t n = master.numel();
  const Device d = master.device();
  ZR_RETURN_IF_ERROR(CheckLambF32(master, n, "master", d));
  ZR_RETURN_IF_ERROR(CheckLambF32(update, n, "update", d));
  if (out.data() != nullptr && (out.numel() != n || out.device() != d)) {
    return absl::InvalidArgumentError("LAMB: compute_out does not match the master");
  }
  const float step_coeff = static_cast<float>(StepSize(h) * coeff);
  float* p = master.data_as<float>();
  const float* u = update.data_as<float>();
  if (d.is_cuda()) {
    return internal::CudaLambApply(step_coeff, p, u, out.data(), out.dtype(), n, stream);
  }
  return RunOnHostInOrder(stream, [=, out = out.Detached()] {
    cpu::ParallelFor(n, cpu::kElementGrain, [&](int64_t i0, int64_t i1) {
      ApplyRange(step_coeff, p, u, out.data(), out.dtype(), i0, i1);
    });
    return absl::OkStatus();
  });
}

}  // namespace zerort
