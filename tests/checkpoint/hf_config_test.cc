// Hugging Face model directories: config.json files as zerort shapes: the published LLaMA-3, Qwen2,
// Mistral and GPT-2 configs (their fields as the model cards' config.json give them) give the
// presets and the published parameter counts; hostile or unsupported fields are refused naming the
// key.
#include "zerort/checkpoint/hf_config.h"

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "zerort/layers/decoder_model.h"

namespace zerort {
namespace {

nlohmann::json Llama3_8B() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

nlohmann::json Qwen2_72B() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 8192,
    "initializer_range": 0.02, "intermediate_size": 29568, "max_position_embeddings": 32768,
    "max_window_layers": 80, "model_type": "qwen2", "num_attention_heads": 64,
    "num_hidden_layers": 80, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 152064})");
}

TEST(HfConfigTest, PublishedConfigsGiveThePresetsAndTheirParameterCounts) {
  const StatusOr<DecoderConfig> llama = DecoderConfigFromHuggingFace(Llama3_8B(), "config.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(*llama, *DecoderPreset("llama-3-8b"));
  EXPECT_EQ(llama->NumParameters(), 8'030'261'248);  // LLaMA-3-8B's published count

  const StatusOr<DecoderConfig> qwen = DecoderConfigFromHuggingFace(Qwen2_72B(), "config.json");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(qwen->qkv_bias);  // Qwen2's architecture, not its config
  EXPECT_EQ(*qwen, *DecoderPreset("qwen2-72b"));
  EXPECT_EQ(qwen->NumParameters(), 72'706'203'648);

  // Qwen3-8B's config.json (head_dim 128 = 4096 / 32: unset); 8.2B parameters, 6.95B of them
  // outside the two embeddings.
  const StatusOr<DecoderConfig> qwen3 = DecoderConfigFromHuggingFace(nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
    "vocab_size": 151936})"),
                                                                     "config.json");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(*qwen3, *DecoderPreset("qwen3-8b"));
  EXPECT_EQ(qwen3->NumParameters(), 8'190'735'360);
  EXPECT_EQ(qwen3->NumParameters() - 2 * int64_t{151936} * 4096, 6'946'075'648);

  nlohmann::json big = Llama3_8B();
  big["hidden_size"] = 8192;
  big["num_hidden_layers"] = 80;
  big["num_attention_heads"] = 64;
  big["intermediate_size"] = 28672;
  EXPECT_EQ(*DecoderConfigFromHuggingFace(big, "config.json"), *DecoderPreset("llama-3-70b"));
  EXPECT_EQ(DecoderPreset("llama-3-70b")->NumParameters(), 70'553'706'496);

  const nlohmann::json gpt2 = nlohmann::json::parse(
      R"({"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768,
          "n_positions": 1024, "vocab_size": 50257})");
  EXPECT_EQ(*DecoderConfigFromHuggingFace(gpt2, "config.json"), *DecoderPreset("gpt2"));
  nlohmann::json wide = gpt2;
  wide["n_inner"] = 4000;  // another MLP width than zerort's GPT-2 has: refused, not ignored
  EXPECT_FALSE(DecoderConfigFromHuggingFace(wide, "config.json").ok());
  wide["n_inner"] = 3072;
  EXPECT_TRUE(DecoderConfigFromHuggingFace(wide, "config.json").ok());
  EXPECT_EQ(DecoderPreset("gpt2")->NumParameters(), 124'439'808);

  // Mistral 7B v0.1: its sliding window (4096) is shorter than its context (32768). Up to the
  // window full causal attention is what it computes ([Note: sliding windows]): read with its
  // window and a context of 4096; a longer seq_len is refused by the model's own validation.
  nlohmann::json mistral = Llama3_8B();
  mistral["model_type"] = "mistral";
  mistral["max_position_embeddings"] = 32768;
  mistral["sliding_window"] = 4096;
  const StatusOr<DecoderConfig> m = DecoderConfigFromHuggingFace(mistral, "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 4096);
  EXPECT_EQ(m->seq_len, 4096);
  DecoderConfig longer = *m;
  longer.seq_len = 4097;
  const Status refused = longer.Validate();
  EXPECT_NE(refused.message().find("model.seq_len = 4097 is longer than model.sliding_window = "
                                   "4096"),
            std::string::npos)
      << refused;
  mistral["sliding_window"] = nullptr;  // Mistral v0.2+: no window
  const StatusOr<DecoderConfig> v2 = DecoderConfigFromHuggingFace(mistral, "m.json");
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->sliding_window, 0);
  EXPECT_EQ(v2->seq_len, 32768);
}

// LLaMA 3.2 1B's config.json (as its model card publishes it): LLaMA 3.1's rotary scaling read,
// the tied head, the published 1.24B parameters; transformers 5's rope_parameters spelling of the
// same scaling gives the same shape. LLaMA's attention_bias biases Q, K, V and O, mlp_bias the MLP.
TEST(HfConfigTest, Llama32ScalingAndLlamaBiasesAreRead) {
  const nlohmann::json published = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
  const StatusOr<DecoderConfig> c = DecoderConfigFromHuggingFace(published, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, (RopeScaling{.type = RopeType::kLlama3,
                                          .factor = 32,
                                          .low_freq_factor = 1,
                                          .high_freq_factor = 4,
                                          .original_max_position_embeddings = 8192}));
  EXPECT_TRUE(c->tied());
  EXPECT_EQ(c->NumParameters(), 1'235'814'400);  // LLaMA 3.2 1B's published count
  EXPECT_EQ(*c, *DecoderPreset("llama-3.2-1b"));
  EXPECT_FALSE(c->qkv_bias || c->o_proj_bias || c->mlp_bias);

  nlohmann::json five = published;
  five.erase("rope_scaling");
  five.erase("rope_theta");
  five["rope_parameters"] = published.at("rope_scaling");
  five["rope_parameters"]["rope_theta"] = 500000.0;
  EXPECT_EQ(*DecoderConfigFromHuggingFace(five, "config.json"), *c);

  nlohmann::json biased = published;
  biased["attention_bias"] = true;
  biased["mlp_bias"] = true;
  const StatusOr<DecoderConfig> b = DecoderConfigFromHuggingFace(biased, "config.json");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->qkv_bias && b->o_proj_bias && b->mlp_bias);
  // q, k, v, o biases (2048 + 2 x 512 + 2048) and the MLP's (2 x 8192 + 2048), per layer.
  EXPECT_EQ(b->NumParameters() - c->NumParameters(), 16 * (5120 + 18432));
  nlohmann::json qwen = biased;  // Qwen2 has Q/K/V biases whatever these keys say
  qwen["model_type"] = "qwen2";
  const StatusOr<DecoderConfig> q = DecoderConfigFromHuggingFace(qwen, "config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->qkv_bias && !q->o_proj_bias && !q->mlp_bias);
}

// An absent key is transformers' default for the model_type (LlamaConfig's rms_norm_eps is 1e-6,
// not 1e-5; MistralConfig's sliding_window 4096; GPT2Config's whole shape); transformers 5 writes
// rope_theta inside rope_parameters, read as the top-level key is.
TEST(HfConfigTest, AbsentKeysAreTransformersDefaultsAndRopeParametersAreRead) {
  nlohmann::json llama = Llama3_8B();
  for (const char* key : {"rms_norm_eps", "max_position_embeddings", "num_key_value_heads",
                          "rope_theta", "tie_word_embeddings", "hidden_act"}) {
    llama.erase(key);
  }
  const StatusOr<DecoderConfig> l = DecoderConfigFromHuggingFace(llama, "config.json");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->norm_eps, 1e-6);
  EXPECT_EQ(l->seq_len, 2048);
  EXPECT_EQ(l->kv_heads(), 32);  // None: num_attention_heads
  EXPECT_EQ(l->rope_theta, 10000.0);
  EXPECT_FALSE(l->tie_word_embeddings);

  nlohmann::json mistral = {{"model_type", "mistral"}};  // every key MistralConfig's default
  const StatusOr<DecoderConfig> m = DecoderConfigFromHuggingFace(mistral, "config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->d_model, 4096);
  EXPECT_EQ(m->intermediate_size, 14336);
  EXPECT_EQ(m->kv_heads(), 8);
  EXPECT_EQ(m->sliding_window, 4096);
  EXPECT_EQ(m->seq_len, 4096);  // max_position_embeddings 131072, read up to the window

  EXPECT_EQ(*DecoderConfigFromHuggingFace(nlohmann::json{{"model_type", "gpt2"}}, "config.json"),
            *DecoderPreset("gpt2"));

  nlohmann::json v5 = Llama3_8B();  // transformers 5's spelling
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
  const StatusOr<DecoderConfig> five = DecoderConfigFromHuggingFace(v5, "config.json");
  ASSERT_TRUE(five.ok()) << five.status();
  EXPECT_EQ(five->rope_theta, 500000.0);
  v5["rope_theta"] = 10000.0;  // both spellings, disagreeing
  const StatusOr<DecoderConfig> both = DecoderConfigFromHuggingFace(v5, "config.json");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("rope_parameters.rope_theta = 500000 disagrees"),
            std::string::npos)
      << both.status();
}

// Qwen2.5's long-context recipe (its model card: YaRN, factor 4 over the 32768 positions it was
// trained on), in transformers 4's spelling and in transformers 5's rope_parameters; without
// original_max_position_embeddings YaRN's context is max_position_embeddings; beta_fast and
// beta_slow written at their defaults read as unset, DeepSeek's mscales as given.
TEST(HfConfigTest, Qwen25YarnIsRead) {
  nlohmann::json qwen = nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "tie_word_embeddings": false, "vocab_size": 152064,
    "use_sliding_window": false, "sliding_window": 131072,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}})");
  const RopeScaling want{
      .type = RopeType::kYarn, .factor = 4, .original_max_position_embeddings = 32768};
  StatusOr<DecoderConfig> c = DecoderConfigFromHuggingFace(qwen, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, want);
  EXPECT_TRUE(c->Validate().ok()) << c->Validate();
  EXPECT_NE(RopeScalingText(c->rope_scaling).find("yarn x4 (original 32768, beta 32/1"),
            std::string::npos)
      << RopeScalingText(c->rope_scaling);

  nlohmann::json five = qwen;
  five.erase("rope_scaling");
  five["rope_parameters"] = {{"rope_type", "yarn"},     {"factor", 4.0},
                             {"rope_theta", 1000000.0}, {"beta_fast", 32.0},
                             {"beta_slow", 1.0},        {"attention_factor", nullptr}};
  five["max_position_embeddings"] = 32768;
  c = DecoderConfigFromHuggingFace(five, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, want);  // the context from max_position_embeddings

  qwen["rope_scaling"] = {{"rope_type", "yarn"},
                          {"factor", 40.0},
                          {"beta_fast", 16},
                          {"mscale", 1.0},
                          {"mscale_all_dim", 0.5},
                          {"attention_factor", 1.25},
                          {"original_max_position_embeddings", 4096},
                          {"truncate", true}};
  c = DecoderConfigFromHuggingFace(qwen, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, (RopeScaling{.type = RopeType::kYarn,
                                          .factor = 40,
                                          .original_max_position_embeddings = 4096,
                                          .attention_factor = 1.25,
                                          .beta_fast = 16,
                                          .mscale = 1,
                                          .mscale_all_dim = 0.5}));
}

