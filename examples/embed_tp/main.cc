// embed_tp_mlp: a trainer with its own two-layer MLP (16 -> 64 -> 4, GELU) split Megatron-style
// over a tensor-parallel group of 2: fc1 column-parallel (each rank 32 of the hidden channels),
// fc2 row-parallel (its bias added once, after the reduction), with zerort's public pieces
// (layers/tp_layers.h) on the CPU kernels, while the shard manager holds each rank's parts
// (ZeRO-3 over the data-parallel group; the gradient norm agreed over the tensor-parallel group,
// fc2's bias counted once). Under `mpirun -np N` (N even): data N/2 x tensor 2. On one process it
// trains at tp 1 and tp 2 (loopback ranks) and checks that the losses agree to 1e-5. Exits 1 if
// the loss did not fall by half or the layouts disagree.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "zerort/layers/tp_layers.h"
#include "zerort/runtime/device_mesh.h"
#include "zerort/runtime/launch_env.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/mpi_communicator.h"
#include "zerort/sharding/shard_manager.h"

namespace {

using zerort::Status;
using zerort::StatusOr;

constexpr int kIn = 16, kHidden = 64, kOut = 4, kBatch = 16, kSteps = 150;

// y = sin(A x) for a fixed A; sample s depends only on s.
void MakeBatch(int64_t first, std::vector<float>& x, std::vector<float>& y) {
  std::mt19937 ra(99);
  std::normal_distribution<float> n(0.0f, 0.4f);
  std::vector<float> a(kOut * kIn);
  for (float& v : a) v = n(ra);
  x.assign(kBatch * kIn, 0);
  y.assign(kBatch * kOut, 0);
  for (int s = 0; s < kBatch; ++s) {
    std::mt19937 rng(static_cast<uint32_t>(first + s));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int i = 0; i < kIn; ++i) x[s * kIn + i] = u(rng);
    for (int o = 0; o < kOut; ++o) {
      float acc = 0;
      for (int i = 0; i < kIn; ++i) acc += a[o * kIn + i] * x[s * kIn + i];
      y[s * kOut + o] = std::sin(acc);
    }
  }
}

// Each element a function of (name, global position): the same model at any tensor-parallel size.
void Init(const zerort::ParamSpec& spec, uint64_t, std::span<float> local) {
  const bool bias = spec.shape.size() == 1;
  const float stddev = bias ? 0.0f : 1.0f / std::sqrt(static_cast<float>(spec.global_shape()[1]));
  for (size_t i = 0; i < local.size(); ++i) {
    const int64_t g = zerort::GlobalIndex(spec, static_cast<int64_t>(i));
    std::mt19937 rng(
        static_cast<uint32_t>(std::hash<std::string>{}(spec.name) ^ (g * 2654435761u)));
    std::normal_distribution<float> n(0.0f, 1.0f);
    local[i] = stddev * n(rng);
  }
}

