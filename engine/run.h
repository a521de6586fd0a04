// A training run's state and its parts (internal to engine/, not installed): Run::Setup's phases
// are run_setup.cc ([Note: a run's setup]), the loop, evaluation, saving and reporting
// trainer.cc; Train (trainer.h) makes one and runs it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/checkpoint/checkpoint.h"
#include "zerort/config/config.h"
#include "zerort/data/data_loader.h"
#include "zerort/engine/comm_spans.h"
#include "zerort/engine/metrics_sink.h"
#include "zerort/engine/timeline.h"
#include "zerort/engine/trainer.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/layers/pipeline_executor.h"
#include "zerort/layers/pipeline_schedule.h"
#include "zerort/runtime/device_mesh.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort::trainer_internal {

class Run {
 public:
  Run(RunConfig config, const TrainerContext& ctx) : c_(std::move(config)), ctx_(ctx) {}

  Status Setup();
  StatusOr<TrainResult> Loop();  // Steps, then the trace file

 private:
  // What one optimizer step produced, for the report.
  struct StepOutcome {
    double lr = 0;
    double loss = 0;  // data-parallel mean
    StepResult result;
    double seconds = 0;
    MemorySnapshot memory;
    StepMetrics::WallClock wall;  // wall_clock_breakdown
    CommSpans::Step comm;
  };
  StatusOr<StepOutcome> TrainStep(int64_t step, int64_t consumed);
  void Report(int64_t step, int64_t consumed, const StepOutcome& outcome, double val);
  StatusOr<bool> SaveOrStop(int64_t step, int64_t consumed);
  Status Sample(TrainResult& result);
  StatusOr<TrainResult> Steps();
  Status Evaluate(double& loss);

  // Run::Setup's phases, in their order ([Note: a run's setup]).
  Status SetupDevice();
  Status SetupMesh();
  Status SetupBatchAndPipeline();
  Status SetupManager();
  Status SetupModel();
  Status SetupPipelineExecutor();
  Status Resume();
  Status SetupData();
  void LogStart();

  RunConfig c_;
  TrainerContext ctx_;
  CommSpans comm_spans_;  // every collective: the timeline's tracks, exposed communication
  // The data x tensor mesh (tensor_parallel_size > 1); without it the world is the
  // data-parallel group.
  std::unique_ptr<DeviceMesh> mesh_;
  Communicator& world() { return *ctx_.world; }
  Communicator& dp() { return mesh_ ? mesh_->data() : *ctx_.world; }
  Communicator* tp() { return mesh_ ? &mesh_->tensor() : nullptr; }
  // qgZ's first level ([Note: qgZ]): the data group's ranks on this node, or the whole group when
  // there is one node (or the nodes hold different numbers of its ranks).
  Communicator* QuantizedGradientGroup() {
    if (!c_.manager.quantized_gradients) return nullptr;
    return mesh_->data_intra() != nullptr ? mesh_->data_intra() : &mesh_->data();
  }
  int pp() const { return c_.parallel.pipeline_parallel_size; }
  bool last_stage() const { return !mesh_ || mesh_->coord().pipeline == pp() - 1; }
  // The pipeline's losses live on its last stage: summed over the pipeline group (the other
  // stages add 0) so every rank holds them.
  Status FromLastStage(float* values, size_t count) {
    if (pp() == 1) return absl::OkStatus();
    if (!last_stage()) std::fill(values, values + count, 0.0f);
    return HostAllReduce(values, count, ReduceOp::kSum, &mesh_->pipeline());
  }
  // Every rank's resolved config against every other's, in one gather before any other
  // collective: ranks that differ (an MPMD job, a --set on one node) exit 2 naming the first
  // differing key and both values.
  Status AgreeOnConfig();
  // Rank 0: the checkpoint directory's lock, and a new run's refusal to take over an earlier
  // run's checkpoints or metrics (checkpoint/run_dir.h).
  Status ClaimRunFiles();
  // Every rank learns whether any rank refused (its code; that rank logs the message) in one
  // collective over the world.
  Status AgreeAll(const Status& mine, std::string_view what);
  // The memory estimator's peak for this rank against what it may use (train.check_memory).
  Status CheckMemoryFits();
  // Rank 0: logging.trace_file can be written and is not an earlier run's a new run would
  // replace (checkpoint/run_dir.h's CheckNewRunFile).
  Status CheckTraceFile();
  std::unique_ptr<Stream> setup_stream_;  // the setup's host collectives
  std::string MetricsPath() const {
    if (!c_.logging.metrics_file.empty()) return c_.logging.metrics_file;
    return c_.checkpoint.dir.empty() ? "" : c_.checkpoint.dir + "/metrics.jsonl";
  }
  CheckpointGroups Groups() {
    return {.world = &world(),
            .dp = mesh_ ? &mesh_->data_shard() : &dp(),
            .tensor_size = mesh_ ? mesh_->shape().tensor : 1,
            .tensor_rank = mesh_ ? mesh_->coord().tensor : 0,
            .pipeline_size = pp(),
            .pipeline_rank = mesh_ ? mesh_->coord().pipeline : 0,
            .unit_positions = model_->UnitPositions(),
            .replica_rank = mesh_ && mesh_->data_replicate() ? mesh_->data_replicate()->rank() : 0};
  }
  // Rank 0 of the world prints and writes metrics.
  bool leader() { return ctx_.world->rank() == 0; }
  // fp32 values on the host, reduced over `group` (the data-parallel group by default: the
  // ranks of a tensor-parallel group hold the same losses).
  Status HostAllReduce(float* values, size_t count, ReduceOp op, Communicator* group = nullptr) {
    return AllReduceHostValues(group != nullptr ? *group : dp(), *allocator_,
                               manager_->compute_stream(), values, count, DType::kF32, op);
  }
  bool cuda_ = false;
  Device device_ = Device::Cpu();
  CudaDeviceInfo gpu_;  // device_'s (name, memory, shared memory a block), queried once: cuda_
  MemoryTracker tracker_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<ShardManager> manager_;
  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<ModelKernels> kernels_;
  std::unique_ptr<DecoderModel> model_;
  std::unique_ptr<PipelineExecutor> executor_;   // pipeline_parallel_size > 1
  DecoderStagePart part_;                        // what this rank's stage holds
  std::optional<PipelineShape> pipeline_shape_;  // pipeline_parallel_size > 1, parsed once
  std::unique_ptr<DataLoader> data_;
  // Rank 0's metrics file, CSV files, lines and progress bar; null on the other ranks. A failed
  // write stops the run at the next step boundary on every rank (exit 1 naming the file).
  std::unique_ptr<MetricsSink> metrics_;
  std::unique_ptr<Timeline> timeline_;  // logging.trace_file
  RunState start_;  // where this run starts: step 0, or the resumed checkpoint's state
  std::unique_ptr<RunLock> lock_;  // rank 0, with checkpoint.dir: held for the run's lifetime
  std::string run_id_;             // a new run's, or the resumed one's
  nlohmann::json hf_config_;       // model.init_from's config.json, or the resumed run's
  OffloadStats offload_seen_;      // the manager's offload counters at the last metrics record
  Status write_error() const { return metrics_ ? metrics_->write_error() : absl::OkStatus(); }
  Status Save(int64_t step, int64_t consumed);
};

}  // namespace zerort::trainer_internal
