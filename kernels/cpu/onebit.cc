// DeepSpeed's 1-bit Adam's element math and scaled-sign compression (kernels/onebit.h), on the
// CPU; CUDA views go to kernels/cuda/onebit.cu.
#include "zerort/kernels/onebit.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "zerort/kernels/cpu/vector_math.h"
#include "zerort/kernels/optimizer_math.h"
#include "zerort/kernels/reduce.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

Status CheckF32(const TensorView& v, int64_t n, const Device& device, const char* what) {
  if (v.data() == nullptr || v.dtype() != DType::kF32 || v.numel() != n || v.device() != device) {
    return absl::InvalidArgumentError(
        StrCat("OneBitAdamStep: ", what, " is not ", n, " fp32 values on ", device.ToString()));
  }
  return absl::OkStatus();
}

Status CheckStream(const Device& device, Stream* stream, const char* what) {
  if (device.is_cuda() && (stream == nullptr || stream->device() != device)) {
    return absl::InvalidArgumentError(
        StrCat(what, " on CUDA views needs a stream of their device"));
  }
  return absl::OkStatus();
}

// One chunk of OneBitLambReconstruct's elements: the updates written, and the chunk's sums of
// squares of the preliminary and final updates (eight double lanes each, [Note: sums in
// written-out lanes], kernels/cpu/vector_math.h) and its largest ratio.
struct LambChunkStats {
  double prelim_sq = 0, update_sq = 0;
  float ratio = 0;
};
LambChunkStats ReconstructChunk(const OneBitAdamHyper& h, float scaling, const float* p,
                                const float* f, float* m, const float* v, float* vf, float* u,
                                int64_t begin, int64_t end) {
  float ratio = -std::numeric_limits<float>::infinity();
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  cpu::Lanes<double, 8> prelim_sq, update_sq;
  cpu::ForLanes<8>(end - begin, [&](int64_t k, int j) {
    const int64_t i = begin + k;
    const math::OneBitLambElement e =
        math::OneBitLambReconstruct(f[i], scaling, m[i], v[i], vf[i], p[i], h.beta1, omb1, h.beta2,
                                    omb2, h.eps, h.weight_decay);
    u[i] = e.update;
    prelim_sq.lane[j] += static_cast<double>(e.prelim) * e.prelim;
    update_sq.lane[j] += static_cast<double>(e.update) * e.update;
    ratio = std::max(ratio, e.ratio);
  });
  return {prelim_sq.Total(), update_sq.Total(), ratio};
}

}  // namespace

Status OneBitAdamStep(const OneBitAdamHyper& h, OneBitPhase phase, const TensorView& master,
                      const TensorView& grad, const TensorView& exp_avg,
                      const TensorView& exp_avg_sq, const TensorView& compute_out, Stream* stream) {
  const int64_t n = exp_avg.numel();
  const Device device = exp_avg.device();
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg, n, device, "exp_avg"));
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg_sq, n, device, "exp_avg_sq"));
  if (phase != OneBitPhase::kApply) ZR_RETURN_IF_ERROR(CheckF32(grad, n, device, "the gradient"));
  if (phase != OneBitPhase::kMomentum) {
    ZR_RETURN_IF_ERROR(CheckF32(master, n, device, "the master"));
    if (compute_out.data() != nullptr &&
        (compute_out.numel() != n || compute_out.device() != device)) {
      return absl::InvalidArgumentError("OneBitAdamStep: the compute copy does not match");
    }
  }
  ZR_RETURN_IF_ERROR(CheckStream(device, stream, "OneBitAdamStep"));
  float* p = phase != OneBitPhase::kMomentum ? master.data_as<float>() : nullptr;
  const float* g = phase != OneBitPhase::kApply ? grad.data_as<float>() : nullptr;
  float* m = exp_avg.data_as<float>();
  float* v = exp_avg_sq.data_as<float>();
  void* out = phase != OneBitPhase::kMomentum ? compute_out.data() : nullptr;
  const DType out_dtype = compute_out.dtype();
  if (device.is_cuda()) {
    return internal::CudaOneBitAdam(h, phase, p, g, m, v, out, out_dtype, n, stream);
  }
  return RunOnHostInOrder(stream, [=] {
    const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
      if (phase != OneBitPhase::kApply) {
        const float gi = math::Mul(g[i], h.grad_scale);
        m[i] = math::OneBitMomentum(m[i], gi, h.beta1, omb1);
        if (phase == OneBitPhase::kWarmup) v[i] = math::OneBitVariance(v[i], gi, h.beta2, omb2);
      }
      if (phase != OneBitPhase::kMomentum) {
        p[i] = math::OneBitApply(p[i], m[i], v[i], h.lr, h.eps, h.weight_decay);
        if (out != nullptr) StoreFromFloat(out, out_dtype, i, p[i]);
      }
    }
    return absl::OkStatus();
  });
}

