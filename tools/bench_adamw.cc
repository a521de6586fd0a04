// zerort bench adamw: the fused AdamW step over a large fp32 shard (with a bf16 compute copy),
// against two baselines taken in the same process: the memory-bandwidth floor (the bytes the
// step must move, 30 per parameter, over the bandwidth of a STREAM-style triad on buffers of
// the same size) and the scalar reference. On a GPU, also the CUDA kernel against a
// device-to-device copy of the same bytes. Beside it, the rest of the host work an offloaded
// optimizer does each step ([Note: the host step behind the forward], sharding/): the same step
// on a worker thread (the step worker's, with its own OpenMP team), and the gradient slices'
// adds into the fp32 shard, each against the triad.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <omp.h>

#include "bench_stats.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/engine/host_memory.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/kernels/optimizer.h"
#include "zerort/kernels/reduce.h"
#include "zerort/offload/task_pool.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"

namespace zerort::cli {
namespace {

// Read p, g, m, v; write p, m, v (fp32) and the bf16 compute copy.
constexpr double kBytesPerParam = 4 * 4 + 3 * 4 + 2;

// The median of `repeats` calls' seconds.
template <typename F>
double MedianSeconds(int repeats, F f) {
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) times.push_back(Seconds(f));
  return Median(times);
}

}  // namespace

bool ParamsFitHostMemory(const char* command, int64_t params, double bytes_per_param) {
  const double bytes = bytes_per_param * static_cast<double>(params);
  const HostMemory mem = QueryHostMemory();
  if (mem.available < 0 || bytes <= static_cast<double>(mem.available)) return true;
  Logger()->error("{}: --params {} needs {} of host memory, but {} is available ({})", command,
                  params, FormatBytes(bytes), FormatBytes(static_cast<double>(mem.available)),
                  mem.source);
  return false;
}

