// embed_mlp: a trainer with its own model code (a 3-layer MLP regressing a fixed random
// function) that uses zerort only for state: each layer is a unit of the shard manager, gathered
// for its forward and backward and released after, with ZeRO-3 and AdamW. Two ways to drive the
// same model code:
//   (default)  manual scopes: the trainer opens each unit's Forward and Backward scope itself;
//              one process runs --ranks loopback ranks (4), or one rank per process under mpirun
//   --driver   zerort::Session (setup in one call), zerort::LayerDriver (the scopes done for it)
//              and zerort::ManagerCheckpoints (--checkpoint DIR: resume from DIR, save at the end)
// Both print the final loss and gradient norm exactly ("%a"), so that they can be compared
// bitwise. With `--nvme DIR` the optimizer state and the parameter shards live on NVMe
// (ZeRO-Infinity): placement is one option, the trainer's code does not change. `--fp16` computes
// in fp16 with dynamic loss scaling (the model code reads any float dtype through LoadAsFloat;
// the loss's gradient is seeded with loss_scale(), and the driver is told so: Backward(scale)).
// `--mistake NAME` makes one of the misuses zerort must report (make test-install runs each).
// Prints the loss; exits 1 if it did not fall by half or zerort reported an error.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "zerort/checkpoint/manager_checkpoint.h"
#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/mpi_communicator.h"
#include "zerort/runtime/session.h"
#include "zerort/sharding/layer_driver.h"
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

// The trainer's own model code: each layer's forward and backward over this micro-batch's
// activations, given its parameters (and gradients to add into). zerort never sees this.
class Mlp {
 public:
  void SetBatch(Batch b) {
    batch_ = std::move(b);
    acts_.assign(kLayers + 1, {});
    acts_[0] = batch_.x;
  }
  Status Forward(int l, std::span<const zerort::TensorView> p) {
    const zerort::TensorView &w = p[0], &bias = p[1];
    acts_[l + 1].clear();
    for (const std::vector<float>& in : acts_[l]) {
      std::vector<float> out(kWidths[l + 1]);
      for (int o = 0; o < kWidths[l + 1]; ++o) {
        float acc = At(bias, o);
        for (int i = 0; i < kWidths[l]; ++i) acc += At(w, o * kWidths[l] + i) * in[i];
        out[o] = l + 1 < kLayers ? std::tanh(acc) : acc;
      }
      acts_[l + 1].push_back(std::move(out));
    }
    return absl::OkStatus();
  }
  // Mean squared error over the micro-batch; seeds the output gradient with loss_scale.
  double Loss(float loss_scale) {
    const int n = static_cast<int>(batch_.x.size());
    double loss = 0;
    delta_.assign(n, std::vector<float>(kWidths[kLayers]));
    for (int s = 0; s < n; ++s) {
      for (int o = 0; o < kWidths[kLayers]; ++o) {
        const float d = acts_[kLayers][s][o] - batch_.y[s][o];
        loss += static_cast<double>(d) * d / n;
        delta_[s][o] = 2 * d / n * loss_scale;
      }
    }
    return loss;
  }
  Status Backward(int l, std::span<const zerort::TensorView> p,
                  std::span<const zerort::TensorView> g) {
    const int n = static_cast<int>(batch_.x.size());
    const zerort::TensorView &w = p[0], &gw = g[0], &gb = g[1];
    std::vector<std::vector<float>> prev(n, std::vector<float>(kWidths[l], 0.0f));
    for (int o = 0; o < kWidths[l + 1]; ++o) {
      float db = 0;
      for (int s = 0; s < n; ++s) db += delta_[s][o];
      AddAt(gb, o, db);
      for (int i = 0; i < kWidths[l]; ++i) {
        float dw = 0;
        for (int s = 0; s < n; ++s) {
          dw += delta_[s][o] * acts_[l][s][i];
          prev[s][i] += delta_[s][o] * At(w, o * kWidths[l] + i);
        }
        AddAt(gw, o * kWidths[l] + i, dw);
      }
    }
    for (int s = 0; s < n && l > 0; ++s) {
      for (int i = 0; i < kWidths[l]; ++i) prev[s][i] *= 1 - acts_[l][s][i] * acts_[l][s][i];
    }
    delta_ = std::move(prev);
    return absl::OkStatus();
  }

 private:
  Batch batch_;
  std::vector<std::vector<std::vector<float>>> acts_;
  std::vector<std::vector<float>> delta_;
};

std::vector<zerort::ParamSpec> LayerParams(int l, bool transposed = false) {
  const std::string name = "fc" + std::to_string(l);
  zerort::Shape w = {kWidths[l + 1], kWidths[l]};
  if (transposed) std::swap(w[0], w[1]);
  return {{name + ".weight", w, true}, {name + ".bias", {kWidths[l + 1]}, false}};
}

