// The training loop.
#include "engine/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <memory>
#include <optional>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "checkpoint/config_match.h"
#include "checkpoint/export.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/run_dir.h"
#include "checkpoint/safetensors.h"
#include "config/run_options.h"
#include "data/data_loader.h"
#include "data/tokenizer.h"
#include "engine/comm_spans.h"
#include "engine/host_memory.h"
#include "engine/lr_schedule.h"
#include "engine/metrics_sink.h"
#include "engine/preflight.h"
#include "engine/run_mesh.h"
#include "engine/timeline.h"
#include "estimate/memory_model.h"
#include "kernels/blas.h"
#include "kernels/model_kernels.h"
#include "layers/gpt_model.h"
#include "layers/pipeline_executor.h"
#include "runtime/device_mesh.h"
#include "runtime/host_collectives.h"
#include "runtime/log.h"
#include "runtime/strings.h"
#include "runtime/watchdog.h"
#include "sharding/manager_state.h"
#include "sharding/shard_manager.h"

namespace zerort {

static_assert(kMaskedTarget == kIgnoreTarget, "the data's masked target is the model's");

namespace {

// Set by SIGTERM/SIGUSR1 while a run is in progress; read once per step. A signal handler can
// reach nothing else, so this one flag is process-wide by necessity.
volatile std::sig_atomic_t g_stop_signal = 0;
// The watchdog is told too: if a collective is blocked (a peer died; mpirun's SIGTERM), it logs
// every rank's trace and ends the run with exit code 3 instead of waiting for a step boundary
// that will not come.
extern "C" void OnStopSignal(int signal) {
  g_stop_signal = signal;
  Watchdog::ForwardStopSignal(signal);
}

// Installs the handlers for the lifetime of a run and restores the previous ones.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGUSR1, &sa, &old_usr1_);
  }
  ~StopSignals() {
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGUSR1, &old_usr1_, nullptr);
  }

 private:
  struct sigaction old_term_ {};
  struct sigaction old_usr1_ {};
};

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
    if (!c_.zero.zero_quantized_gradients) return nullptr;
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
  MemoryTracker tracker_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<ShardManager> manager_;
  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<ModelKernels> kernels_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<PipelineExecutor> executor_;   // pipeline_parallel_size > 1
  GptStagePart part_;                            // what this rank's stage holds
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

Status Run::AgreeOnConfig() {
  ZR_ASSIGN_OR_RETURN(setup_stream_,
                      CreateStream(allocator_->device(), "setup", StreamOptionsFrom(c_)));
  if (world().size() == 1) return absl::OkStatus();
  const nlohmann::json mine = c_.ToJson();
  ZR_ASSIGN_OR_RETURN(const std::vector<std::string> all,
                      AllGatherHostStrings(world(), *allocator_, *setup_stream_, mine.dump()));
  return CompareRankConfigs(all, world().rank());
}

Status Run::ClaimRunFiles() {
  run_id_ = NewRunId();  // kept unless the resumed checkpoint has one
  if (!c_.checkpoint.dir.empty()) {
    ZR_ASSIGN_OR_RETURN(lock_, RunLock::Acquire(c_.checkpoint.dir));
    if (!ctx_.resume) ZR_RETURN_IF_ERROR(CheckNewRunDirectory(c_.checkpoint.dir, ctx_.overwrite));
  }
  ZR_ASSIGN_OR_RETURN(
      metrics_,
      MetricsSink::Open(
          {.metrics_file = MetricsPath(),
           .resume = ctx_.resume,
           .overwrite = ctx_.overwrite,
           .csv_dir = c_.csv_monitor.enabled ? c_.csv_monitor.Dir() : "",
           .out = ctx_.out,
           .progress_bar = ctx_.progress_bar,
           .steps = c_.train.steps,
           .steps_per_print = c_.steps_per_print,
           .train_batch_size = c_.train_batch_size,
           .seq_len = c_.model.shape.seq_len,
           .flops_per_token = c_.model.shape.FlopsPerToken(),
           .devices = world().size(),
           .peak_flops =
               cuda_ ? DenseBf16PeakFlops(QueryCuda().devices.at(device_.index).name) : 0.0,
           .fp16 = c_.fp16.enabled,
           .wall_clock_breakdown = c_.wall_clock_breakdown}));
  return absl::OkStatus();
}

