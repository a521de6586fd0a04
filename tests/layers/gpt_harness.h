// Training the GPT model through the shard manager, for the layer tests (loopback ranks) and the
// MPI tests: one rank's model, its data (a deterministic function of the global sequence index,
// so every world size sees the same global batch) and a run of steps returning the global losses.
#pragma once

#include <cstdio>
#include <memory>
#include <vector>

#include "layers/gpt_model.h"
#include "runtime/communicator.h"
#include "runtime/device_mesh.h"
#include "runtime/loopback_communicator.h"
#include "sharding/shard_manager.h"

namespace zerort::testing {

inline GptConfig TinyGpt() {
  return GptConfig{.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 23};
}

// Tokens of global sequence `index` (seq + 1 of them: inputs are the first seq, targets the last).
inline std::vector<int32_t> GptSequence(int64_t index, int seq, int vocab) {
  std::vector<int32_t> out(seq + 1);
  uint64_t x = static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ull + 12345;
  for (int t = 0; t <= seq; ++t) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    // A learnable pattern: mostly the previous token + 1, sometimes random.
    out[t] = (t > 0 && x % 4 != 0) ? (out[t - 1] + 1) % vocab : static_cast<int32_t>(x % vocab);
  }
  return out;
}

// Inputs and targets of sequences [first, first + count).
inline void GptBatch(int64_t first, int count, int seq, int vocab, std::vector<int32_t>& tokens,
                     std::vector<int32_t>& targets) {
  tokens.clear();
  targets.clear();
  for (int b = 0; b < count; ++b) {
    const std::vector<int32_t> s = GptSequence(first + b, seq, vocab);
    tokens.insert(tokens.end(), s.begin(), s.end() - 1);
    targets.insert(targets.end(), s.begin() + 1, s.end());
  }
}

struct GptRunConfig {
  GptConfig model = TinyGpt();
  ZeroStage stage = ZeroStage::k3;
  int global_batch = 4;  // sequences per step, split over the ranks
  int steps = 6;
  bool checkpointing = false;
  float lr = 3e-3f;
  int tp = 1;  // tensor-parallel size: the world is data x tensor (tensor fastest)
  bool sequence_parallel = false;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
};

struct GptRank {
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<ShardManager> manager;
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<ModelKernels> kernels;
  std::unique_ptr<GptModel> model;
};

inline StatusOr<GptRank> MakeGptRank(const GptRunConfig& c, Communicator& comm,
                                     MemoryTracker& tracker) {
  GptRank r;
  ZR_ASSIGN_OR_RETURN(r.mesh, DeviceMesh::Create(comm, {.data = comm.size() / c.tp, .tensor = c.tp},
                                                 {.name = "gpt"}));
  r.allocator = MakeCpuCachingAllocator(&tracker);
  ShardManagerOptions o;
  o.stage = c.stage;
  o.optimizer.kind = c.optimizer;
  o.optimizer.weight_decay = 0.1f;
  o.optimizer.beta2 = 0.95f;
  o.optimizer.momentum = 0.9f;
  o.stage3_param_persistence_threshold = 0;
  o.seed = 42;
  ZR_ASSIGN_OR_RETURN(
      r.manager,
      ShardManager::Create(o, {.dp = &r.mesh->data(),
                               .device_allocator = r.allocator.get(),
                               .model_parallel = c.tp > 1 ? &r.mesh->model_parallel() : nullptr,
                               .tensor_parallel_rank = r.mesh->coord().tensor}));
  r.store = MakeShardManagerStore(*r.manager);
  r.kernels = MakeCpuModelKernels(CpuPrecision::kFloat);
  const int per_rank = c.global_batch / r.mesh->shape().data;
  ZR_ASSIGN_OR_RETURN(r.model, GptModel::Create({.config = c.model,
                                                 .micro_batch = per_rank,
                                                 .activation_checkpointing = c.checkpointing,
                                                 .tp = {c.tp > 1 ? &r.mesh->tensor() : nullptr},
                                                 .sequence_parallel = c.sequence_parallel},
                                                *r.store, *r.kernels, *r.allocator));
  ZR_RETURN_IF_ERROR(r.manager->Initialize(GptInitializer(c.model)));
  return r;
}

// Trains c.steps steps; `losses` (rank 0) gets the global mean loss of each step (the ranks of a
// tensor-parallel group compute the same loss, so the world's mean is the replicas' mean).
inline Status TrainGptRank(const GptRunConfig& c, Communicator& comm, std::vector<double>& losses,
                           MemoryTracker* tracker_out = nullptr) {
  MemoryTracker local;
  MemoryTracker& tracker = tracker_out != nullptr ? *tracker_out : local;
  ZR_ASSIGN_OR_RETURN(GptRank r, MakeGptRank(c, comm, tracker));
  const int per_rank = c.global_batch / r.mesh->shape().data;
  const int seq = c.model.seq_len;
  std::vector<int32_t> tokens, targets;
  for (int step = 0; step < c.steps; ++step) {
    // Tensor-parallel ranks of one replica see the same sequences.
    GptBatch(int64_t{step} * c.global_batch + r.mesh->coord().data * per_rank, per_rank, seq,
             c.model.vocab_size, tokens, targets);
    ZR_ASSIGN_OR_RETURN(double loss, r.model->ForwardBackward(tokens, targets, per_rank, seq,
                                                              r.manager->loss_scale()));
    ZR_RETURN_IF_ERROR(r.manager->Step({.lr = c.lr}).status());
    float local_loss = static_cast<float>(loss);
    ZR_RETURN_IF_ERROR(
        comm.AllReduce(&local_loss, &local_loss, 1, DType::kF32, ReduceOp::kAvg, nullptr));
    if (comm.rank() == 0) losses.push_back(local_loss);
  }
  return absl::OkStatus();
}

// The losses of c.steps steps on `world` loopback ranks (empty, with the error on stderr, when the
// run failed: the caller's size comparison then fails).
inline std::vector<double> TrainLoopback(const GptRunConfig& c, int world) {
  std::vector<double> losses;
  CommOptions options;
  options.timeout = std::chrono::seconds(60);
  const Status s = RunLoopbackRanks(
      world, options, nullptr, [&](Communicator& comm) { return TrainGptRank(c, comm, losses); });
  if (!s.ok()) std::fprintf(stderr, "TrainLoopback: %s\n", s.ToString().c_str());
  return s.ok() ? losses : std::vector<double>{};
}

}  // namespace zerort::testing
