// CPU reductions (vectorised with per-thread partial sums in a fixed order, so results do not
// depend on timing) and their scalar double-precision references, plus the validating entries.
#include <cmath>
#include <vector>

#include <omp.h>

#include "zerort/kernels/cpu/vector_math.h"
#include "zerort/kernels/reduce.h"
#include "zerort/kernels/rounded_math.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

Status CheckArgs(const TensorView& x, const TensorView* out) {
  if (!IsFloatingPoint(x.dtype())) {
    return absl::InvalidArgumentError(StrCat("reduction over ", DTypeName(x.dtype()), " data"));
  }
  if (x.numel() > 0 && x.data() == nullptr) return absl::InvalidArgumentError("null input");
  if (out != nullptr) {
    if (out->dtype() != DType::kF32 || out->numel() != 1 || out->data() == nullptr) {
      return absl::InvalidArgumentError("the output must be one f32 element");
    }
    if (out->device() != x.device()) return absl::InvalidArgumentError("output on another device");
  }
  return absl::OkStatus();
}

Status CheckStream(const TensorView& x, Stream* stream) {
  if (stream == nullptr || stream->device() != x.device()) {
    return absl::InvalidArgumentError("a reduction on CUDA data needs a stream of its device");
  }
  return absl::OkStatus();
}

// The sum of f over elements [begin, end) of `base`, in double, one vectorised loop.
template <typename F>
double ChunkSum(const void* base, DType dtype, int64_t begin, int64_t end, F f) {
  double acc = 0.0;
  if (dtype == DType::kF32) {
    const float* p = static_cast<const float*>(base);
#pragma omp simd reduction(+ : acc)
    for (int64_t i = begin; i < end; ++i) acc += f(p[i]);
  } else {
#pragma omp simd reduction(+ : acc)
    for (int64_t i = begin; i < end; ++i) acc += f(LoadAsFloat(base, dtype, i));
  }
  return acc;
}

struct Square {
  double operator()(float v) const { return static_cast<double>(v) * v; }
};

// An fp32 chunk's sum of squares in kSquareLanes double sums, element i into lane i % kSquareLanes
// (from the chunk's start), the lanes then added in a fixed tree ([Note: sums in written-out
// lanes], kernels/cpu/vector_math.h), so that the add fused with it below
// (HostAccumulateWithSumOfSquares) takes the same sums in the same order whatever the compiler
// makes of either loop. Eight lanes: a pass over 32 Mi floats on one thread of this project's
// 2-core machine ran at 26 GB/s, against 23 for the vectoriser's loop and 20 for sixteen lanes
// (a scratch program with the build's flags, 2026-12-05).
constexpr int kSquareLanes = 8;
using SquareLanes = cpu::Lanes<double, kSquareLanes>;

ZR_CPU_CLONES double ChunkSumOfSquaresF32(const float* p, int64_t n) {
  SquareLanes s;
  cpu::ForLanes<kSquareLanes>(
      n, [&](int64_t i, int j) { s.lane[j] += static_cast<double>(p[i]) * p[i]; });
  return s.Total();
}

// Sum of chunk(base, dtype, begin, end) over fixed chunks of kReduceChunk elements, one double
// partial each, combined in chunk order: accurate enough for a global norm over billions of
// elements, and deterministic.
template <typename Chunk>
double ChunkedSum(const TensorView& x, Chunk chunk, double total = 0.0) {
  const void* base = x.data();
  const DType dtype = x.dtype();
  for (double p : cpu::ChunkResults(x.numel(), kReduceChunk, [&](int64_t begin, int64_t end) {
         return chunk(base, dtype, begin, end);
       })) {
    total += p;
  }
  return total;
}

// The chunk functions of the three sums.
double SquaresChunk(const void* base, DType dtype, int64_t begin, int64_t end) {
  if (dtype == DType::kF32) {
    return ChunkSumOfSquaresF32(static_cast<const float*>(base) + begin, end - begin);
  }
  return ChunkSum(base, dtype, begin, end, Square{});
}
double NonFiniteChunk(const void* base, DType dtype, int64_t begin, int64_t end) {
  return ChunkSum(base, dtype, begin, end, [](float v) { return math::IsFinite(v) ? 0.0 : 1.0; });
}
double ValuesChunk(const void* base, DType dtype, int64_t begin, int64_t end) {
  return ChunkSum(base, dtype, begin, end, [](float v) { return static_cast<double>(v); });
}

}  // namespace

Status SumOfSquares(const TensorView& x, const TensorView& out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, &out));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaSumOfSquares(x.data(), x.dtype(), x.numel(), out.data_as<float>(), stream);
  }
  return RunOnHostInOrder(stream, [x = x.Detached(), out = out.Detached()] {
    *out.data_as<float>() += static_cast<float>(ChunkedSum(x, SquaresChunk));
    return absl::OkStatus();
  });
}