Status Run::AgreeAll(const Status& mine, std::string_view what) {
  float code = mine.ok() ? 0.0f : static_cast<float>(static_cast<int>(mine.code()));
  ZR_RETURN_IF_ERROR(AllReduceHostValues(world(), *allocator_, *setup_stream_, &code, 1,
                                         DType::kF32, ReduceOp::kMax));
  if (!mine.ok()) return mine;
  if (code != 0.0f) {
    return absl::Status(
        static_cast<absl::StatusCode>(static_cast<int>(code)),
        StrCat("another rank refused to start the run: ", what, " (its message says why)"));
  }
  return absl::OkStatus();
}

Status Run::CheckMemoryFits() {
  if (!c_.train.check_memory) return absl::OkStatus();
  StatusOr<MemoryModelInput> input = MemoryModelInput::FromConfig(c_, world().size(), cuda_);
  if (!input.ok()) return absl::OkStatus();  // what the estimator cannot model goes unchecked
  MemoryModelInput in = *input;
  in.pipeline_stage = mesh_ ? mesh_->coord().pipeline : 0;
  int64_t gpu = 0;
  if (cuda_) {
    const CudaInfo info = QueryCuda();
    const size_t index = static_cast<size_t>(device_.index);
    if (index < info.devices.size()) {
      gpu = static_cast<int64_t>(info.devices[index].total_memory_bytes);
    }
  }
  return ::zerort::CheckMemoryFits(in, {.cuda = cuda_,
                                        .ranks_on_node = std::max(1, ctx_.local_world_size),
                                        .world_size = world().size(),
                                        .gpu_bytes = gpu,
                                        .host = QueryHostMemory()});
}

