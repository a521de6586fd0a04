// zerort bench adamw --lane: could the device take part of the host step's update? (docs/gpu.md
// "A device lane for the host step?")
//
// With the optimizer state on the host, the CPU's update moves 30 bytes a parameter through host
// memory after the last backward, and the next forward waits for it. A second lane would let the
// copy engines bring some units' master, gradient and moments to the device (16 bytes a
// parameter), the device's AdamW update them and write their compute copy there, and take master
// and moments back (12 bytes), while the CPU updates the other units. This measures that before
// zerort builds it: the update of --params parameters in pinned memory split between the two lanes
// at several shares, against the CPU alone and the lane alone, in the same run, alternating
// rounds; the lane's values compared bitwise with the CPU's. Without a GPU the lane runs on queued
// CPU streams: a check of the method (the staging's reuse, the bits), not of speed.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include <omp.h>

#include "bench_stats.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/kernels/optimizer.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

// The lane's state moves in chunks of at most this many parameters, through two staging sets on
// the device (master, gradient and the two moments: 16 bytes a parameter each), so that one
// chunk's copies in overlap the last one's copies back.
constexpr int64_t kMaxChunk = int64_t{1} << 22;
constexpr int kSets = 2;
constexpr double kShares[] = {0.3, 0.4, 0.5, 0.6, 0.7, 1.0};

struct HostState {
  float* buf[4];  // master, gradient, exp_avg, exp_avg_sq
  uint16_t* out;  // bf16 compute values of the CPU's part
};

class Lane {
 public:
  Lane(Device device, Stream& in, Stream& out, int64_t chunk)
      : device_(device), in_(in), out_(out), chunk_(chunk) {}
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;
  // An update that failed part-way: its copies land before the staging goes.
  ~Lane() { (void)Wait(); }
  Status Init(Allocator& device_memory, int64_t n) {
    for (int s = 0; s < kSets; ++s) {
      ZR_ASSIGN_OR_RETURN(staging_[s], device_memory.Allocate(static_cast<size_t>(16 * chunk_),
                                                              MemoryCategory::kWorkspace, &in_));
      ZR_ASSIGN_OR_RETURN(updated_[s], CreateEvent(device_));
      ZR_ASSIGN_OR_RETURN(returned_[s], CreateEvent(device_));
    }
    ZR_ASSIGN_OR_RETURN(values_, device_memory.Allocate(static_cast<size_t>(2 * n),
                                                        MemoryCategory::kWorkspace, &in_));
    return absl::OkStatus();
  }
  const Buffer& values() const { return values_; }

  // Issues the update of parameters [begin, end) of `s`: each chunk's four buffers copied in on
  // the in-stream and updated there (the compute values written to values()), its master and
  // moments copied back on the out-stream; a staging set is refilled once its copies back ran.
  Status Issue(const AdamHyper& h, const HostState& s, int64_t begin, int64_t end) {
    const Device cpu = Device::Cpu();
    int k = 0;
    for (int64_t b = begin; b < end; b += chunk_, ++k) {
      const int64_t c = std::min(chunk_, end - b);
      const int set = k % kSets;
      float* st = staging_[set].as<float>();
      auto at = [&](int i) { return st + i * chunk_; };
      ZR_RETURN_IF_ERROR(in_.WaitEvent(*returned_[set]));
      for (int i = 0; i < 4; ++i) {
        ZR_RETURN_IF_ERROR(
            CopyBytes(at(i), device_, s.buf[i] + b, cpu, static_cast<size_t>(4 * c), &in_));
      }
      auto view = [&](int i) { return TensorView(at(i), DType::kF32, {c}, device_); };
      ZR_RETURN_IF_ERROR(
          AdamStep(h, view(0), view(1), view(2), view(3),
                   TensorView(values_.as<uint16_t>() + b, DType::kBF16, {c}, device_), &in_));
      ZR_RETURN_IF_ERROR(updated_[set]->Record(in_));
      ZR_RETURN_IF_ERROR(out_.WaitEvent(*updated_[set]));
      for (int i : {0, 2, 3}) {
        ZR_RETURN_IF_ERROR(
            CopyBytes(s.buf[i] + b, cpu, at(i), device_, static_cast<size_t>(4 * c), &out_));
      }
      ZR_RETURN_IF_ERROR(returned_[set]->Record(out_));
    }
    return absl::OkStatus();
  }
  Status Wait() {
    ZR_RETURN_IF_ERROR(in_.Synchronize());
    return out_.Synchronize();
  }