Status ZeroOneAdamStep(const OneBitAdamHyper& h, float lrs, ZeroOnePhase phase,
                       const TensorView& master, const TensorView& exp_avg,
                       const TensorView& exp_avg_sq, const TensorView& accumulator,
                       const TensorView& compute_out, Stream* stream) {
  const int64_t n = master.numel();
  const Device device = master.device();
  ZR_RETURN_IF_ERROR(CheckF32(master, n, device, "the master"));
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg, n, device, "exp_avg"));
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg_sq, n, device, "exp_avg_sq"));
  ZR_RETURN_IF_ERROR(CheckF32(accumulator, n, device, "the accumulator"));
  if (compute_out.data() != nullptr &&
      (compute_out.numel() != n || compute_out.device() != device)) {
    return absl::InvalidArgumentError("ZeroOneAdamStep: the compute copy does not match");
  }
  if (phase == ZeroOnePhase::kSyncIn && !(lrs > 0.0f)) {
    return absl::InvalidArgumentError(StrCat("ZeroOneAdamStep: the summed learning rates are ", lrs,
                                             " (a synchronisation needs local steps)"));
  }
  ZR_RETURN_IF_ERROR(CheckStream(device, stream, "ZeroOneAdamStep"));
  float* p = master.data_as<float>();
  float* m = exp_avg.data_as<float>();
  const float* v = exp_avg_sq.data_as<float>();
  float* acc = accumulator.data_as<float>();
  void* out = phase == ZeroOnePhase::kSyncOut ? nullptr : compute_out.data();
  const DType out_dtype = compute_out.dtype();
  if (device.is_cuda()) {
    return internal::CudaZeroOneAdam(h, lrs, phase, p, m, v, acc, out, out_dtype, n, stream);
  }
  return RunOnHostInOrder(stream, [=] {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
      if (phase == ZeroOnePhase::kLocalStep) {
        math::ZeroOneLocalStep(p[i], acc[i], m[i], v[i], h.lr, h.eps, h.weight_decay);
      } else if (phase == ZeroOnePhase::kSyncOut) {
        math::ZeroOneSyncOut(p[i], acc[i], v[i], h.eps);
      } else {
        math::ZeroOneSyncIn(p[i], acc[i], m[i], v[i], h.eps, lrs);
      }
      if (out != nullptr) StoreFromFloat(out, out_dtype, i, p[i]);
    }
    return absl::OkStatus();
  });
}

Status OneBitLambMomentum(const OneBitAdamHyper& h, float scaling, const TensorView& grad,
                          const TensorView& exp_avg, const TensorView& fused, Stream* stream) {
  const int64_t n = exp_avg.numel();
  const Device device = exp_avg.device();
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg, n, device, "exp_avg"));
  ZR_RETURN_IF_ERROR(CheckF32(grad, n, device, "the gradient"));
  ZR_RETURN_IF_ERROR(CheckF32(fused, n, device, "the fused momentum"));
  ZR_RETURN_IF_ERROR(CheckStream(device, stream, "OneBitLambMomentum"));
  const float* g = grad.data_as<float>();
  const float* m = exp_avg.data_as<float>();
  float* f = fused.data_as<float>();
  if (device.is_cuda()) return internal::CudaOneBitLambMomentum(h, scaling, g, m, f, n, stream);
  return RunOnHostInOrder(stream, [=] {
    const float omb1 = 1.0f - h.beta1;
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
      f[i] = math::OneBitLambFused(m[i], math::Mul(g[i], h.grad_scale), h.beta1, omb1, scaling);
    }
    return absl::OkStatus();
  });
}