Status Run::Save(int64_t step, int64_t consumed) {
  const auto t0 = std::chrono::steady_clock::now();
  Timeline::Scope span(timeline_.get(), StrCat("checkpoint save ", step), "io");
  RunState state{.step = step,
                 .consumed_sequences = consumed,
                 .applied_steps = ShardManagerState(*manager_).steps(),
                 .scaler = ShardManagerState(*manager_).scaler_state(),
                 .config = c_.ToJson(),
                 .hf_config = hf_config_,
                 .run_id = run_id_};
  ZR_RETURN_IF_ERROR(SaveCheckpoint(c_.checkpoint.dir, state, *manager_, Groups(),
                                    c_.checkpoint.keep_last_n, ctx_.overwrite));
  if (c_.zero.stage3_gather_16bit_weights_on_model_save) {
    // DeepSpeed's 16-bit model save: the consolidated weights from the checkpoint just committed.
    const DType dtype = ComputeDType(c_);
    const std::string step_dir = StrCat(c_.checkpoint.dir, "/step_", step);
    Status exported = absl::OkStatus();
    if (leader()) exported = ExportHuggingFace(step_dir, step_dir + "/hf", dtype).status();
    ZR_RETURN_IF_ERROR(AgreeAll(exported, "the 16-bit model save"));
  }
  if (leader()) {
    Logger()->info("saved checkpoint {}/step_{} in {:.2f} s", c_.checkpoint.dir, step,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return absl::OkStatus();
}

// The mesh (engine/run_mesh.h); null when nothing splits the world.
Status Run::SetupMesh() {
  comm_spans_.Attach(world());  // before any group is split from it
  ZR_ASSIGN_OR_RETURN(mesh_, MakeRunMesh(c_, world(), ctx_.world_source, ctx_.topology));
  return absl::OkStatus();
}

// The batch over the data-parallel group, then the stage's part of the model and the pipeline's
// shape (its micro-batches are the accumulation steps).
Status Run::SetupBatchAndPipeline() {
  const std::string dp_source =
      mesh_ ? StrCat(ctx_.world_source, " / (tensor_parallel_size ", mesh_->shape().tensor,
                     " x pipeline_parallel_size ", mesh_->shape().pipeline, ")")
            : ctx_.world_source;
  ZR_RETURN_IF_ERROR(ResolveBatch(c_, dp().size(), dp_source));
  if (pp() == 1) return absl::OkStatus();
  const ParallelConfig& par = c_.parallel;
  ZR_ASSIGN_OR_RETURN(PipelineSchedule schedule, ParsePipelineSchedule(par.pipeline_schedule));
  const PipelineShape shape{schedule, pp(), static_cast<int>(c_.gradient_accumulation_steps),
                            par.virtual_pipeline_stages};
  if (Status s = ValidatePipelineShape(shape); !s.ok()) {
    return absl::InvalidArgumentError(StrCat("parallel.pipeline_schedule \"", par.pipeline_schedule,
                                             "\" with ", pp(), " stages: ", s.message()));
  }
  const int stage = mesh_->coord().pipeline;
  ZR_ASSIGN_OR_RETURN(part_.chunks,
                      StageChunks(c_.model.shape.n_layer, pp(), par.virtual_pipeline_stages,
                                  par.pipeline_layers, stage));
  part_.first = stage == 0;
  part_.last = stage == pp() - 1;
  part_.embedding_group = mesh_->embedding();
  pipeline_shape_ = shape;
  return absl::OkStatus();
}

// [Note: a run's setup]
// Run::Setup's phases, each needing what the ones before it made:
//  1. the device and its allocator (SetupDevice): every collective below goes through them;
//  2. every rank's config against every other's (AgreeOnConfig), before any other collective;
//  3. the mesh (SetupMesh), then the batch over its data-parallel group and the pipeline's shape
//     and this stage's part (SetupBatchAndPipeline);
//  4. the memory check against the estimator, agreed by every rank, before anything is
//     allocated (CheckMemoryFits), and the trace file's writability;
//  5. the shard manager and, on rank 0, the run's files (SetupManager: the lock, the metrics);
//  6. the kernels, the model and its initial weights (SetupModel), the pipeline's executor
//     (SetupPipelineExecutor);
//  7. a resumed run's checkpoint (Resume), then the data (SetupData) and the start line.
Status Run::Setup() {
  ZR_RETURN_IF_ERROR(SetupDevice());
  ZR_RETURN_IF_ERROR(AgreeOnConfig());
  ZR_RETURN_IF_ERROR(SetupMesh());
  ZR_RETURN_IF_ERROR(SetupBatchAndPipeline());
  if (ctx_.resume && c_.checkpoint.dir.empty()) {
    return absl::InvalidArgumentError("--resume needs checkpoint.dir in the config");
  }
  ZR_RETURN_IF_ERROR(AgreeAll(CheckMemoryFits(), "the memory check"));
  if (!c_.logging.trace_file.empty()) {
    timeline_ = std::make_unique<Timeline>(world().rank());
    if (leader()) ZR_RETURN_IF_ERROR(Timeline::CheckWritable(c_.logging.trace_file));
  }
  ZR_RETURN_IF_ERROR(SetupManager());
  ZR_RETURN_IF_ERROR(SetupModel());
  ZR_RETURN_IF_ERROR(SetupPipelineExecutor());
  if (ctx_.resume) ZR_RETURN_IF_ERROR(Resume());
  ZR_RETURN_IF_ERROR(SetupData());
  comm_spans_.SetTimeline(timeline_.get());
  if (executor_ && timeline_) executor_->SetSpanSink(timeline_->Sink());
  if (leader()) LogStart();
  return absl::OkStatus();
}

Status Run::SetupDevice() {
  const std::string& want = c_.train.device;
  cuda_ = want == "cuda" || (want.empty() && CudaDeviceCount() > 0);
  if (cuda_ && CudaDeviceCount() == 0) {
    return absl::InvalidArgumentError(StrCat(
        "train.device = \"cuda\", but there is no usable GPU: ", QueryCuda().unavailable_reason));
  }
  if (cuda_) {
    device_ = Device::Cuda(ctx_.local_rank % CudaDeviceCount());
    ZR_RETURN_IF_ERROR(SetCurrentDevice(device_));
    ZR_ASSIGN_OR_RETURN(allocator_, MakeCudaCachingAllocator(device_, &tracker_));
  } else {
    allocator_ = MakeCpuCachingAllocator(&tracker_);
  }
  return absl::OkStatus();
}

Status Run::SetupManager() {
  const ShardManagerOptions mo = ShardManagerOptionsFrom(c_, dp().size(), ctx_.faults);
  ZR_ASSIGN_OR_RETURN(
      manager_,
      ShardManager::Create(mo, {.dp = mesh_ ? &mesh_->data_shard() : &dp(),
                                .replicate = mesh_ ? mesh_->data_replicate() : nullptr,
                                .secondary = mesh_ ? mesh_->data_secondary() : nullptr,
                                .grad_intra = QuantizedGradientGroup(),
                                .grad_inter = mesh_ ? mesh_->data_inter() : nullptr,
                                .device_allocator = allocator_.get(),
                                .tracker = &tracker_,
                                .model_parallel = mesh_ ? &mesh_->model_parallel() : nullptr,
                                .tensor_parallel_rank = mesh_ ? mesh_->coord().tensor : 0,
                                .span = timeline_ ? timeline_->Sink() : SpanSink()}));
  ZR_RETURN_IF_ERROR(AgreeAll(leader() ? ClaimRunFiles() : absl::OkStatus(),
                              "the checkpoint directory or metrics file"));
  // The setup's few host values leave no cached segment behind: the run's memory (and the
  // estimator's replay of it) starts from the model's own allocations.
  return allocator_->EmptyCache();
}

Status Run::SetupModel() {
  const DType compute = ComputeDType(c_);
  store_ = MakeShardManagerStore(*manager_, timeline_ ? timeline_->Sink() : SpanSink());
  if (cuda_) {
    ZR_ASSIGN_OR_RETURN(kernels_, MakeCudaModelKernels(compute, DType::kF32,
                                                       manager_->compute_stream(), *allocator_));
  } else {
    kernels_ = MakeCpuModelKernels(compute == DType::kBF16  ? CpuPrecision::kBf16
                                   : compute == DType::kF16 ? CpuPrecision::kF16
                                                            : CpuPrecision::kFloat,
                                   &manager_->compute_stream());
  }
  ZR_ASSIGN_OR_RETURN(
      model_, GptModel::Create({.config = c_.model.shape,
                                .micro_batch = static_cast<int>(c_.train_micro_batch_size_per_gpu),
                                .activation_checkpointing = c_.model.activation_checkpointing,
                                .tp = {tp()},
                                .sequence_parallel = c_.parallel.sequence_parallel,
                                .vocab_multiple = c_.parallel.make_vocab_size_divisible_by,
                                .head_chunk_rows = c_.model.head_chunk_rows,
                                .stage = part_},
                               *store_, *kernels_, *allocator_));
  model_->set_defer_training_loss(true);  // read once per step, not per micro-batch
  ZR_RETURN_IF_ERROR(InitializeWeights(c_.model, *manager_));  // or model.init_from's
  if (!c_.model.init_from.empty()) {  // kept for export (RunState::hf_config)
    ZR_ASSIGN_OR_RETURN(hf_config_, ReadHuggingFaceConfigJson(c_.model.init_from));
  }
  return absl::OkStatus();
}

Status Run::SetupPipelineExecutor() {
  if (!pipeline_shape_) return absl::OkStatus();
  PipelineStageOptions po{.shape = *pipeline_shape_,
                          .stage = mesh_->coord().pipeline,
                          .pipeline = &mesh_->pipeline(),
                          .tp = {tp()},
                          .sequence_parallel = c_.parallel.sequence_parallel,
                          .scatter_gather = c_.parallel.pipeline_scatter_gather,
                          .chunks = part_.chunks,
                          .allocator = allocator_.get(),
                          .stream = &manager_->compute_stream(),
                          .streams = StreamOptionsFrom(c_)};
  po.fail_send_stage = ctx_.faults.pipeline_send_stage;  // the hang tests' hook
  po.fail_send_dies = ctx_.faults.pipeline_send_dies;
  ZR_ASSIGN_OR_RETURN(executor_, PipelineExecutor::Create(*model_, std::move(po)));
  return absl::OkStatus();
}

Status Run::Resume() {
  ZR_ASSIGN_OR_RETURN(const std::string step_dir, LatestCheckpoint(c_.checkpoint.dir));
  ZR_ASSIGN_OR_RETURN(start_, LoadCheckpoint(step_dir, *manager_, Groups()));
  ZR_RETURN_IF_ERROR(CheckResumable(start_.config, c_.ToJson(), step_dir));
  if (!start_.run_id.empty()) run_id_ = start_.run_id;  // an older checkpoint has none
  if (!start_.hf_config.is_null()) hf_config_ = start_.hf_config;
  if (leader()) {
    Logger()->info("resumed from {} (step {}, {} sequences consumed)", step_dir, start_.step,
                   start_.consumed_sequences);
  }
  return absl::OkStatus();
}

Status Run::SetupData() {
  ZR_ASSIGN_OR_RETURN(DataLoader loader,
                      DataLoader::Load(c_.data, c_.model.shape.seq_len, c_.model.shape.vocab_size));
  data_ = std::make_unique<DataLoader>(std::move(loader));
  return absl::OkStatus();
}

// Rank 0's account of what it is about to train, and the warnings that concern speed.
void Run::LogStart() {
  const std::string layout = DescribeDataLayout(c_, ctx_.topology);
  if (!layout.empty()) Logger()->info("data parallelism: {}", layout);
  Logger()->info(
      "training {} parameters ({}) on {} x {} ({}), ZeRO-{}{}, batch {} = {} micro x {} "
      "accumulation x {} data-parallel ranks; data: {} ({} training tokens, {} validation)",
      c_.model.shape.NumParameters(), c_.model.shape.Describe(), world().size(), device_.ToString(),
      DTypeName(ComputeDType(c_)), c_.zero.stage,
      mesh_ ? fmt::format(", data {} x tensor {}{}{}", mesh_->shape().data, mesh_->shape().tensor,
                          c_.parallel.sequence_parallel ? " (sequence parallel)" : "",
                          pp() > 1 ? fmt::format(" x pipeline {} ({}, {} chunk(s) per stage)", pp(),
                                                 c_.parallel.pipeline_schedule,
                                                 c_.parallel.virtual_pipeline_stages)
                                   : "")
            : "",
      c_.train_batch_size, c_.train_micro_batch_size_per_gpu, c_.gradient_accumulation_steps,
      dp().size(), data_->source(), data_->train_tokens(), data_->validation_tokens());
  if (!cuda_) {
    if (const std::string w = BlasCoreWarning(); !w.empty()) Logger()->warn("{}", w);
    return;
  }
  const int tp_size = c_.parallel.tensor_parallel_size;
  const int64_t vocab_rows =
      PaddedVocab(c_.model.shape, tp_size, c_.parallel.make_vocab_size_divisible_by) / tp_size;
  if (vocab_rows % 8 != 0) {
    Logger()->warn(
        "the output projection's {} vocabulary rows per tensor-parallel rank are not a multiple "
        "of 8, so cuBLAS multiplies them with its unaligned kernels; "
        "parallel.make_vocab_size_divisible_by = 128 (Megatron's default) pads them (GPT-2 124M "
        "trains 1.24x faster on an H100, docs/gpu.md)",
        vocab_rows);
  }
}

Status Run::Evaluate(double& loss) {
  // Every rank runs the same number of forward passes (at ZeRO-3 each is collective); a rank
  // with no window left in a round repeats window 0 with weight 0.
  const int64_t windows = std::min<int64_t>(c_.train.eval_windows, data_->validation_windows());
  if (windows == 0) return absl::FailedPreconditionError("no validation windows");
  const int m = static_cast<int>(c_.train_micro_batch_size_per_gpu);
  const int seq = c_.model.shape.seq_len;
  const int world = dp().size();
  float sums[2] = {0, 0};  // loss x windows, windows
  std::vector<int32_t> in(static_cast<size_t>(m) * seq), out(in.size());
  for (int64_t first = 0; first < windows; first += int64_t{m} * world) {
    const int64_t mine = first + int64_t{dp().rank()} * m;
    const int count = static_cast<int>(std::clamp<int64_t>(windows - mine, 0, m));
    const int run = std::max(count, 1);
    for (int b = 0; b < run; ++b) {
      ZR_RETURN_IF_ERROR(data_->ValidationWindow(count > 0 ? mine + b : 0,
                                                 std::span(in).subspan(b * seq, seq),
                                                 std::span(out).subspan(b * seq, seq)));
    }
    double l = 0;
    if (executor_) {
      const PipelineData d{std::span(in).first(run * seq), std::span(out).first(run * seq)};
      ZR_ASSIGN_OR_RETURN(l, executor_->Evaluate(std::span(&d, 1), run, seq));
    } else {
      ZR_ASSIGN_OR_RETURN(l, model_->Loss(std::span(in).first(run * seq),
                                          std::span(out).first(run * seq), run, seq));
    }
    sums[0] += static_cast<float>(l * count);
    sums[1] += static_cast<float>(count);
  }
  ZR_RETURN_IF_ERROR(FromLastStage(sums, 2));
  ZR_RETURN_IF_ERROR(HostAllReduce(sums, 2, ReduceOp::kSum));
  loss = sums[0] / sums[1];
  return absl::OkStatus();
}

// One optimizer step: the micro-batches of this rank's share of the global batch, the step, the
// data-parallel mean loss.
StatusOr<Run::StepOutcome> Run::TrainStep(int64_t step, int64_t consumed) {
  const auto t0 = std::chrono::steady_clock::now();
  tracker_.ResetPeaks();
  model_->ResetPhaseSeconds();
  const ShardManager::StepTimes times0 = manager_->step_times();
  comm_spans_.Take(manager_->compute_stream());  // what came before the step is not its own
  const int m = static_cast<int>(c_.train_micro_batch_size_per_gpu);
  const int accumulation = static_cast<int>(c_.gradient_accumulation_steps);
  const int seq = c_.model.shape.seq_len;
  std::vector<int32_t> in(static_cast<size_t>(m) * seq), out(in.size());
  StepOutcome o;
  o.lr = LearningRate(c_.optimizer, c_.scheduler, step);
  // Every stage of a pipeline reads the same micro-batches (the first uses the tokens, the last
  // the targets).
  std::vector<std::vector<int32_t>> ins(executor_ ? accumulation : 0), outs(ins.size());
  std::vector<PipelineData> pipeline_data;
  for (int k = 0; k < accumulation; ++k) {
    // The data position is the global count of sequences consumed, which a checkpoint keeps:
    // a resumed run continues from it even with another global batch size.
    const int64_t first = consumed + int64_t{dp().rank()} * m * accumulation + int64_t{k} * m;
    for (int b = 0; b < m; ++b) {
      ZR_RETURN_IF_ERROR(data_->TrainSequence(first + b, std::span(in).subspan(b * seq, seq),
                                              std::span(out).subspan(b * seq, seq)));
    }
    if (executor_) {
      ins[k] = in;
      outs[k] = out;
      pipeline_data.push_back({ins[k], outs[k]});
      continue;
    }
    Timeline::Scope span(timeline_.get(), StrCat("forward+backward ", step + 1, ".", k), "compute");
    ZR_RETURN_IF_ERROR(model_->ForwardBackward(in, out, m, seq, manager_->loss_scale()).status());
  }
  if (executor_) {  // the schedule's forwards and backwards, spans recorded by the executor
    ZR_RETURN_IF_ERROR(executor_->Train(pipeline_data, m, seq, manager_->loss_scale()).status());
  }
  {
    Timeline::Scope span(timeline_.get(), StrCat("optimizer step ", step + 1), "compute");
    ZR_ASSIGN_OR_RETURN(
        o.result, manager_->Step({.lr = static_cast<float>(o.lr), .micro_batches = accumulation}));
  }
  ZR_ASSIGN_OR_RETURN(const double loss_sum, model_->TakeTrainingLoss());  // 0 off the head
  float loss = static_cast<float>(loss_sum / accumulation);
  ZR_RETURN_IF_ERROR(FromLastStage(&loss, 1));
  ZR_RETURN_IF_ERROR(HostAllReduce(&loss, 1, ReduceOp::kAvg));
  o.loss = loss;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  o.memory = tracker_.Snapshot();  // the step's training, before evaluation
  const ShardManager::StepTimes& times = manager_->step_times();
  const GptModel::PhaseSeconds& phases = model_->phase_seconds();
  const double gather_fwd = times.gather_forward - times0.gather_forward;
  const double gather_bwd = times.gather_backward - times0.gather_backward;
  const double reduce_bwd = times.reduce_backward - times0.reduce_backward;
  StepMetrics::WallClock& w = o.wall;
  w.forward = phases.forward - gather_fwd;
  w.backward = phases.backward - gather_bwd - reduce_bwd;
  w.gather = gather_fwd + gather_bwd;
  w.reduce = reduce_bwd + times.reduce_step - times0.reduce_step;
  w.optimizer = times.optimizer - times0.optimizer;
  w.other = o.seconds - (w.forward + w.backward + w.gather + w.reduce + w.optimizer);
  o.comm = comm_spans_.Take(manager_->compute_stream());
  return o;
}

// The metrics record (every step, metrics.jsonl), the metrics line (every steps_per_print
// steps, the first and the last) and the progress bar, on world rank 0.
void Run::Report(int64_t step, int64_t consumed, const StepOutcome& o, double val) {
  std::optional<OffloadStats> offload;
  if (c_.zero.offload_optimizer.device != "none" || c_.zero.offload_param.device != "none") {
    const OffloadStats now = manager_->offload_stats();  // cumulative: this step's is the change
    offload = now - offload_seen_;
    offload_seen_ = now;
  }
  if (!metrics_) return;  // not rank 0
  metrics_->Step({.step = step + 1,
                  .loss = o.loss,
                  .grad_norm = o.result.grad_norm,
                  .lr = o.lr,
                  .loss_scale = o.result.loss_scale,
                  .skipped = o.result.skipped,
                  .skipped_steps = ShardManagerState(*manager_).skipped_steps(),
                  .tokens = consumed * c_.model.shape.seq_len,
                  .seconds = o.seconds,
                  .memory = o.memory,
                  .val_loss = val,
                  .wall = o.wall,
                  .offload = offload,
                  .comm_s = o.comm.comm_s,
                  .exposed_comm_s = o.comm.exposed_s,
                  .comm_bytes_intra = o.comm.intra_bytes,
                  .comm_bytes_inter = o.comm.inter_bytes});
}

// After a step: a signal on any rank stops every rank at the same step boundary; checkpoints at
// the interval, at the end and on a stop. Returns whether to stop.
StatusOr<bool> Run::SaveOrStop(int64_t step, int64_t consumed) {
  const bool last = step + 1 == c_.train.steps;
  const bool checkpoints = !c_.checkpoint.dir.empty();
  // The stop signal and rank 0's write failure, agreed over the world in one collective.
  float agreed[2] = {static_cast<float>(g_stop_signal), write_error().ok() ? 0.0f : 1.0f};
  ZR_RETURN_IF_ERROR(HostAllReduce(agreed, 2, ReduceOp::kMax, &world()));
  if (agreed[1] > 0) {
    if (!write_error().ok()) return write_error();
    return absl::InternalError(
        "rank 0 could not write its metrics or csv_monitor files; stopping (its message)");
  }
  const float stop = agreed[0];
  const bool interval = c_.checkpoint.interval > 0 && (step + 1) % c_.checkpoint.interval == 0;
  if (checkpoints && (interval || last || stop > 0)) ZR_RETURN_IF_ERROR(Save(step + 1, consumed));
  if (stop > 0 && leader()) {
    Logger()->warn("stopping after step {} on signal {}{}", step + 1, static_cast<int>(stop),
                   checkpoints ? " (checkpoint saved; continue with --resume)" : "");
  }
  return stop > 0;
}

// The text sample at the end of a run.
Status Run::Sample(TrainResult& result) {
  if (c_.train.sample_tokens <= 0) return absl::OkStatus();
  ZR_ASSIGN_OR_RETURN(const TextCodec codec,
                      TextCodec::For(c_.data.tokenizer, c_.model.shape.vocab_size));
  ZR_ASSIGN_OR_RETURN(const std::vector<int32_t> prompt, codec.Encode(c_.train.sample_prompt));
  if (prompt.empty()) return absl::OkStatus();
  const SamplingOptions sampling{
      .temperature = c_.train.sample_temperature, .top_k = c_.train.sample_top_k, .seed = c_.seed};
  ZR_ASSIGN_OR_RETURN(std::vector<int32_t> text,
                      executor_ ? executor_->Generate(prompt, c_.train.sample_tokens, sampling)
                                : model_->Generate(prompt, c_.train.sample_tokens, sampling));
  ZR_ASSIGN_OR_RETURN(result.sample, codec.Decode(text));
  if (leader()) {
    std::fprintf(ctx_.out, "sample (temperature %g, top-k %d):\n%s\n", c_.train.sample_temperature,
                 c_.train.sample_top_k, result.sample.c_str());
    std::fflush(ctx_.out);
  }
  return absl::OkStatus();
}

StatusOr<TrainResult> Run::Loop() {
  ZR_ASSIGN_OR_RETURN(TrainResult result, Steps());
  ZR_RETURN_IF_ERROR(write_error());  // a write after the last agreement (the final records)
  if (metrics_) ZR_RETURN_IF_ERROR(metrics_->Close());
  if (timeline_) {
    ZR_RETURN_IF_ERROR(
        timeline_->Write(world(), *allocator_, manager_->compute_stream(), c_.logging.trace_file));
  }
  return result;
}

StatusOr<TrainResult> Run::Steps() {
  TrainResult result;
  const int64_t steps = c_.train.steps;
  StopSignals signals;
  if (ctx_.resume) result.resumed_from = start_.step;
  int64_t consumed = start_.consumed_sequences;
  for (int64_t step = start_.step; step < steps; ++step) {
    ZR_ASSIGN_OR_RETURN(StepOutcome o, TrainStep(step, consumed));
    consumed += c_.train_batch_size;
    result.steps = step + 1;
    result.final_loss = o.loss;
    result.last_step_memory = o.memory;
    double val = -1;
    const bool last = step + 1 == steps;
    if ((c_.train.eval_interval > 0 && (step + 1) % c_.train.eval_interval == 0) || last) {
      if (data_->validation_windows() > 0) {
        Timeline::Scope span(timeline_.get(), "evaluation", "compute");
        ZR_RETURN_IF_ERROR(Evaluate(val));
        result.val_loss = val;
      }
    }
    Report(step, consumed, o, val);
    if (!std::isfinite(o.loss)) {
      Logger()->error("step {}: the loss is {} on the data-parallel mean; stopping", step + 1,
                      o.loss);
      result.non_finite = true;
      return result;
    }
    ZR_ASSIGN_OR_RETURN(const bool stop, SaveOrStop(step, consumed));
    if (stop) {
      result.stopped_by_signal = true;
      return result;
    }
  }
  ZR_RETURN_IF_ERROR(Sample(result));
  return result;
}

}  // namespace

StatusOr<TrainResult> Train(RunConfig config, const TrainerContext& context) {
  if (context.world == nullptr) return absl::InvalidArgumentError("Train needs the world group");
  Run run(std::move(config), context);
  ZR_RETURN_IF_ERROR(run.Setup());
  return run.Loop();
}

}  // namespace zerort
