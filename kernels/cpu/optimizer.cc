// CPU optimizer steps: the scalar references and the vectorised versions (one fused pass, OpenMP
// threads taking chunks as they free up, SIMD inside), plus the validating entries shared with
// CUDA.
#include "zerort/kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "zerort/kernels/cast.h"
#include "zerort/kernels/cpu/vector_math.h"
#include "zerort/kernels/optimizer_math.h"
#include "zerort/runtime/dtype.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// [Note: the host update's schedule]
// The CPU update is element-wise, so how its elements are split among threads changes no bit. It
// was one `parallel for schedule(static)` region per parameter piece: each thread 1/T of the
// piece, the region over when its slowest thread is. Behind the next forward on a GPU the step
// worker's team shares the cores with the thread issuing the forward's kernels, and the team's
// thread on that core ran at about half speed, so the whole update did (`bench adamw`'s
// worker_beside_a_busy_core, one of 2 cores kept busy: 0.50-0.55 of the update alone). Now the
// pieces of a unit (the segments of one call) are cut into kUpdateChunk elements, handed out one
// at a time in one region: a slowed thread takes fewer chunks (0.64-0.77 there; 0.75 is the ideal
// with one of two threads at half speed), and a unit forks one region, not one per piece. Under
// kUpdateChunk elements in all, the calling thread does it.
constexpr int64_t kUpdateChunk = int64_t{1} << 15;

struct UpdateChunk {
  size_t segment;
  int64_t begin, end;  // elements of the call's views
};

template <typename Body>  // Body(const UpdateChunk&)
void ForEachUpdateChunk(std::span<const OptimizerSegment> segments, Body body) {
  std::vector<UpdateChunk> chunks;
  int64_t total = 0;
  for (size_t s = 0; s < segments.size(); ++s) {
    const int64_t end = segments[s].begin + segments[s].count;
    total += segments[s].count;
    for (int64_t b = segments[s].begin; b < end; b += kUpdateChunk) {
      chunks.push_back({s, b, std::min(end, b + kUpdateChunk)});
    }
  }
  const int64_t n = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(dynamic, 1) if (total > kUpdateChunk)
  for (int64_t i = 0; i < n; ++i) body(chunks[static_cast<size_t>(i)]);
}

// [Note: the host update's vector width]
// The host step's update is meant to run at the memory's speed: 30 bytes a parameter, a few
// operations each. Built for the baseline x86-64 alone, its loop ran in 4 lanes and read its nine
// scalars from memory again for every 4 elements (they came by reference, and a store through p,
// m or v may alias a reference's floats), so one thread's update was bound by its instructions,
// not by the memory: on this project's 2-core machine `bench adamw`'s update moved 26 GB/s beside
// the same run's triad at 20. Now the range functions below copy the scalars into registers and
// are compiled for AVX-512, AVX2 and the baseline, picked at load time (ZR_CPU_CLONES,
// vector_math.h): 33-36 GB/s there. The bits are the same at every width: each operation is
// rounded on its own (-ffp-contract=off in every clone), and the square root, the quotient and
// the bf16 rounding are exact at any width (optimizer_test compares the update with the scalar
// reference, which is not cloned). The element bodies are inlined into each clone
// (always_inline), or they would be compiled once, for the baseline.
template <typename Out>
[[gnu::always_inline]] inline void AdamBody(const math::AdamScalars& a, float* __restrict p,
                                            const float* __restrict g, float* __restrict m,
                                            float* __restrict v, Out* __restrict out, int64_t i0,
                                            int64_t i1) {
  if constexpr (std::is_same_v<Out, Half>) {
    // An fp16 compute copy: pieces of the update, each cast while still in cache by the cast
    // kernel (F16C where the CPU has it, the same bits); the software conversion inside the fused
    // loop took 7 of a tiny fp16 step's 37 ms.
    constexpr int64_t kCast = 4096;
    for (int64_t c0 = i0; c0 < i1; c0 += kCast) {
      const int64_t c1 = std::min(i1, c0 + kCast);
#pragma omp simd
      for (int64_t i = c0; i < c1; ++i) p[i] = math::AdamElement(a, p[i], g[i], m[i], v[i]);
      internal::CpuCast(p + c0, DType::kF32, out + c0, DType::kF16, c1 - c0);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    const float np = math::AdamElement(a, p[i], g[i], m[i], v[i]);
    p[i] = np;
    cpu::StoreAs(out, i, np);
  }
}

// Elements [i0, i1) of the update, the compute copy written as `out_dtype` (none when out is
// null): [Note: the host update's vector width].
ZR_CPU_CLONES void AdamRange(const math::AdamScalars& scalars, float* p, const float* g, float* m,
                             float* v, void* out, DType out_dtype, int64_t i0, int64_t i1) {
  const math::AdamScalars a = scalars;  // in registers
  if (out == nullptr) return AdamBody<void>(a, p, g, m, v, nullptr, i0, i1);
  switch (out_dtype) {
    case DType::kBF16:
      return AdamBody(a, p, g, m, v, static_cast<BFloat16*>(out), i0, i1);
    case DType::kF16:
      return AdamBody(a, p, g, m, v, static_cast<Half*>(out), i0, i1);
    default:
      return AdamBody(a, p, g, m, v, static_cast<float*>(out), i0, i1);
  }
}

// One loop per momentum case, so no loop carries a load through a null pointer.
template <typename Out>
[[gnu::always_inline]] inline void SgdBody(const math::SgdScalars& s, float* __restrict p,
                                           const float* __restrict g, float* __restrict buf,
                                           Out* __restrict out, int64_t i0, int64_t i1) {
  auto store = [&](int64_t i, float np) {
    p[i] = np;
    cpu::StoreAs(out, i, np);
  };
  if (s.momentum == 0.0f) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i)
      store(i, math::SgdApply(s, p[i], math::SgdGradient(s, p[i], g[i]), 0.0f));
  } else {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const float d = math::SgdGradient(s, p[i], g[i]);
      const float b = math::SgdMomentum(s, buf[i], d);
      buf[i] = b;
      store(i, math::SgdApply(s, p[i], d, b));
    }
  }
}

