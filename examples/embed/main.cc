// embed_mlp: a trainer with its own model code (a 3-layer MLP regressing a fixed random
// function) that uses zerort only for state: each layer is a unit of the shard manager, gathered
// for its forward and backward and released after, with ZeRO-3 and AdamW. Runs on one process
// (4 loopback ranks) or under mpirun (one rank per process). With `--nvme DIR` the optimizer
// state and the parameter shards live on NVMe (ZeRO-Infinity): placement is one option, the
// trainer's code does not change. Prints the loss; exits 1 if it did not fall by half.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/mpi_communicator.h"
#include "zerort/sharding/shard_manager.h"

namespace {

using zerort::Status;
using zerort::StatusOr;

constexpr int kWidths[] = {16, 64, 64, 4};
constexpr int kLayers = 3;
constexpr int kBatchPerRank = 16;

struct Batch {
  std::vector<std::vector<float>> x, y;
};

// The function to learn: y = sin(A x) for a fixed random A; samples depend only on their index.
Batch MakeBatch(int64_t first, int count) {
  static const std::vector<float> a = [] {
    std::mt19937 rng(99);
    std::normal_distribution<float> n(0.0f, 0.4f);
    std::vector<float> m(kWidths[0] * kWidths[kLayers]);
    for (float& v : m) v = n(rng);
    return m;
  }();
  Batch b;
  for (int s = 0; s < count; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(first + s));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(kWidths[0]), y(kWidths[kLayers]);
    for (float& v : x) v = u(rng);
    for (int o = 0; o < kWidths[kLayers]; ++o) {
      float acc = 0;
      for (int i = 0; i < kWidths[0]; ++i) acc += a[o * kWidths[0] + i] * x[i];
      y[o] = std::sin(acc);
    }
    b.x.push_back(std::move(x));
    b.y.push_back(std::move(y));
  }
  return b;
}

float At(const zerort::TensorView& v, int64_t i) {
  return zerort::LoadAsFloat(v.data(), v.dtype(), i);
}
void AddAt(const zerort::TensorView& v, int64_t i, float d) {
  zerort::StoreFromFloat(v.data(), v.dtype(), i, At(v, i) + d);
}

// One forward/backward of this rank's batch through the manager's scopes; returns the loss.
StatusOr<double> TrainMicroBatch(zerort::ShardManager& m, const std::vector<int>& units,
                                 const Batch& b) {
  const int n = static_cast<int>(b.x.size());
  std::vector<std::vector<std::vector<float>>> acts(kLayers + 1);
  acts[0] = b.x;
  for (int l = 0; l < kLayers; ++l) {
    ZR_ASSIGN_OR_RETURN(zerort::UnitScope scope, m.Forward(units[l]));
    const auto w = scope.param(0), bias = scope.param(1);
    for (int s = 0; s < n; ++s) {
      std::vector<float> out(kWidths[l + 1]);
      for (int o = 0; o < kWidths[l + 1]; ++o) {
        float acc = At(bias, o);
        for (int i = 0; i < kWidths[l]; ++i) acc += At(w, o * kWidths[l] + i) * acts[l][s][i];
        out[o] = l + 1 < kLayers ? std::tanh(acc) : acc;
      }
      acts[l + 1].push_back(std::move(out));
    }
    ZR_RETURN_IF_ERROR(scope.End());
  }
  double loss = 0;
  std::vector<std::vector<float>> delta(n, std::vector<float>(kWidths[kLayers]));
  for (int s = 0; s < n; ++s) {
    for (int o = 0; o < kWidths[kLayers]; ++o) {
      const float d = acts[kLayers][s][o] - b.y[s][o];
      loss += static_cast<double>(d) * d / n;
      delta[s][o] = 2 * d / n * m.loss_scale();
    }
  }
  for (int l = kLayers - 1; l >= 0; --l) {
    ZR_ASSIGN_OR_RETURN(zerort::UnitScope scope, m.Backward(units[l]));
    const auto w = scope.param(0), gw = scope.grad(0), gb = scope.grad(1);
    std::vector<std::vector<float>> prev(n, std::vector<float>(kWidths[l], 0.0f));
    for (int o = 0; o < kWidths[l + 1]; ++o) {
      float db = 0;
      for (int s = 0; s < n; ++s) db += delta[s][o];
      AddAt(gb, o, db);
      for (int i = 0; i < kWidths[l]; ++i) {
        float dw = 0;
        for (int s = 0; s < n; ++s) {
          dw += delta[s][o] * acts[l][s][i];
          prev[s][i] += delta[s][o] * At(w, o * kWidths[l] + i);
        }
        AddAt(gw, o * kWidths[l] + i, dw);
      }
    }
    for (int s = 0; s < n && l > 0; ++s) {
      for (int i = 0; i < kWidths[l]; ++i) prev[s][i] *= 1 - acts[l][s][i] * acts[l][s][i];
    }
    delta = std::move(prev);
    ZR_RETURN_IF_ERROR(scope.End());
  }
  return loss;
}

