// Checkpoints through the training engine on loopback ranks: bitwise resumption at the same world
// size, resumption at another world size and ZeRO stage, keep_last_n, an interrupted save that
// leaves the previous checkpoint loadable, what a save killed at any instant leaves cleared by the
// resumed run, and truncated or bit-flipped shards refused by name.
#include "zerort/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "tests/engine/metrics_file.h"
#include "tests/layers/decoder_harness.h"
#include "zerort/engine/trainer.h"
#include "zerort/runtime/loopback_communicator.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

namespace fs = std::filesystem;

std::string Fresh(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/ckpt_" + name;
  fs::remove_all(dir);
  return dir;
}

RunConfig Config(const std::string& dir, int world, int stage, int64_t steps) {
  RunConfig c = *ParseRunConfig(nlohmann::json::parse(R"({
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 3,
                  "total_num_steps": 20, "warmup_type": "linear"}},
    "gradient_clipping": 1.0, "steps_per_print": 100,
    "model": {"n_layer": 2, "n_head": 2, "d_model": 32, "seq_len": 16, "vocab_size": 256},
    "train": {"eval_windows": 2, "sample_tokens": 0, "device": "cpu"}
  })"),
                                "test");
  c.train.steps = steps;
  c.train_micro_batch_size_per_gpu = 8 / world;
  c.zero.stage = stage;
  c.manager.stage3_param_persistence_threshold = 0;
  c.checkpoint.dir = dir;
  c.checkpoint.keep_last_n = 0;
  c.logging.metrics_file = dir + "/metrics.jsonl";
  return c;
}

Status TrainRanks(const RunConfig& c, int world, bool resume) {
  std::FILE* sink = std::fopen("/dev/null", "w");
  CommOptions options;
  options.timeout = std::chrono::seconds(120);
  const Status status = RunLoopbackRanks(world, options, nullptr, [&](Communicator& comm) {
    return Train(c, {.world = &comm, .world_source = "test", .out = sink, .resume = resume})
        .status();
  });
  std::fclose(sink);
  return status;
}

