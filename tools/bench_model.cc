// zerort bench model: forward + backward of the built-in GPT model through the shard manager
// (one rank) for a config, in tokens per second and achieved FLOP/s by the PaLM formula
// (6 N + 12 L d T per token), against a same-run baseline: the throughput of the model's own
// largest GEMM shape (the MLP's [rows, d] x [d, 4d]) through the same GEMM path (OpenBLAS on CPU,
// cuBLASLt on a GPU), i.e. the fraction of the machine's dense-math rate the whole model reaches.
// On a GPU it also reports MFU against the device's dense bf16 peak.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/config.h"
#include "kernels/blas.h"
#include "kernels/model_kernels.h"
#include "layers/gpt_model.h"
#include "nlohmann/json.hpp"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "runtime/loopback_communicator.h"
#include "runtime/strings.h"
#include "tools/commands.h"

namespace zerort::cli {
namespace {

struct BenchModelConfig {
  GptConfig model;
  int micro_batch = 1;
  bool bf16 = false;
  bool checkpointing = false;
  ZeroStage stage = ZeroStage::k0;
};

// A run config, read and validated as `zerort train` reads it; bench uses the model, the
// micro-batch (1 when unset), bf16, the ZeRO stage and activation checkpointing.
StatusOr<BenchModelConfig> LoadBenchConfig(const std::string& path) {
  ZR_ASSIGN_OR_RETURN(RunConfig run, LoadRunConfig(path));
  BenchModelConfig c;
  c.model = run.model.shape;
  c.micro_batch = run.train_micro_batch_size_per_gpu > 0
                      ? static_cast<int>(run.train_micro_batch_size_per_gpu)
                      : 1;
  c.bf16 = run.bf16;
  c.checkpointing = run.model.activation_checkpointing;
  c.stage = static_cast<ZeroStage>(run.zero.stage);
  return c;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int RunBenchModel(const BenchModelOptions& o) {
  StatusOr<BenchModelConfig> loaded = LoadBenchConfig(o.config);
  if (!loaded.ok()) {
    Logger()->error("bench model: {}", loaded.status().message());
    return kExitUsage;
  }
  BenchModelConfig c = *loaded;
  const bool cuda = !o.cpu && CudaDeviceCount() > 0;
  const Device device = cuda ? Device::Cuda(0) : Device::Cpu();
  const DType dtype = c.bf16 ? DType::kBF16 : DType::kF32;
  const GptConfig& m = c.model;
  const int batch = c.micro_batch, seq = m.seq_len;
  const double tokens = static_cast<double>(batch) * seq;

  nlohmann::json result;
  const Status status = [&]() -> Status {
    auto comms = CreateLoopbackGroup(1, {}, nullptr);
    ZR_RETURN_IF_ERROR(comms.status());
    MemoryTracker tracker;
    std::unique_ptr<Allocator> allocator;
    if (cuda) {
      ZR_RETURN_IF_ERROR(SetCurrentDevice(device));
      ZR_ASSIGN_OR_RETURN(allocator, MakeCudaCachingAllocator(device, &tracker));
    } else {
      allocator = MakeCpuCachingAllocator(&tracker);
    }
    ShardManagerOptions so;
    so.stage = c.stage;
    so.compute_dtype = dtype;
    so.reduce_dtype = DType::kF32;
    ZR_ASSIGN_OR_RETURN(
        auto manager,
        ShardManager::Create(so, {.dp = (*comms)[0].get(), .device_allocator = allocator.get()}));
    auto store = MakeShardManagerStore(*manager);
    std::unique_ptr<ModelKernels> kernels;
    if (cuda) {
      ZR_ASSIGN_OR_RETURN(
          kernels, MakeCudaModelKernels(dtype, DType::kF32, manager->compute_stream(), *allocator));
    } else {
      kernels = MakeCpuModelKernels(c.bf16 ? CpuPrecision::kBf16 : CpuPrecision::kFloat);
    }
    ZR_ASSIGN_OR_RETURN(auto model, GptModel::Create({.config = m,
                                                      .micro_batch = batch,
                                                      .activation_checkpointing = c.checkpointing},
                                                     *store, *kernels, *allocator));
    ZR_RETURN_IF_ERROR(manager->Initialize(GptInitializer(m)));
    std::mt19937 rng(1);
    std::vector<int32_t> ids(static_cast<size_t>(tokens)), targets(ids.size());
    for (int32_t& t : ids) t = static_cast<int32_t>(rng() % m.vocab_size);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng() % m.vocab_size);
    auto now = [] { return std::chrono::steady_clock::now(); };
    auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };

    // Baseline: the MLP's up-projection GEMM on buffers of the same shapes, same GEMM path.
    const int64_t rows = static_cast<int64_t>(tokens);
    const size_t act = kernels->act_size();
    ZR_ASSIGN_OR_RETURN(Buffer x,
                        allocator->Allocate(rows * m.d_model * act, MemoryCategory::kWorkspace,
                                            &kernels->stream()));
    ZR_ASSIGN_OR_RETURN(Buffer w,
                        allocator->Allocate(int64_t{4} * m.d_model * m.d_model * act,
                                            MemoryCategory::kWorkspace, &kernels->stream()));
    ZR_ASSIGN_OR_RETURN(Buffer y,
                        allocator->Allocate(rows * 4 * m.d_model * act, MemoryCategory::kWorkspace,
                                            &kernels->stream()));
    ZR_RETURN_IF_ERROR(FillZero(x.data(), device, x.bytes(), &kernels->stream()));
    ZR_RETURN_IF_ERROR(FillZero(w.data(), device, w.bytes(), &kernels->stream()));
    const double gemm_flops = 2.0 * rows * m.d_model * 4.0 * m.d_model;
    const int gemm_repeats = std::max(1, static_cast<int>(5e10 / gemm_flops));

    std::vector<double> step_s, gemm_s;
    tracker.ResetPeaks();
    for (int it = 0; it <= o.iters; ++it) {  // iteration 0 warms up (allocator, cuBLASLt plans)
      const auto t0 = now();
      ZR_RETURN_IF_ERROR(model->ForwardBackward(ids, targets, batch, seq, 1.0f).status());
      ZR_RETURN_IF_ERROR(manager->ReduceGradients());
      ZR_RETURN_IF_ERROR(manager->compute_stream().Synchronize());
      const auto t1 = now();
      ZR_RETURN_IF_ERROR(manager->Step({.lr = 1e-4f}).status());
      const auto t2 = now();
      for (int r = 0; r < gemm_repeats; ++r) {
        ZR_RETURN_IF_ERROR(
            kernels->Matmul(y.data(), x.data(), w.data(), nullptr, rows, m.d_model, 4 * m.d_model));
      }
      ZR_RETURN_IF_ERROR(kernels->stream().Synchronize());
      const auto t3 = now();
      if (it > 0) {
        step_s.push_back(seconds(t0, t1));
        gemm_s.push_back(seconds(t2, t3) / gemm_repeats);
        Logger()->info("iteration {}: forward+backward {:.3f} s, optimizer step {:.3f} s", it,
                       seconds(t0, t1), seconds(t1, t2));
      }
    }
    const double fb = Median(step_s);
    const double flops = m.FlopsPerToken() * tokens / fb;
    const double gemm_rate = gemm_flops / Median(gemm_s);
    result = {
        {"bench", "model"},
        {"baseline", "the model's largest GEMM shape ([rows, d] x [d, 4d]) alone, same GEMM path"},
        {"config", o.config},
        {"device", cuda ? QueryCuda().devices.at(0).name : "cpu"},
        {"dtype", std::string(DTypeName(dtype))},
        {"params", m.NumParameters()},
        {"n_layer", m.n_layer},
        {"d_model", m.d_model},
        {"seq_len", seq},
        {"micro_batch", batch},
        {"activation_checkpointing", c.checkpointing},
        {"zero_stage", static_cast<int>(c.stage)},
        {"threads", cuda ? 0 : BlasThreads()},
        {"iterations", o.iters},
        {"forward_backward_s", fb},
        {"tokens_per_s", tokens / fb},
        {"flops_per_token", m.FlopsPerToken()},
        {"achieved_tflops", flops / 1e12},
        {"gemm_tflops", gemm_rate / 1e12},
        {"ratio", flops / gemm_rate},
        {"peak_activation_bytes",
         tracker.Usage(MemoryTier::kDevice, MemoryCategory::kActivations).peak},
    };
    if (cuda) {
      const double peak = DenseBf16PeakFlops(QueryCuda().devices.at(0).name);
      result["bf16_peak_tflops"] = peak / 1e12;
      result["mfu"] = peak > 0 ? flops / peak : 0.0;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    Logger()->error("bench model: {}", status.message());
    return kExitRuntimeFailure;
  }
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
    return kExitOk;
  }
  std::printf("zerort bench model: %s on %s (%s), %lld parameters, micro-batch %d x %d tokens\n",
              o.config.c_str(), result["device"].get<std::string>().c_str(),
              result["dtype"].get<std::string>().c_str(), static_cast<long long>(m.NumParameters()),
              batch, seq);
  std::printf("  forward+backward      %10.4f s   (median of %d)\n",
              result["forward_backward_s"].get<double>(), o.iters);
  std::printf("  tokens/s              %10.1f\n", result["tokens_per_s"].get<double>());
  std::printf("  achieved TFLOP/s      %10.4f   (PaLM: %.3g FLOPs/token)\n",
              result["achieved_tflops"].get<double>(), m.FlopsPerToken());
  std::printf("  GEMM baseline TFLOP/s %10.4f\n", result["gemm_tflops"].get<double>());
  std::printf("  ratio (model / GEMM)  %10.3f\n", result["ratio"].get<double>());
  if (result.contains("mfu")) {
    std::printf("  MFU (bf16 peak %.0f)  %10.3f\n", result["bf16_peak_tflops"].get<double>(),
                result["mfu"].get<double>());
  }
  std::printf("  peak activations      %10.1f MiB\n",
              result["peak_activation_bytes"].get<int64_t>() / 1048576.0);
  return kExitOk;
}

}  // namespace zerort::cli
