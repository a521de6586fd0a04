// The byte-level BPE tokenizer ([Note: zerort's tokenizers]) against Hugging Face's JavaScript
// implementation: three tokenizer.json files (GPT-2's, LLaMA-3's and Qwen2's pre-tokenisation,
// special tokens, Qwen2's NFC) written and run by tests/engine/tokenizer_reference.mjs, and the
// ids it gave for strings with Unicode, whitespace runs, digits, contractions and special tokens:
// identical ids, and the same decoded text. Hostile tokenizer.json files are refused naming the
// JSON path.
#include "engine/tokenizer.h"

#include <gtest/gtest.h>

#include "engine/data_prepare.h"
#include "engine/token_file.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace zerort {
namespace {

const std::string kGolden = ZR_TOKENIZER_GOLDEN_DIR;

nlohmann::json Read(const std::string& file) {
  std::ifstream in(kGolden + "/" + file);
  return nlohmann::json::parse(in);
}

class TokenizerGoldenTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Kinds, TokenizerGoldenTest, ::testing::Values("gpt2", "llama3", "qwen2"));

TEST_P(TokenizerGoldenTest, IdsAndTextAreHuggingFacesJavaScriptImplementations) {
  const nlohmann::json golden = Read("tokenizer_golden.json");
  const nlohmann::json& mine = golden.at("tokenizers").at(GetParam());
  const StatusOr<std::unique_ptr<Tokenizer>> t =
      Tokenizer::Load(kGolden + "/" + mine.at("file").get<std::string>());
  ASSERT_TRUE(t.ok()) << t.status();
  const auto& strings = golden.at("strings");
  ASSERT_EQ(strings.size(), mine.at("ids").size());
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string text = strings[i].get<std::string>();
    std::vector<int32_t> ids;
    ASSERT_TRUE((*t)->Encode(text, ids).ok()) << text;
    EXPECT_EQ(ids, mine.at("ids")[i].get<std::vector<int32_t>>()) << "\"" << text << "\"";
    const StatusOr<std::string> back = (*t)->Decode(ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, mine.at("decoded")[i].get<std::string>()) << "\"" << text << "\"";
  }
  EXPECT_TRUE((*t)->EndOfText().has_value());
}

// SentencePiece (a model zerort data train-tokenizer wrote) against SentencePiece's own Python
// binding (tests/engine/sentencepiece_reference.py): the same ids and text; training again on 2
// threads gives the same model (SentencePiece's trainer depends on its thread count).
TEST(TokenizerTest, SentencePieceIsItsPythonBindings) {
  const nlohmann::json golden = Read("sentencepiece_golden.json");
  const StatusOr<std::unique_ptr<Tokenizer>> t =
      Tokenizer::Load(kGolden + "/sentencepiece_tiny.model");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), golden.at("vocab_size").get<int>());
  EXPECT_EQ((*t)->EndOfText(), golden.at("eos").get<int32_t>());
  EXPECT_FALSE((*t)->CutsAtLines());
  for (size_t i = 0; i < golden.at("strings").size(); ++i) {
    const std::string text = golden.at("strings")[i].get<std::string>();
    std::vector<int32_t> ids;
    ASSERT_TRUE((*t)->Encode(text, ids).ok());
    EXPECT_EQ(ids, golden.at("ids")[i].get<std::vector<int32_t>>()) << "\"" << text << "\"";
    EXPECT_EQ(*(*t)->Decode(ids), golden.at("decoded")[i].get<std::string>());
  }
  const std::string dir = ::testing::TempDir() + "/tokenizer_spm_test";
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(
      TrainSentencePiece({.output = dir + "/again.model", .vocab_size = 512, .threads = 2}).ok());
  std::ifstream a(dir + "/again.model", std::ios::binary),
      b(kGolden + "/sentencepiece_tiny.model", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}),
            std::string(std::istreambuf_iterator<char>(b), {}));
  // Not a model: named.
  std::ofstream(dir + "/junk.model") << "not a protobuf at all";
  const StatusOr<std::unique_ptr<Tokenizer>> junk = Tokenizer::Load(dir + "/junk.model");
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("junk.model: not a SentencePiece model"),
            std::string::npos)
      << junk.status();
  EXPECT_FALSE(TrainSentencePiece({.output = dir + "/x.bin"}).ok());
  EXPECT_FALSE(TrainSentencePiece({.output = dir + "/x.model", .vocab_size = 3}).ok());
}