 private:
  Device device_;
  Stream& in_;
  Stream& out_;
  int64_t chunk_;
  Buffer staging_[kSets];
  std::unique_ptr<Event> updated_[kSets], returned_[kSets];
  Buffer values_;
};

// One update of all `n` parameters: the last `lane_n` through the lane (issued first, so that it
// runs while the caller's OpenMP team updates the others).
Status SplitUpdate(Lane& lane, const AdamHyper& h, const HostState& s, int64_t n, int64_t lane_n) {
  const int64_t cpu_n = n - lane_n;
  ZR_RETURN_IF_ERROR(lane.Issue(h, s, cpu_n, n));
  if (cpu_n > 0) {
    auto view = [&](int i) { return TensorView(s.buf[i], DType::kF32, {cpu_n}); };
    ZR_RETURN_IF_ERROR(AdamStep(h, view(0), view(1), view(2), view(3),
                                TensorView(s.out, DType::kBF16, {cpu_n}), nullptr));
  }
  return lane.Wait();
}

}  // namespace

int RunBenchAdamwLane(const BenchAdamwOptions& o) {
  // The state and the CPU part's compute values (18 bytes a parameter), the reference copy of
  // both and the lane's values read back for the check (20); on the CPU the "device" memory too.
  const bool gpu = CudaDeviceCount() > 0;
  if (!ParamsFitHostMemory("bench adamw --lane", o.params, gpu ? 38.0 : 40.0)) return kExitUsage;
  const int64_t n = o.params;
  const Device device = gpu ? Device::Cuda(0) : Device::Cpu();
  const int64_t chunk = std::min(kMaxChunk, std::max<int64_t>(1024, n / 16));
  auto fail = [&](const Status& s) {
    Logger()->error("bench adamw --lane: {}", std::string(s.message()));
    return kExitRuntimeFailure;
  };
  StreamOptions queued;
  queued.cpu = CpuExecution::kQueued;
  StatusOr<std::unique_ptr<Stream>> in = CreateStream(device, "lane in", queued);
  StatusOr<std::unique_ptr<Stream>> out = CreateStream(device, "lane out", queued);
  if (!in.ok()) return fail(in.status());
  if (!out.ok()) return fail(out.status());
  // The state in pinned memory on a GPU (what DMA needs); plain host memory without one.
  StatusOr<std::unique_ptr<Allocator>> host_memory =
      gpu ? MakePinnedHostAllocator(nullptr)
          : StatusOr<std::unique_ptr<Allocator>>(std::unique_ptr<Allocator>(
                std::make_unique<HostAllocator>(HostAllocator::Options{.alignment = 4096})));
  StatusOr<std::unique_ptr<Allocator>> device_memory =
      gpu ? MakeCudaCachingAllocator(device, nullptr) : MakeCpuCachingAllocator(nullptr);
  if (!host_memory.ok()) return fail(host_memory.status());
  if (!device_memory.ok()) return fail(device_memory.status());
  StatusOr<Buffer> state =
      (*host_memory)->Allocate(static_cast<size_t>(18 * n), MemoryCategory::kWorkspace, nullptr);
  if (!state.ok()) return fail(state.status());
  HostState s;
  for (int i = 0; i < 4; ++i) s.buf[i] = state->as<float>() + i * n;
  s.out = reinterpret_cast<uint16_t*>(state->as<float>() + 4 * n);
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      s.buf[0][i] = d(rng);
      s.buf[1][i] = d(rng);
      s.buf[2][i] = 0.1f * d(rng);
      s.buf[3][i] = std::abs(0.01f * d(rng));
    }
  }
  Lane lane(device, **in, **out, chunk);
  if (Status st = lane.Init(**device_memory, n); !st.ok()) return fail(st);
  AdamHyper h{.lr = 1e-4f, .weight_decay = 0.1f};
  int64_t step = 0;

  // The method first: half the parameters through the lane, against the CPU's update of a copy.
  std::vector<float> ref(static_cast<size_t>(4 * n));
  std::vector<uint16_t> ref_out(static_cast<size_t>(n)), lane_out(static_cast<size_t>(n));
  for (int i = 0; i < 4; ++i) std::memcpy(ref.data() + i * n, s.buf[i], static_cast<size_t>(4 * n));
  h.step = ++step;
  const int64_t half = n / 2;
  if (Status st = SplitUpdate(lane, h, s, n, half); !st.ok()) return fail(st);
  {
    auto view = [&](int i) { return TensorView(ref.data() + i * n, DType::kF32, {n}); };
    if (Status st = AdamStep(h, view(0), view(1), view(2), view(3),
                             TensorView(ref_out.data(), DType::kBF16, {n}), nullptr);
        !st.ok()) {
      return fail(st);
    }
  }
  std::memcpy(lane_out.data(), s.out, static_cast<size_t>(2 * (n - half)));
  if (Status st = CopyBytes(lane_out.data() + (n - half), Device::Cpu(),
                            lane.values().as<uint16_t>() + (n - half), device,
                            static_cast<size_t>(2 * half), nullptr);
      !st.ok()) {
    return fail(st);
  }
  bool bitwise = std::memcmp(ref_out.data(), lane_out.data(), static_cast<size_t>(2 * n)) == 0;
  for (int i : {0, 2, 3}) {
    bitwise = bitwise && std::memcmp(ref.data() + i * n, s.buf[i], static_cast<size_t>(4 * n)) == 0;
  }

  // Then the time: the CPU alone, the lane alone (share 1) and the shares between, alternated.
  const size_t shares = std::size(kShares);
  std::vector<double> t_cpu;
  std::vector<std::vector<double>> t_share(shares);
  for (int r = 0; r < o.rounds; ++r) {
    t_cpu.push_back(Seconds([&] {
      h.step = ++step;
      ZR_CHECK_OK(SplitUpdate(lane, h, s, n, 0));
    }));
    for (size_t k = 0; k < shares; ++k) {
      t_share[k].push_back(Seconds([&] {
        h.step = ++step;
        ZR_CHECK_OK(SplitUpdate(lane, h, s, n, static_cast<int64_t>(kShares[k] * n)));
      }));
    }
  }
  const double cpu_s = Median(t_cpu);
  const double lane_s = Median(t_share[shares - 1]);
  nlohmann::json rows = nlohmann::json::array();
  double best_s = cpu_s, best_share = 0;
  for (size_t k = 0; k < shares; ++k) {
    const double t = Median(t_share[k]);
    rows.push_back({{"share", kShares[k]}, {"seconds", t}, {"speedup", cpu_s / t}});
    if (t < best_s) best_s = t, best_share = kShares[k];
  }
  nlohmann::json result = {
      {"bench", "adamw lane"},
      {"baseline", "the CPU's update of the same parameters alone, in the same run"},
      {"device", gpu ? device.ToString()
                     : std::string("cpu (queued streams: the method checked, not the speed)")},
      {"params", n},
      {"chunk", chunk},
      {"threads", omp_get_max_threads()},
      {"bitwise", bitwise},
      {"cpu_s", cpu_s},
      {"cpu_gbps", 30.0 * static_cast<double>(n) / cpu_s / 1e9},
      {"lane_s", lane_s},
      {"lane_copy_gbps", 28.0 * static_cast<double>(n) / lane_s / 1e9},
      {"shares", rows},
      {"best_share", best_share},
      {"best_speedup", cpu_s / best_s},
      // Both lanes at their alone rates, nothing shared: the most a split could gain.
      {"ideal_speedup", 1.0 + cpu_s / lane_s},
  };
  if (o.json) {
    std::printf("%s\n", result.dump(2).c_str());
  } else {
    std::printf("zerort bench adamw --lane: %lld parameters on %s, chunks of %lld; baseline: %s\n",
                static_cast<long long>(n), result["device"].get<std::string>().c_str(),
                static_cast<long long>(chunk), result["baseline"].get<std::string>().c_str());
    std::printf("  CPU alone %.2f ms (%.1f GB/s); lane alone %.2f ms (%.1f GB/s of copies)\n",
                cpu_s * 1e3, result["cpu_gbps"].get<double>(), lane_s * 1e3,
                result["lane_copy_gbps"].get<double>());
    for (const nlohmann::json& row : rows) {
      std::printf("  lane share %.1f: %.2f ms, %.3fx the CPU alone\n", row["share"].get<double>(),
                  row["seconds"].get<double>() * 1e3, row["speedup"].get<double>());
    }
    std::printf("  best %.3fx at share %.1f (ideal %.3fx); the lane's values %s\n",
                result["best_speedup"].get<double>(), best_share,
                result["ideal_speedup"].get<double>(),
                bitwise ? "bitwise the CPU's" : "DIFFER from the CPU's");
  }
  if (!bitwise) {
    Logger()->error("bench adamw --lane: the lane's update differs from the CPU's");
    return kExitRuntimeFailure;
  }
  return kExitOk;
}

}  // namespace zerort::cli
