// The tokenizer.json tokenizers ([Note: zerort's tokenizers]) against Hugging Face's JavaScript
// implementation: six tokenizer.json files written and run by
// tests/data/tokenizer_reference.mjs (byte-level: GPT-2's, LLaMA-3's and Qwen2's
// pre-tokenisation, special tokens, Qwen2's NFC; SentencePiece-converted with byte fallback:
// LLaMA-2's legacy normalizers, Mistral's Metaspace, a Replace-only one), and the ids it gave for
// strings with Unicode, whitespace runs, digits, contractions, special tokens, NUL and characters
// without a token: identical ids, and the same decoded text. Invalid UTF-8 is an error naming its
// byte; a 128,000-letter word merges in O(n log n); hostile tokenizer.json files are refused
// naming the JSON path; data prepare's blocks give the whole text's ids for every kind.
#include "zerort/data/tokenizer.h"

#include <gtest/gtest.h>

#include "zerort/data/data_prepare.h"
#include "zerort/data/token_file.h"
#include "zerort/runtime/strings.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace zerort {
namespace {

const std::string kGolden = ZR_TOKENIZER_GOLDEN_DIR;
// Every tokenizer the golden directory holds: the six tokenizer.json kinds and the SentencePiece
// model data train-tokenizer wrote.
const char* const kKinds[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral", "replace"};
std::string TokenizerFile(const std::string& kind) {
  return kGolden + (kind == "spm" ? "/sentencepiece_tiny.model" : "/tokenizer_" + kind + ".json");
}

nlohmann::json Read(const std::string& file) {
  std::ifstream in(kGolden + "/" + file);
  return nlohmann::json::parse(in);
}

class TokenizerGoldenTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Kinds, TokenizerGoldenTest,
                         ::testing::Values("gpt2", "llama3", "qwen2", "llama2", "mistral",
                                           "replace"));

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
// binding (tests/data/sentencepiece_reference.py): the same ids and text; training again on 2
// threads gives the same model (SentencePiece's trainer depends on its thread count).
TEST(TokenizerTest, SentencePieceIsItsPythonBindings) {
  const nlohmann::json golden = Read("sentencepiece_golden.json");
  const StatusOr<std::unique_ptr<Tokenizer>> t =
      Tokenizer::Load(kGolden + "/sentencepiece_tiny.model");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), golden.at("vocab_size").get<int>());
  EXPECT_EQ((*t)->EndOfText(), golden.at("eos").get<int32_t>());
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
  // A unigram model with a piece that starts with NUL: libsentencepiece's trie builder takes it for
  // an empty key and throws, which ended the process (found by the file fuzzers, tests/fuzz/);
  // now an error naming the file. The ModelProto by hand: pieces {"<unk>", score 0, UNKNOWN} and
  // {"\0", score 0, NORMAL}.
  const char empty_piece[] =
      "\x0a\x0e\x0a\x05<unk>\x15\0\0\0\0\x18\x02"
      "\x0a\x0a\x0a\x01\x00\x15\0\0\0\0\x18\x01";
  std::ofstream(dir + "/empty_piece.model", std::ios::binary)
      .write(empty_piece, sizeof(empty_piece) - 1);
  const StatusOr<std::unique_ptr<Tokenizer>> damaged = Tokenizer::Load(dir + "/empty_piece.model");
  ASSERT_FALSE(damaged.ok());
  EXPECT_THAT(std::string(damaged.status().message()),
              ::testing::HasSubstr("empty_piece.model: not a SentencePiece model (the model is "
                                   "damaged"))
      << damaged.status();
  // A model libsentencepiece loads without an error and then answers every query with 0 (no
  // pieces; the file fuzzers' find, as found: a piece of an unknown type, holding NUL, twice):
  // refused at the load, where `data prepare` blamed a missing end-of-text token.
  const char no_pieces[] =
      "\x18\x02\x0a\x0f\x0a\x06\x00\x00\x18\x04\x0a\x3e\x15\x00\x00\x00\x00\x18\x31"
      "\x0a\x0e\x0a\x05<unk>\x15\x00\x00\x00\x00\x18\x02"
      "\x0a\x0f\x0a\x06\x00\x00\x18\x04\x0a\x3e\x15\x00\x00\x00\x00\x18\x31";
  std::ofstream(dir + "/no_pieces.model", std::ios::binary).write(no_pieces, sizeof(no_pieces) - 1);
  const StatusOr<std::unique_ptr<Tokenizer>> empty = Tokenizer::Load(dir + "/no_pieces.model");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()),
              ::testing::HasSubstr("no_pieces.model: not a SentencePiece model"))
      << empty.status();
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
      {"byte fallback beside ByteLevel",
       [](nlohmann::json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
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
      {"Metaspace without its replacement",
       [](nlohmann::json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "pre_tokenizer.replacement"},
      {"Metaspace's unknown prepend_scheme",
       [](nlohmann::json& j) {
         j["pre_tokenizer"] = {
             {"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
       },
       "pre_tokenizer.prepend_scheme"},
      {"BPE dropout", [](nlohmann::json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {"an unk_token outside the vocab", [](nlohmann::json& j) { j["model"]["unk_token"] = "<x>"; },
       "model.unk_token"},
      {"a Replace by regex",
       [](nlohmann::json& j) {
         j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
       },
       "normalizer"},
      {"a WordPiece decoder",
       [](nlohmann::json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder"},
      {"a Strip without counts",
       [](nlohmann::json& j) {
         j["decoder"] = {{"type", "Sequence"},
                         {"decoders", {{{"type", "Fuse"}}, {{"type", "Strip"}, {"content", " "}}}}};
       },
       "decoder[1]"},
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
  const std::vector<int32_t> outside = {1, t->vocab_size()};
  EXPECT_FALSE(t->Decode(outside).ok());
  // A vocab id past every other (a hole before it, no added token after): the table spans it
  // (libFuzzer found the id table sized by the vocab's count, written past its end).
  nlohmann::json holes = good;
  const int far = t->vocab_size() + 40;
  holes["model"]["vocab"]["zz"] = far;
  std::ofstream(dir + "/holes.json") << holes.dump();
  const StatusOr<std::unique_ptr<Tokenizer>> spans = Tokenizer::Load(dir + "/holes.json");
  ASSERT_TRUE(spans.ok()) << spans.status();
  EXPECT_EQ((*spans)->vocab_size(), far + 1);
  const std::vector<int32_t> zz = {far};
  EXPECT_EQ(*(*spans)->Decode(zz), "zz");
  // A Sequence normalizer, a character without a token and no byte fallback or unk: named.
  nlohmann::json strict = Read("tokenizer_llama2.json");
  strict["model"]["byte_fallback"] = false;
  strict["model"]["unk_token"] = nullptr;
  std::ofstream(dir + "/strict.json") << strict.dump();
  std::vector<int32_t> ids;
  const Status no_token = (*Tokenizer::Load(dir + "/strict.json"))->Encode("snow \u2603", ids);
  EXPECT_NE(no_token.message().find("no token for '\u2603' (U+2603)"), std::string::npos)
      << no_token;
}

// Text that is not UTF-8 (a stray continuation byte, a truncated sequence, an overlong form, a
// lone surrogate's encoding, a code point past U+10FFFF) is an error naming its byte, for every
// tokenizer kind, SentencePiece's included (Hugging Face's tokenizers take only Unicode strings;
// SentencePiece would encode such bytes as U+FFFD, silently); a NUL is a character (its ids are
// in the golden strings), never the end of the text.
TEST(TokenizerTest, InvalidUtf8IsNamedAndNulIsACharacter) {
  const std::pair<const char*, size_t> bad[] = {{"ok \x80 then", 3},
                                                {"caf\xc3", 3},
                                                {"over \xc0\xaf long", 5},
                                                {"lone \xed\xa0\x80 surrogate", 5},
                                                {"past \xf4\x90\x80\x80 max", 5}};
  std::vector<std::string> kinds(std::begin(kKinds), std::end(kKinds));
  kinds.push_back("spm");
  for (const std::string& kind : kinds) {
    const std::unique_ptr<Tokenizer> t = *Tokenizer::Load(TokenizerFile(kind));
    for (const auto& [text, at] : bad) {
      std::vector<int32_t> ids;
      const Status s = t->Encode(text, ids);
      ASSERT_FALSE(s.ok()) << kind << ": " << text;
      EXPECT_NE(s.message().find(StrCat("not valid UTF-8 at byte ", at)), std::string::npos)
          << kind << ": " << s;
    }
    for (const std::string& nul : {std::string(1, '\0'), std::string("a\0b", 3)}) {
      std::vector<int32_t> ids;
      ASSERT_TRUE(t->Encode(nul, ids).ok()) << kind;
      EXPECT_FALSE(ids.empty()) << kind;
      EXPECT_EQ(*t->Decode(ids), nul) << kind;
    }
  }
}

// One long word merges in O(n log n) ([Note: the tokenizer.json pipeline]): a tokenizer whose
// merges chain 1,000 characters (U+2581 c0, then c1, ... c999) encodes one word of 128,000
// characters (that chain, then its characters again, which merge no further) within 10x the time
// of 12,800 distinct ten-character words (U+2581 c0 ... c6 and two others). Merging round by round
// (a pass over the word per merge rank, what zerort did before: 35 s for a 128,000-letter word
// with LLaMA-3's vocabulary) makes the long word 1,000 passes over 128,000 symbols against 7 over
// 10 per short word: about 100x, and fails here. The best of three runs each.
TEST(TokenizerTest, ALongWordMergesInNLogN) {
  const std::string meta = "\u2581";
  std::vector<std::string> c;
  for (uint32_t i = 0; i < 1000; ++i) {
    const uint32_t cp = 0x4E00 + i;  // three UTF-8 bytes each
    c.push_back({static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                 static_cast<char>(0x80 | (cp & 0x3F))});
  }
  nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
  vocab[meta] = 0;
  for (const std::string& ch : c) vocab[ch] = static_cast<int>(vocab.size());
  std::string chain = meta;
  for (const std::string& ch : c) {
    merges.push_back({chain, ch});
    chain += ch;
    vocab[chain] = static_cast<int>(vocab.size());
  }
  const nlohmann::json file = {
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", meta},
        {"prepend_scheme", "always"},
        {"split", true}}},
      {"decoder", {{"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "always"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  const std::string dir = ::testing::TempDir() + "/tokenizer_long_word";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/chain.json") << file.dump();
  const StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir + "/chain.json");
  ASSERT_TRUE(t.ok()) << t.status();
  std::string word, words;
  while (word.size() < 3 * 128000) {
    for (const std::string& ch : c) word += ch;
  }
  word.resize(3 * 128000);
  for (size_t w = 0; w < 12800; ++w) {  // distinct words, so that none is merged only once
    words += " ";
    for (size_t i = 0; i < 7; ++i) words += c[i];
    words += c[100 + w % 900] + c[100 + w / 900];
  }
  auto best_seconds = [&](const std::string& text, size_t want_ids) {
    double best = 1e9;
    for (int r = 0; r < 3; ++r) {
      std::vector<int32_t> ids;
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_TRUE((*t)->Encode(text, ids).ok());
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      EXPECT_EQ(ids.size(), want_ids);
    }
    return best;
  };
  // The long word: the whole chain in one token, then 127,000 single characters.
  const double long_word = best_seconds(word, 1 + 127000);
  const double short_words = best_seconds(words, 3 * 12800);
  std::printf("one 128,000-character word %.4f s, 12,800 ten-character words %.4f s (%.1fx)\n",
              long_word, short_words, long_word / short_words);
  EXPECT_LT(long_word, 10 * short_words + 0.05);
}

// Every place LastCut offers, whatever the end asked: the two sides' ids, side by side, are the
// whole text's ([Note: cutting a text]). Around U+2581s of the text's own above all: before a
// single space one made LLaMA-2's tokenizer.json cut inside its two-U+2581 token (found by the
// file fuzzers, tests/fuzz/).
TEST(TokenizerTest, EveryCutEncodesLikeTheWholeText) {
  const std::string text =
      "q\u2581 r s\u2581\u2581 t \u2581u v\u2581w x \u2581 U+5161; \u00e9;\u2581 U+1. Line "
      "one\nLine two\n\n  three \u00e9 "
      "caf\u00e9 \u6771\u4eac \U0001F642 end";
  std::vector<std::string> kinds(std::begin(kKinds), std::end(kKinds));
  kinds.push_back("spm");
  for (const std::string& kind : kinds) {
    const std::unique_ptr<Tokenizer> t = *Tokenizer::Load(TokenizerFile(kind));
    std::vector<int32_t> whole;
    ASSERT_TRUE(t->Encode(text, whole).ok()) << kind;
    for (size_t end = 0; end <= text.size(); ++end) {
      const std::optional<TextCut> cut = t->LastCut(text, end);
      if (!cut) continue;
      ASSERT_LE(cut->first_end, cut->second_begin) << kind;
      ASSERT_LE(cut->second_begin, end) << kind;
      std::vector<int32_t> sides;
      ASSERT_TRUE(t->Encode(text.substr(0, cut->first_end), sides).ok());
      ASSERT_TRUE(t->Encode(text.substr(cut->second_begin), sides).ok());
      EXPECT_EQ(sides, whole) << kind << ": cut at " << cut->first_end << "/" << cut->second_begin
                              << " ('" << text.substr(0, cut->first_end) << "' | '"
                              << text.substr(cut->second_begin) << "')";
    }
  }
}

// data prepare streams the text in blocks cut where the ids cannot change ([Note: cutting a
// text]: after lines for byte-level tokenizers, at single spaces for SentencePiece and its
// converted tokenizer.json files), on several threads: the ids are those of the whole text
// encoded at once, then the end-of-text token; a .jsonl file is one document per line, each
// followed by it.
TEST(TokenizerTest, PreparedFilesAreTheWholeTextsIdsAtAnyBlockSizeAndThreadCount) {
  const std::string dir = ::testing::TempDir() + "/tokenizer_prepare_test";
  std::filesystem::create_directories(dir);
  const nlohmann::json golden = Read("tokenizer_golden.json");
  std::string text;
  for (int r = 0; r < 40; ++r) {
    for (const auto& s : golden.at("strings")) text += s.get<std::string>() + "\n";
    text += "  indented\n\n\tline " + std::to_string(r) + "\n";
    text += "a b  c   d \n e\t f x\u00a0y \u2581z \u2581\u2581w: end. ";
  }
  const std::string input = dir + "/text.txt";
  std::ofstream(input, std::ios::binary) << text;
  std::vector<std::string> kinds(std::begin(kKinds), std::end(kKinds));
  kinds.push_back("spm");
  for (const std::string& kind : kinds) {
    const std::string tok = TokenizerFile(kind);
    const std::unique_ptr<Tokenizer> t = *Tokenizer::Load(tok);
    // Every kind here has places to cut ([Note: cutting a text]): the test covers them.
    ASSERT_TRUE(t->LastCut(text, text.size() / 2).has_value()) << kind;
    std::vector<int32_t> want;
    ASSERT_TRUE(t->Encode(text, want).ok());
    want.push_back(*t->EndOfText());
    for (const auto& [block, threads] :
         std::vector<std::pair<int64_t, int>>{{1 << 20, 1}, {512, 1}, {700, 4}, {61, 3}}) {
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
  for (const auto& e : std::filesystem::directory_iterator(dir)) {  // nor what it wrote through
    EXPECT_FALSE(e.path().filename().string().starts_with("bad.bin")) << e.path();
  }
}

}  // namespace
}  // namespace zerort
