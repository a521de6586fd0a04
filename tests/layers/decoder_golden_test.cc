// The model against golden values from independent PyTorch implementations (committed output in
// tests/layers/golden/): GPT-2 (tests/layers/gpt_reference.py), LLaMA with grouped-query
// attention and an untied head, and Qwen2-style Q/K/V biases with tied embeddings
// (tests/layers/llama_reference.py), LLaMA 3.1's rotary scaling with every bias
// (attention_bias, mlp_bias), YaRN's on Qwen2's shape, and a head_dim other than d / n_head.
// Loss, logits and every parameter's gradient in fp32 to 1e-5, on plain host weights, through the
// shard manager at ZeRO-3 on two ranks, and split over two tensor-parallel ranks (sequence
// parallel, the vocabulary of 23 padded to 24, the vocabulary-parallel cross-entropy; LLaMA: the
// query and key/value heads split).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "zerort/layers/decoder_model.h"
#include "zerort/runtime/loopback_communicator.h"

namespace zerort {
namespace {

struct Golden {
  DecoderConfig config;
  int batch = 0;
  std::vector<int32_t> tokens, targets;
  std::map<std::string, std::vector<float>> params;
  std::map<std::string, std::vector<double>> grads;
  double loss = 0;
  std::vector<std::array<int, 2>> positions;
  std::vector<std::vector<double>> logits;
};

Golden LoadGolden(const std::string& name) {
  const std::string path = std::string(ZR_GOLDEN_DIR "/") + name + ".json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  const nlohmann::json j = nlohmann::json::parse(in);
  Golden g;
  const auto& c = j.at("config");
  g.config = DecoderConfig{c.at("n_layer"), c.at("n_head"), c.at("d_model"), c.at("seq_len"),
                           c.at("vocab_size")};
  if (c.contains("n_kv_head")) {  // llama_reference.py
    g.config.arch = ModelArch::kLlama;
    g.config.n_kv_head = c.at("n_kv_head");
    g.config.head_dim = c.value("head_dim", 0);
    g.config.intermediate_size = c.at("intermediate_size");
    g.config.rope_theta = c.at("rope_theta");
    g.config.norm_eps = c.at("rms_norm_eps");
    g.config.tie_word_embeddings = c.at("tie_word_embeddings");
    g.config.qkv_bias = c.at("qkv_bias");
    g.config.o_proj_bias = c.value("o_proj_bias", false);
    g.config.mlp_bias = c.value("mlp_bias", false);
    g.config.qk_norm = c.value("qk_norm", false);
    if (c.contains("rope_scaling") && c.at("rope_scaling").is_object()) {
      const auto& s = c.at("rope_scaling");
      if (s.at("rope_type") == "yarn" || s.at("rope_type") == "dynamic") {
        // transformers' defaults for the rest of YaRN's keys
        g.config.rope_scaling = {
            .type = s.at("rope_type") == "yarn" ? RopeType::kYarn : RopeType::kDynamic,
            .factor = s.at("factor"),
            .original_max_position_embeddings = s.at("original_max_position_embeddings")};
      } else {
        EXPECT_EQ(s.at("rope_type"), "llama3");
        g.config.rope_scaling = {
            .type = RopeType::kLlama3,
            .factor = s.at("factor"),
            .low_freq_factor = s.at("low_freq_factor"),
            .high_freq_factor = s.at("high_freq_factor"),
            .original_max_position_embeddings = s.at("original_max_position_embeddings")};
      }
    }
  }
  g.batch = j.at("batch");
  g.tokens = j.at("tokens").get<std::vector<int32_t>>();
  g.targets = j.at("targets").get<std::vector<int32_t>>();
  for (const auto& [name, v] : j.at("params").items()) g.params[name] = v.get<std::vector<float>>();
  for (const auto& [name, v] : j.at("grads").items()) g.grads[name] = v.get<std::vector<double>>();
  g.loss = j.at("loss");
  g.positions = j.at("logit_positions").get<std::vector<std::array<int, 2>>>();
  g.logits = j.at("logits").get<std::vector<std::vector<double>>>();
  return g;
}

Initializer FromGolden(const Golden& g) {
  return [&g](const ParamSpec& spec, uint64_t, std::span<float> full) {
    const std::vector<float>& v = g.params.at(spec.name);
    ZR_CHECK(v.size() == full.size()) << spec.name;
    std::copy(v.begin(), v.end(), full.begin());
  };
}

template <typename A, typename B>
double RelativeError(const A& got, const B& want) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    err += (got[i] - want[i]) * (got[i] - want[i]);
    ref += want[i] * want[i];
  }
  return std::sqrt(err / ref);
}

class DecoderGoldenTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Models, DecoderGoldenTest,
                         ::testing::Values("gpt_tiny", "llama_tiny", "qwen2_tiny", "llama31_tiny",
                                           "qwen2_yarn_tiny", "llama_hd_tiny", "llama_dynamic_tiny",
                                           "qwen3_tiny"));

TEST_P(DecoderGoldenTest, LossLogitsAndGradientsMatchPyTorch) {
  const Golden g = LoadGolden(GetParam());
  HostWeightStore<float> store;
  auto kernels = MakeCpuModelKernels(CpuPrecision::kFloat);
  MemoryTracker tracker;
  auto allocator = MakeCpuCachingAllocator(&tracker);
  auto model = *DecoderModel::Create({.config = g.config, .micro_batch = g.batch}, store, *kernels,
                                     *allocator);
  ASSERT_EQ(store.names().size(), g.params.size());
  store.Initialize(FromGolden(g), 0);
  const int seq = g.config.seq_len, vocab = g.config.vocab_size;

  const std::vector<double> logits = *model->Logits(g.tokens, g.batch, seq);
  for (size_t i = 0; i < g.positions.size(); ++i) {
    const auto [b, t] = g.positions[i];
    const std::span<const double> row(logits.data() + (int64_t{b} * seq + t) * vocab, vocab);
    EXPECT_LE(RelativeError(row, g.logits[i]), 1e-5) << "logits at " << b << ", " << t;
  }
  const double loss = *model->ForwardBackward(g.tokens, g.targets, g.batch, seq, 1.0f);
  EXPECT_NEAR(loss, g.loss, 1e-5 * g.loss);
  for (const auto& [name, want] : g.grads) {
    ASSERT_NE(store.grad(name), nullptr) << name;
    const std::vector<float>& got = *store.grad(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    EXPECT_LE(RelativeError(got, want), 1e-5) << name;
  }
}

// The same weights through the shard manager at ZeRO-3 on two ranks, each rank one sequence:
// the averaged loss and the reduced gradients are the golden ones.
TEST_P(DecoderGoldenTest, ShardedZero3MatchesPyTorch) {
  const Golden g = LoadGolden(GetParam());
  ASSERT_EQ(g.batch, 2);
  const int seq = g.config.seq_len;
  std::vector<double> rank_loss(2);
  std::map<std::string, std::vector<float>> grads;
  std::mutex mu;
  CommOptions options;
  options.timeout = std::chrono::seconds(60);
  const Status status = RunLoopbackRanks(2, options, nullptr, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    auto allocator = MakeCpuCachingAllocator(&tracker);
    ShardManagerOptions o;
    o.stage = ZeroStage::k3;
    o.stage3_param_persistence_threshold = 0;
    ZR_ASSIGN_OR_RETURN(
        auto manager, ShardManager::Create(o, {.dp = &comm, .device_allocator = allocator.get()}));
    auto store = MakeShardManagerStore(*manager);
    auto kernels = MakeCpuModelKernels(CpuPrecision::kFloat);
    ZR_ASSIGN_OR_RETURN(auto model, DecoderModel::Create({.config = g.config, .micro_batch = 1},
                                                         *store, *kernels, *allocator));
    ZR_RETURN_IF_ERROR(manager->Initialize(FromGolden(g)));
    const int r = comm.rank();
    const std::span<const int32_t> tokens(g.tokens.data() + r * seq, seq);
    const std::span<const int32_t> targets(g.targets.data() + r * seq, seq);
    ZR_ASSIGN_OR_RETURN(rank_loss[r], model->ForwardBackward(tokens, targets, 1, seq, 1.0f));
    ZR_RETURN_IF_ERROR(manager->ReduceGradients());
    // Each rank holds its shard of the averaged gradient; assemble them by parameter.
    for (int u = 0; u < manager->num_units(); ++u) {
      const ShardedUnit& unit = manager->unit(u);
      const float* shard = manager->optimizer().GradShard(u).data_as<float>();  // CPU run
      std::lock_guard lock(mu);
      for (const ShardPiece& piece : unit.layout().ShardPieces(r)) {
        const ParamSpec& p = unit.layout().params()[piece.param];
        std::vector<float>& full = grads[p.name];
        full.resize(p.numel());
        for (int64_t i = 0; i < piece.param_range.size(); ++i) {
          full[piece.param_range.begin + i] = shard[piece.shard_range.begin + i];
        }
      }
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_NEAR((rank_loss[0] + rank_loss[1]) / 2, g.loss, 1e-5 * g.loss);
  ASSERT_EQ(grads.size(), g.grads.size());
  for (const auto& [name, want] : g.grads) {
    EXPECT_LE(RelativeError(grads.at(name), want), 1e-5) << name;
  }
}

// Two tensor-parallel ranks, each holding its part of the golden weights (through the global
// frame), with sequence parallelism and without: the loss, the logits (gathered) and every
// gradient gathered to the global frame (a replicated parameter's from whichever rank wrote it
// last: a rank holding only its own heads' part of Qwen3's q_norm gradient fails).
TEST_P(DecoderGoldenTest, TensorParallelTwoMatchesPyTorch) {
  const Golden g = LoadGolden(GetParam());
  const int seq = g.config.seq_len, vocab = g.config.vocab_size;
  for (const bool sequence_parallel : {true, false}) {
    SCOPED_TRACE(sequence_parallel ? "sequence parallelism" : "no sequence parallelism");
    std::vector<double> loss(2);
    std::vector<std::vector<double>> logits(2);
    std::map<std::string, std::vector<float>> grads;
    std::mutex mu;
    const Status status = RunLoopbackRanks(2, {}, nullptr, [&](Communicator& comm) -> Status {
      MemoryTracker tracker;
      auto allocator = MakeCpuCachingAllocator(&tracker);
      auto kernels = MakeCpuModelKernels(CpuPrecision::kFloat);
      HostWeightStore<float> store;
      ZR_ASSIGN_OR_RETURN(auto model, DecoderModel::Create({.config = g.config,
                                                            .micro_batch = g.batch,
                                                            .tp = {&comm},
                                                            .sequence_parallel = sequence_parallel},
                                                           store, *kernels, *allocator));
      store.Initialize(
          [&g](const ParamSpec& spec, uint64_t, std::span<float> local) {
            const std::vector<float>& v = g.params.at(spec.name);
            for (size_t i = 0; i < local.size(); ++i) {
              const int64_t at = GlobalIndex(spec, static_cast<int64_t>(i));
              local[i] = at < spec.real_numel() ? v.at(at) : 0.0f;
            }
          },
          0);
      const int r = comm.rank();
      ZR_ASSIGN_OR_RETURN(logits[r], model->Logits(g.tokens, g.batch, seq));
      ZR_ASSIGN_OR_RETURN(loss[r], model->ForwardBackward(g.tokens, g.targets, g.batch, seq, 1.0f));
      ZR_ASSIGN_OR_RETURN(std::vector<DecoderUnit> units, DecoderUnits(g.config, 2, r));
      std::lock_guard lock(mu);
      for (const DecoderUnit& u : units) {
        for (const ParamSpec& p : u.params) {
          std::vector<float>& full = grads[p.name];
          full.resize(p.real_numel());
          const std::vector<float>& local = *store.grad(p.name);
          for (int64_t i = 0; i < p.numel(); ++i) {
            const int64_t at = GlobalIndex(p, i);
            if (at < p.real_numel()) full[at] = local[i];
          }
        }
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_NEAR(loss[0], g.loss, 1e-5 * g.loss);
    EXPECT_EQ(loss[0], loss[1]);
    for (size_t i = 0; i < g.positions.size(); ++i) {
      const auto [b, t] = g.positions[i];
      const std::span<const double> row(logits[0].data() + (int64_t{b} * seq + t) * vocab, vocab);
      EXPECT_LE(RelativeError(row, g.logits[i]), 1e-5) << "logits at " << b << ", " << t;
    }
    ASSERT_EQ(grads.size(), g.grads.size());
    for (const auto& [name, want] : g.grads) {
      EXPECT_LE(RelativeError(grads.at(name), want), 1e-5) << name;
    }
  }
}

}  // namespace
}  // namespace zerort