// Dynamic NTK ([Note: rotary scaling]): transformers scales from max_position_embeddings and
// does not read rope_scaling's original_max_position_embeddings for it (optional, ignored), so
// the context is always max_position_embeddings, in either spelling.
TEST(HfConfigTest, DynamicNtkIsReadFromMaxPositionEmbeddings) {
  nlohmann::json llama = nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-05,
    "vocab_size": 32000, "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
  const RopeScaling want{
      .type = RopeType::kDynamic, .factor = 2, .original_max_position_embeddings = 4096};
  StatusOr<DecoderConfig> c = DecoderConfigFromHuggingFace(llama, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, want);
  EXPECT_EQ(c->seq_len, 4096);
  EXPECT_TRUE(c->Validate().ok()) << c->Validate();
  EXPECT_EQ(RopeScalingText(c->rope_scaling), "dynamic x2 (original 4096)");

  llama["rope_scaling"]["original_max_position_embeddings"] = 2048;  // not read
  c = DecoderConfigFromHuggingFace(llama, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, want);

  nlohmann::json five = llama;
  five.erase("rope_scaling");
  five["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  c = DecoderConfigFromHuggingFace(five, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling, want);

  llama["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 0.5}};
  c = DecoderConfigFromHuggingFace(llama, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rope_scaling.factor"), std::string::npos) << c.status();
  llama["rope_scaling"] = {{"rope_type", "dynamic"}};
  c = DecoderConfigFromHuggingFace(llama, "config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rope_scaling.factor is missing"), std::string::npos)
      << c.status();
}

// Qwen3-0.6B's config.json: q_norm and k_norm (qk_norm), 16 heads of head_dim 128 over a hidden
// size of 1024 (q_proj [2048, 1024]), 8 key/value heads, tied: 155,582,464 embedding parameters
// and 28 blocks of 15,730,944 (two norms 2048, q/k/v 4,194,304, o 2,097,152, the MLP 9,437,184,
// q_norm and k_norm 256) and the final norm: 596,049,920. An absent head_dim is Qwen3's 128.
TEST(HfConfigTest, Qwen3sPerHeadNormsAreRead) {
  nlohmann::json qwen3 = nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
  StatusOr<DecoderConfig> c = DecoderConfigFromHuggingFace(qwen3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias || c->o_proj_bias || c->mlp_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->attention_channels(), 2048);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->NumParameters(), 596'049'920);
  StatusOr<std::vector<DecoderUnit>> units = DecoderUnits(*c, 1, 0);
  ASSERT_TRUE(units.ok()) << units.status();
  int64_t sum = 0;
  for (const DecoderUnit& u : *units) {
    for (const ParamSpec& p : u.params) {
      sum += p.numel();
      if (p.name == "blocks.0.attn.q_norm.weight" || p.name == "blocks.0.attn.k_norm.weight") {
        EXPECT_EQ(p.real_shape(), (Shape{128})) << p.name;
      }
    }
  }
  EXPECT_EQ(sum, c->NumParameters());

  qwen3.erase("head_dim");  // Qwen3Config's default
  qwen3["attention_bias"] = true;
  c = DecoderConfigFromHuggingFace(qwen3, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_TRUE(c->qkv_bias && c->o_proj_bias && !c->mlp_bias);
}

// Mistral-Nemo: 32 heads of head_dim 128 over a hidden size of 5120, so q_proj is [4096, 5120]
// and o_proj [5120, 4096]; its safetensors index's total_size, 24,495,564,800 bytes of bf16, is
// 12,247,782,400 parameters. A head_dim that is the quotient (LLaMA 3.2's) reads as unset.
TEST(HfConfigTest, MistralNemosHeadDimIsRead) {
  const nlohmann::json nemo = nlohmann::json::parse(R"({
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 5120, "intermediate_size": 14336,
    "max_position_embeddings": 1024000, "num_attention_heads": 32, "num_hidden_layers": 40,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 131072})");
  const StatusOr<DecoderConfig> c = DecoderConfigFromHuggingFace(nemo, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->head_size(), 128);
  EXPECT_EQ(c->attention_channels(), 4096);
  EXPECT_EQ(c->NumParameters(), 12'247'782'400);
  const StatusOr<std::vector<DecoderUnit>> units = DecoderUnits(*c, 1, 0);
  ASSERT_TRUE(units.ok()) << units.status();
  int64_t total = 0;
  for (const DecoderUnit& u : *units) {
    for (const ParamSpec& p : u.params) {
      total += p.numel();
      if (p.name == "blocks.0.attn.q.weight") {
        EXPECT_EQ(p.real_shape(), (Shape{4096, 5120}));
      }
      if (p.name == "blocks.0.attn.o.weight") {
        EXPECT_EQ(p.real_shape(), (Shape{5120, 4096}));
      }
    }
  }
  EXPECT_EQ(total, c->NumParameters());

  nlohmann::json quotient = nemo;
  quotient["head_dim"] = 160;  // 5120 / 32
  EXPECT_EQ(DecoderConfigFromHuggingFace(quotient, "config.json")->head_dim, 0);
}

TEST(HfConfigTest, HostileAndUnsupportedFieldsAreNamed) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* expect;
  };
  const Case cases[] = {
      {"hidden_size", "4096", "hidden_size = \"4096\": not an integer"},
      {"hidden_size", -1, "hidden_size = -1: must be in"},
      {"num_hidden_layers", nullptr, "num_hidden_layers = null: not an integer"},
      {"num_key_value_heads", 5, "model.n_kv_head = 5"},
      {"vocab_size", 1e300, "vocab_size = 1e+300: not an integer"},
      {"rope_theta", "big", "rope_theta = \"big\": not a number"},
      {"rms_norm_eps", 2, "rms_norm_eps = 2: must be in"},
      {"rope_scaling", nlohmann::json{{"rope_type", "llama3"}, {"factor", 8.0}},
       "rope_scaling.low_freq_factor is missing"},
      {"rope_scaling", nlohmann::json{{"type", "longrope"}, {"factor", 2.0}},
       "rope_scaling.type = \"longrope\": zerort computes default, linear, llama3"},
      {"rope_scaling", nlohmann::json{{"type", "dynamic"}, {"factor", "2"}},
       "rope_scaling.factor = \"2\": not a number"},
      {"rope_scaling", nlohmann::json{{"rope_type", "linear"}}, "rope_scaling.factor is missing"},
      {"rope_parameters", nlohmann::json{{"rope_type", "longrope"}, {"factor", 4.0}},
       "rope_parameters.rope_type = \"longrope\""},
      {"rope_scaling", nlohmann::json{{"type", "yarn"}}, "rope_scaling.factor is missing"},
      {"rope_scaling", nlohmann::json{{"type", "yarn"}, {"factor", 4.0}, {"beta_fast", 1.0}},
       "rope_scaling.beta_fast = 1: must be above beta_slow = 1"},
      {"rope_scaling", nlohmann::json{{"type", "yarn"}, {"factor", 4.0}, {"truncate", false}},
       "rope_scaling.truncate = false: zerort's YaRN rounds the ramp's ends"},
      {"rope_scaling",
       nlohmann::json{{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 0}},
       "rope_scaling.original_max_position_embeddings = 0: must be an integer in [1, 16777216]"},
      {"rope_scaling", nlohmann::json{{"type", "yarn"}, {"factor", 4.0}, {"attention_factor", -1}},
       "rope_scaling.attention_factor = -1: must be in"},
      {"rope_parameters", 5, "rope_parameters = 5: not an object"},
      {"hidden_act", "gelu", "hidden_act = \"gelu\": zerort's LLaMA-family MLP gates with SiLU"},
      {"hidden_act", 7, "hidden_act = 7: not a string"},
      {"attention_bias", "no", "attention_bias = \"no\": not a boolean"},
      {"mlp_bias", 1, "mlp_bias = 1: not a boolean"},
      {"head_dim", 0, "head_dim = 0: must be in"},
      {"head_dim", 127, "model.head_dim = 127: rotary embeddings rotate pairs"},
      {"tie_word_embeddings", 1, "tie_word_embeddings = 1: not a boolean"},
      {"model_type", "falcon", "model_type \"falcon\" is not one zerort builds"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = Llama3_8B();
    j[c.key] = c.value;
    const StatusOr<DecoderConfig> got = DecoderConfigFromHuggingFace(j, "dir/config.json");
    ASSERT_FALSE(got.ok()) << c.key;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_NE(got.status().message().find(c.expect), std::string::npos)
        << c.key << ": " << got.status();
    EXPECT_NE(got.status().message().find("dir/config.json"), std::string::npos) << c.key;
  }
  EXPECT_FALSE(DecoderConfigFromHuggingFace(nlohmann::json::array(), "x").ok());
  // GPT-2's activation and LayerNorm epsilon are zerort's GPT-2's, or refused by name.
  for (const auto& [key, value, expect] :
       {std::tuple<const char*, nlohmann::json, const char*>{"activation_function", "relu",
                                                             "activation_function = \"relu\""},
        {"activation_function", "gelu", "activation_function = \"gelu\""},
        {"layer_norm_epsilon", 1e-6, "layer_norm_epsilon = 1e-06"},
        {"tie_word_embeddings", false, "tie_word_embeddings = false"},
        {"tie_word_embeddings", "yes", "tie_word_embeddings"},
        {"scale_attn_weights", false, "scale_attn_weights = false"},
        // null is transformers' None, false to it: not the default true.
        {"scale_attn_weights", nullptr, "scale_attn_weights = null"},
        {"tie_word_embeddings", nullptr, "tie_word_embeddings = null"},
        {"scale_attn_weights", 1, "scale_attn_weights = 1: not a boolean"},
        {"scale_attn_by_inverse_layer_idx", true, "scale_attn_by_inverse_layer_idx = true"},
        {"n_layer", nullptr, "n_layer = null"}}) {
    nlohmann::json gpt2 = {{"model_type", "gpt2"}};
    gpt2[key] = value;
    const StatusOr<DecoderConfig> got = DecoderConfigFromHuggingFace(gpt2, "g.json");
    ASSERT_FALSE(got.ok()) << key;
    EXPECT_NE(got.status().message().find(expect), std::string::npos) << got.status();
  }
  nlohmann::json tanh = {{"model_type", "gpt2"}, {"activation_function", "gelu_pytorch_tanh"}};
  EXPECT_TRUE(DecoderConfigFromHuggingFace(tanh, "g.json").ok());  // gelu_new by another name
  nlohmann::json tied = {{"model_type", "gpt2"},
                         {"tie_word_embeddings", true},
                         {"scale_attn_weights", true},
                         {"scale_attn_by_inverse_layer_idx", false},
                         {"reorder_and_upcast_attn", true}};       // the same function, upcast
  EXPECT_TRUE(DecoderConfigFromHuggingFace(tied, "g.json").ok());  // GPT-2's own, said aloud
  EXPECT_FALSE(ReadHuggingFaceConfig("/nonexistent/config.json").ok());
}

}  // namespace
}  // namespace zerort