TEST(CheckpointTest, ResumeIsBitwiseAtTheSameWorldSize) {
  const std::string straight = Fresh("straight");
  ASSERT_TRUE(TrainRanks(Config(straight, 2, 3, 20), 2, false).ok());
  const std::string split = Fresh("split");
  ASSERT_TRUE(TrainRanks(Config(split, 2, 3, 10), 2, false).ok());
  EXPECT_EQ(LatestCheckpoint(split).value_or(""), split + "/step_10");
  ASSERT_TRUE(TrainRanks(Config(split, 2, 3, 20), 2, true).ok());
  const std::vector<double> a = testing::MetricLosses(straight + "/metrics.jsonl");
  const std::vector<double> b = testing::MetricLosses(split + "/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);  // 10 + 10 appended
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

TEST(CheckpointTest, ResumeAtAnotherWorldSizeAndStage) {
  const std::string straight = Fresh("w4s3");
  ASSERT_TRUE(TrainRanks(Config(straight, 4, 3, 20), 4, false).ok());
  const std::string moved = Fresh("w4s3_to_w2s1");
  ASSERT_TRUE(TrainRanks(Config(moved, 4, 3, 10), 4, false).ok());
  ASSERT_TRUE(TrainRanks(Config(moved, 2, 1, 20), 2, true).ok());
  const std::string to_stage0 = Fresh("w4s3_to_w1s0");
  ASSERT_TRUE(TrainRanks(Config(to_stage0, 4, 3, 10), 4, false).ok());
  ASSERT_TRUE(TrainRanks(Config(to_stage0, 1, 0, 20), 1, true).ok());
  const std::vector<double> a = testing::MetricLosses(straight + "/metrics.jsonl");
  for (const std::string& dir : {moved, to_stage0}) {
    const std::vector<double> b = testing::MetricLosses(dir + "/metrics.jsonl");
    ASSERT_EQ(b.size(), a.size()) << dir;
    for (size_t i = 10; i < a.size(); ++i) {
      EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << dir << " step " << i + 1;
    }
  }
}

TEST(CheckpointTest, IntervalsKeepLastNAndInterruptedSaves) {
  const std::string dir = Fresh("keep");
  RunConfig c = Config(dir, 2, 2, 6);
  c.checkpoint.interval = 2;
  c.checkpoint.keep_last_n = 2;
  ASSERT_TRUE(TrainRanks(c, 2, false).ok());
  EXPECT_FALSE(fs::exists(dir + "/step_2"));
  EXPECT_TRUE(fs::exists(dir + "/step_4"));
  EXPECT_TRUE(fs::exists(dir + "/step_6"));
  // A save killed half way leaves a .tmp directory with the run's marker; latest still names
  // step_6 and it loads; the run's next save of step 8 replaces it. (A .tmp without this run's
  // marker is refused: tests/hostile/run_files_test.py.)
  const std::string run_id =
      nlohmann::json::parse(std::ifstream(dir + "/step_6/metadata.json")).at("run_id");
  fs::create_directory(dir + "/step_8.tmp");
  std::ofstream(dir + "/step_8.tmp/.zerort-run") << run_id << "\n";
  std::ofstream(dir + "/step_8.tmp/dp0-tp0.master.bin") << "partial";
  EXPECT_EQ(*LatestCheckpoint(dir), dir + "/step_6");
  c.train.steps = 8;
  c.checkpoint.interval = 0;
  ASSERT_TRUE(TrainRanks(c, 2, true).ok());
  EXPECT_EQ(*LatestCheckpoint(dir), dir + "/step_8");
  EXPECT_FALSE(fs::exists(dir + "/step_8.tmp"));
  const CheckpointSummary s = *InspectCheckpoint(dir + "/step_8");
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.metadata["step"], 8);
  EXPECT_EQ(s.files.size(), 6u);  // 2 ranks x (master, exp_avg, exp_avg_sq)
}

// [Note: a kill at any instant] (checkpoint_save.cc): each leftover a `kill -9` can leave in the
// way of a resumed run's saves is cleared by them, and a half-removed old step is rotated away;
// another run's half-written marker is left alone.
TEST(CheckpointTest, KilledSavesAreCleared) {
  const std::string dir = Fresh("killed");
  RunConfig c = Config(dir, 2, 2, 4);
  c.checkpoint.interval = 1;
  c.checkpoint.keep_last_n = 2;
  ASSERT_TRUE(TrainRanks(c, 2, false).ok());
  ASSERT_EQ(*LatestCheckpoint(dir), dir + "/step_4");
  const std::string run_id =
      nlohmann::json::parse(std::ifstream(dir + "/step_4/metadata.json")).at("run_id");
  // Killed right after the mkdir of step_5.tmp.
  fs::create_directory(dir + "/step_5.tmp");
  // Killed while writing step_6.tmp's marker.
  fs::create_directory(dir + "/step_6.tmp");
  std::ofstream(dir + "/step_6.tmp/.zerort-run") << run_id.substr(0, 5);
  // Killed while rotation removed step_2, at its end: an empty directory.
  fs::create_directory(dir + "/step_2");
  // Killed while rotation removed step_3: its metadata and some shards are left.
  ASSERT_TRUE(fs::remove(dir + "/step_3/dp1-tp0.master.bin"));
  // Killed while a save of step 7 again removed the step_7 an earlier save committed.
  fs::create_directory(dir + "/step_7");
  fs::copy_file(dir + "/step_4/metadata.json", dir + "/step_7/metadata.json");
  // Another run's save, killed while writing its marker (the text differs from this run's id).
  fs::create_directory(dir + "/step_9.tmp");
  const std::string other = std::string(1, run_id[0] == '0' ? '1' : '0') + "12";
  std::ofstream(dir + "/step_9.tmp/.zerort-run") << other;

  c.train.steps = 7;
  const Status resumed = TrainRanks(c, 2, true);
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_EQ(*LatestCheckpoint(dir), dir + "/step_7");
  const CheckpointSummary s = *InspectCheckpoint(dir + "/step_7");
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.metadata["step"], 7);
  EXPECT_EQ(s.files.size(), 6u);
  EXPECT_TRUE(fs::exists(dir + "/step_6"));
  for (const char* gone :
       {"step_2", "step_3", "step_4", "step_5", "step_5.tmp", "step_6.tmp", "step_7.tmp"}) {
    EXPECT_FALSE(fs::exists(dir + "/" + gone)) << gone;
  }
  std::ifstream marker(dir + "/step_9.tmp/.zerort-run");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(marker), {}), other);
}

TEST(CheckpointTest, DamagedShardsAreRefusedByName) {
  const std::string dir = Fresh("damaged");
  ASSERT_TRUE(TrainRanks(Config(dir, 2, 3, 2), 2, false).ok());
  const std::string file = dir + "/step_2/dp1-tp0.exp_avg.bin";
  const std::string original = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto expect_refused = [&](const std::string& contents, const char* needle) {
    std::ofstream(file, std::ios::binary | std::ios::trunc) << contents;
    const Status s = TrainRanks(Config(dir, 2, 3, 4), 2, true);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(file), std::string::npos) << s;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
    EXPECT_FALSE(InspectCheckpoint(dir + "/step_2")->ok);
  };
  expect_refused(original.substr(0, original.size() - 4), "truncated");
  std::string flipped = original;
  flipped[flipped.size() / 2] ^= 0x10;
  expect_refused(flipped, "corrupted");
  std::ofstream(file, std::ios::binary | std::ios::trunc) << original;
  EXPECT_TRUE(InspectCheckpoint(dir + "/step_2")->ok);
  // A checkpoint of another model is refused naming the parameter.
  RunConfig other = Config(dir, 2, 3, 4);
  other.model.shape.d_model = 48;
  const Status s = TrainRanks(other, 2, true);
  EXPECT_NE(s.message().find("has shape"), std::string::npos) << s;
}

}  // namespace
}  // namespace zerort