// SGD's AdamRange ([Note: the host update's vector width]).
ZR_CPU_CLONES void SgdRange(const math::SgdScalars& scalars, float* p, const float* g, float* buf,
                            void* out, DType out_dtype, int64_t i0, int64_t i1) {
  const math::SgdScalars s = scalars;  // in registers
  if (out == nullptr) return SgdBody<void>(s, p, g, buf, nullptr, i0, i1);
  switch (out_dtype) {
    case DType::kBF16:
      return SgdBody(s, p, g, buf, static_cast<BFloat16*>(out), i0, i1);
    case DType::kF16:
      return SgdBody(s, p, g, buf, static_cast<Half*>(out), i0, i1);
    default:
      return SgdBody(s, p, g, buf, static_cast<float*>(out), i0, i1);
  }
}

// One call's update over `segments` (a unit's parameter pieces), the compute copy written as
// `out_dtype` (none when out is null).
void CpuAdamSegments(const AdamHyper& h, std::span<const OptimizerSegment> segments, float* p,
                     const float* g, float* m, float* v, void* out, DType out_dtype) {
  std::vector<math::AdamScalars> scalars;
  for (const OptimizerSegment& seg : segments) {
    AdamHyper hs = h;
    hs.weight_decay = seg.weight_decay;
    scalars.push_back(math::MakeAdamScalars(hs));
  }
  ForEachUpdateChunk(segments, [&](const UpdateChunk& c) {
    AdamRange(scalars[c.segment], p, g, m, v, out, out_dtype, c.begin, c.end);
  });
}

Status CheckF32(const TensorView& v, int64_t n, const char* what, Device device) {
  if (v.dtype() != DType::kF32)
    return absl::InvalidArgumentError(StrCat(what, " must be f32, not ", DTypeName(v.dtype())));
  if (v.numel() != n)
    return absl::InvalidArgumentError(StrCat(what, " has ", v.numel(), " elements, expected ", n));
  if (v.device() != device)
    return absl::InvalidArgumentError(
        StrCat(what, " is on ", v.device().ToString(), ", expected ", device.ToString()));
  if (n > 0 && v.data() == nullptr) return absl::InvalidArgumentError(StrCat(what, " is null"));
  return absl::OkStatus();
}

