// The field table: docs/config.md is its reference, every row reads its own default, its range's
// ends and refuses the values just outside them (naming the JSON path), every printed row survives
// --print-config's round trip, and the directory knows every section.
#include "zerort/config/config_schema.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// {"a": {"b": {key: value}}} for the row's section.
nlohmann::json Nest(const ConfigField& f, const nlohmann::json& value) {
  nlohmann::json j = nlohmann::json::object();
  f.Set(j, value);
  return j;
}

// The problems of reading `json` through the table alone (no cross-key rules).
std::vector<std::string> Read(const nlohmann::json& json, RunConfig* out = nullptr) {
  RunConfig c;
  GivenKeys given;
  Problems problems;
  ReadConfigFields(json, c, given, problems);
  if (out != nullptr) *out = c;
  return problems.messages();
}

bool Numeric(const ConfigField& f) { return f.TypeName() == "integer" || f.TypeName() == "number"; }

TEST(ConfigSchemaTest, DocsConfigIsTheTablesReference) {
  std::ifstream in(ZR_CONFIG_DOC);
  ASSERT_TRUE(in) << ZR_CONFIG_DOC;
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const std::string begin = "<!-- config-reference:begin -->\n";
  const std::string end = "<!-- config-reference:end -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), ConfigReferenceMarkdown())
      << "docs/config.md differs from config/config_rows.cc: run sh scripts/update_docs.sh";
}

TEST(ConfigSchemaTest, EveryRowReadsItsDefaultAndItsRangeEnds) {
  const RunConfig defaults;
  int rows = 0;
  for (const ConfigField& f : ConfigFields()) {
    SCOPED_TRACE(f.Path());
    ++rows;
    EXPECT_FALSE(f.doc.empty());
    EXPECT_NE(ConfigKeyDirectory().count(std::string(f.section)), 0u);
    const nlohmann::json def = f.Value(defaults);
    if (!def.is_null() && !(f.flags & kOmitUnset)) {
      EXPECT_TRUE(Read(Nest(f, def)).empty()) << def;  // the default is in range
    }
    if (!Numeric(f)) continue;
    RunConfig c;
    EXPECT_TRUE(Read(Nest(f, f.min), &c).empty()) << f.min;
    EXPECT_EQ(f.Value(c), nlohmann::json(f.min)) << "min read back";
    EXPECT_TRUE(Read(Nest(f, f.max)).empty()) << f.max;
    const bool integer = f.TypeName() == "integer";
    const double below = integer ? f.min - 1 : f.min - std::max(1e-3, std::fabs(f.min) * 0.5);
    const double above = integer ? f.max + (f.max >= 9e15 ? f.max : 1) : f.max * 2 + 1;
    for (const double bad : {below, above}) {
      const std::vector<std::string> problems = Read(Nest(f, bad));
      ASSERT_EQ(problems.size(), 1u) << bad;
      EXPECT_NE(problems[0].find(f.Path()), std::string::npos) << problems[0];
    }
    // The wrong type names the path too.
    const std::vector<std::string> wrong = Read(Nest(f, "x"));
    ASSERT_EQ(wrong.size(), 1u);
    EXPECT_NE(wrong[0].find(f.Path()), std::string::npos) << wrong[0];
  }
  EXPECT_GT(rows, 90);
}

// A boolean row takes true and false only: a string, a number or a list is refused naming the key.
TEST(ConfigSchemaTest, BooleansRefuseOtherTypesNamingTheKey) {
  int rows = 0;
  for (const ConfigField& f : ConfigFields()) {
    if (f.TypeName() != "boolean") continue;
    SCOPED_TRACE(f.Path());
    ++rows;
    for (const nlohmann::json& bad :
         {nlohmann::json("true"), nlohmann::json(1), nlohmann::json::array()}) {
      const std::vector<std::string> problems = Read(Nest(f, bad));
      ASSERT_EQ(problems.size(), 1u) << bad;
      EXPECT_NE(problems[0].find(f.Path()), std::string::npos) << problems[0];
    }
  }
  EXPECT_GT(rows, 10);
}