Status CountNonFinite(const TensorView& x, const TensorView& out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, &out));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaCountNonFinite(x.data(), x.dtype(), x.numel(), out.data_as<float>(),
                                        stream);
  }
  return RunOnHostInOrder(stream, [x = x.Detached(), out = out.Detached()] {
    *out.data_as<float>() += static_cast<float>(ChunkedSum(x, NonFiniteChunk));
    return absl::OkStatus();
  });
}

Status Sum(const TensorView& x, double factor, const TensorView& out, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, &out));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaSum(x.data(), x.dtype(), x.numel(), static_cast<float>(factor),
                             out.data_as<float>(), stream);
  }
  return RunOnHostInOrder(stream, [x = x.Detached(), out = out.Detached(), factor] {
    *out.data_as<float>() += static_cast<float>(factor * ChunkedSum(x, ValuesChunk));
    return absl::OkStatus();
  });
}

double HostSumOfSquares(const TensorView& x, double running) {
  ZR_CHECK(x.device().is_cpu() && IsFloatingPoint(x.dtype())) << "HostSumOfSquares on device data";
  return ChunkedSum(x, SquaresChunk, running);
}

double HostCountNonFinite(const TensorView& x, double running) {
  ZR_CHECK(x.device().is_cpu() && IsFloatingPoint(x.dtype()))
      << "HostCountNonFinite on device data";
  return ChunkedSum(x, NonFiniteChunk, running);
}

Status Scale(const TensorView& x, float factor, Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckArgs(x, nullptr));
  if (x.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(x, stream));
    return internal::CudaScale(x.data(), x.dtype(), x.numel(), factor, stream);
  }
  void* base = x.data();
  const DType dtype = x.dtype();
  const int64_t n = x.numel();
  return RunOnHostInOrder(stream, [=] {
    if (dtype == DType::kF32) {
      float* p = static_cast<float*>(base);
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i) p[i] *= factor;
    } else {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t i = 0; i < n; ++i)
        StoreFromFloat(base, dtype, i, LoadAsFloat(base, dtype, i) * factor);
    }
    return absl::OkStatus();
  });
}

namespace {

Status CheckAccumulate(const char* what, const TensorView& src, const TensorView& dst) {
  ZR_RETURN_IF_ERROR(CheckArgs(src, nullptr));
  if (dst.dtype() != DType::kF32 || dst.numel() != src.numel() || dst.device() != src.device() ||
      (dst.numel() > 0 && dst.data() == nullptr)) {
    return absl::InvalidArgumentError(StrCat(what, " needs an f32 destination of ", src.numel(),
                                             " elements on ", src.device().ToString()));
  }
  return absl::OkStatus();
}

// dst[begin, end) = dst + src (0 + src when `assign`: a -0 becomes +0 as the add into zeros makes
// it) on this thread, the source's conversion outside the loop so that it vectorises (a dtype
// switch per element kept GCC from it); with `squares`, also the sum of squares of the new
// values, as ChunkSumOfSquaresF32 takes it over dst[begin, end), in the same loop (each value
// squared as it is written). Built for the baseline only: as clones per vector width
// (ZR_CPU_CLONES) the add alone ran no faster on this project's 2-core machine, and the add with
// the squares 13% slower (`bench adamw`'s last_add_with_norm_s, 2026-12-06). ChunkSumOfSquaresF32
// is cloned (the add and then the norm's pass 8% faster there), the same bits at every width: the
// explicit lanes fix every sum's order (reduce_test compares the two bitwise).
double IntoF32Piece(const void* in, DType dtype, float* out, int64_t begin, int64_t end,
                    bool assign, bool squares) {
  SquareLanes s;
  auto run = [&](auto value) {
    if (!squares) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) out[i] = value(i);
      return;
    }
    cpu::ForLanes<kSquareLanes>(end - begin, [&](int64_t k, int j) {
      const float v = value(begin + k);
      out[begin + k] = v;
      s.lane[j] += static_cast<double>(v) * v;
    });
  };
  auto apply = [&](auto load) {
    if (assign) {
      run([&](int64_t i) { return 0.0f + load(i); });
    } else {
      run([&](int64_t i) { return out[i] + load(i); });
    }
  };
  if (dtype == DType::kF32) {
    const float* f = static_cast<const float*>(in);
    apply([f](int64_t i) { return f[i]; });
  } else if (dtype == DType::kBF16) {
    const uint16_t* b = static_cast<const uint16_t*>(in);
    apply([b](int64_t i) { return Bf16BitsToFloat(b[i]); });
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(in);
    apply([h](int64_t i) { return F16BitsToFloat(h[i]); });
  }
  return squares ? s.Total() : 0.0;
}

