// The training loop (Run::Setup's phases: run_setup.cc).
#include "zerort/engine/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <memory>
#include <optional>
#include <utility>

#include "zerort/checkpoint/checkpoint.h"
#include "zerort/checkpoint/config_match.h"
#include "zerort/checkpoint/export.h"
#include "zerort/checkpoint/hf_config.h"
#include "zerort/checkpoint/run_dir.h"
#include "zerort/checkpoint/safetensors.h"
#include "zerort/config/run_options.h"
#include "zerort/data/data_loader.h"
#include "zerort/data/tokenizer.h"
#include "zerort/engine/comm_spans.h"
#include "zerort/engine/host_memory.h"
#include "zerort/engine/lr_schedule.h"
#include "zerort/engine/metrics_sink.h"
#include "zerort/engine/preflight.h"
#include "zerort/engine/run.h"
#include "zerort/engine/run_mesh.h"
#include "zerort/engine/timeline.h"
#include "zerort/estimate/memory_model.h"
#include "zerort/kernels/blas.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/layers/pipeline_executor.h"
#include "zerort/runtime/device_mesh.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/watchdog.h"
#include "zerort/sharding/manager_state.h"
#include "zerort/sharding/shard_manager.h"

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

}  // namespace

namespace trainer_internal {

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
  const DecoderModel::PhaseSeconds& phases = model_->phase_seconds();
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

}  // namespace trainer_internal

StatusOr<TrainResult> Train(RunConfig config, const TrainerContext& context) {
  if (context.world == nullptr) return absl::InvalidArgumentError("Train needs the world group");
  trainer_internal::Run run(std::move(config), context);
  ZR_RETURN_IF_ERROR(run.Setup());
  return run.Loop();
}

}  // namespace zerort