TEST(TokenizerTest, HostileFilesAndInputsAreRefusedByName) {
  const nlohmann::json good = Read("tokenizer_gpt2.json");
  const std::string dir = ::testing::TempDir() + "/tokenizer_test";
  std::filesystem::create_directories(dir);
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> breaks;
    const char* expect;
  };
  const Case cases[] = {
      {"Unigram", [](nlohmann::json& j) { j["model"]["type"] = "Unigram"; }, "model.type"},
      {"byte fallback", [](nlohmann::json& j) { j["model"]["byte_fallback"] = true; },
       "model.byte_fallback"},
      {"an id too large", [](nlohmann::json& j) { j["model"]["vocab"]["zz"] = 1 << 30; },
       "model.vocab[\"zz\"]"},
      {"an id twice", [](nlohmann::json& j) { j["model"]["vocab"]["zz"] = 5; }, "gives id 5 twice"},
      {"a merge of unknown tokens", [](nlohmann::json& j) { j["model"]["merges"][3] = "qq rr"; },
       "model.merges[3]"},
      {"no byte alphabet", [](nlohmann::json& j) { j["model"]["vocab"].erase("!"); },
       "lacks the byte-level token"},
      {"a lowercase normalizer",
       [](nlohmann::json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer"},
      {"Metaspace",
       [](nlohmann::json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "pre_tokenizer"},
      {"a pattern that does not compile",
       [](nlohmann::json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"Regex", "(unclosed"}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}},
                                 {{"type", "ByteLevel"}, {"use_regex", false}}}}};
       },
       "does not compile"},
      {"an added token without id", [](nlohmann::json& j) { j["added_tokens"][0].erase("id"); },
       "added_tokens[0]"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.breaks(j);
    const std::string path = dir + "/bad.json";
    std::ofstream(path) << j.dump();
    const StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(path);
    ASSERT_FALSE(t.ok()) << c.what;
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos)
        << c.what << ": " << t.status();
  }
  const std::unique_ptr<Tokenizer> t = *Tokenizer::Load(kGolden + "/tokenizer_gpt2.json");
  std::vector<int32_t> ids;
  const Status bad_utf8 = t->Encode("caf\xc3 ok", ids);
  EXPECT_FALSE(bad_utf8.ok());
  const std::vector<int32_t> outside = {1, t->vocab_size()};
  EXPECT_FALSE(t->Decode(outside).ok());
}

// data prepare streams the text in blocks cut where no pre-token spans, on several threads: the
// ids are those of the whole text encoded at once, then the end-of-text token; a .jsonl file is
// one document per line, each followed by it.
TEST(TokenizerTest, PreparedFilesAreTheWholeTextsIdsAtAnyBlockSizeAndThreadCount) {
  const std::string dir = ::testing::TempDir() + "/tokenizer_prepare_test";
  std::filesystem::create_directories(dir);
  const nlohmann::json golden = Read("tokenizer_golden.json");
  std::string text;
  for (int r = 0; r < 40; ++r) {
    for (const auto& s : golden.at("strings")) text += s.get<std::string>() + "\n";
    text += "  indented\n\n\tline " + std::to_string(r) + "\n";
  }
  const std::string input = dir + "/text.txt";
  std::ofstream(input, std::ios::binary) << text;
  for (const char* kind : {"gpt2", "llama3", "qwen2"}) {
    const std::string tok = kGolden + "/tokenizer_" + std::string(kind) + ".json";
    const std::unique_ptr<Tokenizer> t = *Tokenizer::Load(tok);
    std::vector<int32_t> want;
    ASSERT_TRUE(t->Encode(text, want).ok());
    want.push_back(*t->EndOfText());
    for (const auto& [block, threads] :
         std::vector<std::pair<int64_t, int>>{{1 << 20, 1}, {512, 1}, {700, 4}}) {
      const std::string out = dir + "/out.bin";
      const StatusOr<PrepareSummary> s = PrepareTokenFile({.input = input,
                                                           .output = out,
                                                           .tokenizer = tok,
                                                           .threads = threads,
                                                           .block_bytes = block},
                                                          nullptr);
      ASSERT_TRUE(s.ok()) << s.status();
      const TokenFile f = *ReadTokenFile(out);
      EXPECT_EQ(f.vocab_size, t->vocab_size());
      EXPECT_EQ(f.tokens, want) << kind << " block " << block << " threads " << threads;
    }
  }
  // JSON lines: a document each, the end-of-text token after each.
  const std::string jsonl = dir + "/docs.jsonl";
  std::ofstream(jsonl) << R"({"text": "first document"})"
                       << "\n\n"
                       << R"({"text": "second\ndocument", "id": 7})"
                       << "\n";
  const std::string tok = kGolden + "/tokenizer_gpt2.json";
  const std::unique_ptr<Tokenizer> t = *Tokenizer::Load(tok);
  std::vector<int32_t> want;
  ASSERT_TRUE(t->Encode("first document", want).ok());
  want.push_back(*t->EndOfText());
  ASSERT_TRUE(t->Encode("second\ndocument", want).ok());
  want.push_back(*t->EndOfText());
  const StatusOr<PrepareSummary> s =
      PrepareTokenFile({.input = jsonl, .output = dir + "/docs.bin", .tokenizer = tok}, nullptr);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->documents, 2);
  EXPECT_EQ(ReadTokenFile(dir + "/docs.bin")->tokens, want);
  // A line that is not a document: named by its byte offset, nothing written.
  std::ofstream(jsonl) << R"({"text": "ok"})"
                       << "\n"
                       << R"({"txt": "no"})"
                       << "\n";
  std::filesystem::remove(dir + "/bad.bin");
  const StatusOr<PrepareSummary> bad =
      PrepareTokenFile({.input = jsonl, .output = dir + "/bad.bin", .tokenizer = tok}, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("at byte 15"), std::string::npos) << bad.status();
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/bad.bin.tmp"));
}

}  // namespace
}  // namespace zerort
