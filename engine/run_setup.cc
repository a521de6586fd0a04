// Run::Setup's phases ([Note: a run's setup]): the device, the ranks' agreement, the mesh, the
// batch and pipeline, the memory check, the shard manager and run files, the model, the
// pipeline's executor, a resume, the data and the start line.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "zerort/checkpoint/config_match.h"
#include "zerort/checkpoint/hf_config.h"
#include "zerort/checkpoint/run_dir.h"
#include "zerort/checkpoint/safetensors.h"
#include "zerort/config/run_options.h"
#include "zerort/engine/host_memory.h"
#include "zerort/engine/preflight.h"
#include "zerort/engine/run.h"
#include "zerort/engine/run_mesh.h"
#include "zerort/estimate/memory_model.h"
#include "zerort/kernels/blas.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/rope.h"
#include "zerort/layers/decoder_plans.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort::trainer_internal {

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
      metrics_, MetricsSink::Open({.metrics_file = MetricsPath(),
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
                                   .peak_flops = PeakFlops(c_.train.peak_tflops, cuda_, gpu_.name),
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

// Rank 0's: the file can be written, and a new run does not replace an earlier run's trace
// unasked (as with its metrics; a resumed run replaces it). Every rank learns the answer
// (AgreeAll), so none waits in a collective the failing rank will not join.
Status Run::CheckTraceFile() {
  if (!ctx_.resume) {
    ZR_RETURN_IF_ERROR(CheckNewRunFile("logging.trace_file", c_.logging.trace_file, ctx_.overwrite,
                                       "continue that run (its trace is then replaced)"));
  }
  return Timeline::CheckWritable(c_.logging.trace_file);
}

Status Run::CheckMemoryFits() {
  if (!c_.train.check_memory) return absl::OkStatus();
  StatusOr<MemoryModelInput> input = MemoryModelInput::FromConfig(c_, world().size(), cuda_);
  if (!input.ok()) return absl::OkStatus();  // what the estimator cannot model goes unchecked
  MemoryModelInput in = *input;
  in.pipeline_stage = mesh_ ? mesh_->coord().pipeline : 0;
  // The nodes the mesh forms its qgZ levels over (FromConfig's default is one node).
  in.ranks_per_node = std::max(1, ctx_.local_world_size);
  return ::zerort::CheckMemoryFits(in, {.cuda = cuda_,
                                        .ranks_on_node = std::max(1, ctx_.local_world_size),
                                        .world_size = world().size(),
                                        .gpu_bytes = static_cast<int64_t>(gpu_.total_memory_bytes),
                                        .host = QueryHostMemory()});
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
    ZR_RETURN_IF_ERROR(
        AgreeAll(leader() ? CheckTraceFile() : absl::OkStatus(), "logging.trace_file"));
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

// The device for train.device `want`: the session's (`given`, where the caller passed it) or
// chosen here. "" takes either; "cuda" only a GPU, "cpu" and "cpu-async" only the CPU. A session's
// device that train.device rules out is the caller's mistake.
static StatusOr<Device> DeviceFor(const std::string& want, const std::optional<Device>& given,
                                  int local_rank) {
  const bool gpu_choice = want == "cuda" || want.empty();
  if (given.has_value()) {
    if (want.empty() || given->is_cuda() == gpu_choice) return *given;
    return absl::InvalidArgumentError(
        StrCat("the session runs on ", given->ToString(), ", but train.device is \"", want, "\""));
  }
  StatusOr<Device> chosen = ChooseDevice(gpu_choice ? want : "cpu", local_rank);
  if (chosen.ok()) return chosen;
  return absl::InvalidArgumentError(
      StrCat("train.device = \"cuda\", but there is ", chosen.status().message()));
}

Status Run::SetupDevice() {
  ZR_ASSIGN_OR_RETURN(const Device chosen,
                      DeviceFor(c_.train.device, ctx_.device, ctx_.local_rank));
  cuda_ = chosen.is_cuda();
  if (cuda_) {
    device_ = chosen;
    // Its name (the MFU's peak), memory (the memory check) and shared memory a block (the flash
    // attention's blocks); unknown (zeros) where its properties do not read.
    gpu_ = QueryCudaDevice(device_.index);
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
                                .tensor_parallel = mesh_ ? &mesh_->tensor() : nullptr,
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
    // model.attention_backend and model.flash_attention: checked here as well as by the memory
    // check (which a run may skip).
    const std::optional<AttentionProgram> attention =
        AttentionBackendNamed(c_.model.attention_backend);
    // The flash programs' blocks against this GPU's shared memory a block (unknown: 0, unchecked).
    ZR_RETURN_IF_ERROR(internal::CheckAttentionBackend(
        attention, c_.model.flash_attention, compute,
        decoder::AttentionShapeOf(c_.model.shape, c_.parallel.tensor_parallel_size,
                                  static_cast<int>(c_.train_micro_batch_size_per_gpu)),
        gpu_.shared_memory_per_block));
    if (c_.model.shape.features().qkv == QkvKind::kRotary) {
      ZR_RETURN_IF_ERROR(Annotate(CheckCudaRope(c_.model.shape.head_size()), "model"));
    }
    ZR_ASSIGN_OR_RETURN(kernels_,
                        MakeCudaModelKernels(compute, DType::kF32, manager_->compute_stream(),
                                             *allocator_, attention, c_.model.flash_attention));
  } else {
    kernels_ = MakeCpuModelKernels(compute == DType::kBF16  ? CpuPrecision::kBf16
                                   : compute == DType::kF16 ? CpuPrecision::kF16
                                                            : CpuPrecision::kFloat,
                                   &manager_->compute_stream());
  }
  ZR_ASSIGN_OR_RETURN(
      model_,
      DecoderModel::Create({.config = c_.model.shape,
                            .micro_batch = static_cast<int>(c_.train_micro_batch_size_per_gpu),
                            .activation_checkpointing = c_.model.activation_checkpointing,
                            .tp = {tp()},
                            .sequence_parallel = c_.parallel.sequence_parallel,
                            .vocab_multiple = c_.parallel.make_vocab_size_divisible_by,
                            .head_chunk_rows = c_.model.head_chunk_rows,
                            .stage = part_},
                           *store_, *kernels_, *allocator_));
  model_->set_defer_training_loss(true);  // read once per step, not per micro-batch
  // Or model.init_from's, where a NaN is seen only by the ranks whose part (a stage's units, a
  // tensor-parallel slice) holds it: they agree. GPT-2's initialisation is the same on every
  // rank and needs no agreement, nor the small buffer it would take from the device allocator
  // after the model's (the estimator replays none: estimate --measure stays exact there).
  const Status initialized = InitializeWeights(c_.model, *manager_);
  if (c_.model.init_from.empty() || world().size() == 1) {
    ZR_RETURN_IF_ERROR(initialized);
  } else {
    ZR_RETURN_IF_ERROR(AgreeAll(initialized, "model.init_from"));
  }
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

}  // namespace zerort::trainer_internal
