// Training the GPT model through the shard manager, for the layer tests (loopback ranks) and the
// MPI tests: one rank's model, its data (a deterministic function of the global sequence index,
// so every world size sees the same global batch) and a run of steps returning the global losses.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zerort/layers/decoder_model.h"
#include "zerort/layers/pipeline_executor.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/device_mesh.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/sharding/manager_state.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort::testing {

inline DecoderConfig TinyGpt() {
  return DecoderConfig{.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 23};
}

// The LLaMA family's tiny shape: 4 query heads on 2 key/value heads, SwiGLU of 24, untied head.
inline DecoderConfig TinyLlama(int n_layer = 2) {
  return DecoderConfig{.n_layer = n_layer,
                       .n_head = 4,
                       .d_model = 16,
                       .seq_len = 8,
                       .vocab_size = 23,
                       .arch = ModelArch::kLlama,
                       .n_kv_head = 2,
                       .intermediate_size = 24,
                       .rope_theta = 1000.0};
}

// Tokens of global sequence `index` (seq + 1 of them: inputs are the first seq, targets the last).
inline std::vector<int32_t> TestSequence(int64_t index, int seq, int vocab) {
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
inline void TestBatch(int64_t first, int count, int seq, int vocab, std::vector<int32_t>& tokens,
                      std::vector<int32_t>& targets) {
  tokens.clear();
  targets.clear();
  for (int b = 0; b < count; ++b) {
    const std::vector<int32_t> s = TestSequence(first + b, seq, vocab);
    tokens.insert(tokens.end(), s.begin(), s.end() - 1);
    targets.insert(targets.end(), s.begin() + 1, s.end());
  }
}

struct DecoderRunConfig {
  DecoderConfig model = TinyGpt();
  ZeroStage stage = ZeroStage::k3;
  int global_batch = 4;  // sequences per step, split over the ranks
  int steps = 6;
  bool checkpointing = false;
  float lr = 3e-3f;
  int tp = 1;  // tensor-parallel size: the world is data x tensor (tensor fastest)
  bool sequence_parallel = false;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  int micro_batches = 1;  // per step (gradient accumulation); the pipeline's m
  // Pipeline parallelism: the world is data x tensor x pipeline (Megatron's order).
  int pp = 1;
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int virtual_stages = 1;
  bool scatter_gather = true;
  DType compute = DType::kF32;  // weights and activations: f32, bf16, or f16 (loss scaling)
  StreamOptions streams;        // the manager's streams: queued for the asynchronous CPU device
  ShardPlacement placement;     // offload of the optimizer state and the parameters
  // How the loopback ranks' sends complete: kRendezvous has NCCL's semantics.
  LoopbackSends sends = LoopbackSends::kBuffered;
  std::chrono::milliseconds comm_timeout{60'000};
  // The micro-batches' losses summed in the kernels' ledger and read once per step
  // (DecoderModel::set_defer_training_loss), as zerort train does.
  bool defer_loss = false;
  int fail_send_stage = -1;  // the executor's fault injection: this stage skips its first send
  int64_t alignment = ShardManagerOptions{}.alignment;  // FlatLayout's, in elements
};

struct DecoderRank {
  std::unique_ptr<DeviceMesh> mesh;
  std::unique_ptr<Allocator> allocator;
  std::unique_ptr<ShardManager> manager;
  std::unique_ptr<WeightStore> store;
  std::unique_ptr<ModelKernels> kernels;
  std::unique_ptr<DecoderModel> model;
  std::unique_ptr<PipelineExecutor> executor;  // pp > 1
};

inline StatusOr<DecoderRank> MakeDecoderRank(const DecoderRunConfig& c, Communicator& comm,
                                             MemoryTracker& tracker) {
  DecoderRank r;
  const int dp = comm.size() / (c.tp * c.pp);
  ZR_ASSIGN_OR_RETURN(r.mesh,
                      DeviceMesh::Create(comm, {.data = dp, .tensor = c.tp, .pipeline = c.pp},
                                         {.name = "gpt", .timeout = comm.options().timeout}));
  r.allocator = MakeCpuCachingAllocator(&tracker);
  ShardManagerOptions o;
  o.poison_released = true;  // a read of released memory shows as NaN in every comparison
  o.stage = c.stage;
  o.optimizer.kind = c.optimizer;
  o.optimizer.weight_decay = 0.1f;
  o.optimizer.beta2 = 0.95f;
  o.optimizer.momentum = 0.9f;
  o.stage3_param_persistence_threshold = 0;
  o.seed = 42;
  o.reduce_at_step = c.pp > 1;  // a pipeline reduces once per step
  o.compute_dtype = c.compute;
  o.streams = c.streams;
  o.placement = c.placement;
  o.alignment = c.alignment;
  const bool model_parallel = c.tp > 1 || c.pp > 1;
  ZR_ASSIGN_OR_RETURN(
      r.manager, ShardManager::Create(
                     o, {.dp = &r.mesh->data(),
                         .device_allocator = r.allocator.get(),
                         .model_parallel = model_parallel ? &r.mesh->model_parallel() : nullptr,
                         .tensor_parallel_rank = r.mesh->coord().tensor,
                         .tensor_parallel = &r.mesh->tensor()}));
  r.store = MakeShardManagerStore(*r.manager);
  r.kernels = MakeCpuModelKernels(c.compute == DType::kBF16  ? CpuPrecision::kBf16
                                  : c.compute == DType::kF16 ? CpuPrecision::kF16
                                                             : CpuPrecision::kFloat,
                                  &r.manager->compute_stream());
  const int per_rank = c.global_batch / dp / c.micro_batches;
  const int stage = r.mesh->coord().pipeline;
  DecoderStagePart part;
  if (c.pp > 1) {
    ZR_ASSIGN_OR_RETURN(part.chunks,
                        StageChunks(c.model.n_layer, c.pp, c.virtual_stages, {}, stage));
    part.first = stage == 0;
    part.last = stage == c.pp - 1;
    part.embedding_group = r.mesh->embedding();
  }
  ZR_ASSIGN_OR_RETURN(r.model, DecoderModel::Create({.config = c.model,
                                                     .micro_batch = per_rank,
                                                     .activation_checkpointing = c.checkpointing,
                                                     .tp = {c.tp > 1 ? &r.mesh->tensor() : nullptr},
                                                     .sequence_parallel = c.sequence_parallel,
                                                     .stage = part},
                                                    *r.store, *r.kernels, *r.allocator));
  r.model->set_defer_training_loss(c.defer_loss);
  ZR_RETURN_IF_ERROR(r.manager->Initialize(DecoderInitializer(c.model)));
  if (c.pp > 1) {
    ZR_ASSIGN_OR_RETURN(
        r.executor, PipelineExecutor::Create(
                        *r.model, {.shape = {c.schedule, c.pp, c.micro_batches, c.virtual_stages},
                                   .stage = stage,
                                   .pipeline = &r.mesh->pipeline(),
                                   .tp = {c.tp > 1 ? &r.mesh->tensor() : nullptr},
                                   .sequence_parallel = c.sequence_parallel,
                                   .scatter_gather = c.scatter_gather,
                                   .chunks = part.chunks,
                                   .allocator = r.allocator.get(),
                                   .stream = &r.kernels->stream(),
                                   .streams = c.streams,
                                   .fail_send_stage = c.fail_send_stage}));
  }
  return r;
}

// Every parameter's full fp32 master by name, assembled from the ranks of one process
// (loopback): each rank writes its tensor-parallel part's elements at their global positions.
using DecoderMasters = std::map<std::string, std::vector<float>>;
inline Status CollectMasters(DecoderRank& r, DecoderMasters& out, std::mutex& mu) {
  for (int u = 0; u < r.manager->num_units(); ++u) {
    const std::vector<ParamSpec>& params = r.manager->unit(u).layout().params();
    for (int k = 0; k < static_cast<int>(params.size()); ++k) {
      const ParamSpec& spec = params[k];
      std::vector<float> local(static_cast<size_t>(spec.numel()));
      ZR_RETURN_IF_ERROR(
          ShardManagerState(*r.manager).GatherMaster(u, k, local));  // over the data-parallel group
      std::lock_guard<std::mutex> lock(mu);
      std::vector<float>& full = out[spec.name];
      full.resize(static_cast<size_t>(spec.global_numel()));
      for (int64_t i = 0; i < spec.numel(); ++i) full[GlobalIndex(spec, i)] = local[i];
    }
  }
  return absl::OkStatus();
}

// Trains c.steps steps; `losses` (rank 0) gets the global mean loss of each step (the ranks of a
// tensor-parallel group compute the same loss, so the world's mean is the replicas' mean; under
// pipeline parallelism the last stage has it). `masters` (when given) gets the final weights.
inline Status TrainDecoderRank(const DecoderRunConfig& c, Communicator& comm,
                               std::vector<double>& losses, MemoryTracker* tracker_out = nullptr,
                               DecoderMasters* masters = nullptr,
                               std::mutex* masters_mu = nullptr) {
  MemoryTracker local;
  MemoryTracker& tracker = tracker_out != nullptr ? *tracker_out : local;
  ZR_ASSIGN_OR_RETURN(DecoderRank r, MakeDecoderRank(c, comm, tracker));
  const int dp = r.mesh->shape().data;
  const int per_rank = c.global_batch / dp / c.micro_batches;
  const int seq = c.model.seq_len;
  const bool last_stage = r.mesh->coord().pipeline == c.pp - 1;
  std::vector<std::vector<int32_t>> tokens(c.micro_batches), targets(c.micro_batches);
  for (int step = 0; step < c.steps; ++step) {
    // Tensor-parallel ranks and pipeline stages of one replica see the same sequences.
    std::vector<PipelineData> data;
    for (int k = 0; k < c.micro_batches; ++k) {
      TestBatch(
          int64_t{step} * c.global_batch + (r.mesh->coord().data * c.micro_batches + k) * per_rank,
          per_rank, seq, c.model.vocab_size, tokens[k], targets[k]);
      data.push_back({tokens[k], targets[k]});
    }
    double loss_sum = 0;
    if (r.executor) {
      ZR_ASSIGN_OR_RETURN(loss_sum,
                          r.executor->Train(data, per_rank, seq, r.manager->loss_scale()));
    } else {
      for (const PipelineData& d : data) {
        ZR_ASSIGN_OR_RETURN(double loss, r.model->ForwardBackward(d.tokens, d.targets, per_rank,
                                                                  seq, r.manager->loss_scale()));
        loss_sum += loss;
      }
    }
    ZR_RETURN_IF_ERROR(r.manager->Step({.lr = c.lr, .micro_batches = c.micro_batches}).status());
    if (c.defer_loss) {
      ZR_ASSIGN_OR_RETURN(const double deferred, r.model->TakeTrainingLoss());
      if (loss_sum != 0) return absl::InternalError("a deferred loss was also returned");
      loss_sum = deferred;
    }
    float local_loss = last_stage ? static_cast<float>(loss_sum / c.micro_batches) : 0.0f;
    ZR_RETURN_IF_ERROR(
        comm.AllReduce(&local_loss, &local_loss, 1, DType::kF32, ReduceOp::kSum, nullptr));
    if (comm.rank() == 0) losses.push_back(local_loss / (dp * c.tp));
  }
  if (masters != nullptr) ZR_RETURN_IF_ERROR(CollectMasters(r, *masters, *masters_mu));
  return absl::OkStatus();
}

// The losses of c.steps steps on `world` loopback ranks (empty, with the error on stderr, when the
// run failed: the caller's size comparison then fails).
inline std::vector<double> TrainLoopback(const DecoderRunConfig& c, int world,
                                         DecoderMasters* masters = nullptr) {
  std::vector<double> losses;
  CommOptions options;
  options.timeout = c.comm_timeout;
  std::mutex mu;
  const Status s = RunLoopbackRanks(
      world, options, nullptr,
      [&](Communicator& comm) { return TrainDecoderRank(c, comm, losses, nullptr, masters, &mu); },
      c.sends);
  if (!s.ok()) std::fprintf(stderr, "TrainLoopback: %s\n", s.ToString().c_str());
  return s.ok() ? losses : std::vector<double>{};
}

}  // namespace zerort::testing