// Scaled-normal initialisation, identical on every rank (`rank_offset` breaks that on purpose).
zerort::Initializer Init(int rank_offset = 0) {
  return [rank_offset](const zerort::ParamSpec& spec, uint64_t seed, std::span<float> full) {
    std::mt19937 rng(
        static_cast<uint32_t>(seed + std::hash<std::string>{}(spec.name) + rank_offset));
    const float stddev =
        spec.shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(spec.shape[1])) : 0.0f;
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (float& v : full) v = stddev * n(rng);
  };
}

struct Args {
  bool driver = false;             // --driver: Session, LayerDriver and ManagerCheckpoints
  int ranks = 4;                   // --ranks N: loopback ranks in one process (manual scopes)
  int steps = 150;                 // --steps N
  std::string nvme_path;           // --nvme DIR: optimizer state and parameters on NVMe
  std::string checkpoint_dir;      // --checkpoint DIR (--driver): resume from it, save at the end
  std::string mistake;             // --mistake NAME (manual scopes): misuse that must fail loudly
  bool default_threshold = false;  // --default-threshold: DeepSpeed's persistence threshold
  bool fp16 = false;               // --fp16: fp16 compute with dynamic loss scaling
  double timeout_s = 600;          // --collective-timeout S: the watchdog's limit
};

zerort::ShardManagerOptions Options(const Args& args) {
  zerort::ShardManagerOptions options;
  options.stage = zerort::ZeroStage::k3;
  if (!args.default_threshold) {
    options.stage3_param_persistence_threshold = 0;  // gather and release every layer
  }
  options.optimizer.weight_decay = 0.01f;
  options.gradient_clipping = 1.0f;
  options.poison_released = true;  // debug: released weights read as NaN, not stale numbers
  if (args.fp16) {
    // Weights gathered and computed in fp16 (the views hold zerort::Half: this trainer reads
    // and writes them through LoadAsFloat / StoreFromFloat), gradients reduced in fp32, fp32
    // masters; the loss's gradient is seeded with loss_scale(), which starts at 2^16 and halves
    // on an overflow (that step is skipped on every rank).
    options.compute_dtype = zerort::DType::kF16;
    options.loss_scale.dynamic = true;
  }
  if (args.mistake == "rank-skips-backward") options.reduce_bucket_size = 1;  // unit by unit
  if (!args.nvme_path.empty()) {
    options.placement = {.optimizer = zerort::MemoryTier::kNvme,
                         .params = zerort::MemoryTier::kNvme};
    options.offload.nvme_path = args.nvme_path;
  }
  return options;
}

// The losses, averaged over the ranks, step by step (every rank gets them).
struct Losses {
  std::vector<double> per_step;
  double last_grad_norm = 0;
};

Status Report(const Args& args, zerort::Communicator& dp, const Losses& l,
              zerort::MemoryTracker& tracker, int64_t first_step, bool* fell) {
  if (l.per_step.empty()) return absl::OkStatus();
  const double first = l.per_step.front(), last = l.per_step.back();
  if (dp.rank() == 0) {
    const auto usage =
        tracker.Usage(zerort::MemoryTier::kDevice, zerort::MemoryCategory::kGatheredWeights);
    std::printf(
        "embed_mlp (%s): %d ranks, ZeRO-3%s; steps %lld-%lld; loss %.5f -> %.5f; gathered weights "
        "peak %lld bytes (now %lld); on NVMe %lld bytes\n",
        args.driver ? "layer driver" : "manual scopes", dp.size(),
        args.nvme_path.empty() ? "" : " with optimizer state and parameters on NVMe",
        static_cast<long long>(first_step),
        static_cast<long long>(first_step + static_cast<int64_t>(l.per_step.size())), first, last,
        static_cast<long long>(usage.peak), static_cast<long long>(usage.current),
        static_cast<long long>(tracker.InUse(zerort::MemoryTier::kNvme).peak));
    // Exact, for comparing runs bitwise (the layer driver against the manual scopes).
    std::printf("final loss %a grad norm %a\n", last, l.last_grad_norm);
  }
  // A resumed run starts where the loss has already fallen.
  *fell = first_step > 0 || last < 0.5 * first;
  return absl::OkStatus();
}

double MeanOverRanks(zerort::Communicator& dp, double loss) {
  float mean = static_cast<float>(loss);
  ZR_CHECK_OK(dp.AllReduce(&mean, &mean, 1, zerort::DType::kF32, zerort::ReduceOp::kAvg));
  return mean;
}

int64_t FirstSample(int64_t step, zerort::Communicator& dp) {
  return (step * dp.size() + dp.rank()) * kBatchPerRank;
}