// dst (n fp32 values) = dst + src (0 + src when `assign`) in pieces of at most kReduceChunk
// elements over the threads, and the sum of squares of the new values over `ranges` (in order,
// disjoint, inside dst; not checked here), each range's as SumOfSquares over it gives it, added
// into a float from 0: the pieces are cut where SumOfSquares cuts its chunks. AccumulateInto and
// AssignInto are this without ranges.
float IntoF32Pieces(const void* in, DType dtype, float* out, int64_t n, bool assign,
                    std::span<const Range> ranges) {
  // [0, n) once; `range` -1: outside every range.
  struct Piece {
    int64_t begin, end;
    int range;
  };
  std::vector<Piece> pieces;
  auto cut = [&](int64_t begin, int64_t end, int range) {
    for (int64_t b = begin; b < end; b += kReduceChunk) {
      pieces.push_back({b, std::min(end, b + kReduceChunk), range});
    }
  };
  int64_t at = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    cut(at, ranges[i].begin, -1);
    cut(ranges[i].begin, ranges[i].end, static_cast<int>(i));
    at = ranges[i].end;
  }
  cut(at, n, -1);
  std::vector<double> partial(pieces.size(), 0.0);
  const int64_t count = static_cast<int64_t>(pieces.size());
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t i = 0; i < count; ++i) {
    const Piece& p = pieces[static_cast<size_t>(i)];
    partial[static_cast<size_t>(i)] =
        IntoF32Piece(in, dtype, out, p.begin, p.end, assign, p.range >= 0);
  }
  // As SumOfSquares adds each range's double total, rounded, into a float from 0.
  float sum = 0.0f;
  double total = 0.0;
  int current = -1;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].range < 0) continue;
    if (pieces[i].range != current) {
      if (current >= 0) sum += static_cast<float>(total);
      total = 0.0;
      current = pieces[i].range;
    }
    total += partial[i];
  }
  if (current >= 0) sum += static_cast<float>(total);
  return sum;
}

// AccumulateInto (dst += src) and AssignInto (dst = 0 + src): the same checks and placement.
Status IntoF32(const char* what, bool assign, const TensorView& src, const TensorView& dst,
               Stream* stream) {
  ZR_RETURN_IF_ERROR(CheckAccumulate(what, src, dst));
  if (src.device().is_cuda()) {
    ZR_RETURN_IF_ERROR(CheckStream(src, stream));
    // AssignInto as the zero fill and the add: no second CUDA kernel to keep.
    if (assign) ZR_RETURN_IF_ERROR(FillZero(dst.data(), dst.device(), dst.nbytes(), stream));
    return internal::CudaAccumulateInto(src.data(), src.dtype(), dst.data_as<float>(), src.numel(),
                                        stream);
  }
  float* out = dst.data_as<float>();
  const void* in = src.data();
  const DType dtype = src.dtype();
  const int64_t n = src.numel();
  return RunOnHostInOrder(stream, [=] {
    (void)IntoF32Pieces(in, dtype, out, n, assign, {});
    return absl::OkStatus();
  });
}

}  // namespace

Status AccumulateInto(const TensorView& src, const TensorView& dst, Stream* stream) {
  return IntoF32("AccumulateInto", false, src, dst, stream);
}

Status AssignInto(const TensorView& src, const TensorView& dst, Stream* stream) {
  return IntoF32("AssignInto", true, src, dst, stream);
}

StatusOr<float> HostAccumulateWithSumOfSquares(const TensorView& src, const TensorView& dst,
                                               bool assign, std::span<const Range> ranges) {
  ZR_RETURN_IF_ERROR(CheckAccumulate("HostAccumulateWithSumOfSquares", src, dst));
  if (!src.device().is_cpu()) {
    return absl::InvalidArgumentError("HostAccumulateWithSumOfSquares on device data");
  }
  const int64_t n = dst.numel();
  int64_t at = 0;
  for (const Range& r : ranges) {
    if (r.begin < at || r.end < r.begin || r.end > n) {
      return absl::InvalidArgumentError(StrCat("HostAccumulateWithSumOfSquares: range ",
                                               r.ToString(), " is not in order inside [0, ", n,
                                               ")"));
    }
    at = r.end;
  }
  return IntoF32Pieces(src.data(), src.dtype(), dst.data_as<float>(), n, assign, ranges);
}

double SumOfSquaresReference(const TensorView& x) {
  double acc = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = LoadAsFloat(x.data(), x.dtype(), i);
    acc += v * v;
  }
  return acc;
}

int64_t CountNonFiniteReference(const TensorView& x) {
  int64_t count = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    count += math::IsFinite(LoadAsFloat(x.data(), x.dtype(), i)) ? 0 : 1;
  return count;
}

}  // namespace zerort