int RunBenchAdamw(const BenchAdamwOptions& o) {
  if (o.params < 1024 || o.params > (int64_t{1} << 32)) {
    Logger()->error("bench adamw: --params {} must be in [1024, 2^32]", o.params);
    return kExitUsage;
  }
  if (o.rounds < 1 || o.rounds > 1000) {
    Logger()->error("bench adamw: --rounds {} must be in [1, 1000]", o.rounds);
    return kExitUsage;
  }
  if (o.lane) return RunBenchAdamwLane(o);
  // p, g, m, v (fp32), the bf16 compute copy and an fp32 gradient slice.
  if (!ParamsFitHostMemory("bench adamw", o.params, 22.0)) return kExitUsage;
  const int64_t n = o.params;
  HostAllocator host({.alignment = 4096, .tier = MemoryTier::kHost, .tracker = nullptr});
  std::vector<Buffer> buffers;
  for (int64_t bytes : {n * 4, n * 4, n * 4, n * 4, n * 2, n * 4}) {
    StatusOr<Buffer> b =
        host.Allocate(static_cast<size_t>(bytes), MemoryCategory::kWorkspace, nullptr);
    if (!b.ok()) {
      Logger()->error("bench adamw: --params {} needs {} of host memory: {}", n,
                      FormatBytes(22.0 * static_cast<double>(n)),
                      std::string(b.status().message()));
      return kExitRuntimeFailure;
    }
    buffers.push_back(*std::move(b));
  }
  Buffer &p = buffers[0], &g = buffers[1], &m = buffers[2], &v = buffers[3], &out = buffers[4],
         &reduced = buffers[5];
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    float* fp = p.as<float>();
    float* fg = g.as<float>();
    for (int64_t i = 0; i < n; ++i) {
      fp[i] = d(rng);
      fg[i] = d(rng);
    }
    std::memset(m.data(), 0, n * 4);
    std::memset(v.data(), 0, n * 4);
    float* fr = reduced.as<float>();
    for (int64_t i = 0; i < n; ++i) fr[i] = 1e-3f * d(rng);
  }
  auto view = [&](Buffer& b, DType t) { return TensorView(b.data(), t, {n}); };
  AdamHyper h{.lr = 1e-4f, .weight_decay = 0.1f};
  int64_t step = 0;
  auto adam = [&] {
    h.step = ++step;
    ZR_CHECK_OK(AdamStep(h, view(p, DType::kF32), view(g, DType::kF32), view(m, DType::kF32),
                         view(v, DType::kF32), view(out, DType::kBF16), nullptr));
  };
  auto scalar = [&] {
    h.step = ++step;
    ZR_CHECK_OK(AdamStepReference(h, view(p, DType::kF32), view(g, DType::kF32),
                                  view(m, DType::kF32), view(v, DType::kF32),
                                  view(out, DType::kBF16)));
  };
  // Triad a = b + s*c over the same buffers (3 x 4 bytes per element moved; write-allocate not
  // counted, as STREAM does), with the same threads as the optimizer.
  float* a = p.as<float>();
  const float* b = g.as<float>();
  const float* c = m.as<float>();
  auto triad = [&] {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
  };

  adam();
  triad();
  std::vector<double> t_adam, t_triad;
  for (int r = 0; r < o.rounds; ++r) {  // alternate so that both see the same machine state
    t_adam.push_back(MedianSeconds(1, adam));
    t_triad.push_back(MedianSeconds(1, triad));
  }
  std::sort(t_adam.begin(), t_adam.end());
  std::sort(t_triad.begin(), t_triad.end());
  const double adam_s = t_adam[t_adam.size() / 2];
  const double triad_s = t_triad[t_triad.size() / 2];
  const double scalar_s = MedianSeconds(std::max(1, o.rounds / 2), scalar);
  const double bandwidth = 12.0 * n / triad_s;
  const double floor_s = kBytesPerParam * n / bandwidth;

  // The offloaded step's other host work. The step on a worker thread, as the step worker runs
  // it (a persistent thread: its OpenMP team is made once); a micro-batch's gradient slice added
  // into the fp32 shard (read 4 + 4, write 4 bytes a parameter: slices are reduced in fp32,
  // ShardManagerOptions::reduce_dtype) and written into it (the first slice of a step: read 4,
  // write 4; no zero fill before it); the zero fill (write 4).
  TaskPool worker(1);
  auto adam_worker = [&] {
    ZR_CHECK_OK(worker.Submit([&] { return (adam(), absl::OkStatus()); }).Wait());
  };
  const TensorView slice = view(reduced, DType::kF32), shard = view(g, DType::kF32);
  auto grad_add = [&] { ZR_CHECK_OK(AccumulateInto(slice, shard, nullptr)); };
  auto grad_write = [&] { ZR_CHECK_OK(AssignInto(slice, shard, nullptr)); };
  auto zero_fill = [&] { ZR_CHECK_OK(FillZero(g.data(), Device::Cpu(), n * 4, nullptr)); };
  // A step's last slice and the norm's part of the shard ([Note: the norm taken by the last
  // add]): the add then a pass for the sum of squares (read 4 more), against the fused kernel.
  volatile double sink = 0;
  auto add_then_norm = [&] {
    grad_add();
    sink = sink + HostSumOfSquares(shard, 0.0);
  };
  const Range whole[] = {{0, n}};
  auto add_with_norm = [&] {
    sink = sink + *HostAccumulateWithSumOfSquares(slice, shard, false, whole);
  };
  adam_worker();
  const double worker_s = MedianSeconds(o.rounds, adam_worker);
  // A unit's update as the step worker runs it (parameter pieces of 2^20 elements in one call),
  // alone and beside a thread that keeps one core busy, as the thread issuing the next forward's
  // kernels does while the host step runs behind it on a GPU: a team that splits each piece
  // statically runs at the pace of its thread on that core ([Note: the host update's schedule],
  // kernels/cpu/optimizer.cc).
  std::vector<OptimizerSegment> pieces;
  for (int64_t b = 0; b < n; b += int64_t{1} << 20) {
    pieces.push_back({.begin = b, .count = std::min<int64_t>(n - b, int64_t{1} << 20)});
  }
  auto unit_worker = [&] {
    ZR_CHECK_OK(worker
                    .Submit([&] {
                      h.step = ++step;
                      return AdamStepSegments(h, pieces, view(p, DType::kF32), view(g, DType::kF32),
                                              view(m, DType::kF32), view(v, DType::kF32),
                                              view(out, DType::kBF16), nullptr);
                    })
                    .Wait());
  };
  auto unit_worker_busy = [&] {
    std::atomic<bool> stop{false};
    std::thread busy([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
    unit_worker();
    stop = true;
    busy.join();
  };
  std::vector<double> t_alone, t_busy;
  for (int r = 0; r < o.rounds; ++r) {  // alternated, as the step and the triad
    t_alone.push_back(MedianSeconds(1, unit_worker));
    t_busy.push_back(MedianSeconds(1, unit_worker_busy));
  }
  std::sort(t_alone.begin(), t_alone.end());
  std::sort(t_busy.begin(), t_busy.end());
  const double busy_ratio = t_alone[t_alone.size() / 2] / t_busy[t_busy.size() / 2];
  const double add_s = MedianSeconds(o.rounds, grad_add);
  const double write_s = MedianSeconds(o.rounds, grad_write);
  const double zero_s = MedianSeconds(o.rounds, zero_fill);
  std::vector<double> t_two, t_fused;
  for (int r = 0; r < o.rounds; ++r) {
    t_two.push_back(MedianSeconds(1, add_then_norm));
    t_fused.push_back(MedianSeconds(1, add_with_norm));
  }
  std::sort(t_two.begin(), t_two.end());
  std::sort(t_fused.begin(), t_fused.end());
  const double two_s = t_two[t_two.size() / 2], fused_s = t_fused[t_fused.size() / 2];

  nlohmann::json result = {
      {"bench", "adamw"},
      {"baseline", "memory-bandwidth floor: 30 bytes per parameter over a same-run STREAM triad"},
      {"params", n},
      {"threads", omp_get_max_threads()},
      {"cpu_params_per_s", n / adam_s},
      {"cpu_gbps", kBytesPerParam * n / adam_s / 1e9},
      {"triad_gbps", bandwidth / 1e9},
      {"ratio", floor_s / adam_s},
      {"scalar_params_per_s", n / scalar_s},
      {"speedup_vs_scalar", scalar_s / adam_s},
      {"worker_params_per_s", n / worker_s},
      {"worker_vs_caller", adam_s / worker_s},
      {"worker_beside_a_busy_core", busy_ratio},
      {"grad_add_gbps", 12.0 * n / add_s / 1e9},
      {"grad_write_gbps", 8.0 * n / write_s / 1e9},
      {"zero_fill_gbps", 4.0 * n / zero_s / 1e9},
      {"last_add_and_norm_s", two_s},
      {"last_add_with_norm_s", fused_s},
      {"last_add_norm_ratio", two_s / fused_s},
  };

  if (o.overlap) {
    // 20 forward GEMMs of the 124M MLP ([512, 768] x [768, 3072]): about the backward time of
    // the blocks below one block, whose update (7.1 M parameters) is what would overlap them.
    const int rows = 512, in = 768, out_features = 3072, gemms = 20;
    std::unique_ptr<ModelKernels> k = MakeCpuModelKernels(CpuPrecision::kFloat);
    std::vector<float> x(static_cast<size_t>(rows) * in, 0.5f),
        w(static_cast<size_t>(out_features) * in, 0.01f),
        y(static_cast<size_t>(rows) * out_features);
    auto backward = [&] {
      for (int i = 0; i < gemms; ++i) {
        ZR_CHECK_OK(k->Matmul(y.data(), x.data(), w.data(), nullptr, rows, in, out_features));
      }
    };
    auto in_turn = [&] {
      backward();
      adam();
    };
    auto beside = [&] {
      std::thread update([&] {
        omp_set_num_threads(1);
        adam();
      });
      backward();
      update.join();
    };
    backward();
    std::vector<double> t_gemm, t_turn, t_beside;
    for (int r = 0; r < o.rounds; ++r) {
      t_gemm.push_back(MedianSeconds(1, backward));
      t_turn.push_back(MedianSeconds(1, in_turn));
      t_beside.push_back(MedianSeconds(1, beside));
    }
    for (auto* t : {&t_gemm, &t_turn, &t_beside}) std::sort(t->begin(), t->end());
    const double gemm_s = t_gemm[t_gemm.size() / 2], turn_s = t_turn[t_turn.size() / 2],
                 beside_s = t_beside[t_beside.size() / 2];
    result["overlap"] = {
        {"gemms_s", gemm_s},          {"in_turn_s", turn_s},
        {"beside_s", beside_s},       {"step_s", adam_s},
        {"ratio", turn_s / beside_s}, {"hidden_fraction_of_step", (turn_s - beside_s) / adam_s}};
  }

  if (CudaDeviceCount() > 0) {
    const Device gpu = Device::Cuda(0);
    auto allocator = MakeCudaCachingAllocator(gpu, nullptr);
    auto stream = CreateStream(gpu, "bench");
    auto e0 = CreateEvent(gpu);
    if (allocator.ok() && stream.ok()) {
      auto dalloc = [&](size_t bytes) {
        return *(*allocator)->Allocate(bytes, MemoryCategory::kWorkspace, stream->get());
      };
      Buffer dp = dalloc(n * 4), dg = dalloc(n * 4), dm = dalloc(n * 4), dv = dalloc(n * 4),
             dout = dalloc(n * 2);
      Buffer copy_src = dalloc(static_cast<size_t>(kBytesPerParam * n / 2));
      Buffer copy_dst = dalloc(static_cast<size_t>(kBytesPerParam * n / 2));
      for (Buffer* bb : {&dp, &dg})
        ZR_CHECK_OK(CopyBytes(bb->data(), gpu, p.data(), Device::Cpu(), n * 4, stream->get()));
      for (Buffer* bb : {&dm, &dv})
        ZR_CHECK_OK(CopyBytes(bb->data(), gpu, m.data(), Device::Cpu(), n * 4, stream->get()));
      auto dview = [&](Buffer& bb, DType t) { return TensorView(bb.data(), t, {n}, gpu); };
      auto gadam = [&] {
        h.step = ++step;
        for (int k = 0; k < 10; ++k) {
          ZR_CHECK_OK(AdamStep(h, dview(dp, DType::kF32), dview(dg, DType::kF32),
                               dview(dm, DType::kF32), dview(dv, DType::kF32),
                               dview(dout, DType::kBF16), stream->get()));
        }
        ZR_CHECK_OK((*stream)->Synchronize());
      };
      // A copy reads and writes half the bytes each: the same total traffic as the step.
      auto gcopy = [&] {
        for (int k = 0; k < 10; ++k) {
          ZR_CHECK_OK(CopyBytes(copy_dst.data(), gpu, copy_src.data(), gpu, copy_src.bytes(),
                                stream->get()));
        }
        ZR_CHECK_OK((*stream)->Synchronize());
      };
      gadam();
      gcopy();
      const double gadam_s = MedianSeconds(o.rounds, gadam) / 10;
      const double gcopy_s = MedianSeconds(o.rounds, gcopy) / 10;
      result["cuda"] = {{"params_per_s", n / gadam_s},
                        {"gbps", kBytesPerParam * n / gadam_s / 1e9},
                        {"copy_gbps", kBytesPerParam * n / gcopy_s / 1e9},
                        {"ratio_vs_device_copy", gcopy_s / gadam_s}};
    }
  }

  if (o.json) {
    std::printf("%s\n", result.dump(2).c_str());
    return kExitOk;
  }
  std::printf("zerort bench adamw: %lld parameters, %d threads; baseline: %s\n",
              static_cast<long long>(n), omp_get_max_threads(),
              result["baseline"].get<std::string>().c_str());
  std::printf("  fused AdamW (CPU)     %10.1f M params/s  %6.2f GB/s\n", n / adam_s / 1e6,
              kBytesPerParam * n / adam_s / 1e9);
  std::printf("  triad bandwidth       %10s             %6.2f GB/s\n", "", bandwidth / 1e9);
  std::printf("  scalar reference      %10.1f M params/s\n", n / scalar_s / 1e6);
  std::printf("  ratio to the bandwidth floor %.3f, speedup over the scalar reference %.2fx\n",
              floor_s / adam_s, scalar_s / adam_s);
  std::printf(
      "  on a worker thread    %10.1f M params/s  (%.3f of the caller's; %.3f of that "
      "beside a busy core)\n",
      n / worker_s / 1e6, adam_s / worker_s, busy_ratio);
  std::printf("  gradient add f32->f32 %10.2f GB/s; first write %.2f GB/s; zero fill %.2f GB/s\n",
              12.0 * n / add_s / 1e9, 8.0 * n / write_s / 1e9, 4.0 * n / zero_s / 1e9);
  std::printf(
      "  last add then the norm's pass %.2f ms; fused %.2f ms (%.2f GB/s); ratio %.3f (above 1: "
      "the fused kernel pays)\n",
      two_s * 1e3, fused_s * 1e3, 12.0 * n / fused_s / 1e9, two_s / fused_s);
  if (result.contains("overlap")) {
    const nlohmann::json& v = result["overlap"];
    std::printf(
        "  overlap: GEMMs %.1f ms; GEMMs then the step %.1f ms; the step on its own thread beside "
        "the GEMMs %.1f ms; ratio %.3f (above 1: the overlap pays), %.0f%% of the step hidden\n",
        v["gemms_s"].get<double>() * 1e3, v["in_turn_s"].get<double>() * 1e3,
        v["beside_s"].get<double>() * 1e3, v["ratio"].get<double>(),
        v["hidden_fraction_of_step"].get<double>() * 100);
  }
  if (result.contains("cuda")) {
    std::printf(
        "  fused AdamW (CUDA)    %10.1f M params/s  %6.1f GB/s; device copy %.1f GB/s; ratio "
        "%.3f\n",
        result["cuda"]["params_per_s"].get<double>() / 1e6, result["cuda"]["gbps"].get<double>(),
        result["cuda"]["copy_gbps"].get<double>(),
        result["cuda"]["ratio_vs_device_copy"].get<double>());
  }
  return kExitOk;
}

}  // namespace zerort::cli