// Trains on `world` split into data x tensor `tp`; `losses` (world rank 0) gets the mean loss of
// each step.
Status Train(zerort::Communicator& world, int tp, std::vector<double>& losses) {
  ZR_ASSIGN_OR_RETURN(
      auto mesh, zerort::DeviceMesh::Create(world, {.data = world.size() / tp, .tensor = tp}, {}));
  zerort::MemoryTracker tracker;
  auto allocator = zerort::MakeCpuCachingAllocator(&tracker);
  auto kernels = zerort::MakeCpuModelKernels(zerort::CpuPrecision::kFloat);
  zerort::ShardManagerOptions options;
  options.stage = zerort::ZeroStage::k3;
  options.stage3_param_persistence_threshold = 0;
  options.gradient_clipping = 1.0f;
  ZR_ASSIGN_OR_RETURN(auto manager, zerort::ShardManager::Create(
                                        options, {.dp = &mesh->data(),
                                                  .device_allocator = allocator.get(),
                                                  .model_parallel = &mesh->model_parallel(),
                                                  .tensor_parallel_rank = mesh->coord().tensor,
                                                  .tensor_parallel = &mesh->tensor()}));
  const int r = mesh->coord().tensor;
  using zerort::TensorSplit;
  auto split = [&](const char* name, zerort::Shape shape, bool decay, TensorSplit how) {
    return zerort::TensorParallelSpec(name, shape, decay, how, tp, r);
  };
  ZR_ASSIGN_OR_RETURN(auto w1, split("fc1.weight", {kHidden, kIn}, true, TensorSplit::kColumn));
  ZR_ASSIGN_OR_RETURN(auto b1, split("fc1.bias", {kHidden}, false, TensorSplit::kColumn));
  ZR_ASSIGN_OR_RETURN(auto w2, split("fc2.weight", {kOut, kHidden}, true, TensorSplit::kRow));
  ZR_ASSIGN_OR_RETURN(auto b2, split("fc2.bias", {kOut}, false, TensorSplit::kRow));
  ZR_ASSIGN_OR_RETURN(int fc1, manager->AddUnit("fc1", {w1, b1}));
  ZR_ASSIGN_OR_RETURN(int fc2, manager->AddUnit("fc2", {w2, b2}));
  ZR_RETURN_IF_ERROR(manager->Initialize(Init));

  const zerort::TpContext ctx{{tp > 1 ? &mesh->tensor() : nullptr}, kernels.get(), allocator.get()};
  const int local = kHidden / tp;
  std::vector<float> x, y, h(kBatch * local), a(kBatch * local), out(kBatch * kOut),
      dout(kBatch * kOut), da(kBatch * local), dh(kBatch * local);
  for (int step = 0; step < kSteps; ++step) {
    // The ranks of one tensor-parallel group train on the same samples.
    MakeBatch((int64_t{step} * mesh->shape().data + mesh->coord().data) * kBatch, x, y);
    {
      ZR_ASSIGN_OR_RETURN(zerort::UnitScope s, manager->ForwardScope(fc1));
      ZR_RETURN_IF_ERROR(zerort::ColumnParallelForward(ctx, h.data(), x.data(), s.param(0).data(),
                                                       s.param(1).data(), kBatch, kIn, local));
      ZR_RETURN_IF_ERROR(s.End());
    }
    ZR_RETURN_IF_ERROR(kernels->Gelu(a.data(), h.data(), kBatch * local));
    {
      ZR_ASSIGN_OR_RETURN(zerort::UnitScope s, manager->ForwardScope(fc2));
      ZR_RETURN_IF_ERROR(zerort::RowParallelForward(ctx, out.data(), a.data(), s.param(0).data(),
                                                    s.param(1).data(), kBatch, local, kOut));
      ZR_RETURN_IF_ERROR(s.End());
    }
    double loss = 0;
    for (int i = 0; i < kBatch * kOut; ++i) {
      const float d = out[i] - y[i];
      loss += static_cast<double>(d) * d / (kBatch * kOut);
      dout[i] = 2 * d / (kBatch * kOut) * manager->loss_scale();
    }
    {
      ZR_ASSIGN_OR_RETURN(zerort::UnitScope s, manager->BackwardScope(fc2));
      std::fill(da.begin(), da.end(), 0.0f);
      ZR_RETURN_IF_ERROR(zerort::RowParallelBackward(ctx, da.data(), s.grad(0).data(),
                                                     s.grad(1).data(), dout.data(), a.data(),
                                                     s.param(0).data(), kBatch, local, kOut));
      ZR_RETURN_IF_ERROR(s.End());
    }
    std::fill(dh.begin(), dh.end(), 0.0f);
    ZR_RETURN_IF_ERROR(kernels->GeluBackward(dh.data(), h.data(), da.data(), kBatch * local));
    {
      ZR_ASSIGN_OR_RETURN(zerort::UnitScope s, manager->BackwardScope(fc1));
      ZR_RETURN_IF_ERROR(zerort::ColumnParallelBackward(ctx, nullptr, s.grad(0).data(),
                                                        s.grad(1).data(), dh.data(), x.data(),
                                                        s.param(0).data(), kBatch, kIn, local));
      ZR_RETURN_IF_ERROR(s.End());
    }
    ZR_ASSIGN_OR_RETURN(zerort::StepResult result, manager->Step({.lr = 3e-3f}));
    float mean = static_cast<float>(loss);
    ZR_RETURN_IF_ERROR(
        world.AllReduce(&mean, &mean, 1, zerort::DType::kF32, zerort::ReduceOp::kAvg));
    if (world.rank() == 0) {
      losses.push_back(mean);
      if (step % 30 == 0) {
        std::printf("tp %d step %3d  loss %.5f  grad norm %.4f\n", tp, step, mean,
                    result.grad_norm);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  auto launch = zerort::DiscoverLaunchEnv(zerort::ProcessEnv());
  if (!launch.ok()) {
    std::fprintf(stderr, "%s\n", launch.status().ToString().c_str());
    return 2;
  }
  zerort::ConfigureLogging({launch->rank, launch->world_size});
  std::vector<double> tp2, tp1;
  Status status;
  std::unique_ptr<zerort::MpiContext> mpi;
  if (launch->world_size > 1) {
    if (launch->world_size % 2 != 0) {
      std::fprintf(stderr,
                   "embed_tp_mlp: needs an even number of ranks (tensor-parallel size 2)\n");
      return 2;
    }
    auto m = zerort::MpiContext::Init(&argc, &argv, {});
    if (!m.ok()) {
      std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
      return 1;
    }
    mpi = std::move(*m);
    auto world = mpi->World({});
    status = world.ok() ? Train(**world, 2, tp2) : world.status();
  } else {
    status = zerort::RunLoopbackRanks(
        2, {}, nullptr, [&](zerort::Communicator& comm) { return Train(comm, 2, tp2); });
    if (status.ok()) {
      status = zerort::RunLoopbackRanks(
          1, {}, nullptr, [&](zerort::Communicator& comm) { return Train(comm, 1, tp1); });
    }
  }
  if (!status.ok()) {
    std::fprintf(stderr, "embed_tp_mlp: %s\n", status.ToString().c_str());
    return 1;
  }
  if (launch->rank != 0) return 0;
  bool ok = tp2.back() < 0.5 * tp2.front();
  double worst = 0;
  for (size_t i = 0; i < tp1.size(); ++i) {
    worst = std::max(worst, std::abs(tp1[i] - tp2[i]) / tp1[i]);
  }
  if (!tp1.empty()) ok = ok && worst <= 1e-5;
  char agree[64] = "";
  if (!tp1.empty()) std::snprintf(agree, sizeof(agree), "; tp 1 agrees to %.2g", worst);
  std::printf("embed_tp_mlp: %d ranks, tensor-parallel 2, ZeRO-3; loss %.5f -> %.5f%s: %s\n",
              launch->world_size, tp2.front(), tp2.back(), agree, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
