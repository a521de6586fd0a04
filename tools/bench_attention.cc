// zerort bench attention: causal attention, flash-style (tiles with an online softmax, one fp32
// log-sum-exp saved per query: [Note: flash attention's tiles], kernels/flash_math.h) against
// the materialised path (the scores and probabilities of every (query, key) pair held, a GEMM,
// the softmax, another GEMM), timed in the same run, alternating, medians reported. TFLOP/s by
// FlashAttention's convention: forward 4 x B x H x T^2 x hs, halved for causal; backward 2.5 x
// the forward. On the CPU: the float kernels' flash attention (what training runs) against
// model_ops.h's reference. On CUDA (--device cuda, bf16): zerort's flash kernels
// (kernels/flash_attention.h) against the model's materialised CUDA attention, timed with CUDA
// events; and cuDNN's flash attention beside them where the build has it and libcudnn loads
// (kernels/cudnn_attention.h).
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "bench_stats.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/kernels/cudnn_attention.h"
#include "zerort/kernels/flash_attention.h"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/kernels/model_ops.h"
#include "zerort/runtime/allocator.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/float_bits.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

// Calls a CUDA time spans ([Note: back-to-back calls]).
constexpr int kCudaCalls = 10;

// A flash pass other than zerort's default (kernels/memory_facts.h's FlashTiles, or cuDNN's
// attention): its name in the table, its JSON keys' stem (flash_forward_128q_s, ..._tflops,
// ..._max_abs_difference), what it is.
struct TileVariant {
  std::string name, key, what;
  bool backward = false;
  std::function<void()> run;
  // A backward's: the forward whose output and log-sum-exps it reads, when not the default's.
  std::function<void()> prepare = nullptr;
  double worst = -1;  // its largest |result - materialised result|; -1: not compared
};

