// Offload is a placement, not another computation: the MLP trained with its optimizer state on
// the host tier or on NVMe, and at stage 3 its parameters too, gives bitwise the parameters and
// gradient norms of the run that keeps everything on the device — at ZeRO stages 1-3, world
// sizes 1, 2 and 4 (loopback ranks), AdamW and SGD with Nesterov momentum, both NVMe engines
// (io_uring where the kernel allows it), with micro-batch accumulation and clipping. Also: the
// tiers are accounted, an NVMe fault stops the step naming the file, and nothing is left in
// nvme_path.
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "gtest/gtest.h"
#include "tests/sharding/harness.h"
#include "zerort/offload/nvme_store.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/manager_state.h"

namespace zerort {
namespace {

using namespace testing;  // the harness: RunConfig, Train, MLP
namespace fs = std::filesystem;

class NvmeDir {
 public:
  NvmeDir() : path_(fs::temp_directory_path() / ("zerort_parity." + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~NvmeDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  bool empty() const { return fs::is_empty(path_); }

 private:
  fs::path path_;
};

struct Case {
  ZeroStage stage;
  int world;
  OptimizerKind optimizer;
};

class OffloadParity : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadParity, EveryPlacementEqualsTheDeviceRunBitwise) {
  const Case c = GetParam();
  NvmeDir dir;
  RunConfig base{.stage = c.stage, .world = c.world, .optimizer = c.optimizer, .steps = 6};
  const RunResult device = Train(base);
  ASSERT_EQ(device.error, "");
  struct Variant {
    const char* name;
    ShardPlacement placement;
    IoEngine engine;
  };
  std::vector<Variant> variants = {
      {"optimizer on pinned host", {.optimizer = MemoryTier::kPinnedHost}, IoEngine::kAuto},
      {"optimizer on host", {.optimizer = MemoryTier::kHost}, IoEngine::kAuto},
      {"optimizer on nvme (io_uring)", {.optimizer = MemoryTier::kNvme}, IoEngine::kIoUring},
      {"optimizer on nvme (threads)", {.optimizer = MemoryTier::kNvme}, IoEngine::kThreads},
  };
  if (c.stage == ZeroStage::k3) {
    variants.push_back({"optimizer and parameters on host",
                        {.optimizer = MemoryTier::kPinnedHost, .params = MemoryTier::kPinnedHost},
                        IoEngine::kAuto});
    variants.push_back({"optimizer and parameters on nvme",
                        {.optimizer = MemoryTier::kNvme, .params = MemoryTier::kNvme},
                        IoEngine::kAuto});
  }
  for (const Variant& v : variants) {
    // Where the kernel refuses io_uring its variant is left out (offload_test's skips say so).
    if (v.engine == IoEngine::kIoUring && !IoUringUsable().ok()) continue;
    RunConfig offloaded = base;
    offloaded.placement = v.placement;
    offloaded.nvme_path = dir.str();
    offloaded.io_engine = v.engine;
    const RunResult r = Train(offloaded);
    ASSERT_EQ(r.error, "") << v.name;
    EXPECT_EQ(r.params, device.params) << v.name;
    EXPECT_EQ(r.grad_norms, device.grad_norms) << v.name;
    EXPECT_TRUE(dir.empty()) << v.name << ": files left in nvme_path";
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    for (int world : {1, 2, 4}) {
      for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
        cases.push_back({stage, world, opt});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(StagesWorldsOptimizers, OffloadParity, ::testing::ValuesIn(Cases()),
                         [](const auto& info) {
                           return "stage" + std::to_string(static_cast<int>(info.param.stage)) +
                                  "_world" + std::to_string(info.param.world) +
                                  (info.param.optimizer == OptimizerKind::kSgd ? "_sgd" : "_adamw");
                         });

TEST(OffloadParity, AccumulationAndClippingOnNvmeEqualTheDeviceRun) {
  // Three micro-batches: the NVMe gradient shard is read, added to and written back; clipping
  // needs the global norm before any update (taken as the shards were written).
  NvmeDir dir;
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    // reduce_bucket_size 1: every unit is reduced at the end of each micro-batch's backward
    // (stages 2-3), so its NVMe shard is written once and then read, added to and written again.
    RunConfig base{.stage = stage,
                   .world = 2,
                   .clip = 0.05f,
                   .micro_batches = 3,
                   .steps = 5,
                   .reduce_bucket_size = 1};
    RunConfig nvme = base;
    nvme.placement = {.optimizer = MemoryTier::kNvme,
                      .params = stage == ZeroStage::k3 ? MemoryTier::kNvme : MemoryTier::kDevice};
    nvme.nvme_path = dir.str();
    const RunResult a = Train(base), b = Train(nvme);
    ASSERT_EQ(a.error, "");
    ASSERT_EQ(b.error, "");
    EXPECT_EQ(a.params, b.params) << "stage " << static_cast<int>(stage);
    EXPECT_EQ(a.grad_norms, b.grad_norms) << "stage " << static_cast<int>(stage);
  }
}

// The host step's parity runs: two micro-batches, clipping, five steps, every unit's state read
// and loaded back after the third (a deferred step's completion), small units kept at stage 3.
RunConfig ClippedRun(ZeroStage stage, int world, OptimizerKind optimizer) {
  return RunConfig{.stage = stage,
                   .world = world,
                   .optimizer = optimizer,
                   .clip = 0.05f,
                   .micro_batches = 2,
                   .steps = 5,
                   .persistence_threshold = stage == ZeroStage::k3 ? 100 : 0,
                   .reload_after = 3};
}

// [Note: the host step behind the forward]: the host-tier AdamW and SGD steps run on a worker
// thread and each unit is completed at its next use, yet every number is the synchronous step's:
// stages 1-3 (full parameters refreshed by all-gathers at 1-2, gathers of shards at 3, persistent
// units), one and two ranks, micro-batches and clipping, and a checkpoint's read and load right
// after a deferred step (reload_after), before any unit was completed. Under ThreadSanitizer too
// (make test-tsan): a unit read before its update is completed is a reported race.
TEST(OffloadParity, TheHostStepBehindTheForwardEqualsTheSynchronousStep) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    // World 0 stands for one rank without poisoned releases: at stage 3 its units read their
    // compute shards in place ([Note: one shard rank]), which the worker's updates write.
    for (int world : {1, 2, 0}) {
      for (OptimizerKind optimizer : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
        RunConfig base = ClippedRun(stage, std::max(world, 1), optimizer);
        base.placement = {.optimizer = MemoryTier::kPinnedHost};
        base.poison = world != 0;
        RunConfig synchronous = base;
        synchronous.overlap_host_step = HostStepOverlap::kOff;
        RunConfig device = base;
        device.placement = {};
        const RunResult a = Train(base), b = Train(synchronous), d = Train(device);
        const std::string name = StrCat("stage ", static_cast<int>(stage), ", world ", base.world,
                                        base.poison ? "" : " in place",
                                        optimizer == OptimizerKind::kSgd ? ", SGD" : ", AdamW");
        ASSERT_EQ(a.error, "") << name;
        ASSERT_EQ(b.error, "") << name;
        ASSERT_EQ(d.error, "") << name;
        EXPECT_EQ(a.params, b.params) << name;
        EXPECT_EQ(a.grad_norms, b.grad_norms) << name;
        EXPECT_EQ(a.params, d.params) << name;
        if (stage == ZeroStage::k3 && world == 0) {
          EXPECT_EQ(a.gathered_peak, 0) << name;
        }
      }
    }
  }
}

// The device run against the optimizer state on the host for the last units (`ratios`: 1 all of
// them), deferred or not, with the gradient sums on the device or on the host: stages 1-3, one and
// two ranks, AdamW, SGD and LAMB (never deferred), micro-batches and clipping, a checkpoint's read
// and load after a deferred step, at stage 3 the parameters on the host too (the device units'
// updates write them there).
void ExpectHostPlacementsEqualTheDeviceRun(std::initializer_list<double> ratios,
                                           bool device_grad_sums) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    for (int world : {1, 2}) {
      for (OptimizerKind optimizer :
           {OptimizerKind::kAdamW, OptimizerKind::kSgd, OptimizerKind::kLamb}) {
        const RunConfig device = ClippedRun(stage, world, optimizer);
        const RunResult d = Train(device);
        ASSERT_EQ(d.error, "");
        for (double ratio : ratios) {
          for (HostStepOverlap overlap : {HostStepOverlap::kOn, HostStepOverlap::kOff}) {
            RunConfig host = device;
            host.placement = {
                .optimizer = MemoryTier::kPinnedHost,
                .params = stage == ZeroStage::k3 ? MemoryTier::kPinnedHost : MemoryTier::kDevice};
            host.offload_ratio = ratio;
            host.overlap_host_step = overlap;
            host.device_grad_sums = device_grad_sums;
            const RunResult r = Train(host);
            const std::string name = StrCat(
                "stage ", static_cast<int>(stage), ", world ", world, ", ",
                optimizer == OptimizerKind::kSgd    ? "SGD"
                : optimizer == OptimizerKind::kLamb ? "LAMB"
                                                    : "AdamW",
                ", ratio ", ratio, overlap == HostStepOverlap::kOn ? ", deferred" : ", synchronous",
                device_grad_sums ? ", sums on the device" : "");
            ASSERT_EQ(r.error, "") << name;
            EXPECT_EQ(r.params, d.params) << name;
            EXPECT_EQ(r.grad_norms, d.grad_norms) << name;
            if (device_grad_sums) {
              // No host shard is read again for the norm: every gradient's is taken on the device.
              for (int64_t passes : r.norm_passes) EXPECT_EQ(passes, 0) << name;
            }
          }
        }
      }
    }
  }
}

// [Note: partial optimizer offload]: the first units' optimizer state on the device, the last
// ones' on the host, gives bitwise the numbers of the run that keeps everything on the device
// (the global norm adds the device units' parts, then the host units', in unit order).
TEST(OffloadParity, APartialOffloadEqualsTheDeviceRun) {
  ExpectHostPlacementsEqualTheDeviceRun({0.5, 0.25}, false);
}

// And with the gradient sums on the device ([Note: gradient sums on the device]) every unit's
// gradient shard on the device, none on the host, the optimizer state where the ratio puts it.
TEST(OffloadTiers, APartialOffloadKeepsTheFirstUnitsOnTheDevice) {
  auto group = *CreateLoopbackGroup(1, {}, nullptr);
  for (bool sums : {false, true}) {
    for (double ratio : {1.0, 0.5, 0.0}) {
      const std::string name = StrCat("ratio ", ratio, sums ? ", sums on the device" : "");
      MemoryTracker tracker;
      ShardManagerOptions o = Options({.stage = ZeroStage::k3});
      o.placement.optimizer = MemoryTier::kPinnedHost;
      o.offload.optimizer_ratio = ratio;
      o.offload.device_grad_sums = sums;
      StatusOr<MlpRun> run = MakeMlpRun(o, *group[0], tracker);
      ASSERT_TRUE(run.ok()) << run.status();
      const int n = static_cast<int>(run->units.size());
      const int on_device = DeviceOptimizerUnits(o, n);
      int64_t device_bytes = 0, host_bytes = 0;
      for (int i = 0; i < n; ++i) {
        const ShardedUnit& unit = run->manager->unit(run->units[i]);
        const PlannedBuffer* master = unit.plan().Find(UnitBuffer::kMaster);
        const PlannedBuffer* grad = unit.plan().Find(UnitBuffer::kGradShard);
        ASSERT_NE(master, nullptr);
        ASSERT_NE(grad, nullptr);
        EXPECT_EQ(master->tier, i < on_device ? MemoryTier::kDevice : MemoryTier::kPinnedHost)
            << name << ", unit " << i;
        EXPECT_EQ(grad->tier, sums ? MemoryTier::kDevice : master->tier) << name << ", unit " << i;
        EXPECT_EQ(run->manager->optimizer().tier(run->units[i]), master->tier);
        (i < on_device ? device_bytes : host_bytes) += unit.layout().shard_numel() * 4;
      }
      EXPECT_EQ(on_device, ratio == 1.0 ? 0 : ratio == 0.5 ? n / 2 : n) << name;
      // Adam's two moments of each unit on its own tier.
      const MemorySnapshot s = tracker.Snapshot();
      EXPECT_EQ(s.Get(MemoryTier::kDevice, MemoryCategory::kOptimizerState).current,
                2 * device_bytes)
          << name;
      EXPECT_EQ(s.Get(MemoryTier::kPinnedHost, MemoryCategory::kOptimizerState).current,
                2 * host_bytes)
          << name;
      EXPECT_EQ(s.Get(MemoryTier::kDevice, MemoryCategory::kGradients).current,
                sums ? device_bytes + host_bytes : device_bytes)
          << name;
      EXPECT_EQ(s.Get(MemoryTier::kPinnedHost, MemoryCategory::kGradients).current,
                sums ? 0 : host_bytes)
          << name;
    }
  }
}

// [Note: gradient sums on the device]: a host-tier unit's gradient shard kept on the device, its
// micro-batch slices added there, its sum staged to the host right before the unit's CPU update
// (serial, or on the host step's worker behind the forward), gives bitwise the numbers of the run
// that keeps everything on the device (the norm of every shard taken on the device), whole or
// partial offload. Under ThreadSanitizer too (make test-tsan's 'BehindTheForward'): the worker
// reads the staged sum only after the copy's event.
TEST(OffloadParity, GradientSumsOnTheDeviceBehindTheForwardEqualTheDeviceRun) {
  ExpectHostPlacementsEqualTheDeviceRun({1.0, 0.5}, true);
}

// sub_group_size 0 (DeepSpeed: one optimizer sub-group per parameter) is one NVMe chunk per
// unit's shard, and the step is the device run's, bitwise; so is a chunk smaller than a shard.
TEST(OffloadParity, SubGroupSizeZeroIsOneChunkPerShard) {
  ShardManagerOptions o;
  o.offload.sub_group_size = 0;
  EXPECT_EQ(NvmeChunkNumel(o, 10'000), NvmeChunkNumel(ShardManagerOptions{}, 10'000));
  EXPECT_GE(NvmeChunkNumel(o, 10'000), 10'000);
  NvmeDir dir;
  RunConfig base{.stage = ZeroStage::k3, .world = 2, .steps = 4};
  const RunResult device = Train(base);
  ASSERT_EQ(device.error, "");
  for (int64_t sub_group : {int64_t{0}, int64_t{1000}}) {
    RunConfig nvme = base;
    nvme.placement = {.optimizer = MemoryTier::kNvme, .params = MemoryTier::kDevice};
    nvme.nvme_path = dir.str();
    nvme.sub_group_size = sub_group;
    const RunResult r = Train(nvme);
    ASSERT_EQ(r.error, "") << sub_group;
    EXPECT_EQ(r.params, device.params) << "sub_group_size " << sub_group;
  }
}

// [Note: the norm taken by the last add]: a host-tier shard's norm part taken by the add that
// the step before's count says is its last gives bitwise the device run's norms and parameters,
// and the pass it saves is saved exactly when the prediction holds: micro-batches 2, 3, 3, 1, 1, 2
// at stages 1-3, one and two ranks, the host step behind the forward, clipping.
TEST(OffloadParity, TheNormTakenByTheLastAddEqualsTheDeviceRun) {
  for (ZeroStage stage : {ZeroStage::k1, ZeroStage::k2, ZeroStage::k3}) {
    for (int world : {1, 2}) {
      RunConfig base{.stage = stage,
                     .world = world,
                     .clip = 0.05f,
                     .micro_batch_pattern = {2, 3, 3, 1, 1, 2},
                     .steps = 6,
                     .reduce_bucket_size = 1};
      RunConfig host = base;
      host.placement = {.optimizer = MemoryTier::kPinnedHost};
      const RunResult device = Train(base), r = Train(host);
      const std::string name = StrCat("stage ", static_cast<int>(stage), ", world ", world);
      ASSERT_EQ(device.error, "") << name;
      ASSERT_EQ(r.error, "") << name;
      EXPECT_EQ(r.params, device.params) << name;
      EXPECT_EQ(r.grad_norms, device.grad_norms) << name;
      ASSERT_EQ(r.norm_passes.size(), 6u) << name;
      const int64_t units = r.norm_passes[0];  // the first step has no count to go by
      EXPECT_GT(units, 0) << name;
      std::vector<int64_t> per_step = {units};
      for (size_t s = 1; s < r.norm_passes.size(); ++s) {
        per_step.push_back(r.norm_passes[s] - r.norm_passes[s - 1]);
      }
      // Stage 1 reduces each unit once a step, at the step: every later step's last add is
      // predicted. Stages 2-3 (reduce_bucket_size 1) add each micro-batch's slice as its unit's
      // backward ends: the prediction holds where the count repeats (3 after 3, 1 after 1).
      const std::vector<int64_t> want =
          stage == ZeroStage::k1 ? std::vector<int64_t>{units, 0, 0, 0, 0, 0}
                                 : std::vector<int64_t>{units, units, 0, units, 0, units};
      EXPECT_EQ(per_step, want) << name;
    }
  }
}

TEST(OffloadParity, Bf16ComputeOnEveryTierEqualsTheDeviceRun) {
  // bf16 compute copies written by the CPU step into host memory or an NVMe region, and bf16
  // gradients reduced into fp32 shards on the host tiers (what configs/gpt2-xl-nvme.json runs).
  NvmeDir dir;
  for (int world : {1, 2}) {
    RunConfig base{.stage = ZeroStage::k3, .world = world, .compute = DType::kBF16, .steps = 5};
    const RunResult device = Train(base);
    ASSERT_EQ(device.error, "");
    for (MemoryTier tier : {MemoryTier::kPinnedHost, MemoryTier::kNvme}) {
      RunConfig c = base;
      c.placement = {.optimizer = tier, .params = tier};
      c.nvme_path = dir.str();
      const RunResult r = Train(c);
      ASSERT_EQ(r.error, "");
      EXPECT_EQ(r.params, device.params) << MemoryTierName(tier) << " world " << world;
      EXPECT_EQ(r.grad_norms, device.grad_norms) << MemoryTierName(tier) << " world " << world;
    }
  }
}

// A model that changes its unit order mid-step (a branch): a shard fetched ahead for a use that
// does not come is given back at the step, and a unit needed out of order still finds a fetch
// buffer (fetch-ahead leaves one) — with two fetch buffers, the fewest that prefetch at all.
TEST(OffloadParity, ChangingTheUnitOrderMidStepWithNvmeParameters) {
  NvmeDir dir;
  std::vector<std::vector<float>> results[2];
  for (int nvme = 0; nvme < 2; ++nvme) {
    auto group = *CreateLoopbackGroup(1, {}, nullptr);
    MemoryTracker tracker;
    ShardManagerOptions o = Options({.stage = ZeroStage::k3});
    if (nvme == 1) o.placement = {.optimizer = MemoryTier::kNvme, .params = MemoryTier::kNvme};
    o.offload.nvme_path = dir.str();
    o.offload.param_buffer_count = 2;
    o.stage3_prefetch_bucket_size = 0;  // no gathers ahead: fetches ahead keep their buffers
    StatusOr<MlpRun> run = MakeMlpRun(o, *group[0], tracker);
    ASSERT_TRUE(run.ok()) << run.status();
    ShardManager& m = *run->manager;
    auto normal_step = [&](int step) {
      ASSERT_TRUE(MlpForwardBackward(m, run->units, step * kGlobalBatch, 4, 1.0f).ok());
      ASSERT_TRUE(m.Step({.lr = kLr}).ok());
    };
    normal_step(0);  // records the order
    // Step 2: unit 0 as recorded (prefetch fetches the next), then unit 3 out of order.
    for (int u : {0, 3}) {
      StatusOr<UnitScope> s = m.ForwardScope(run->units[u]);
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_TRUE(s->End().ok());
    }
    {
      StatusOr<UnitScope> s = m.BackwardScope(run->units[3]);
      ASSERT_TRUE(s.ok()) << s.status();
      TensorView g = s->grad(0);
      for (int64_t i = 0; i < g.numel(); ++i) g.data_as<float>()[i] += 0.01f * (i % 7);
      ASSERT_TRUE(s->End().ok());
    }
    {  // unit 0's backward too (adding nothing), or Step refuses its forward without one
      StatusOr<UnitScope> s = m.BackwardScope(run->units[0]);
      ASSERT_TRUE(s.ok()) << s.status();
      ASSERT_TRUE(s->End().ok());
    }
    StatusOr<StepResult> r = m.Step({.lr = kLr});
    ASSERT_TRUE(r.ok()) << r.status();
    normal_step(2);  // re-records, then trains as usual
    normal_step(3);
    for (int u : run->units) {
      for (size_t i = 0; i < m.unit(u).layout().params().size(); ++i) {
        std::vector<float> full(m.unit(u).layout().params()[i].numel());
        ASSERT_TRUE(ShardManagerState(m).GatherMaster(u, static_cast<int>(i), full).ok());
        results[nvme].push_back(std::move(full));
      }
    }
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_TRUE(dir.empty());
}

TEST(OffloadTiers, StateIsAccountedOnItsTierAndLeavesTheDevice) {
  NvmeDir dir;
  auto group = *CreateLoopbackGroup(1, {}, nullptr);
  for (MemoryTier tier : {MemoryTier::kDevice, MemoryTier::kPinnedHost, MemoryTier::kNvme}) {
    MemoryTracker tracker;
    ShardManagerOptions o = Options({.stage = ZeroStage::k3});
    o.placement = {.optimizer = tier, .params = tier};
    o.offload.nvme_path = dir.str();
    StatusOr<MlpRun> run = MakeMlpRun(o, *group[0], tracker);
    ASSERT_TRUE(run.ok()) << run.status();
    int64_t master = 0;
    for (int u : run->units) master += run->manager->unit(u).layout().shard_numel() * 4;
    const MemorySnapshot s = tracker.Snapshot();
    EXPECT_EQ(s.Get(tier, MemoryCategory::kOptimizerState).current, 2 * master)
        << MemoryTierName(tier);
    EXPECT_EQ(s.Get(tier, MemoryCategory::kGradients).current, master) << MemoryTierName(tier);
    if (tier != MemoryTier::kDevice) {
      EXPECT_EQ(s.Get(MemoryTier::kDevice, MemoryCategory::kOptimizerState).current, 0);
      EXPECT_EQ(s.Get(tier, MemoryCategory::kParameters).current, master + master)
          << "fp32 master and fp32 compute shard";
    }
    if (tier == MemoryTier::kNvme) {
      ASSERT_NE(run->manager->nvme_store(), nullptr);
      EXPECT_GT(s.Get(MemoryTier::kPinnedHost, MemoryCategory::kStaging).current, 0);
    }
  }
  EXPECT_TRUE(dir.empty());
}

TEST(OffloadTiers, AnNvmeFaultFailsTheStepNamingTheFile) {
  NvmeDir dir;
  for (int64_t k : {5, 40}) {  // during initialisation, and during training
    RunConfig c{.stage = ZeroStage::k3, .world = 2, .steps = 3};
    c.placement = {.optimizer = MemoryTier::kNvme, .params = MemoryTier::kNvme};
    c.nvme_path = dir.str();
    RunResult result;
    CommOptions comm_options;
    comm_options.timeout = std::chrono::seconds(4);  // the healthy rank waits this long
    const Status status = RunLoopbackRanks(2, comm_options, nullptr, [&](Communicator& comm) {
      ShardManagerOptions o = Options(c);
      if (comm.rank() == 0) {
        o.offload.fail_io_request = k;
        o.offload.fail_io_errno = ENOSPC;
      }
      MemoryTracker tracker;
      ZR_ASSIGN_OR_RETURN(MlpRun run, MakeMlpRun(o, comm, tracker));
      for (int step = 0; step < c.steps; ++step) {
        ZR_RETURN_IF_ERROR(MlpForwardBackward(*run.manager, run.units, step * kGlobalBatch, 6,
                                              run.manager->loss_scale())
                               .status());
        ZR_RETURN_IF_ERROR(run.manager->Step({.lr = kLr}).status());
      }
      return absl::OkStatus();
    });
    ASSERT_FALSE(status.ok()) << "fault at request " << k;
    EXPECT_NE(status.message().find("zerort-rank0"), std::string::npos) << status;
    EXPECT_NE(status.message().find("No space left"), std::string::npos) << status;
    EXPECT_TRUE(dir.empty());
  }
}

TEST(OffloadTiers, NotEnoughSpaceOrABadPathIsAConfigError) {
  auto group = *CreateLoopbackGroup(1, {}, nullptr);
  MemoryTracker tracker;
  ShardManagerOptions o = Options({.stage = ZeroStage::k2});
  o.placement.optimizer = MemoryTier::kNvme;
  o.offload.nvme_path = "/nonexistent/zerort";
  StatusOr<MlpRun> run = MakeMlpRun(o, *group[0], tracker);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument) << run.status();
  // /dev/shm is a tmpfs of bounded size: a parameter list far beyond it must be refused before
  // anything is written, saying how much is needed.
  NvmeDir dir;
  o.offload.nvme_path = dir.str();
  StatusOr<std::unique_ptr<ShardManager>> m =
      ShardManager::Create(o, {.dp = group[0].get(), .device_allocator = nullptr});
  EXPECT_FALSE(m.ok());  // a device allocator is required
  auto allocator = MakeCpuCachingAllocator(&tracker);
  m = ShardManager::Create(
      o, {.dp = group[0].get(), .device_allocator = allocator.get(), .tracker = &tracker});
  ASSERT_TRUE(m.ok()) << m.status();
  // 2^40 elements in one parameter: 4 TiB of master alone, not allocated before the check.
  ASSERT_TRUE((*m)->AddUnit("huge", {{"huge.weight", {int64_t{1} << 20, int64_t{1} << 20}}}).ok());
  const Status init = (*m)->Initialize(MlpInit);
  EXPECT_EQ(init.code(), absl::StatusCode::kInvalidArgument) << init;
  EXPECT_NE(init.message().find("GiB"), std::string::npos) << init;
  EXPECT_TRUE(dir.empty());
}

}  // namespace
}  // namespace zerort