Status Train(zerort::Communicator& dp, const std::string& nvme_path, bool* fell) {
  zerort::MemoryTracker tracker;
  std::unique_ptr<zerort::Allocator> allocator = zerort::MakeCpuCachingAllocator(&tracker);
  zerort::ShardManagerOptions options;
  options.stage = zerort::ZeroStage::k3;
  options.stage3_param_persistence_threshold = 0;  // gather and release every layer
  options.optimizer.weight_decay = 0.01f;
  options.gradient_clipping = 1.0f;
  if (!nvme_path.empty()) {
    options.placement = {.optimizer = zerort::MemoryTier::kNvme,
                         .params = zerort::MemoryTier::kNvme};
    options.offload.nvme_path = nvme_path;
  }
  ZR_ASSIGN_OR_RETURN(
      auto manager,
      zerort::ShardManager::Create(
          options, {.dp = &dp, .device_allocator = allocator.get(), .tracker = &tracker}));
  std::vector<int> units;
  for (int l = 0; l < kLayers; ++l) {
    const std::string name = "fc" + std::to_string(l);
    ZR_ASSIGN_OR_RETURN(
        int u, manager->AddUnit(name, {{name + ".weight", {kWidths[l + 1], kWidths[l]}, true},
                                       {name + ".bias", {kWidths[l + 1]}, false}}));
    units.push_back(u);
  }
  // Scaled-normal initialisation, identical on every rank.
  ZR_RETURN_IF_ERROR(
      manager->Initialize([](const zerort::ParamSpec& spec, uint64_t seed, std::span<float> full) {
        std::mt19937 rng(static_cast<uint32_t>(seed + std::hash<std::string>{}(spec.name)));
        const float stddev =
            spec.shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(spec.shape[1])) : 0.0f;
        std::normal_distribution<float> n(0.0f, 1.0f);
        for (float& v : full) v = stddev * n(rng);
      }));
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    const int64_t offset = (int64_t{step} * dp.size() + dp.rank()) * kBatchPerRank;
    ZR_ASSIGN_OR_RETURN(double loss,
                        TrainMicroBatch(*manager, units, MakeBatch(offset, kBatchPerRank)));
    float mean = static_cast<float>(loss);
    ZR_RETURN_IF_ERROR(dp.AllReduce(&mean, &mean, 1, zerort::DType::kF32, zerort::ReduceOp::kAvg));
    ZR_ASSIGN_OR_RETURN(zerort::StepResult r, manager->Step({.lr = 3e-3f}));
    if (step == 0) first = mean;
    last = mean;
    if (dp.rank() == 0 && step % 30 == 0) {
      std::printf("step %3d  loss %.5f  grad norm %.4f\n", step, mean, r.grad_norm);
    }
  }
  if (dp.rank() == 0) {
    const auto usage =
        tracker.Usage(zerort::MemoryTier::kDevice, zerort::MemoryCategory::kGatheredWeights);
    std::printf(
        "embed_mlp: %d ranks, ZeRO-3%s; loss %.5f -> %.5f; gathered weights peak %lld bytes (now "
        "%lld); on NVMe %lld bytes\n",
        dp.size(), nvme_path.empty() ? "" : " with optimizer state and parameters on NVMe", first,
        last, static_cast<long long>(usage.peak), static_cast<long long>(usage.current),
        static_cast<long long>(tracker.InUse(zerort::MemoryTier::kNvme).peak));
  }
  *fell = last < 0.5 * first;
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string nvme_path;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--nvme" && i + 1 < argc) nvme_path = argv[i + 1];
  }
  auto launch = zerort::DiscoverLaunchEnv(zerort::ProcessEnv());
  if (!launch.ok()) {
    std::fprintf(stderr, "%s\n", launch.status().ToString().c_str());
    return 2;
  }
  zerort::ConfigureLogging({launch->rank, launch->world_size});
  bool fell = true;
  Status status;
  if (launch->world_size > 1) {
    auto mpi = zerort::MpiContext::Init(&argc, &argv, {});
    if (!mpi.ok()) {
      std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str());
      return 1;
    }
    auto world = (*mpi)->World({});
    status = world.ok() ? Train(**world, nvme_path, &fell) : world.status();
  } else {
    std::vector<char> fells(4, 1);
    status = zerort::RunLoopbackRanks(4, {}, nullptr, [&](zerort::Communicator& dp) {
      bool f = true;
      Status s = Train(dp, nvme_path, &f);
      fells[dp.rank()] = f;
      return s;
    });
    for (char f : fells) fell = fell && f;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "embed_mlp: %s\n", status.ToString().c_str());
    return 1;
  }
  if (!fell) std::fprintf(stderr, "embed_mlp: the loss did not fall by half\n");
  return fell ? 0 : 1;
}