// The largest |a - b| of two tensors (fp32, or bf16 bits); infinity where an element is not finite
// (a NaN would otherwise compare as no difference at all).
double Value(float v) { return v; }
double Value(uint16_t bf16) { return Bf16BitsToFloat(bf16); }
template <typename T>
double MaxAbsDifference(const std::vector<T>& a, const std::vector<T>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(Value(a[i]) - Value(b[i]));
    if (!std::isfinite(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

// JSON has no infinity: a difference that is not finite is written as 1e30.
double Finite(double x) { return std::isfinite(x) ? x : 1e30; }

// The two paths of one device: each pass as a closure over buffers the struct keeps alive, how a
// pass is timed, and what the comparison needs.
struct Paths {
  std::string device, where, dtype, baseline;
  std::function<void()> flash_forward, flash_backward, ref_forward, ref_backward;
  // CUDA at head size 64: the flash kernels' other block shapes (model.flash_attention), timed
  // beside the defaults; cuDNN's attention at any head size, where built and loadable.
  std::vector<TileVariant> variants;
  std::function<double(const std::function<void()>&)> time = Seconds;  // one call's seconds
  int calls = 1;               // the calls a time is the mean of ([Note: back-to-back calls])
  double worst = 0;            // the largest |flash out - materialised out| (the default's)
  double worst_backward = -1;  // the same of dqkv; -1: not compared
  double saved_flash = 0, saved_materialised = 0;
  std::vector<std::shared_ptr<void>> keep;  // buffers, kernels, streams
};

// Every buffer, fp32: qkv and two gradients of it, out twice, dout, the flash path's
// log-sum-exps, and the materialised path's B x H x T x T probabilities (element_size bytes per
// element on CUDA); refused over 8 GiB.
Status CheckBytes(const BenchAttentionOptions& o, int kv, double element_size) {
  const int channels = o.heads * o.head_size;
  const int64_t rows = int64_t{o.batch} * o.seq;
  const int64_t row = channels + 2 * int64_t{kv} * o.head_size;  // [Note: the qkv layout]
  const double probs_bytes = element_size * o.batch * o.heads * static_cast<double>(o.seq) * o.seq;
  const double total_bytes = element_size * (3.0 * rows * row + 4.0 * rows * channels) +
                             4.0 * 2 * static_cast<double>(o.batch) * o.heads * o.seq + probs_bytes;
  if (total_bytes > 8.0 * (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        "the two paths would hold " + FormatBytes(total_bytes) +
        " (more than 8 GiB; the materialised path's probabilities alone " +
        FormatBytes(probs_bytes) + "): lower --batch, --heads, --head-size or --seq");
  }
  return absl::OkStatus();
}

// The CPU: the float kernels' flash attention (what training runs) against model_ops.h's
// materialised reference.
StatusOr<Paths> CpuPaths(const BenchAttentionOptions& o, int kv) {
  ZR_RETURN_IF_ERROR(CheckBytes(o, kv, 4));
  const int channels = o.heads * o.head_size;
  const int64_t rows = int64_t{o.batch} * o.seq;
  const int64_t row = channels + 2 * int64_t{kv} * o.head_size;
  struct Buffers {
    std::vector<float> qkv, dout, out, lse, dqkv, ref_out, probs, ref_dqkv;
    std::unique_ptr<ModelKernels> k = MakeCpuModelKernels(CpuPrecision::kFloat);
  };
  auto b = std::make_shared<Buffers>();
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  b->qkv.resize(rows * row);
  b->dout.resize(rows * channels);
  for (float& x : b->qkv) x = normal(rng);
  for (float& x : b->dout) x = normal(rng);
  b->out.resize(rows * channels);
  b->lse.resize(int64_t{o.batch} * o.heads * o.seq);
  b->dqkv.resize(b->qkv.size());
  b->ref_out.resize(b->out.size());
  b->probs.resize(int64_t{o.batch} * o.heads * o.seq * o.seq);
  b->ref_dqkv.resize(b->qkv.size());
  Paths p{.device = "cpu",
          .where = StrCat("the CPU, ", omp_get_max_threads(), " threads"),
          .dtype = "fp32",
          .baseline = "the materialised path (model_ops.h: GEMM, softmax, GEMM), same run"};
  Buffers* x = b.get();
  p.flash_forward = [=, &o] {
    ZR_CHECK_OK(x->k->Attention(x->out.data(), x->lse.data(), x->qkv.data(), o.batch, o.seq,
                                channels, o.heads, kv));
  };
  p.flash_backward = [=, &o] {
    ZR_CHECK_OK(x->k->AttentionBackward(x->dqkv.data(), x->dout.data(), x->qkv.data(),
                                        x->out.data(), x->lse.data(), o.batch, o.seq, channels,
                                        o.heads, kv));
  };
  p.ref_forward = [=, &o] {
    cpu::AttentionForward<float>(x->ref_out.data(), x->probs.data(), x->qkv.data(), o.batch, o.seq,
                                 channels, o.heads, kv);
  };
  p.ref_backward = [=, &o] {
    cpu::AttentionBackward<float>(x->ref_dqkv.data(), x->dout.data(), x->qkv.data(),
                                  x->probs.data(), o.batch, o.seq, channels, o.heads, kv);
  };
  p.flash_forward();  // warm-up, and the two paths' results compared once
  p.ref_forward();
  p.flash_backward();
  p.ref_backward();
  p.worst = MaxAbsDifference(x->out, x->ref_out);
  p.worst_backward = MaxAbsDifference(x->dqkv, x->ref_dqkv);
  p.saved_flash = static_cast<double>(
      AttentionSavedBytes(AttentionProgram::kFlash, o.batch, o.seq, o.heads, 4));
  p.saved_materialised = 4.0 * o.batch * o.heads * static_cast<double>(o.seq) * o.seq;
  p.keep.push_back(b);
  return p;
}

// CUDA, bf16: zerort's flash kernels (kernels/flash_attention.h) against the model's CUDA
// attention (cuBLAS GEMMs around a softmax kernel, the probabilities saved), timed between stream
// marks (CUDA events).
StatusOr<Paths> CudaPaths(const BenchAttentionOptions& o, int kv) {
  ZR_RETURN_IF_ERROR(CheckBytes(o, kv, 2));
  const int channels = o.heads * o.head_size;
  const int64_t rows = int64_t{o.batch} * o.seq;
  const int64_t row = channels + 2 * int64_t{kv} * o.head_size;
  const Device dev = Device::Cuda(0);
  ZR_RETURN_IF_ERROR(SetCurrentDevice(dev));
  struct State {
    std::unique_ptr<Allocator> allocator;
    std::unique_ptr<Stream> stream;
    std::unique_ptr<ModelKernels> k;
    std::unique_ptr<StreamMark> begin, end;
    std::unique_ptr<internal::CudnnAttention> cudnn;
    Buffer qkv, dout, out, lse, workspace, dqkv, ref_out, saved, ref_dqkv, cudnn_fwd_ws,
        cudnn_bwd_ws;
    ~State() {
      if (stream) (void)stream->Synchronize();
    }
  };
  auto s = std::make_shared<State>();
  ZR_ASSIGN_OR_RETURN(s->allocator, MakeCudaCachingAllocator(dev, nullptr));
  ZR_ASSIGN_OR_RETURN(s->stream, CreateStream(dev, "compute"));
  ZR_ASSIGN_OR_RETURN(s->k, MakeCudaModelKernels(DType::kBF16, DType::kF32, *s->stream,
                                                 *s->allocator, AttentionProgram::kMaterialised));
  ZR_ASSIGN_OR_RETURN(s->begin, CreateStreamMark(dev));
  ZR_ASSIGN_OR_RETURN(s->end, CreateStreamMark(dev));
  auto alloc = [&](Buffer* b, int64_t bytes) -> Status {
    ZR_ASSIGN_OR_RETURN(*b,
                        s->allocator->Allocate(bytes, MemoryCategory::kWorkspace, s->stream.get()));
    return FillZero(b->data(), dev, b->bytes(), s->stream.get());
  };
  const int64_t stats = int64_t{o.batch} * o.heads * o.seq;
  ZR_RETURN_IF_ERROR(alloc(&s->qkv, rows * row * 2));
  ZR_RETURN_IF_ERROR(alloc(&s->dout, rows * channels * 2));
  ZR_RETURN_IF_ERROR(alloc(&s->out, rows * channels * 2));
  ZR_RETURN_IF_ERROR(alloc(&s->ref_out, rows * channels * 2));
  ZR_RETURN_IF_ERROR(alloc(&s->lse, stats * 4));
  // The flash backward's workspace: D, then the dQ accumulator (kernels/memory_facts.h).
  ZR_RETURN_IF_ERROR(alloc(
      &s->workspace,
      AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kFlash, true, o.batch, o.seq,
                            channels, o.heads, o.kv_heads > 0 ? o.kv_heads : o.heads, 2)
          .at(0)));
  ZR_RETURN_IF_ERROR(alloc(&s->dqkv, rows * row * 2));
  ZR_RETURN_IF_ERROR(alloc(&s->ref_dqkv, rows * row * 2));
  const int64_t saved_bytes =
      AttentionSavedBytes(AttentionProgram::kMaterialised, o.batch, o.seq, o.heads, 2);
  ZR_RETURN_IF_ERROR(alloc(&s->saved, saved_bytes));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto upload = [&](Buffer& b, int64_t n) {
    std::vector<uint16_t> bits(n);
    for (uint16_t& v : bits) v = FloatToBf16Bits(normal(rng));
    return CopyBytes(b.data(), dev, bits.data(), Device::Cpu(), n * 2, nullptr);
  };
  ZR_RETURN_IF_ERROR(s->stream->Synchronize());
  ZR_RETURN_IF_ERROR(upload(s->qkv, rows * row));
  ZR_RETURN_IF_ERROR(upload(s->dout, rows * channels));
  const internal::FlashAttentionShape shape{o.batch, o.seq, o.heads, kv, o.head_size};
  State* x = s.get();
  Paths p{.device = QueryCuda().devices.at(0).name,
          .where = QueryCuda().devices.at(0).name,
          .dtype = "bf16",
          .baseline =
              "the model's CUDA attention (cuBLAS GEMMs around a softmax kernel, the "
              "probabilities saved), same run"};
  auto flash_forward = [=](FlashTiles tiles) {
    return [=] {
      ZR_CHECK_OK(internal::CudaFlashAttentionForward(DType::kBF16, shape, x->out.data(),
                                                      x->lse.as<float>(), x->qkv.data(), *x->stream,
                                                      tiles));
    };
  };
  auto flash_backward = [=](FlashTiles tiles) {
    return [=] {
      ZR_CHECK_OK(internal::CudaFlashAttentionBackward(
          DType::kBF16, shape, x->dqkv.data(), x->workspace.as<float>(), x->dout.data(),
          x->qkv.data(), x->out.data(), x->lse.as<float>(), *x->stream, tiles));
    };
  };
  p.flash_forward = flash_forward({});
  p.flash_backward = flash_backward({});
  // model.flash_attention's other values, as the table names them: 128-query forward blocks at
  // both head sizes (two row groups on 4 warps at 64, one on 8 at 128), and at 64 one on 8 too
  // and the backward's other shapes.
  p.variants = {{"flash 128q", "flash_forward_128q", "forward_block_queries 128", false,
                 flash_forward({128, 0, 0})}};
  if (o.head_size == 64) {
    p.variants.insert(
        p.variants.end(),
        {
            {"flash 128q 8w", "flash_forward_128q_8w", "forward_block_queries 128, forward_warps 8",
             false, flash_forward({128, 0, 0, 8})},
            {"flash bwd c32", "flash_backward_c32", "backward_query_chunk 32", true,
             flash_backward({0, 0, 32})},
            {"flash bwd 128k", "flash_backward_128k", "backward_block_keys 128", true,
             flash_backward({0, 128, 0})},
            {"bwd 128k c32", "flash_backward_128k_c32",
             "backward_block_keys 128, backward_query_chunk 32", true,
             flash_backward({0, 128, 32})},
        });
  }
  // cuDNN's attention (model.attention_backend "cudnn"), with the workspaces the memory plan
  // gives it; where it is not built or libcudnn does not load, the table says so and goes on.
  if (StatusOr<std::unique_ptr<internal::CudnnAttention>> made =
          internal::CudnnAttention::Create(*s->stream);
      !made.ok()) {
    Logger()->info("bench attention: no cuDNN row: {}", made.status().message());
  } else {
    s->cudnn = *std::move(made);
    const int kv = o.kv_heads > 0 ? o.kv_heads : o.heads;
    const std::vector<int64_t> fwd =
        AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kCudnn, false, o.batch, o.seq,
                              channels, o.heads, kv, 2);
    const std::vector<int64_t> bwd =
        AttentionScratchBytes(KernelBackend::kCuda, AttentionProgram::kCudnn, true, o.batch, o.seq,
                              channels, o.heads, kv, 2);
    ZR_RETURN_IF_ERROR(alloc(&s->cudnn_fwd_ws, fwd.at(0)));
    ZR_RETURN_IF_ERROR(alloc(&s->cudnn_bwd_ws, bwd.at(0)));
    // Each direction once first (its graph built): one cuDNN refuses (a shape, the workspace
    // budget) is reported and left out, and zerort's rows are still timed.
    auto forward = [x, shape] {
      return x->cudnn->Forward(DType::kBF16, shape, x->out.data(), x->lse.as<float>(),
                               x->qkv.data(), x->cudnn_fwd_ws.data(), x->cudnn_fwd_ws.bytes());
    };
    auto backward = [x, shape] {
      return x->cudnn->Backward(DType::kBF16, shape, x->dqkv.data(), x->dout.data(), x->qkv.data(),
                                x->out.data(), x->lse.as<float>(), x->cudnn_bwd_ws.data(),
                                x->cudnn_bwd_ws.bytes());
    };
    if (const Status f = forward(); !f.ok()) {
      Logger()->warn("bench attention: no cuDNN rows: {}", f.message());
    } else {
      p.variants.push_back({"cudnn", "cudnn_forward", "cuDNN's SDPA, model.attention_backend cudnn",
                            false, [forward] { ZR_CHECK_OK(forward()); }});
      if (const Status b = backward(); !b.ok()) {
        Logger()->warn("bench attention: no cuDNN backward row: {}", b.message());
      } else {
        p.variants.push_back({"cudnn bwd", "cudnn_backward", "cuDNN's SDPA backward", true,
                              [backward] { ZR_CHECK_OK(backward()); },
                              [forward] { ZR_CHECK_OK(forward()); }});
      }
    }
  }
  p.ref_forward = [=, &o] {
    ZR_CHECK_OK(x->k->Attention(x->ref_out.data(), x->saved.data(), x->qkv.data(), o.batch, o.seq,
                                channels, o.heads, kv));
  };
  p.ref_backward = [=, &o] {
    ZR_CHECK_OK(x->k->AttentionBackward(x->ref_dqkv.data(), x->dout.data(), x->qkv.data(),
                                        x->ref_out.data(), x->saved.data(), o.batch, o.seq,
                                        channels, o.heads, kv));
  };
  // [Note: back-to-back calls] A GPU time is of kCudaCalls calls queued back to back between
  // the two events, divided by their number: timed alone, a call's time also held the idle GPU's
  // wait for the host to launch it (the checks, the launch itself: microseconds, a few percent of
  // GPT-2's 0.1 ms forward), which in training the queue hides. Each pass may run again on its
  // own results: every one writes its outputs whole (the backwards their dqkv, not added to).
  p.calls = kCudaCalls;
  p.time = [x](const std::function<void()>& f) {
    ZR_CHECK_OK(x->begin->Record(*x->stream));
    for (int i = 0; i < kCudaCalls; ++i) f();
    ZR_CHECK_OK(x->end->Record(*x->stream));
    return *x->end->SecondsSince(*x->begin) / kCudaCalls;
  };
  // Warm-up, and every pass's result against the materialised path's once: each forward's output,
  // each backward's dqkv after the forward whose output and log-sum-exps it reads. A block shape
  // that computes wrongly on this GPU shows here (tools/flash_tiles_pick.py does not take it),
  // not only in flash_attention_cuda_test.
  p.ref_forward();
  p.ref_backward();
  std::vector<uint16_t> ref_out(rows * channels), ref_dqkv(rows * row), got(rows * row);
  ZR_RETURN_IF_ERROR(s->stream->Synchronize());
  ZR_RETURN_IF_ERROR(CopyBytes(ref_out.data(), Device::Cpu(), s->ref_out.data(), dev,
                               ref_out.size() * 2, nullptr));
  ZR_RETURN_IF_ERROR(CopyBytes(ref_dqkv.data(), Device::Cpu(), s->ref_dqkv.data(), dev,
                               ref_dqkv.size() * 2, nullptr));
  auto difference = [&](const Buffer& result,
                        const std::vector<uint16_t>& ref) -> StatusOr<double> {
    ZR_RETURN_IF_ERROR(s->stream->Synchronize());
    got.resize(ref.size());
    ZR_RETURN_IF_ERROR(
        CopyBytes(got.data(), Device::Cpu(), result.data(), dev, got.size() * 2, nullptr));
    return MaxAbsDifference(got, ref);
  };
  for (TileVariant& v : p.variants) {
    if (v.backward) continue;
    v.run();
    ZR_ASSIGN_OR_RETURN(v.worst, difference(s->out, ref_out));
  }
  p.flash_forward();  // the default's last: its output and log-sum-exps stay for the backwards
  ZR_ASSIGN_OR_RETURN(p.worst, difference(s->out, ref_out));
  p.flash_backward();
  ZR_ASSIGN_OR_RETURN(p.worst_backward, difference(s->dqkv, ref_dqkv));
  for (TileVariant& v : p.variants) {
    if (!v.backward) continue;
    if (v.prepare) v.prepare();
    v.run();
    ZR_ASSIGN_OR_RETURN(v.worst, difference(s->dqkv, ref_dqkv));
    if (v.prepare) p.flash_forward();
  }
  p.saved_flash = 4.0 * stats;
  p.saved_materialised = static_cast<double>(saved_bytes);
  p.keep.push_back(s);
  return p;
}

}  // namespace

