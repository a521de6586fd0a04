// zerort bench model: forward + backward of the built-in GPT model through the shard manager
// (one rank) for a config, in tokens per second and achieved FLOP/s by the PaLM formula
// (6 N + 12 L d T per token), against a same-run baseline: the throughput of the model's own
// largest GEMM shape (the MLP's [rows, d] x [d, 4d]) through the same GEMM path (OpenBLAS on CPU,
// cuBLASLt on a GPU), i.e. the fraction of the machine's dense-math rate the whole model reaches.
// On a GPU it also reports MFU against the device's dense bf16 peak. Under mpirun with
// parallel.tensor_parallel_size in the config, every rank runs its part of the model on a data x
// tensor mesh; throughput and FLOP/s are reported per device (the whole run's over every
// device), the baseline is this rank's own GEMM shape ([rows, d] x [d, 4d/tp]). Every run also
// times the whole training step (forward + backward + optimizer step). With --phases: the
// step's phases (forward, backward, optimizer; within forward + backward, the linear layers'
// GEMMs, the attention and the other ops, on the CPU) and a second baseline, the same GEMM path
// on a square 2048^3 product (the machine's sgemm peak, as far as this path reaches it).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "bench_stats.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/config/config.h"
#include "zerort/kernels/blas.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/kernels/op_census.h"
#include "zerort/kernels/op_timeline.h"
#include "zerort/layers/decoder_model.h"
#include "zerort/layers/decoder_plans.h"
#include "zerort/runtime/device_mesh.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/mpi_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

struct BenchModelConfig {
  DecoderConfig model;
  int micro_batch = 1;
  DType compute = DType::kF32;  // bf16.enabled: bf16; fp16.enabled: f16
  bool checkpointing = false;
  ZeroStage stage = ZeroStage::k0;
  int tp = 1;
  bool sequence_parallel = false;
  int vocab_multiple = 1;
  int64_t head_chunk_rows = 0;
  std::optional<AttentionProgram> attention;  // model.attention_backend (CUDA)
  FlashTiles flash_tiles;                     // model.flash_attention (CUDA)
  double peak_tflops = 0;                     // train.peak_tflops: MFU's denominator
};

// A run config, read and validated as `zerort train` reads it; bench uses the model, the
// micro-batch (1 when unset), the compute dtype (bf16 or fp16), the ZeRO stage and activation
// checkpointing.
StatusOr<BenchModelConfig> LoadBenchConfig(const std::string& path,
                                           const std::vector<std::string>& overrides) {
  ZR_ASSIGN_OR_RETURN(RunConfig run, LoadRunConfig(path, overrides));
  BenchModelConfig c;
  c.model = run.model.shape;
  c.micro_batch = run.train_micro_batch_size_per_gpu > 0
                      ? static_cast<int>(run.train_micro_batch_size_per_gpu)
                      : 1;
  c.compute = run.bf16 ? DType::kBF16 : run.fp16.enabled ? DType::kF16 : DType::kF32;
  c.checkpointing = run.model.activation_checkpointing;
  c.stage = static_cast<ZeroStage>(run.zero.stage);
  c.tp = run.parallel.tensor_parallel_size;
  c.sequence_parallel = run.parallel.sequence_parallel;
  c.vocab_multiple = run.parallel.make_vocab_size_divisible_by;
  c.head_chunk_rows = run.model.head_chunk_rows;
  c.attention = AttentionBackendNamed(run.model.attention_backend);
  c.flash_tiles = run.model.flash_attention;
  c.peak_tflops = run.train.peak_tflops;
  return c;
}

}  // namespace