Status OneBitLambReconstruct(const OneBitAdamHyper& h, float scaling, const TensorView& master,
                             const TensorView& fused, const TensorView& exp_avg,
                             const TensorView& exp_avg_sq, const TensorView& exp_avg_sq_fresh,
                             const TensorView& update_out, const TensorView& stats,
                             Stream* stream) {
  const int64_t n = exp_avg.numel();
  const Device device = exp_avg.device();
  ZR_RETURN_IF_ERROR(CheckF32(master, n, device, "the master"));
  ZR_RETURN_IF_ERROR(CheckF32(fused, n, device, "the fused momentum"));
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg, n, device, "exp_avg"));
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg_sq, n, device, "exp_avg_sq"));
  ZR_RETURN_IF_ERROR(CheckF32(exp_avg_sq_fresh, n, device, "exp_avg_sq_fresh"));
  ZR_RETURN_IF_ERROR(CheckF32(update_out, n, device, "the update"));
  ZR_RETURN_IF_ERROR(CheckF32(stats, 3, device, "the stats"));
  ZR_RETURN_IF_ERROR(CheckStream(device, stream, "OneBitLambReconstruct"));
  if (!(scaling > 0.0f)) {
    return absl::InvalidArgumentError(StrCat("OneBitLambReconstruct: the scaling coefficient is ",
                                             scaling, " (positive expected)"));
  }
  const float* p = master.data_as<float>();
  const float* f = fused.data_as<float>();
  float* m = exp_avg.data_as<float>();
  const float* v = exp_avg_sq.data_as<float>();
  float* vf = exp_avg_sq_fresh.data_as<float>();
  float* u = update_out.data_as<float>();
  float* st = stats.data_as<float>();
  if (device.is_cuda()) {
    return internal::CudaOneBitLambReconstruct(h, scaling, p, f, m, v, vf, u, st, n, stream);
  }
  return RunOnHostInOrder(stream, [=] {
    double prelim_sq = 0, update_sq = 0;  // the chunks' in chunk order: the same bits at any
    float ratio = st[2];                  // thread count
    for (const LambChunkStats& c : cpu::ChunkResults(n, kReduceChunk, [&](int64_t b, int64_t e) {
           return ReconstructChunk(h, scaling, p, f, m, v, vf, u, b, e);
         })) {
      prelim_sq += c.prelim_sq;
      update_sq += c.update_sq;
      ratio = std::max(ratio, c.ratio);
    }
    st[0] += static_cast<float>(prelim_sq);
    st[1] += static_cast<float>(update_sq);
    st[2] = ratio;
    return absl::OkStatus();
  });
}

Status SignCompress(const TensorView& buffer, const float* sum_sq, float* scale, uint8_t* bits,
                    int64_t chunk, int64_t chunk_stride, Stream* stream) {
  const int64_t n = buffer.numel();
  if (buffer.data() == nullptr || buffer.dtype() != DType::kF32 || n < 8 || n % 8 != 0 ||
      chunk < 8 || chunk % 8 != 0 || n % chunk != 0 || (n > chunk && chunk_stride < chunk / 8)) {
    return absl::InvalidArgumentError(StrCat("SignCompress: ", n, " ", DTypeName(buffer.dtype()),
                                             " values in chunks of ", chunk,
                                             " (fp32, multiples of 8 that divide it, expected)"));
  }
  ZR_RETURN_IF_ERROR(CheckStream(buffer.device(), stream, "SignCompress"));
  // sqrt(n) as DeepSpeed's np.sqrt(numel): in double, then used as a float.
  const float sqrt_n = static_cast<float>(std::sqrt(static_cast<double>(n)));
  float* b = buffer.data_as<float>();
  if (buffer.device().is_cuda()) {
    return internal::CudaSignCompress(b, n, sqrt_n, sum_sq, scale, bits, chunk, chunk_stride,
                                      stream);
  }
  return RunOnHostInOrder(stream, [=] {
    const float s = math::Div(math::Sqrt(*sum_sq), sqrt_n);
    *scale = s;
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t byte = 0; byte < n / 8; ++byte) {
      uint8_t packed = 0;
      for (int k = 0; k < 8; ++k) {
        float& x = b[byte * 8 + k];
        const bool positive = !(x < 0.0f);
        packed = static_cast<uint8_t>(packed | (positive ? 0x80u >> k : 0u));
        x = math::Sub(x, positive ? s : -s);
      }
      const int64_t per_chunk = chunk / 8;
      bits[byte / per_chunk * chunk_stride + byte % per_chunk] = packed;
    }
    return absl::OkStatus();
  });
}

Status SignDecode(const uint8_t* bits, int64_t bits_stride, const float* scales,
                  int64_t scale_stride, int sources, float factor, bool accumulate,
                  const TensorView& out, Stream* stream) {
  if (out.data() == nullptr || out.dtype() != DType::kF32 || sources < 1) {
    return absl::InvalidArgumentError(StrCat("SignDecode: ", sources, " sources into ",
                                             DTypeName(out.dtype()), " (fp32 expected)"));
  }
  ZR_RETURN_IF_ERROR(CheckStream(out.device(), stream, "SignDecode"));
  const int64_t n = out.numel();
  float* o = out.data_as<float>();
  if (out.device().is_cuda()) {
    return internal::CudaSignDecode(bits, bits_stride, scales, scale_stride, sources, factor,
                                    accumulate, o, n, stream);
  }
  return RunOnHostInOrder(stream, [=] {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f;
      for (int w = 0; w < sources; ++w) {
        const bool positive = (bits[w * bits_stride + j / 8] >> (7 - j % 8)) & 1u;
        const float s = math::Mul(scales[w * scale_stride], factor);
        sum = math::Add(sum, positive ? s : -s);
      }
      o[j] = accumulate ? math::Add(sum, o[j]) : sum;
    }
    return absl::OkStatus();
  });
}

}  // namespace zerort