// The manual scopes: every layer's forward and backward in its unit's scope, by hand.
Status TrainManual(const Args& args, zerort::Communicator& dp, bool* fell) {
  zerort::MemoryTracker tracker;
  std::unique_ptr<zerort::Allocator> allocator = zerort::MakeCpuCachingAllocator(&tracker);
  ZR_ASSIGN_OR_RETURN(
      auto manager,
      zerort::ShardManager::Create(
          Options(args), {.dp = &dp, .device_allocator = allocator.get(), .tracker = &tracker}));
  const bool odd = dp.rank() == 1;
  std::vector<int> units;
  for (int l = 0; l < kLayers; ++l) {
    ZR_ASSIGN_OR_RETURN(
        int u, manager->AddUnit("fc" + std::to_string(l),
                                LayerParams(l, odd && l == 0 && args.mistake == "rank-shape")));
    units.push_back(u);
  }
  ZR_RETURN_IF_ERROR(manager->Initialize(Init(args.mistake == "rank-init" ? dp.rank() : 0)));
  Mlp mlp;
  Losses losses;
  std::vector<zerort::TensorView> kept;  // --mistake stale-view: fc0's views from step 0
  void* stale = nullptr;                 // --mistake stale-pointer: fc0's weights at step 0
  for (int step = 0; step < args.steps; ++step) {
    mlp.SetBatch(MakeBatch(FirstSample(step, dp), kBatchPerRank));
    for (int l = 0; l < kLayers; ++l) {
      if (l == 0 && step > 0 && args.mistake == "stale-view") {
        ZR_RETURN_IF_ERROR(mlp.Forward(l, kept));  // the mistake: last step's views, no scope
        continue;
      }
      ZR_ASSIGN_OR_RETURN(zerort::UnitScope scope, manager->ForwardScope(units[l]));
      if (l == 0 && step == 0) kept = {scope.param(0), scope.param(1)};
      if (l == 0 && step == 0) stale = scope.param(0).data();
      if (l == 0 && step > 0 && args.mistake == "stale-pointer") {
        // The mistake: inside the scope, but reading fc0's weights through a raw pointer kept
        // from step 0 (poison_released makes it read NaN: [Note: poisoned buffers]).
        const zerort::TensorView w(stale, scope.param(0).dtype(), scope.param(0).shape());
        ZR_RETURN_IF_ERROR(mlp.Forward(l, std::vector{w, scope.param(1)}));
      } else {
        ZR_RETURN_IF_ERROR(mlp.Forward(l, std::vector{scope.param(0), scope.param(1)}));
      }
      ZR_RETURN_IF_ERROR(scope.End());
    }
    const double loss = mlp.Loss(manager->loss_scale());
    if (!std::isfinite(loss)) {
      return absl::InternalError("step " + std::to_string(step) + ": the loss is " +
                                 std::to_string(loss) + " (a released buffer read?)");
    }
    for (int l = kLayers - 1; l >= 0; --l) {
      const bool skip = l == 1 && (args.mistake == "skip-backward" ||
                                   (args.mistake == "rank-skips-backward" && odd));
      if (skip) continue;  // the mistake: this layer's backward (and its gradient) skipped
      ZR_ASSIGN_OR_RETURN(zerort::UnitScope scope, manager->BackwardScope(units[l]));
      ZR_RETURN_IF_ERROR(mlp.Backward(l, std::vector{scope.param(0), scope.param(1)},
                                      std::vector{scope.grad(0), scope.grad(1)}));
      const zerort::TensorView bias_grad = scope.grad(1);
      ZR_RETURN_IF_ERROR(scope.End());
      if (l == 1 && args.mistake == "late-grad-write") {
        AddAt(bias_grad, 0, 1.0f);  // the mistake: a gradient written after the scope ended
      }
    }
    losses.per_step.push_back(MeanOverRanks(dp, loss));
    ZR_ASSIGN_OR_RETURN(zerort::StepResult r, manager->Step({.lr = 3e-3f}));
    losses.last_grad_norm = r.grad_norm;
  }
  return Report(args, dp, losses, tracker, 0, fell);
}

