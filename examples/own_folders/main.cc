// own_folders: a trainer with its own runtime/allocator.h and layers/layer.h on its include path
// before zerort's, using both its own files and zerort's shard manager (ZeRO-3, two loopback
// ranks): one unit trained a few steps toward w = 1 by hand-written gradients. Exits 1 unless the
// weights moved toward 1 on every rank.
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "zerort/runtime/loopback_communicator.h"
#include "zerort/sharding/shard_manager.h"
// The trainer's own, after zerort's: each stops compiling if a zerort header included it first.
#include "layers/layer.h"
#include "runtime/allocator.h"

namespace {

constexpr int64_t kWidth = 16;

// One step's loss 0.5 * |w - 1|^2: its gradient w - 1 added into the unit's scope.
zerort::Status Train(zerort::Communicator& dp, float* distance) {
  zerort::MemoryTracker tracker;
  auto allocator = zerort::MakeCpuCachingAllocator(&tracker);
  zerort::ShardManagerOptions options;
  options.stage = zerort::ZeroStage::k3;
  options.optimizer.kind = zerort::OptimizerKind::kSgd;
  options.stage3_param_persistence_threshold = 0;  // shard even this small unit
  ZR_ASSIGN_OR_RETURN(
      auto manager,
      zerort::ShardManager::Create(
          options, {.dp = &dp, .device_allocator = allocator.get(), .tracker = &tracker}));
  ZR_ASSIGN_OR_RETURN(int unit, manager->AddUnit("w", {{"w", {kWidth}}}));
  ZR_RETURN_IF_ERROR(
      manager->Initialize([](const zerort::ParamSpec&, uint64_t, std::span<float> full) {
        for (float& v : full) v = 0.0f;
      }));
  own::Allocator mine;
  float* ones = mine.Floats(kWidth);
  for (int64_t i = 0; i < kWidth; ++i) ones[i] = 1.0f;
  for (int step = 0; step < 5; ++step) {
    {
      ZR_ASSIGN_OR_RETURN(zerort::UnitScope s, manager->BackwardScope(unit));
      const float* w = s.param(0).data_as<float>();
      float* g = s.grad(0).data_as<float>();
      for (int64_t i = 0; i < kWidth; ++i) g[i] += w[i] - 1.0f;
      ZR_RETURN_IF_ERROR(s.End());
    }
    ZR_RETURN_IF_ERROR(manager->Step({.lr = 0.5f, .micro_batches = 1}).status());
  }
  ZR_ASSIGN_OR_RETURN(zerort::UnitScope s, manager->ForwardScope(unit));
  const float* w = s.param(0).data_as<float>();
  // |w - 1|^2 = w.w - 2 w.1 + n, through the trainer's own layer code.
  *distance = std::sqrt(own::Dot(w, w, kWidth) - 2 * own::Dot(w, ones, kWidth) + kWidth);
  return s.End();
}

}  // namespace

int main() {
  std::vector<float> distance(2, -1.0f);
  zerort::Status status = zerort::RunLoopbackRanks(
      2, {}, nullptr, [&](zerort::Communicator& dp) { return Train(dp, &distance[dp.rank()]); });
  if (!status.ok()) {
    std::fprintf(stderr, "own_folders: %s\n", status.ToString().c_str());
    return 1;
  }
  // From w = 0, five SGD steps of rate 0.5 leave |w - 1| = 4 * 0.5^5 = 0.125.
  bool ok = true;
  for (float d : distance) ok = ok && std::fabs(d - 0.125f) < 1e-6f;
  std::printf("own_folders: its own runtime/ and layers/ beside zerort's, |w - 1| = %g, %g (%s)\n",
              distance[0], distance[1], ok ? "correct" : "WRONG");
  return ok ? 0 : 1;
}