namespace zerort {
namespace {

// Checkpoints move between data x tensor layouts: a checkpoint saved after two AdamW steps at
// each of (dp 2, tp 2), (dp 4, tp 1), (dp 1, tp 4) and (dp 1, tp 1) loads at every other layout
// and, saved again there, holds bitwise the same master weights and moments for every
// parameter (a vocabulary of 37 is padded differently at tp 2 and tp 4; the padding is never
// stored).
struct Layout {
  int dp, tp;
};

Status TrainAndSave(Layout l, const std::string& dir) {
  testing::DecoderRunConfig c;
  c.model = DecoderConfig{.n_layer = 2, .n_head = 4, .d_model = 16, .seq_len = 8, .vocab_size = 37};
  c.stage = ZeroStage::k3;
  c.tp = l.tp;
  c.global_batch = 4;
  return RunLoopbackRanks(l.dp * l.tp, {}, nullptr, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    ZR_ASSIGN_OR_RETURN(testing::DecoderRank r, testing::MakeDecoderRank(c, comm, tracker));
    const int per_rank = c.global_batch / l.dp;
    std::vector<int32_t> tokens, targets;
    for (int step = 0; step < 2; ++step) {
      testing::TestBatch(step * c.global_batch + r.mesh->coord().data * per_rank, per_rank,
                         c.model.seq_len, c.model.vocab_size, tokens, targets);
      ZR_RETURN_IF_ERROR(
          r.model->ForwardBackward(tokens, targets, per_rank, c.model.seq_len, 1.0f).status());
      ZR_RETURN_IF_ERROR(r.manager->Step({.lr = 1e-2f}).status());
    }
    const CheckpointGroups g{&comm, &r.mesh->data(), l.tp, r.mesh->coord().tensor};
    // The run config the metadata must carry (what inspect, export and resume read).
    const nlohmann::json config = {
        {"model",
         {{"n_layer", 2}, {"n_head", 4}, {"d_model", 16}, {"seq_len", 8}, {"vocab_size", 37}}},
        {"zero_optimization", {{"stage", 3}}},
        {"optimizer", {{"type", "AdamW"}}}};
    return SaveCheckpoint(
        dir, {.step = 2, .applied_steps = 2, .config = config, .run_id = "layout-test"}, *r.manager,
        g, 0);
  });
}

Status LoadAndSave(Layout l, const std::string& from, const std::string& dir) {
  testing::DecoderRunConfig c;
  c.model = DecoderConfig{.n_layer = 2, .n_head = 4, .d_model = 16, .seq_len = 8, .vocab_size = 37};
  c.stage = ZeroStage::k1;  // another stage too
  c.tp = l.tp;
  return RunLoopbackRanks(l.dp * l.tp, {}, nullptr, [&](Communicator& comm) -> Status {
    MemoryTracker tracker;
    ZR_ASSIGN_OR_RETURN(testing::DecoderRank r, testing::MakeDecoderRank(c, comm, tracker));
    const CheckpointGroups g{&comm, &r.mesh->data(), l.tp, r.mesh->coord().tensor};
    ZR_ASSIGN_OR_RETURN(RunState state, LoadCheckpoint(from, *r.manager, g));
    return SaveCheckpoint(dir, state, *r.manager, g, 0);
  });
}

TEST(CheckpointTest, MovesBetweenDataAndTensorLayoutsBitwise) {
  const std::vector<Layout> layouts = {{2, 2}, {4, 1}, {1, 4}, {1, 1}};
  for (Layout s : layouts) {
    const std::string src = Fresh(StrCat("layout_dp", s.dp, "_tp", s.tp));
    ASSERT_TRUE(TrainAndSave(s, src).ok());
    CheckpointReader want = *CheckpointReader::Open(src + "/step_2");
    EXPECT_EQ(want.metadata().at("mesh").at("tensor"), s.tp);
    for (Layout t : layouts) {
      if (t.dp == s.dp && t.tp == s.tp) continue;
      const std::string dst = src + StrCat("_to_dp", t.dp, "_tp", t.tp);
      fs::remove_all(dst);
      const Status st = LoadAndSave(t, src + "/step_2", dst);
      ASSERT_TRUE(st.ok()) << st;
      CheckpointReader got = *CheckpointReader::Open(dst + "/step_2");
      ASSERT_EQ(got.params(), want.params());
      for (const auto& [name, shape] : want.params()) {
        for (const char* kind : {"master", "exp_avg", "exp_avg_sq"}) {
          const std::vector<float> a = *want.ReadAll(name, kind);
          const std::vector<float> b = *got.ReadAll(name, kind);
          ASSERT_EQ(a, b) << name << " " << kind << ": dp " << s.dp << " tp " << s.tp << " -> dp "
                          << t.dp << " tp " << t.tp;
        }
      }
    }
  }
}

// Format 1 (before tensor parallelism: files rank<r>.*.bin, no frames, no mesh) still loads: a
// format-2 checkpoint at tp 1 rewritten as format 1 wrote it loads and saves the same values.
TEST(CheckpointTest, FormatOneStillLoads) {
  const std::string src = Fresh("format1_src");
  ASSERT_TRUE(TrainAndSave({2, 1}, src).ok());
  const std::string step = src + "/step_2";
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(step + "/metadata.json"));
  meta["format_version"] = 1;
  meta.erase("mesh");
  for (auto& p : meta["params"]) {
    p.erase("padded_shape");
    p.erase("split_dim");
    p.erase("groups");
  }
  for (auto& r : meta["ranks"]) {
    const int rank = r["data"];
    r.erase("data");
    r.erase("tensor");
    r["rank"] = rank;
    for (auto& [kind, file] : r["files"].items()) {
      const std::string old = file["name"], now = StrCat("rank", rank, ".", kind, ".bin");
      fs::rename(step + "/" + old, step + "/" + now);
      file["name"] = now;
    }
  }
  std::ofstream(step + "/metadata.json") << meta.dump(1);
  const std::string dst = Fresh("format1_dst");
  for (Layout t : {Layout{1, 1}, Layout{2, 2}}) {
    fs::remove_all(dst);
    const Status st = LoadAndSave(t, step, dst);
    ASSERT_TRUE(st.ok()) << st;
    CheckpointReader want = *CheckpointReader::Open(step);
    CheckpointReader got = *CheckpointReader::Open(dst + "/step_2");
    for (const auto& [name, shape] : want.params()) {
      EXPECT_EQ(*want.ReadAll(name, "master"), *got.ReadAll(name, "master")) << name;
    }
  }
}