int RunBenchAttention(const BenchAttentionOptions& o) {
  auto usage = [](const std::string& message) {
    Logger()->error("bench attention: {}", message);
    return kExitUsage;
  };
  // Each flag with the value the user wrote, when out of its range.
  auto outside = [](const char* flag, int v, int lo, int hi) -> std::optional<std::string> {
    if (v >= lo && v <= hi) return std::nullopt;
    return StrCat(flag, " ", v, " must be in [", lo, ", ", hi, "]");
  };
  for (const auto& bad :
       {outside("--batch", o.batch, 1, 1024), outside("--seq", o.seq, 1, 65536),
        outside("--heads", o.heads, 1, 256), outside("--kv-heads", o.kv_heads, 0, 256),
        outside("--head-size", o.head_size, 2, 512), outside("--rounds", o.rounds, 1, 100)}) {
    if (bad.has_value()) return usage(*bad);
  }
  if (o.head_size % 2 != 0) {
    return usage(StrCat("--head-size ", o.head_size, " must be even (rotary pairs, tiles)"));
  }
  const int kv = o.kv_heads > 0 ? o.kv_heads : o.heads;
  if (o.heads % kv != 0) {
    return usage(StrCat("--kv-heads ", kv, " must divide --heads ", o.heads,
                        " (grouped-query: each key/value head serves heads / kv-heads query "
                        "heads)"));
  }
  if (o.device != "cpu" && o.device != "cuda") {
    return usage(StrCat("--device '", o.device, "' must be cpu or cuda"));
  }
  Paths paths;
  if (o.device == "cuda") {
    if (CudaDeviceCount() == 0) {
      return usage(StrCat("--device cuda: no CUDA device (", QueryCuda().unavailable_reason, ")"));
    }
    const Status shape_ok =
        internal::CheckFlashAttention(DType::kBF16, {o.batch, o.seq, o.heads, kv, o.head_size});
    if (!shape_ok.ok()) return usage(std::string(shape_ok.message()));
    StatusOr<Paths> cuda = CudaPaths(o, kv);
    if (!cuda.ok()) {
      Logger()->error("bench attention: {}", cuda.status().message());
      return cuda.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage
                                                                        : kExitRuntimeFailure;
    }
    paths = std::move(*cuda);
  } else {
    StatusOr<Paths> cpu = CpuPaths(o, kv);
    if (!cpu.ok()) return usage(std::string(cpu.status().message()));
    paths = std::move(*cpu);
  }
  const double worst = paths.worst;
  const double probs_bytes = paths.saved_materialised;
  auto time = [&](const std::function<void()>& f) { return paths.time(f); };
  auto& flash_forward = paths.flash_forward;
  auto& flash_backward = paths.flash_backward;
  auto& ref_forward = paths.ref_forward;
  auto& ref_backward = paths.ref_backward;
  std::vector<double> ff, fb, rf, rb;
  std::vector<std::vector<double>> vt(paths.variants.size());  // each variant's times
  for (int r = 0; r < o.rounds; ++r) {  // alternating, so that both see the same machine
    ff.push_back(time(flash_forward));
    rf.push_back(time(ref_forward));
    if (o.backward) {
      fb.push_back(time(flash_backward));
      rb.push_back(time(ref_backward));
    }
    for (size_t i = 0; i < vt.size(); ++i) {
      if (o.backward || !paths.variants[i].backward) vt[i].push_back(time(paths.variants[i].run));
    }
  }
  // FlashAttention's count: 4 B H T^2 hs for the two GEMMs, halved for causal.
  const double forward_flop =
      4.0 * o.batch * o.heads * static_cast<double>(o.seq) * o.seq * o.head_size / 2;
  const double backward_flop = 2.5 * forward_flop;
  const double saved_flash = paths.saved_flash;
  nlohmann::json result = {
      {"bench", "attention"},
      {"device", paths.device},
      {"dtype", paths.dtype},
      {"baseline", paths.baseline},
      {"batch", o.batch},
      {"seq", o.seq},
      {"heads", o.heads},
      {"kv_heads", kv},
      {"head_size", o.head_size},
      {"threads", o.device == "cpu" ? omp_get_max_threads() : 0},
      {"calls_per_time", paths.calls},
      {"flash_forward_s", Median(ff)},
      {"materialised_forward_s", Median(rf)},
      {"flash_forward_tflops", forward_flop / Median(ff) / 1e12},
      {"materialised_forward_tflops", forward_flop / Median(rf) / 1e12},
      {"forward_speedup", Median(rf) / Median(ff)},
      {"saved_bytes_flash", saved_flash},
      {"saved_bytes_materialised", probs_bytes},
      {"max_abs_difference", Finite(worst)},
  };
  if (paths.worst_backward >= 0) {
    result["max_abs_difference_backward"] = Finite(paths.worst_backward);
  }
  for (size_t i = 0; i < vt.size(); ++i) {
    if (vt[i].empty()) continue;
    const TileVariant& v = paths.variants[i];
    result[v.key + "_s"] = Median(vt[i]);
    result[v.key + "_tflops"] = (v.backward ? backward_flop : forward_flop) / Median(vt[i]) / 1e12;
    if (v.worst >= 0) result[v.key + "_max_abs_difference"] = Finite(v.worst);
  }
  if (o.backward) {
    result["flash_backward_s"] = Median(fb);
    result["materialised_backward_s"] = Median(rb);
    result["flash_backward_tflops"] = backward_flop / Median(fb) / 1e12;
    result["materialised_backward_tflops"] = backward_flop / Median(rb) / 1e12;
    result["backward_speedup"] = Median(rb) / Median(fb);
  }
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
    return kExitOk;
  }
  std::printf(
      "zerort bench attention: causal, B %d, T %d, %d heads (%d key/value), head size %d, "
      "%s on %s; medians of %d alternating rounds%s\n",
      o.batch, o.seq, o.heads, kv, o.head_size, paths.dtype.c_str(), paths.where.c_str(), o.rounds,
      paths.calls > 1 ? StrCat(", each the mean of ", paths.calls, " calls back to back").c_str()
                      : "");
  std::printf("  %-14s %12s %12s %12s %12s\n", "path", "forward s", "fwd TFLOP/s", "backward s",
              "bwd TFLOP/s");
  auto line = [&](const char* name, const std::vector<double>& f, const std::vector<double>& b) {
    std::printf("  %-14s %12.4f %12.4f", name, Median(f), forward_flop / Median(f) / 1e12);
    if (o.backward) {
      std::printf(" %12.4f %12.4f", Median(b), backward_flop / Median(b) / 1e12);
    }
    std::printf("\n");
  };
  line("flash", ff, fb);
  for (size_t i = 0; i < vt.size(); ++i) {
    if (vt[i].empty()) continue;
    const TileVariant& v = paths.variants[i];
    const double t = Median(vt[i]);
    if (v.backward) {
      std::printf("  %-14s %12s %12s %12.4f %12.4f   (%s; differs by %.2g)\n", v.name.c_str(), "",
                  "", t, backward_flop / t / 1e12, v.what.c_str(), v.worst);
    } else {
      std::printf("  %-14s %12.4f %12.4f   (%s; differs by %.2g)\n", v.name.c_str(), t,
                  forward_flop / t / 1e12, v.what.c_str(), v.worst);
    }
  }
  line("materialised", rf, rb);
  std::string backward;
  if (o.backward) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ", backward %.2fx", Median(rb) / Median(fb));
    backward = buf;
  }
  std::printf(
      "  flash / materialised: forward %.2fx%s; saved for the backward %s against %s; "
      "outputs differ by at most %.2g, input gradients by %.2g\n",
      Median(rf) / Median(ff), backward.c_str(), FormatBytes(saved_flash).c_str(),
      FormatBytes(probs_bytes).c_str(), worst, paths.worst_backward);
  return kExitOk;
}

}  // namespace zerort::cli