int RunBenchModel(const BenchModelOptions& o, const LaunchEnv& launch, int* argc, char*** argv) {
  if (o.iters < 1 || o.iters > 100000) {
    Logger()->error("bench model: --iters {} must be in [1, 100000]", o.iters);
    return kExitUsage;
  }
  StatusOr<BenchModelConfig> loaded = LoadBenchConfig(o.config, o.overrides);
  if (!loaded.ok()) {
    Logger()->error("bench model: {}", loaded.status().message());
    return kExitUsage;
  }
  BenchModelConfig c = *loaded;
  if (launch.world_size % c.tp != 0) {
    Logger()->error(
        "bench model: parallel.tensor_parallel_size = {} does not divide the world size {}{}", c.tp,
        launch.world_size, launch.world_size == 1 ? " (run it under mpirun -np <tp x data>)" : "");
    return kExitUsage;
  }
  const bool cuda = !o.cpu && CudaDeviceCount() > 0;
  const Device device =
      cuda ? Device::Cuda(launch.local_rank % std::max(1, CudaDeviceCount())) : Device::Cpu();
  // The bench's own GPU (its index is the rank's): its name, and a known GPU's MFU peak.
  const CudaDeviceInfo gpu = cuda ? QueryCudaDevice(device.index) : CudaDeviceInfo{};
  const DType dtype = c.compute;
  const DecoderConfig& m = c.model;
  const int batch = c.micro_batch, seq = m.seq_len;
  const double tokens = static_cast<double>(batch) * seq;

  nlohmann::json result;
  std::unique_ptr<MpiContext> mpi;
  const Status status = [&]() -> Status {
    std::vector<std::unique_ptr<Communicator>> comms;
    std::unique_ptr<Communicator> world_owned;
    Communicator* world = nullptr;
    if (launch.world_size > 1) {
      ZR_ASSIGN_OR_RETURN(mpi, MpiContext::Init(argc, argv, {}));
      ZR_ASSIGN_OR_RETURN(world_owned, mpi->World({}));
      world = world_owned.get();
    } else {
      ZR_ASSIGN_OR_RETURN(comms, CreateLoopbackGroup(1, {}, nullptr));
      world = comms[0].get();
    }
    ZR_ASSIGN_OR_RETURN(auto mesh,
                        DeviceMesh::Create(*world, {.data = world->size() / c.tp, .tensor = c.tp},
                                           world->options()));
    MemoryTracker tracker;
    std::unique_ptr<Allocator> allocator;
    if (cuda) {
      ZR_RETURN_IF_ERROR(SetCurrentDevice(device));
      ZR_ASSIGN_OR_RETURN(allocator, MakeCudaCachingAllocator(device, &tracker));
    } else {
      allocator = MakeCpuCachingAllocator(&tracker);
    }
    ShardManagerOptions so;
    so.stage = c.stage;
    so.compute_dtype = dtype;
    so.reduce_dtype = DType::kF32;
    ZR_ASSIGN_OR_RETURN(
        auto manager,
        ShardManager::Create(so, {.dp = &mesh->data(),
                                  .device_allocator = allocator.get(),
                                  .model_parallel = c.tp > 1 ? &mesh->model_parallel() : nullptr,
                                  .tensor_parallel_rank = mesh->coord().tensor}));
    auto store = MakeShardManagerStore(*manager);
    std::unique_ptr<ModelKernels> kernels;
    if (cuda) {
      ZR_RETURN_IF_ERROR(internal::CheckAttentionBackend(
          c.attention, c.flash_tiles, dtype, decoder::AttentionShapeOf(m, c.tp, batch)));
      ZR_ASSIGN_OR_RETURN(
          kernels, MakeCudaModelKernels(dtype, DType::kF32, manager->compute_stream(), *allocator,
                                        c.attention, c.flash_tiles));
    } else {
      kernels = MakeCpuModelKernels(dtype == DType::kBF16  ? CpuPrecision::kBf16
                                    : dtype == DType::kF16 ? CpuPrecision::kF16
                                                           : CpuPrecision::kFloat,
                                    &manager->compute_stream());
    }
    // --census: every kernel call of the last iteration's forward and backward counted.
    OpCensus census, micro_batch;
    std::map<std::string, int64_t> launched;  // CUDA: launches of the census' micro-batch
    if (o.census) kernels = CountOperations(std::move(kernels), &census);
    // --timeline: every kernel call of the last iteration's forward and backward timed on the
    // stream, and the step's phases between marks on the compute stream.
    OpTimeline timeline(device);
    std::vector<OpSample> timed;
    std::vector<std::unique_ptr<StreamMark>> phase_marks;  // before / after forward+backward,
    double timed_wall = 0;                                 // after the reduce, after the step
    if (o.timeline) {
      kernels = TimeOperations(std::move(kernels), &timeline);
      for (int i = 0; i < 4; ++i) {
        ZR_ASSIGN_OR_RETURN(auto mark, CreateStreamMark(device));
        phase_marks.push_back(std::move(mark));
      }
    }
    ZR_ASSIGN_OR_RETURN(auto model,
                        DecoderModel::Create({.config = m,
                                              .micro_batch = batch,
                                              .activation_checkpointing = c.checkpointing,
                                              .tp = {c.tp > 1 ? &mesh->tensor() : nullptr},
                                              .sequence_parallel = c.sequence_parallel,
                                              .vocab_multiple = c.vocab_multiple,
                                              .head_chunk_rows = c.head_chunk_rows},
                                             *store, *kernels, *allocator));
    ZR_RETURN_IF_ERROR(manager->Initialize(DecoderInitializer(m)));
    // As `zerort train`: the loss goes into the kernels' ledger, read after the micro-batch, so
    // the timed work has no host read ([Note: the training loss ledger]).
    model->set_defer_training_loss(true);
    std::mt19937 rng(1);
    std::vector<int32_t> ids(static_cast<size_t>(tokens)), targets(ids.size());
    for (int32_t& t : ids) t = static_cast<int32_t>(rng() % m.vocab_size);
    for (int32_t& t : targets) t = static_cast<int32_t>(rng() % m.vocab_size);
    auto now = [] { return std::chrono::steady_clock::now(); };
    auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };

    // Baseline: the MLP's up-projection GEMM on buffers of this rank's shapes, same GEMM path.
    const int64_t rows = static_cast<int64_t>(tokens);
    const int hidden = 4 * m.d_model / c.tp;
    const size_t act = kernels->act_size();
    ZR_ASSIGN_OR_RETURN(Buffer x,
                        allocator->Allocate(rows * m.d_model * act, MemoryCategory::kWorkspace,
                                            &kernels->stream()));
    ZR_ASSIGN_OR_RETURN(
        Buffer w, allocator->Allocate(int64_t{hidden} * m.d_model * act, MemoryCategory::kWorkspace,
                                      &kernels->stream()));
    ZR_ASSIGN_OR_RETURN(
        Buffer y,
        allocator->Allocate(rows * hidden * act, MemoryCategory::kWorkspace, &kernels->stream()));
    ZR_RETURN_IF_ERROR(FillZero(x.data(), device, x.bytes(), &kernels->stream()));
    ZR_RETURN_IF_ERROR(FillZero(w.data(), device, w.bytes(), &kernels->stream()));
    const double gemm_flops = 2.0 * rows * m.d_model * hidden;
    // As many products a timing as the model's forward+backward has FLOPs, at least one and at
    // most 5e10 FLOPs' worth: the baseline costs about what the measured work does. (It used to
    // be 5e10 FLOPs whatever the model: 12,000 tiny products an iteration for bench-tiny, most of
    // the command's time, and minutes of it on a loaded machine.)
    const double step_flops = m.FlopsPerToken() * tokens / c.tp;
    const int gemm_repeats = static_cast<int>(
        std::clamp(step_flops / gemm_flops, 1.0, std::max(1.0, 5e10 / gemm_flops)));

    // --phases: the square GEMM of the second baseline.
    const int64_t square = o.phases ? 2048 : 0;
    Buffer sa, sb, sc;
    if (square > 0) {
      for (Buffer* b : {&sa, &sb, &sc}) {
        ZR_ASSIGN_OR_RETURN(*b,
                            allocator->Allocate(square * square * act, MemoryCategory::kWorkspace,
                                                &kernels->stream()));
        ZR_RETURN_IF_ERROR(FillZero(b->data(), device, b->bytes(), &kernels->stream()));
      }
    }
    struct Phases {
      std::vector<double> forward, backward, optimizer, step, matmul, attention, square;
    } ph;
    std::vector<double> step_s, gemm_s;
    tracker.ResetPeaks();
    // The warm-up iteration names each phase as it ends (rank 0): a run that stops making
    // progress shows where (on the GPU of 2026-11-30 bench model stalled after Initialize).
    const auto warm_up_start = now();
    auto warm_up = [&](int it, const char* done) {
      if (it == 0 && world->rank() == 0) {
        Logger()->info("warm-up iteration: {} ({:.2f} s)", done, seconds(warm_up_start, now()));
      }
    };
    warm_up(0, "weights initialized");
    for (int it = 0; it <= o.iters; ++it) {  // iteration 0 warms up (allocator, cuBLASLt plans)
      const DecoderModel::PhaseSeconds model_before = model->phase_seconds();
      const ModelKernels::Seconds kernels_before =
          kernels->seconds() != nullptr ? *kernels->seconds() : ModelKernels::Seconds{};
      census.Clear();
      timeline.Clear();
      const auto launched_before = kernels->launches();
      Stream& compute = manager->compute_stream();
      auto mark = [&](int i) {
        return o.timeline ? phase_marks[i]->Record(compute) : absl::OkStatus();
      };
      const auto t0 = now();
      ZR_RETURN_IF_ERROR(mark(0));
      ZR_RETURN_IF_ERROR(model->ForwardBackward(ids, targets, batch, seq, 1.0f).status());
      ZR_RETURN_IF_ERROR(mark(1));
      warm_up(it, "forward+backward issued");
      micro_batch = census;
      if (launched_before.has_value()) {  // CUDA: the device work those calls issued
        launched.clear();
        // Named: launches() returns a temporary, and a range-for over `*kernels->launches()`
        // would walk it after its end (the twelfth GPU run's hang, docs/gpu.md).
        const std::optional<std::map<std::string, int64_t>> launched_after = kernels->launches();
        for (const auto& [what, n] : *launched_after) {
          const auto before = launched_before->find(what);
          const int64_t d = n - (before != launched_before->end() ? before->second : 0);
          if (d > 0) launched[what] = d;
        }
      }
      ZR_RETURN_IF_ERROR(manager->ReduceGradients());
      ZR_RETURN_IF_ERROR(mark(2));
      ZR_RETURN_IF_ERROR(manager->compute_stream().Synchronize());
      const auto t1 = now();
      warm_up(it, "gradients reduced, compute stream synchronised");
      const ModelKernels::Seconds kernels_after =
          kernels->seconds() != nullptr ? *kernels->seconds() : ModelKernels::Seconds{};
      ZR_RETURN_IF_ERROR(manager->Step({.lr = 1e-4f}).status());
      if (o.timeline) {
        ZR_RETURN_IF_ERROR(mark(3));
        ZR_RETURN_IF_ERROR(compute.Synchronize());
        ZR_ASSIGN_OR_RETURN(timed, timeline.Collect());
        timed_wall = seconds(t0, t1);
      }
      ZR_RETURN_IF_ERROR(model->TakeTrainingLoss().status());  // outside the census and timeline
      const auto t2 = now();
      warm_up(it, "optimizer step done, loss read");
      for (int r = 0; r < gemm_repeats; ++r) {
        ZR_RETURN_IF_ERROR(
            kernels->Matmul(y.data(), x.data(), w.data(), nullptr, rows, m.d_model, hidden));
      }
      ZR_RETURN_IF_ERROR(kernels->stream().Synchronize());
      const auto t3 = now();
      if (square > 0) {
        ZR_RETURN_IF_ERROR(kernels->Matmul(sc.data(), sa.data(), sb.data(), nullptr, square,
                                           static_cast<int>(square), static_cast<int>(square)));
        ZR_RETURN_IF_ERROR(kernels->stream().Synchronize());
      }
      const auto t4 = now();
      warm_up(it, "GEMM baseline done");
      if (it > 0) {
        step_s.push_back(seconds(t0, t1));
        gemm_s.push_back(seconds(t2, t3) / gemm_repeats);
        ph.step.push_back(seconds(t0, t2));
        ph.optimizer.push_back(seconds(t1, t2));
        ph.forward.push_back(model->phase_seconds().forward - model_before.forward);
        ph.backward.push_back(model->phase_seconds().backward - model_before.backward);
        if (kernels->seconds() != nullptr) {
          ph.matmul.push_back(kernels_after.matmul - kernels_before.matmul);
          ph.attention.push_back(kernels_after.attention - kernels_before.attention);
        }
        if (square > 0) ph.square.push_back(seconds(t3, t4));
        if (world->rank() == 0) {
          Logger()->info("iteration {}: forward+backward {:.3f} s, optimizer step {:.3f} s", it,
                         seconds(t0, t1), seconds(t1, t2));
        }
      }
    }
    // The slowest rank's median sets the pace; every data-parallel replica processes `tokens`
    // per iteration, and the whole run's FLOPs are shared by every device of the mesh.
    int64_t ns[2] = {std::llround(Median(step_s) * 1e9), std::llround(Median(gemm_s) * 1e9)};
    ZR_RETURN_IF_ERROR(world->AllReduce(ns, ns, 2, DType::kI64, ReduceOp::kMax));
    const double medians[2] = {ns[0] * 1e-9, ns[1] * 1e-9};
    const double fb = medians[0];
    const int devices = world->size();
    const double run_tokens_per_s = tokens * mesh->shape().data / fb;
    const double flops = m.FlopsPerToken() * run_tokens_per_s / devices;  // per device
    const double gemm_rate = gemm_flops / medians[1];
    result = {
        {"bench", "model"},
        {"baseline", "the model's largest GEMM shape ([rows, d] x [d, 4d]) alone, same GEMM path"},
        {"config", o.config},
        {"device", cuda ? gpu.name : "cpu"},
        {"dtype", std::string(DTypeName(dtype))},
        {"params", m.NumParameters()},
        {"n_layer", m.n_layer},
        {"d_model", m.d_model},
        {"seq_len", seq},
        {"micro_batch", batch},
        {"activation_checkpointing", c.checkpointing},
        {"head_chunk_rows", HeadChunkRows(c.head_chunk_rows, int64_t{batch} * seq, m.d_model)},
        {"zero_stage", static_cast<int>(c.stage)},
        {"world_size", devices},
        {"data_parallel", mesh->shape().data},
        {"tensor_parallel", c.tp},
        {"sequence_parallel", c.sequence_parallel},
        {"threads", cuda ? 0 : BlasThreads()},
        {"iterations", o.iters},
        {"forward_backward_s", fb},
        {"tokens_per_s", run_tokens_per_s},
        {"tokens_per_s_per_device", run_tokens_per_s / devices},
        {"flops_per_token", m.FlopsPerToken()},
        {"achieved_tflops", flops / 1e12},
        {"gemm_tflops", gemm_rate / 1e12},
        {"ratio", flops / gemm_rate},
        {"peak_activation_bytes",
         tracker.Usage(MemoryTier::kDevice, MemoryCategory::kActivations).peak},
        // The head's logits chunk is workspace, as is the backward's scratch.
        {"peak_workspace_bytes",
         tracker.Usage(MemoryTier::kDevice, MemoryCategory::kWorkspace).peak},
        // The whole training step (forward + backward + optimizer), this rank's median.
        {"step_s", Median(ph.step)},
        {"step_tokens_per_s", tokens * mesh->shape().data / Median(ph.step) / devices},
    };
    if (o.phases) {
      nlohmann::json p = {{"forward_s", Median(ph.forward)},
                          {"backward_s", Median(ph.backward)},
                          {"optimizer_s", Median(ph.optimizer)}};
      if (!ph.matmul.empty()) {
        p["linear_gemm_s"] = Median(ph.matmul);
        p["attention_s"] = Median(ph.attention);
        p["other_ops_s"] =
            Median(ph.forward) + Median(ph.backward) - Median(ph.matmul) - Median(ph.attention);
      }
      result["phases"] = p;
      const double square_rate = 2.0 * square * square * square / Median(ph.square);
      result["sgemm_2048_tflops"] = square_rate / 1e12;
      // PaLM FLOP/s of the whole step against the square GEMM's rate.
      result["step_ratio_to_sgemm"] =
          m.FlopsPerToken() * result["step_tokens_per_s"].get<double>() / square_rate;
    }
    if (o.census) {
      // The average over blocks includes the embedding's and the head's calls.
      result["census"] = {{"ops", micro_batch.ops},
                          {"per_micro_batch", micro_batch.total_ops()},
                          {"per_block", static_cast<double>(micro_batch.total_ops()) / m.n_layer},
                          {"host_reads", micro_batch.host_reads},
                          {"counts",
                           "ModelKernels calls of one micro-batch's forward and backward (each one "
                           "CUDA launch or more: on CUDA `launches` counts them; the runtime's own "
                           "fills and copies outside the kernels are not counted)"}};
      if (kernels->launches().has_value()) {
        int64_t total = 0;
        for (const auto& [what, n] : launched) total += n;
        result["census"]["launches"] = launched;
        result["census"]["launches_per_micro_batch"] = total;
        result["census"]["launches_per_block"] = static_cast<double>(total) / m.n_layer;
      }
    }
    if (o.timeline) {
      const TimelineSummary t = Summarize(timed);
      auto group = [&](const TimelineGroup& g) {
        nlohmann::json j = {{"calls", g.calls},
                            {"seconds", g.seconds},
                            {"share", t.span_seconds > 0 ? g.seconds / t.span_seconds : 0.0}};
        if (g.flops > 0 && g.seconds > 0) j["tflops"] = g.flops / g.seconds / 1e12;
        if (g.bytes > 0 && g.seconds > 0) j["gbps"] = g.bytes / g.seconds / 1e9;
        return j;
      };
      nlohmann::json kinds = nlohmann::json::object(), gemms = nlohmann::json::object(),
                     others = nlohmann::json::object();
      for (const TimelineGroup& g : t.kinds) kinds[g.key] = group(g);
      for (const TimelineGroup& g : t.gemms) gemms[g.key] = group(g);
      for (const TimelineGroup& g : t.others) others[g.key] = group(g);
      ZR_ASSIGN_OR_RETURN(const double fb_stream, phase_marks[1]->SecondsSince(*phase_marks[0]));
      ZR_ASSIGN_OR_RETURN(const double reduce_stream,
                          phase_marks[2]->SecondsSince(*phase_marks[1]));
      ZR_ASSIGN_OR_RETURN(const double step_stream, phase_marks[3]->SecondsSince(*phase_marks[2]));
      result["timeline"] = {
          {"what",
           "the last iteration's forward+backward: each kernel call's time on the compute stream "
           "(CUDA events on a GPU), by kind, GEMM shape and the other calls' operation; gaps: "
           "the stream's time between calls (fills, copies, waits for the collectives' stream or "
           "for the host)"},
          {"calls", t.calls},
          {"host_reads", t.host_reads},
          {"ops_s", t.op_seconds},
          {"gaps_s", t.gap_seconds},
          {"span_s", t.span_seconds},
          {"forward_backward_stream_s", fb_stream},
          {"forward_backward_wall_s", timed_wall},
          {"reduce_stream_s", reduce_stream},
          {"optimizer_stream_s", step_stream},
          {"kinds", kinds},
          {"gemms", gemms},
          {"others", others}};
    }
    const double peak = PeakFlops(c.peak_tflops, cuda, gpu.name);
    if (peak > 0) {  // the CPU, or a GPU whose peak is not known: no MFU (runtime/device.h)
      result["peak_tflops"] = peak / 1e12;
      result["peak_from"] = c.peak_tflops > 0 ? "train.peak_tflops" : "the device's name";
      result["mfu"] = flops / peak;
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    Logger()->error("bench model: {}", status.message());
    return kExitRuntimeFailure;
  }
  if (launch.rank != 0) return kExitOk;
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
    return kExitOk;
  }
  std::printf("zerort bench model: %s on %s (%s), %lld parameters, micro-batch %d x %d tokens\n",
              o.config.c_str(), result["device"].get<std::string>().c_str(),
              result["dtype"].get<std::string>().c_str(), static_cast<long long>(m.NumParameters()),
              batch, seq);
  std::printf("  forward+backward      %10.4f s   (median of %d)\n",
              result["forward_backward_s"].get<double>(), o.iters);
  std::printf("  mesh                  data %d x tensor %d%s\n", result["data_parallel"].get<int>(),
              c.tp, c.sequence_parallel ? " (SP)" : "");
  std::printf("  tokens/s              %10.1f   (%.1f per device)\n",
              result["tokens_per_s"].get<double>(),
              result["tokens_per_s_per_device"].get<double>());
  std::printf("  TFLOP/s per device    %10.4f   (PaLM: %.3g FLOPs/token)\n",
              result["achieved_tflops"].get<double>(), m.FlopsPerToken());
  std::printf("  GEMM baseline TFLOP/s %10.4f\n", result["gemm_tflops"].get<double>());
  std::printf("  ratio (model / GEMM)  %10.3f\n", result["ratio"].get<double>());
  if (result.contains("mfu")) {
    std::printf("  MFU (peak %-8g)    %10.3f\n", result["peak_tflops"].get<double>(),
                result["mfu"].get<double>());
  }
  std::printf("  training step         %10.4f s   (%.1f tokens/s per device, with the optimizer)\n",
              result["step_s"].get<double>(), result["step_tokens_per_s"].get<double>());
  if (o.phases) {
    const nlohmann::json& p = result["phases"];
    std::printf("  phases (medians)      forward %.4f s, backward %.4f s, optimizer %.4f s\n",
                p["forward_s"].get<double>(), p["backward_s"].get<double>(),
                p["optimizer_s"].get<double>());
    if (p.contains("linear_gemm_s")) {
      std::printf(
          "  forward+backward      linear GEMMs %.4f s, attention %.4f s, other ops %.4f s\n",
          p["linear_gemm_s"].get<double>(), p["attention_s"].get<double>(),
          p["other_ops_s"].get<double>());
    }
    std::printf("  sgemm 2048^3 TFLOP/s  %10.4f\n", result["sgemm_2048_tflops"].get<double>());
    std::printf("  ratio (step / sgemm)  %10.3f\n", result["step_ratio_to_sgemm"].get<double>());
  }
  if (o.census) {
    const nlohmann::json& c = result["census"];
    std::printf("  census (one micro-batch) %lld kernel calls, %.1f per block, %lld host reads:",
                static_cast<long long>(c["per_micro_batch"].get<int64_t>()),
                c["per_block"].get<double>(),
                static_cast<long long>(c["host_reads"].get<int64_t>()));
    for (const auto& [op, n] : c["ops"].items()) {
      std::printf(" %s %lld", op.c_str(), static_cast<long long>(n.get<int64_t>()));
    }
    std::printf("\n");
    if (c.contains("launches")) {
      std::printf("  device launches          %lld, %.1f per block:",
                  static_cast<long long>(c["launches_per_micro_batch"].get<int64_t>()),
                  c["launches_per_block"].get<double>());
      for (const auto& [what, n] : c["launches"].items()) {
        std::printf(" %s %lld", what.c_str(), static_cast<long long>(n.get<int64_t>()));
      }
      std::printf("\n");
    }
  }
  if (o.timeline) {
    const nlohmann::json& t = result["timeline"];
    const double span = t["span_s"].get<double>();
    std::printf(
        "  timeline (last forward+backward, stream time): %lld calls in %.2f ms, "
        "%.2f ms in calls, %.2f ms between them (%.1f%%)\n",
        static_cast<long long>(t["calls"].get<int64_t>()), span * 1e3,
        t["ops_s"].get<double>() * 1e3, t["gaps_s"].get<double>() * 1e3,
        span > 0 ? 100 * t["gaps_s"].get<double>() / span : 0.0);
    std::printf(
        "    step on the stream     forward+backward %.2f ms (wall %.2f ms), reduce %.2f "
        "ms, optimizer %.2f ms\n",
        t["forward_backward_stream_s"].get<double>() * 1e3,
        t["forward_backward_wall_s"].get<double>() * 1e3, t["reduce_stream_s"].get<double>() * 1e3,
        t["optimizer_stream_s"].get<double>() * 1e3);
    auto rows = [](const nlohmann::json& groups) {
      std::vector<std::pair<double, std::string>> order;  // most time first
      for (const auto& [key, g] : groups.items())
        order.emplace_back(-g["seconds"].get<double>(), key);
      std::sort(order.begin(), order.end());
      for (const auto& [neg, key] : order) {
        const nlohmann::json& g = groups[key];
        std::printf("    %-34s %5lld calls %9.3f ms %6.1f%%", key.c_str(),
                    static_cast<long long>(g["calls"].get<int64_t>()),
                    g["seconds"].get<double>() * 1e3, 100 * g["share"].get<double>());
        if (g.contains("tflops")) std::printf(" %9.2f TFLOP/s", g["tflops"].get<double>());
        if (g.contains("gbps")) std::printf(" %9.1f GB/s", g["gbps"].get<double>());
        std::printf("\n");
      }
    };
    rows(t["kinds"]);
    std::printf("    GEMMs by shape (rows x in x out):\n");
    rows(t["gemms"]);
    std::printf("    the other calls by operation:\n");
    rows(t["others"]);
  }
  std::printf("  peak activations      %10.1f MiB\n",
              result["peak_activation_bytes"].get<int64_t>() / 1048576.0);
  std::printf("  peak workspace        %10.1f MiB (head logits: %lld rows at a time)\n",
              result["peak_workspace_bytes"].get<int64_t>() / 1048576.0,
              static_cast<long long>(result["head_chunk_rows"].get<int64_t>()));
  return kExitOk;
}

}  // namespace zerort::cli