// The layer driver: setup in one call, the scopes done by the driver, checkpoints of its own.
Status TrainWithDriver(const Args& args, int* argc, char*** argv, bool* fell) {
  Mlp mlp;
  std::vector<zerort::Layer> layers;
  for (int l = 0; l < kLayers; ++l) {
    layers.push_back(
        {.name = "fc" + std::to_string(l),
         .params = LayerParams(l),
         .forward = [&mlp, l](const auto& t) { return mlp.Forward(l, t.params); },
         .backward = [&mlp, l](const auto& t) { return mlp.Backward(l, t.params, t.grads); }});
  }
  // zerort begins
  ZR_ASSIGN_OR_RETURN(auto session,
                      zerort::Session::Start(argc, argv, {.collective_timeout_s = args.timeout_s}));
  ZR_ASSIGN_OR_RETURN(auto model, zerort::LayerDriver::Create(*session, Options(args), layers));
  ZR_RETURN_IF_ERROR(model->Initialize(Init()));
  zerort::ManagerCheckpoints checkpoints(args.checkpoint_dir, model->manager());
  std::optional<zerort::TrainerState> resumed;
  if (!args.checkpoint_dir.empty()) {
    ZR_ASSIGN_OR_RETURN(resumed, checkpoints.LoadLatest());
  }
  const int64_t first_step = resumed ? resumed->step : 0;
  Losses losses;
  for (int64_t step = first_step; step < args.steps; ++step) {
    mlp.SetBatch(MakeBatch(FirstSample(step, session->world()), kBatchPerRank));
    ZR_RETURN_IF_ERROR(model->Forward());
    const double loss = mlp.Loss(model->loss_scale());
    if (args.fp16 && args.mistake != "fp16-unsaid") {
      ZR_RETURN_IF_ERROR(model->Backward(model->loss_scale()));  // the scale it seeded
    } else {
      ZR_RETURN_IF_ERROR(model->Backward());  // fp16 mistake: refused, naming loss_scale()
    }
    losses.per_step.push_back(MeanOverRanks(session->world(), loss));
    ZR_ASSIGN_OR_RETURN(zerort::StepResult r, model->Step(3e-3f));
    losses.last_grad_norm = r.grad_norm;
  }
  if (!args.checkpoint_dir.empty()) ZR_RETURN_IF_ERROR(checkpoints.Save({.step = args.steps}));
  // zerort ends
  return Report(args, session->world(), losses, session->tracker(), first_step, fell);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--driver") {
      args.driver = true;
    } else if (a == "--default-threshold") {
      args.default_threshold = true;
    } else if (a == "--fp16") {
      args.fp16 = true;
    } else if (next != nullptr && a == "--nvme") {
      args.nvme_path = argv[++i];
    } else if (next != nullptr && a == "--checkpoint") {
      args.checkpoint_dir = argv[++i];
    } else if (next != nullptr && a == "--mistake") {
      args.mistake = argv[++i];
    } else if (next != nullptr && a == "--collective-timeout") {
      args.timeout_s = std::atof(argv[++i]);
    } else if (next != nullptr && (a == "--ranks" || a == "--steps")) {
      (a == "--ranks" ? args.ranks : args.steps) = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: embed_mlp [--driver] [--ranks N] [--steps N] [--nvme DIR] "
                   "[--checkpoint DIR] [--default-threshold] [--fp16] [--collective-timeout S] "
                   "[--mistake skip-backward|rank-skips-backward|rank-shape|rank-init|"
                   "stale-view|stale-pointer|late-grad-write|fp16-unsaid]\n");
      return 2;
    }
  }
  bool fell = true;
  Status status;
  if (args.driver) {
    status = TrainWithDriver(args, &argc, &argv, &fell);
  } else {
    auto launch = zerort::DiscoverLaunchEnv(zerort::ProcessEnv());
    if (!launch.ok()) {
      std::fprintf(stderr, "%s\n", launch.status().ToString().c_str());
      return 2;
    }
    zerort::ConfigureLogging({launch->rank, launch->world_size});
    if (launch->world_size > 1) {
      auto mpi = zerort::MpiContext::Init(&argc, &argv, {.install_signal_dump = true});
      if (!mpi.ok()) {
        std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str());
        return 1;
      }
      zerort::CommOptions comm_options;
      comm_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1e3));
      auto world = (*mpi)->World(comm_options);
      status = world.ok() ? TrainManual(args, **world, &fell) : world.status();
      // Now, not after MPI_Finalize: that waits for the other ranks, which may be blocked in a
      // collective this rank will never join until their watchdog ends the run.
      if (!status.ok()) {
        std::fprintf(stderr, "embed_mlp: %s\n", status.ToString().c_str());
        (*mpi)->EndAfterError(1, std::chrono::seconds(5));  // ends the job if the others wait
        return 1;
      }
    } else {
      std::vector<char> fells(static_cast<size_t>(args.ranks), 1);
      status = zerort::RunLoopbackRanks(args.ranks, {}, nullptr, [&](zerort::Communicator& dp) {
        bool f = true;
        Status s = TrainManual(args, dp, &f);
        fells[static_cast<size_t>(dp.rank())] = f;
        return s;
      });
      for (char f : fells) fell = fell && f;
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "embed_mlp: %s\n", status.ToString().c_str());
    return 1;
  }
  if (!fell) std::fprintf(stderr, "embed_mlp: the loss did not fall by half\n");
  return fell ? 0 : 1;
}