TEST(ConfigSchemaTest, ChoicesAreTheOnlyStringsAccepted) {
  for (const ConfigField& f : ConfigFields()) {
    if (f.choices.empty()) continue;
    SCOPED_TRACE(f.Path());
    for (std::string_view choice : f.choices) {
      RunConfig c;
      EXPECT_TRUE(Read(Nest(f, std::string(choice)), &c).empty()) << choice;
      EXPECT_EQ(f.Value(c), std::string(choice));
    }
    const std::vector<std::string> bad = Read(Nest(f, "no-such-choice"));
    ASSERT_EQ(bad.size(), 1u);
    EXPECT_NE(bad[0].find(f.Path()), std::string::npos) << bad[0];
  }
}

// Every row given a non-default value (the other end of its range, another choice, the other
// boolean) prints it, and the printed config reads back to the same config.
TEST(ConfigSchemaTest, PrintedConfigReadsBack) {
  RunConfig c;
  c.optimizer.type = "Lamb";
  c.scheduler.type = "WarmupCosineLR";
  for (const ConfigField& f : ConfigFields()) {
    if (f.flags & kNotPrinted || f.section == "scheduler" || f.Path() == "optimizer.type") {
      continue;
    }
    nlohmann::json v = f.Value(c);
    if (v.is_boolean()) v = !v.get<bool>();
    if (Numeric(f)) v = f.max == v ? nlohmann::json(f.min) : nlohmann::json(f.max);
    if (f.choices.size() > 1)
      v = std::string(f.choices.back() == v ? f.choices[0] : f.choices.back());
    if (f.TypeName() == "list of integers") v = {1, 2};
    RunConfig base = c;
    GivenKeys given;
    Problems problems;
    ReadConfigFields(Nest(f, v), base, given, problems);
    ASSERT_TRUE(problems.empty()) << f.Path() << ": " << problems.ToStatus("x");
    c = base;
  }
  const nlohmann::json printed = FieldsToJson(c);
  RunConfig again;
  GivenKeys given;
  Problems problems;
  ReadConfigFields(printed, again, given, problems);
  ASSERT_TRUE(problems.empty()) << problems.ToStatus("printed");
  EXPECT_EQ(FieldsToJson(again), printed);
  // Parameters of other types are not printed: Lamb has no momentum, the cosine schedule no
  // warmup_max_lr.
  EXPECT_FALSE(printed["optimizer"]["params"].contains("momentum"));
  EXPECT_TRUE(printed["optimizer"]["params"].contains("max_coeff"));
  EXPECT_FALSE(printed["scheduler"]["params"].contains("warmup_max_lr"));
  EXPECT_TRUE(printed["scheduler"]["params"].contains("cos_min_ratio"));
}

TEST(ConfigSchemaTest, UnsetKeysAndNoSchedulerAreNotPrinted) {
  const nlohmann::json j = FieldsToJson(RunConfig{});
  EXPECT_FALSE(j.contains("train_batch_size"));
  EXPECT_FALSE(j.contains("scheduler"));
  EXPECT_FALSE(j["train"].contains("device"));
  EXPECT_FALSE(j["model"].contains("preset"));
  EXPECT_TRUE(j["parallel"]["pipeline_layers"].is_null());
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["buffer_count"], 5);
  EXPECT_EQ(j["zero_optimization"]["offload_optimizer"]["buffer_count"], 4);
}

TEST(ConfigSchemaTest, UnknownKeysAndSectionsThatAreNotObjects) {
  const std::vector<std::string> unknown =
      Read(nlohmann::json::parse(R"({"zero_optimization": {"stgae": 3}})"));
  ASSERT_EQ(unknown.size(), 1u);
  EXPECT_NE(unknown[0].find("stage"), std::string::npos) << unknown[0];  // did you mean
  const std::vector<std::string> scalar = Read(nlohmann::json::parse(R"({"fp16": 1})"));
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_NE(scalar[0].find("fp16"), std::string::npos) << scalar[0];
  const std::vector<std::string> nested = Read(
      nlohmann::json::parse(R"({"zero_optimization": {"offload_param": {"device": "disk"}}})"));
  ASSERT_EQ(nested.size(), 1u);
  EXPECT_NE(nested[0].find("zero_optimization.offload_param.device"), std::string::npos)
      << nested[0];
}

}  // namespace
}  // namespace zerort
