// zerort bench attention: causal attention, flash-style (tiles with an online softmax, one fp32
// log-sum-exp saved per query: [Note: flash attention's tiles], kernels/flash_math.h) against
// the materialised path (the scores and probabilities of every (query, key) pair held, a GEMM,
// the softmax, another GEMM), timed in the same run, alternating, medians reported. TFLOP/s by
// FlashAttention's convention: forward 4 x B x H x T^2 x hs, halved for causal; backward 2.5 x
// the forward. On the CPU: the float kernels' flash attention (what training runs) against
// model_ops.h's reference. zerort's CUDA flash attention is issue 48's, not written yet: on a GPU
// the command says so rather than time the CUDA materialised path alone.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <omp.h>

#include "bench_stats.h"
#include "commands.h"
#include "nlohmann/json.hpp"
#include "zerort/kernels/memory_facts.h"
#include "zerort/kernels/model_kernels.h"
#include "zerort/kernels/model_ops.h"
#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort::cli {
namespace {

double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  if (o.device != "cpu") {
    Logger()->error(
        "bench attention: --device '{}': zerort's CUDA flash attention does not exist yet (issue "
        "48); the CUDA path materialises the scores. Only --device cpu is measured.",
        o.device);
    return kExitUsage;
  }
  // Every buffer, fp32: qkv and two gradients of it, out twice, dout, the flash path's
  // log-sum-exps, and the materialised path's B x H x T x T probabilities.
  const int channels = o.heads * o.head_size;
  const int64_t rows = int64_t{o.batch} * o.seq;
  const int64_t row = channels + 2 * int64_t{kv} * o.head_size;  // [Note: the qkv layout]
  const double probs_bytes = 4.0 * o.batch * o.heads * double{o.seq} * o.seq;
  const double total_bytes =
      4.0 * (3.0 * rows * row + 4.0 * rows * channels + double{o.batch} * o.heads * o.seq) +
      probs_bytes;
  if (total_bytes > 8.0 * (int64_t{1} << 30)) {
    return usage("the two paths would hold " + FormatBytes(total_bytes) +
                 " (more than 8 GiB; the materialised path's probabilities alone " +
                 FormatBytes(probs_bytes) + "): lower --batch, --heads, --head-size or --seq");
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(rows * row), dout(rows * channels);
  for (float& x : qkv) x = normal(rng);
  for (float& x : dout) x = normal(rng);
  std::vector<float> out(rows * channels), lse(int64_t{o.batch} * o.heads * o.seq),
      dqkv(qkv.size()), ref_out(out.size()), probs(static_cast<size_t>(probs_bytes / 4)),
      ref_dqkv(qkv.size());
  std::unique_ptr<ModelKernels> k = MakeCpuModelKernels(CpuPrecision::kFloat);
  auto flash_forward = [&] {
    ZR_CHECK_OK(
        k->Attention(out.data(), lse.data(), qkv.data(), o.batch, o.seq, channels, o.heads, kv));
  };
  auto flash_backward = [&] {
    ZR_CHECK_OK(k->AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                                     o.batch, o.seq, channels, o.heads, kv));
  };
  auto ref_forward = [&] {
    cpu::AttentionForward<float>(ref_out.data(), probs.data(), qkv.data(), o.batch, o.seq, channels,
                                 o.heads, kv);
  };
  auto ref_backward = [&] {
    cpu::AttentionBackward<float>(ref_dqkv.data(), dout.data(), qkv.data(), probs.data(), o.batch,
                                  o.seq, channels, o.heads, kv);
  };
  flash_forward();  // warm-up, and the two outputs compared once
  ref_forward();
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    worst = std::max(worst, double{std::abs(out[i] - ref_out[i])});
  }
  std::vector<double> ff, fb, rf, rb;
  for (int r = 0; r < o.rounds; ++r) {  // alternating, so that both see the same machine
    ff.push_back(Seconds(flash_forward));
    rf.push_back(Seconds(ref_forward));
    if (o.backward) {
      fb.push_back(Seconds(flash_backward));
      rb.push_back(Seconds(ref_backward));
    }
  }
  // FlashAttention's count: 4 B H T^2 hs for the two GEMMs, halved for causal.
  const double forward_flop = 4.0 * o.batch * o.heads * double{o.seq} * o.seq * o.head_size / 2;
  const double backward_flop = 2.5 * forward_flop;
  const double saved_flash =
      static_cast<double>(AttentionSavedBytes(KernelBackend::kCpu, o.batch, o.seq, o.heads, 4));
  nlohmann::json result = {
      {"bench", "attention"},
      {"device", "cpu"},
      {"baseline", "the materialised path (model_ops.h: GEMM, softmax, GEMM), same run"},
      {"batch", o.batch},
      {"seq", o.seq},
      {"heads", o.heads},
      {"kv_heads", kv},
      {"head_size", o.head_size},
      {"threads", omp_get_max_threads()},
      {"flash_forward_s", Median(ff)},
      {"materialised_forward_s", Median(rf)},
      {"flash_forward_tflops", forward_flop / Median(ff) / 1e12},
      {"materialised_forward_tflops", forward_flop / Median(rf) / 1e12},
      {"forward_speedup", Median(rf) / Median(ff)},
      {"saved_bytes_flash", saved_flash},
      {"saved_bytes_materialised", probs_bytes},
      {"max_abs_difference", worst},
  };
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
      "fp32 on the CPU, %d threads; medians of %d alternating rounds\n",
      o.batch, o.seq, o.heads, kv, o.head_size, omp_get_max_threads(), o.rounds);
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
  line("materialised", rf, rb);
  std::string backward;
  if (o.backward) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), ", backward %.2fx", Median(rb) / Median(fb));
    backward = buf;
  }
  std::printf(
      "  flash / materialised: forward %.2fx%s; saved for the backward %s against %s; "
      "outputs differ by at most %.2g\n",
      Median(rf) / Median(ff), backward.c_str(), FormatBytes(saved_flash).c_str(),
      FormatBytes(probs_bytes).c_str(), worst);
  return kExitOk;
}

}  // namespace zerort::cli