// Format 2's new metadata fields, damaged: refused with DataLoss naming metadata.json, never a
// crash and never a read outside the saved pieces.
nlohmann::json& Qkv(nlohmann::json& meta) {
  for (auto& p : meta["params"]) {
    if (p["name"] == "blocks.0.attn.qkv.weight") return p;
  }
  return meta["params"][0];
}

TEST(CheckpointTest, DamagedFormatTwoFramesAreRefused) {
  const std::string src = Fresh("frames_src");
  ASSERT_TRUE(TrainAndSave({1, 2}, src).ok());
  const std::string step = src + "/step_2";
  const nlohmann::json good = nlohmann::json::parse(std::ifstream(step + "/metadata.json"));
  using Edit = std::function<void(nlohmann::json&)>;
  const std::vector<std::pair<std::string, Edit>> edits = {
      {"mesh tensor 0", [](nlohmann::json& m) { m["mesh"]["tensor"] = 0; }},
      {"mesh tensor a string", [](nlohmann::json& m) { m["mesh"]["tensor"] = "two"; }},
      {"mesh tensor huge", [](nlohmann::json& m) { m["mesh"]["tensor"] = 1 << 30; }},
      {"a file of part 7", [](nlohmann::json& m) { m["ranks"][1]["tensor"] = 7; }},
      {"split dimension 9", [](nlohmann::json& m) { Qkv(m)["split_dim"] = 9; }},
      {"groups 0", [](nlohmann::json& m) { Qkv(m)["groups"] = 0; }},
      {"groups 5", [](nlohmann::json& m) { Qkv(m)["groups"] = 5; }},
      {"a piece past its part",
       [](nlohmann::json& m) { m["ranks"][0]["pieces"][0][2] = int64_t{1} << 40; }},
      {"a piece stored twice",
       [](nlohmann::json& m) {
         auto& pieces = m["ranks"][0]["pieces"];
         for (const auto& p : pieces) {
           if (p[0] == "blocks.0.attn.qkv.weight") {
             pieces.push_back(p);
             break;
           }
         }
       }},
  };
  for (const auto& [what, edit] : edits) {
    nlohmann::json meta = good;
    edit(meta);
    std::ofstream(step + "/metadata.json") << meta.dump(1);
    const StatusOr<CheckpointReader> r = CheckpointReader::Open(step);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << what << ": " << r.status();
  }
  std::ofstream(step + "/metadata.json") << good.dump(1);
  EXPECT_TRUE(CheckpointReader::Open(step).ok());
}

}  // namespace
}  // namespace zerort