Status CheckOut(const TensorView& out, int64_t n, Device device) {
  if (out.data() == nullptr) return absl::OkStatus();  // no compute copy wanted
  if (!IsFloatingPoint(out.dtype()))
    return absl::InvalidArgumentError("compute_out must be f32, bf16 or f16");
  if (out.numel() != n)
    return absl::InvalidArgumentError(
        StrCat("compute_out has ", out.numel(), " elements, expected ", n));
  if (out.device() != device) return absl::InvalidArgumentError("compute_out is on another device");
  return absl::OkStatus();
}

Status CheckAdam(const AdamHyper& h, const TensorView& p, const TensorView& g, const TensorView& m,
                 const TensorView& v, const TensorView& out) {
  const int64_t n = p.numel();
  ZR_RETURN_IF_ERROR(CheckF32(p, n, "master", p.device()));
  ZR_RETURN_IF_ERROR(CheckF32(g, n, "grad", p.device()));
  ZR_RETURN_IF_ERROR(CheckF32(m, n, "exp_avg", p.device()));
  ZR_RETURN_IF_ERROR(CheckF32(v, n, "exp_avg_sq", p.device()));
  ZR_RETURN_IF_ERROR(CheckOut(out, n, p.device()));
  if (h.step < 1) return absl::InvalidArgumentError(StrCat("Adam step ", h.step, " is below 1"));
  if (!(h.beta1 >= 0 && h.beta1 < 1 && h.beta2 >= 0 && h.beta2 < 1)) {
    return absl::InvalidArgumentError(
        StrCat("Adam betas (", h.beta1, ", ", h.beta2, ") must be in [0, 1)"));
  }
  return absl::OkStatus();
}

Status CheckSgd(const SgdHyper& h, const TensorView& p, const TensorView& g, const TensorView& buf,
                const TensorView& out) {
  const int64_t n = p.numel();
  ZR_RETURN_IF_ERROR(CheckF32(p, n, "master", p.device()));
  ZR_RETURN_IF_ERROR(CheckF32(g, n, "grad", p.device()));
  if (h.momentum != 0.0f) ZR_RETURN_IF_ERROR(CheckF32(buf, n, "momentum_buffer", p.device()));
  ZR_RETURN_IF_ERROR(CheckOut(out, n, p.device()));
  if (h.nesterov && (h.momentum <= 0 || h.dampening != 0)) {
    return absl::InvalidArgumentError("Nesterov momentum needs momentum > 0 and zero dampening");
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

void CpuAdam(const AdamHyper& h, float* p, const float* g, float* m, float* v, void* out,
             DType out_dtype, int64_t n) {
  const OptimizerSegment whole[] = {{.begin = 0, .count = n, .weight_decay = h.weight_decay}};
  CpuAdamSegments(h, whole, p, g, m, v, out, out_dtype);
}

void CpuSgd(const SgdHyper& h, float* p, const float* g, float* buf, void* out, DType out_dtype,
            int64_t n) {
  const math::SgdScalars s = math::MakeSgdScalars(h);
  const OptimizerSegment whole[] = {{.begin = 0, .count = n, .weight_decay = h.weight_decay}};
  ForEachUpdateChunk(
      whole, [&](const UpdateChunk& c) { SgdRange(s, p, g, buf, out, out_dtype, c.begin, c.end); });
}

}  // namespace internal

// One range with h's weight decay: the multi-range step's one segment.
Status AdamStep(const AdamHyper& h, const TensorView& master, const TensorView& grad,
                const TensorView& exp_avg, const TensorView& exp_avg_sq,
                const TensorView& compute_out, Stream* stream) {
  const OptimizerSegment whole[] = {
      {.begin = 0, .count = master.numel(), .weight_decay = h.weight_decay}};
  return AdamStepSegments(h, whole, master, grad, exp_avg, exp_avg_sq, compute_out, stream);
}

Status AdamStepSegments(const AdamHyper& h, std::span<const OptimizerSegment> segments,
                        const TensorView& master, const TensorView& grad, const TensorView& exp_avg,
                        const TensorView& exp_avg_sq, const TensorView& compute_out,
                        Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckAdam(h, master, grad, exp_avg, exp_avg_sq, compute_out));
  for (const OptimizerSegment& seg : segments) {
    if (seg.begin < 0 || seg.count < 0 || seg.begin > master.numel() - seg.count) {
      return absl::InvalidArgumentError(StrCat("Adam segment [", seg.begin, ", +", seg.count,
                                               ") is outside the ", master.numel(),
                                               " elements of the views"));
    }
  }
  auto* p = master.data_as<float>();
  auto* g = grad.data_as<float>();
  auto* m = exp_avg.data_as<float>();
  auto* v = exp_avg_sq.data_as<float>();
  if (master.device().is_cuda()) {
    if (stream == nullptr || stream->device() != master.device()) {
      return absl::InvalidArgumentError("AdamStep on CUDA views needs a stream of their device");
    }
    return internal::CudaAdamSegments(h, segments, p, g, m, v, compute_out.data(),
                                      compute_out.dtype(), stream);
  }
  std::vector<OptimizerSegment> list(segments.begin(), segments.end());
  void* out = compute_out.data();
  const DType out_dtype = compute_out.dtype();
  return RunOnHostInOrder(stream, [=] {
    CpuAdamSegments(h, list, p, g, m, v, out, out_dtype);  // [Note: the host update's schedule]
    return absl::OkStatus();
  });
}

