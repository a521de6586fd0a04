// Preflight checks as pure functions: rank configs that differ name the first differing key and
// both values on each side; a resumed config may change the stage but not the model's shape; the
// memory check refuses what does not fit the machine it is told about, and lists the layouts
// that would.
#include "zerort/engine/preflight.h"
#include "zerort/checkpoint/config_match.h"

#include <gtest/gtest.h>

namespace zerort {
namespace {

TEST(PreflightTest, RankConfigsNameTheFirstDifferenceOnEachSide) {
  const std::string a = R"({"model": {"n_head": 2}, "train": {"steps": 5}})";
  const std::string b = R"({"model": {"n_head": 4}, "train": {"steps": 5}})";
  EXPECT_TRUE(CompareRankConfigs({a, a, a}, 1).ok());
  const Status on_two = CompareRankConfigs({a, a, b}, 2);
  EXPECT_EQ(on_two.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(on_two.message().find("at model.n_head rank 2 has 4, rank 0 has 2"), std::string::npos)
      << on_two;
  const Status on_one = CompareRankConfigs({a, a, b}, 1);  // agrees with rank 0: names rank 2
  EXPECT_NE(on_one.message().find("at model.n_head rank 1 has 2, rank 2 has 4"), std::string::npos)
      << on_one;
}

TEST(PreflightTest, ResumeMayChangeTheStageButNotTheShape) {
  const nlohmann::json saved = {{"model", {{"n_head", 2}, {"d_model", 32}}},
                                {"zero_optimization", {{"stage", 1}}}};
  nlohmann::json now = saved;
  now["zero_optimization"]["stage"] = 3;
  EXPECT_TRUE(CheckResumable(saved, now, "ckpt/step_2").ok());
  now["model"]["n_head"] = 4;
  const Status s = CheckResumable(saved, now, "ckpt/step_2");
  EXPECT_NE(s.message().find("model.n_head = 2, this run's config has 4"), std::string::npos) << s;
}

TEST(PreflightTest, MemoryFitsOrSaysWhatWould) {
  MemoryModelInput in;
  in.model = DecoderConfig{12, 12, 768, 1024, 50257};  // GPT-2 124M
  in.micro_batch = 24;
  MachineMemory machine;
  machine.host.available = int64_t{1} << 40;  // 1 TiB
  machine.host.source = "test";
  EXPECT_TRUE(CheckMemoryFits(in, machine).ok());
  machine.host.available = int64_t{12} << 30;  // 12 GiB: 17 GiB without checkpointing
  const Status s = CheckMemoryFits(in, machine);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("does not fit in host memory"), std::string::npos) << s;
  EXPECT_NE(s.message().find("stage 3 with model.activation_checkpointing"), std::string::npos)
      << s;
  machine.ranks_on_node = 4;  // four ranks share the node: nothing fits in 12 GiB
  EXPECT_NE(CheckMemoryFits(in, machine).message().find("No ZeRO stage"), std::string::npos);
}

TEST(PreflightTest, MastersAndMomentsThatCannotFitAreRefusedBeforeTheReplay) {
  MemoryModelInput in;
  in.model = DecoderConfig{64, 32, 4096, 128, 256};  // 12.9 billion parameters
  in.manager.stage = ZeroStage::k3;
  MachineMemory machine;
  machine.host.available = int64_t{64} << 30;
  machine.host.source = "test";
  // 12 bytes a parameter (fp32 master, AdamW's two moments): 144 GiB on one rank.
  const Status one = CheckMemoryFits(in, machine);
  EXPECT_NE(
      one.message().find(
          "its fp32 masters and 2 optimizer moment(s) alone, 12889890816 parameters x 12 bytes"),
      std::string::npos)
      << one;
  EXPECT_NE(one.message().find("over tensor_parallel_size 1 and 1 rank(s) sharding them"),
            std::string::npos)
      << one;
  // Sharded over 4 data ranks on 4 nodes: 36 GiB a rank, past this bound (the replay decides).
  in.dp = 4;
  EXPECT_EQ(CheckMemoryFits(in, machine).message().find("fp32 masters"), std::string::npos);
  // Four of them on this node: 144 GiB again.
  machine.ranks_on_node = 4;
  EXPECT_NE(CheckMemoryFits(in, machine).message().find("x 4 rank(s) on this node"),
            std::string::npos);
  // The optimizer on NVMe keeps neither in memory.
  in.dp = 1;
  machine.ranks_on_node = 1;
  in.manager.placement.optimizer = MemoryTier::kNvme;
  in.manager.placement.params = MemoryTier::kNvme;
  EXPECT_EQ(CheckMemoryFits(in, machine).message().find("fp32 masters"), std::string::npos);
}

}  // namespace
}  // namespace zerort