Status SgdStep(const SgdHyper& h, const TensorView& master, const TensorView& grad,
               const TensorView& momentum_buffer, const TensorView& compute_out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckSgd(h, master, grad, momentum_buffer, compute_out));
  auto* p = master.data_as<float>();
  auto* g = grad.data_as<float>();
  auto* buf = h.momentum != 0.0f ? momentum_buffer.data_as<float>() : nullptr;
  if (master.device().is_cuda()) {
    if (stream == nullptr || stream->device() != master.device()) {
      return absl::InvalidArgumentError("SgdStep on CUDA views needs a stream of their device");
    }
    return internal::CudaSgd(h, p, g, buf, compute_out.data(), compute_out.dtype(), master.numel(),
                             stream);
  }
  return RunOnHostInOrder(stream, [=, compute_out = compute_out.Detached()] {
    internal::CpuSgd(h, p, g, buf, compute_out.data(), compute_out.dtype(), master.numel());
    return absl::OkStatus();
  });
}

Status AdamStepReference(const AdamHyper& h, const TensorView& master, const TensorView& grad,
                         const TensorView& exp_avg, const TensorView& exp_avg_sq,
                         const TensorView& compute_out) {
  ZR_RETURN_IF_ERROR(CheckAdam(h, master, grad, exp_avg, exp_avg_sq, compute_out));
  if (!master.device().is_cpu()) return absl::InvalidArgumentError("references run on the CPU");
  const math::AdamScalars a = math::MakeAdamScalars(h);
  float* p = master.data_as<float>();
  float* m = exp_avg.data_as<float>();
  float* v = exp_avg_sq.data_as<float>();
  const float* g = grad.data_as<float>();
  for (int64_t i = 0; i < master.numel(); ++i) {
    p[i] = math::AdamElement(a, p[i], g[i], m[i], v[i]);
    if (compute_out.data() != nullptr)
      StoreFromFloat(compute_out.data(), compute_out.dtype(), i, p[i]);
  }
  return absl::OkStatus();
}

Status SgdStepReference(const SgdHyper& h, const TensorView& master, const TensorView& grad,
                        const TensorView& momentum_buffer, const TensorView& compute_out) {
  ZR_RETURN_IF_ERROR(CheckSgd(h, master, grad, momentum_buffer, compute_out));
  if (!master.device().is_cpu()) return absl::InvalidArgumentError("references run on the CPU");
  float* p = master.data_as<float>();
  const float* g = grad.data_as<float>();
  float* buf = h.momentum != 0.0f ? momentum_buffer.data_as<float>() : nullptr;
  const math::SgdScalars s = math::MakeSgdScalars(h);
  for (int64_t i = 0; i < master.numel(); ++i) {
    const float d = math::SgdGradient(s, p[i], g[i]);
    const float b = buf != nullptr ? (buf[i] = math::SgdMomentum(s, buf[i], d)) : 0.0f;
    p[i] = math::SgdApply(s, p[i], d, b);
    if (compute_out.data() != nullptr)
      StoreFromFloat(compute_out.data(), compute_out.dtype(), i, p[i]);
  }
  return absl::OkStatus();
}

}  // namespace zerort
