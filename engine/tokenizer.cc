// Byte-level BPE from a Hugging Face tokenizer.json ([Note: zerort's tokenizers], tokenizer.h).
#include "engine/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <limits>
#include <thread>
#include <unordered_map>

#include "engine/json_reader.h"
#include "engine/sentencepiece_model.h"
#include "engine/token_file.h"
#include "engine/user_file.h"
#include "runtime/strings.h"

namespace zerort {
namespace {

constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// GPT-2's bytes_to_unicode: the printable bytes as themselves, the others as 256 + n; as UTF-8.
struct ByteAlphabet {
  std::array<std::string, 256> of_byte;
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteAlphabet() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      of_byte[b] = Utf8(keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
      to_byte[of_byte[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteAlphabet& Alphabet() {
  static const ByteAlphabet kAlphabet;
  return kAlphabet;
}

// A compiled pattern, shared by every thread (each match has its own match data).
class Regex {
 public:
  static StatusOr<std::shared_ptr<const Regex>> Compile(const std::string& pattern,
                                                        const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(err, message, sizeof(message));
      return absl::InvalidArgumentError(StrCat(where, ": the pattern does not compile at ", offset,
                                               ": ", reinterpret_cast<char*>(message)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if it cannot
    return std::shared_ptr<const Regex>(new Regex(code));
  }
  ~Regex() { pcre2_code_free(code_); }
  // Splits `text` into its matches and the runs between them (HF's Split, behavior Isolated).
  Status Split(std::string_view text, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    struct Free {
      pcre2_match_data* md;
      ~Free() { pcre2_match_data_free(md); }
    } free_md{md};
    size_t at = 0, done = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                                 at == 0 ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        return absl::InvalidArgumentError(StrCat("the text at byte ", pcre2_get_startchar(md), ": ",
                                                 reinterpret_cast<char*>(message)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // an empty match: step over one character
        size_t next = begin + 1;
        while (next < text.size() && (static_cast<uint8_t>(text[next]) & 0xC0) == 0x80) ++next;
        at = next;
        continue;
      }
      if (begin > done) out.push_back(text.substr(done, begin - done));
      out.push_back(text.substr(begin, end - begin));
      done = at = end;
    }
    if (done < text.size()) out.push_back(text.substr(done));
    return absl::OkStatus();
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

struct PreStep {
  std::shared_ptr<const Regex> split;  // null: no split in this step
};

class BpeTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(const nlohmann::json& j,
                                                          const std::string& file);

  Status Encode(std::string_view text, std::vector<int32_t>& out) const override {
    // Each added token's next occurrence, searched again only once passed: the text is scanned
    // once per added token (LLaMA-3 has 256), not once per token found.
    std::vector<size_t> next(added_.size());
    for (size_t i = 0; i < added_.size(); ++i) next[i] = text.find(added_[i].first);
    size_t at = 0;
    while (at < text.size()) {
      // The earliest added token (the longest there), else the rest.
      size_t best = std::string_view::npos, best_len = 0;
      int32_t best_id = -1;
      for (size_t i = 0; i < added_.size(); ++i) {
        if (next[i] != std::string_view::npos && next[i] < at) {
          next[i] = text.find(added_[i].first, at);
        }
        const size_t p = next[i];
        const std::string& content = added_[i].first;
        if (p == std::string_view::npos) continue;
        if (p < best || (p == best && content.size() > best_len)) {
          best = p;
          best_len = content.size();
          best_id = added_[i].second;
        }
      }
      const size_t end = best == std::string_view::npos ? text.size() : best;
      if (end > at) ZR_RETURN_IF_ERROR(EncodeText(text.substr(at, end - at), out));
      if (best == std::string_view::npos) break;
      out.push_back(best_id);
      at = best + best_len;
    }
    return absl::OkStatus();
  }

  StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    std::string out;
    const ByteAlphabet& a = Alphabet();
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(
            StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
      }
      const std::string& t = token_[static_cast<size_t>(id)];
      if (special_[static_cast<size_t>(id)]) {
        out += t;
        continue;
      }
      for (size_t i = 0; i < t.size();) {  // each character of the byte-level alphabet
        size_t n = 1;
        while (i + n < t.size() && (static_cast<uint8_t>(t[i + n]) & 0xC0) == 0x80) ++n;
        auto it = a.to_byte.find(t.substr(i, n));
        if (it != a.to_byte.end()) {
          out.push_back(static_cast<char>(it->second));
        } else {
          out += t.substr(i, n);  // not byte-level (a hand-made entry): as it is
        }
        i += n;
      }
    }
    return out;
  }

  int vocab_size() const override { return static_cast<int>(token_.size()); }
  std::optional<int32_t> AddedToken(std::string_view content) const override {
    for (const auto& [c, id] : added_) {
      if (c == content) return id;
    }
    return std::nullopt;
  }
  std::optional<int32_t> EndOfText() const override {
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"}) {
      if (auto id = AddedToken(name)) return id;
    }
    return std::nullopt;
  }

 private:
  Status EncodeText(std::string_view text, std::vector<int32_t>& out) const {
    std::string normalized;
    if (nfc_) {
      utf8proc_uint8_t* nfc =
          utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(std::string(text).c_str()));
      if (nfc == nullptr) {
        return absl::InvalidArgumentError("the text is not valid UTF-8 (NFC normalisation)");
      }
      normalized = reinterpret_cast<char*>(nfc);
      std::free(nfc);
      text = normalized;
    }
    std::string prefixed;
    if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    std::vector<std::string_view> pieces = {text}, next;
    for (const PreStep& step : steps_) {
      next.clear();
      for (std::string_view p : pieces) ZR_RETURN_IF_ERROR(step.split->Split(p, next));
      pieces.swap(next);
    }
    const ByteAlphabet& a = Alphabet();
    std::vector<std::string> symbols;
    // Words repeat: each distinct piece of this call is merged once (bounded: a call's pieces).
    std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;
    for (std::string_view piece : pieces) {
      if (auto it = seen.find(piece); it != seen.end()) {
        const auto [from, n] = it->second;
        for (size_t i = 0; i < n; ++i) out.push_back(out[from + i]);
        continue;
      }
      const size_t from = out.size();
      ZR_RETURN_IF_ERROR(EncodePiece(piece, a, symbols, out));
      seen.emplace(piece, std::pair{from, out.size() - from});
    }
    return absl::OkStatus();
  }

  // One pre-token: its bytes in the byte-level alphabet, merged.
  Status EncodePiece(std::string_view piece, const ByteAlphabet& a,
                     std::vector<std::string>& symbols, std::vector<int32_t>& out) const {
    std::string mapped;
    symbols.clear();
    for (char c : piece) {
      const std::string& s = a.of_byte[static_cast<uint8_t>(c)];
      mapped += s;
      symbols.push_back(s);
    }
    if (ignore_merges_) {
      if (auto it = vocab_.find(mapped); it != vocab_.end()) {
        out.push_back(it->second);
        return absl::OkStatus();
      }
    }
    Merge(symbols);
    for (const std::string& s : symbols) {
      auto it = vocab_.find(s);
      if (it == vocab_.end()) {
        return absl::InvalidArgumentError(
            StrCat("the BPE model has no token for '", s, "' (and no unk_token)"));
      }
      out.push_back(it->second);
    }
    return absl::OkStatus();
  }

  // Merges by rank: the lowest-ranked adjacent pair, every non-overlapping occurrence left to
  // right, until none is in the merges.
  void Merge(std::vector<std::string>& s) const {
    std::string key;
    while (s.size() > 1) {
      int best = std::numeric_limits<int>::max();
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        key.assign(s[i]).push_back('\0');
        key += s[i + 1];
        if (auto it = ranks_.find(key); it != ranks_.end()) best = std::min(best, it->second);
      }
      if (best == std::numeric_limits<int>::max()) return;
      const std::string& a = merges_[static_cast<size_t>(best)].first;
      const std::string& b = merges_[static_cast<size_t>(best)].second;
      std::vector<std::string> merged;
      merged.reserve(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(std::move(s[i]));
        }
      }
      s.swap(merged);
    }
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> token_;  // by id
  std::vector<bool> special_;       // added tokens: decoded as they are
  std::vector<std::pair<std::string, int32_t>> added_;
  std::vector<std::pair<std::string, std::string>> merges_;
  std::unordered_map<std::string, int> ranks_;  // "a\0b" -> rank
  std::vector<PreStep> steps_;
  bool nfc_ = false, add_prefix_space_ = false, ignore_merges_ = false;
};

Status Refuse(const std::string& file, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(StrCat(file, ": ", path, " ", what,
                                           " (zerort reads byte-level BPE tokenizers: "
                                           "engine/tokenizer.h)"));
}

StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(const nlohmann::json& j,
                                                               const std::string& file) {
  auto t = std::make_unique<BpeTokenizer>();
  auto str = [](const nlohmann::json& o, const char* key) -> std::string {
    return o.is_object() && o.contains(key) && o.at(key).is_string() ? o.at(key).get<std::string>()
                                                                     : "";
  };
  auto flag = [](const nlohmann::json& o, const char* key, bool fallback) {
    return o.is_object() && o.contains(key) && o.at(key).is_boolean() ? o.at(key).get<bool>()
                                                                      : fallback;
  };
  if (!j.contains("model") || !j.at("model").is_object())
    return Refuse(file, "model", "is missing");
  const nlohmann::json& m = j.at("model");
  if (str(m, "type") != "BPE") return Refuse(file, "model.type", "is not \"BPE\"");
  if (flag(m, "byte_fallback", false)) return Refuse(file, "model.byte_fallback", "is set");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!str(m, key).empty()) return Refuse(file, StrCat("model.", key), "is set");
  }
  t->ignore_merges_ = flag(m, "ignore_merges", false);
  if (!m.contains("vocab") || !m.at("vocab").is_object() || m.at("vocab").empty()) {
    return Refuse(file, "model.vocab", "is not an object of tokens");
  }
  constexpr int64_t kMaxVocab = int64_t{1} << 24;
  const auto& vocab = m.at("vocab");
  if (static_cast<int64_t>(vocab.size()) > kMaxVocab) {
    return Refuse(file, "model.vocab", StrCat("holds ", vocab.size(), " tokens (at most 2^24)"));
  }
  int64_t size = static_cast<int64_t>(vocab.size());
  std::vector<std::pair<int64_t, std::string>> entries;
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocab) {
      return Refuse(file, StrCat("model.vocab[\"", token, "\"]"),
                    StrCat("= ", ShortDump(id), ": not an id in [0, 2^24)"));
    }
    entries.emplace_back(id.get<int64_t>(), token);
  }
  const nlohmann::json added = j.value("added_tokens", nlohmann::json::array());
  if (!added.is_array()) return Refuse(file, "added_tokens", "is not a list");
  for (size_t i = 0; i < added.size(); ++i) {
    const nlohmann::json& a = added[i];
    const std::string content = str(a, "content");
    if (content.empty() || !a.contains("id") || !a.at("id").is_number_integer() ||
        a.at("id").get<int64_t>() < 0 || a.at("id").get<int64_t>() >= kMaxVocab) {
      return Refuse(file, StrCat("added_tokens[", i, "]"),
                    "needs a content and an id in [0, 2^24)");
    }
    t->added_.emplace_back(content, static_cast<int32_t>(a.at("id").get<int64_t>()));
    size = std::max(size, a.at("id").get<int64_t>() + 1);
  }
  t->token_.assign(static_cast<size_t>(size), "");
  t->special_.assign(static_cast<size_t>(size), false);
  std::vector<bool> seen(static_cast<size_t>(size), false);
  for (const auto& [id, token] : entries) {
    if (seen[static_cast<size_t>(id)]) {
      return Refuse(file, "model.vocab", StrCat("gives id ", id, " twice"));
    }
    seen[static_cast<size_t>(id)] = true;
    t->token_[static_cast<size_t>(id)] = token;
    t->vocab_[token] = static_cast<int32_t>(id);
  }
  for (const auto& [content, id] : t->added_) {
    t->token_[static_cast<size_t>(id)] = content;
    t->special_[static_cast<size_t>(id)] = true;
  }
  for (const std::string& b : Alphabet().of_byte) {
    if (!t->vocab_.contains(b)) {
      return Refuse(
          file, "model.vocab",
          StrCat("lacks the byte-level token '", b, "': not a byte-level BPE vocabulary"));
    }
  }
  const nlohmann::json merges = m.value("merges", nlohmann::json::array());
  if (!merges.is_array()) return Refuse(file, "model.merges", "is not a list");
  for (size_t i = 0; i < merges.size(); ++i) {
    const nlohmann::json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t space = s.find(' ');
      if (space != std::string::npos) {
        a = s.substr(0, space);
        b = s.substr(space + 1);
      }
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    }
    if (a.empty() || b.empty() || !t->vocab_.contains(a) || !t->vocab_.contains(b) ||
        !t->vocab_.contains(a + b)) {
      return Refuse(file, StrCat("model.merges[", i, "]"),
                    StrCat("= ", ShortDump(e), ": not two tokens whose join is a token"));
    }
    std::string key = a;
    key.push_back('\0');
    key += b;
    t->ranks_.emplace(key, static_cast<int>(t->merges_.size()));
    t->merges_.emplace_back(a, b);
  }
  // normalizer: none or NFC.
  const nlohmann::json normalizer = j.value("normalizer", nlohmann::json());
  if (!normalizer.is_null()) {
    if (str(normalizer, "type") != "NFC") {
      return Refuse(file, "normalizer", StrCat("= ", ShortDump(normalizer), " (none or NFC)"));
    }
    t->nfc_ = true;
  }
  // pre_tokenizer: Split(Regex, Isolated) steps, then ByteLevel (its own regex when use_regex).
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  std::vector<nlohmann::json> steps;
  if (str(pre, "type") == "Sequence" && pre.contains("pretokenizers") &&
      pre.at("pretokenizers").is_array()) {
    for (const auto& p : pre.at("pretokenizers")) steps.push_back(p);
  } else if (!pre.is_null()) {
    steps.push_back(pre);
  }
  bool byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const nlohmann::json& p = steps[i];
    const std::string where = StrCat("pre_tokenizer", steps.size() > 1 ? StrCat("[", i, "]") : "");
    const std::string type = str(p, "type");
    if (byte_level) return Refuse(file, where, "follows ByteLevel");
    if (type == "ByteLevel") {
      byte_level = true;
      t->add_prefix_space_ = flag(p, "add_prefix_space", false);
      if (flag(p, "use_regex", true)) {
        ZR_ASSIGN_OR_RETURN(auto re, Regex::Compile(kGpt2Pattern, file + ": " + where));
        t->steps_.push_back({std::move(re)});
      }
    } else if (type == "Split") {
      const nlohmann::json pattern = p.value("pattern", nlohmann::json());
      if (str(pattern, "Regex").empty() || str(p, "behavior") != "Isolated" ||
          flag(p, "invert", false)) {
        return Refuse(file, where,
                      StrCat("= ", ShortDump(p),
                             " (a Split needs a Regex pattern, behavior "
                             "Isolated, invert false)"));
      }
      ZR_ASSIGN_OR_RETURN(auto re, Regex::Compile(str(pattern, "Regex"), file + ": " + where));
      t->steps_.push_back({std::move(re)});
    } else {
      return Refuse(file, where, StrCat("= ", ShortDump(p), " (ByteLevel, Split or a Sequence)"));
    }
  }
  if (!byte_level) return Refuse(file, "pre_tokenizer", "has no ByteLevel step");
  const nlohmann::json decoder = j.value("decoder", nlohmann::json());
  if (!decoder.is_null() && str(decoder, "type") != "ByteLevel") {
    return Refuse(file, "decoder", StrCat("= ", ShortDump(decoder), " (ByteLevel)"));
  }
  return t;
}

// A SentencePiece model (LLaMA-2, Mistral, TinyLlama, Gemma's tokenizer.model), through
// libsentencepiece (sentencepiece_model.h).
class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<spm::Model> m) : m_(std::move(m)) {}
  Status Encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    if (const std::string e = m_->Encode(text, &ids); !e.empty()) {
      return absl::InvalidArgumentError(StrCat("SentencePiece: ", e));
    }
    out.insert(out.end(), ids.begin(), ids.end());
    return absl::OkStatus();
  }
  StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(
            StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
      }
    }
    std::string text;
    if (const std::string e = m_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
        !e.empty()) {
      return absl::InvalidArgumentError(StrCat("SentencePiece: ", e));
    }
    return text;
  }
  int vocab_size() const override { return m_->size(); }
  bool CutsAtLines() const override { return false; }  // its dummy prefix starts each call
  std::optional<int32_t> AddedToken(std::string_view content) const override {
    const int id = m_->PieceToId(content);
    if (id < 0 || m_->IsUnknown(id) || !m_->IsControl(id)) return std::nullopt;
    return id;
  }
  std::optional<int32_t> EndOfText() const override {
    return m_->eos() >= 0 ? std::optional<int32_t>(m_->eos()) : std::nullopt;
  }

 private:
  std::unique_ptr<spm::Model> m_;
};

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  if (path.ends_with(".model")) {  // SentencePiece's serialized ModelProto
    ZR_ASSIGN_OR_RETURN(const std::string bytes, ReadDataFile(path, int64_t{256} << 20));
    std::unique_ptr<spm::Model> m;
    if (const std::string e = spm::Model::Load(bytes, &m); !e.empty()) {
      return absl::InvalidArgumentError(StrCat(path, ": not a SentencePiece model (", e, ")"));
    }
    return std::unique_ptr<Tokenizer>(std::make_unique<SentencePieceTokenizer>(std::move(m)));
  }
  JsonLimits limits;
  limits.max_bytes = int64_t{256} << 20;
  limits.max_depth = 32;
  ZR_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJsonFile(path, limits));
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> t, BpeTokenizer::FromJson(j, path));
  return std::unique_ptr<Tokenizer>(std::move(t));
}

StatusOr<TextCodec> TextCodec::For(const std::string& tokenizer, int vocab_size) {
  TextCodec codec;
  if (tokenizer.empty()) return codec;
  StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(tokenizer);
  if (!t.ok()) return absl::InvalidArgumentError(StrCat("data.tokenizer: ", t.status().message()));
  if ((*t)->vocab_size() > vocab_size) {
    return absl::InvalidArgumentError(StrCat("data.tokenizer: ", tokenizer, " has ",
                                             (*t)->vocab_size(),
                                             " tokens, more than model.vocab_size = ", vocab_size));
  }
  codec.tokenizer_ = *std::move(t);
  return codec;
}

StatusOr<std::vector<int32_t>> TextCodec::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  if (tokenizer_ == nullptr) {
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  ZR_RETURN_IF_ERROR(tokenizer_->Encode(text, ids));
  return ids;
}

StatusOr<std::string> TextCodec::Decode(std::span<const int32_t> ids) const {
  if (tokenizer_ != nullptr) return tokenizer_->Decode(ids);
  return BytesText(std::vector<int32_t>(ids.begin(), ids.end()));
}

Status TrainSentencePiece(const TokenizerTraining& o) {
  if (!o.output.ends_with(".model")) {
    return absl::InvalidArgumentError(StrCat(o.output,
                                             ": a SentencePiece model's name ends with "
                                             ".model (how data prepare knows it)"));
  }
  ZR_RETURN_IF_ERROR(CheckOutputPath(o.output, "data train-tokenizer"));  // before the training
  if (o.vocab_size < 32 || o.vocab_size > (1 << 20)) {
    return absl::InvalidArgumentError(StrCat("--vocab-size ", o.vocab_size, ": in [32, 2^20]"));
  }
  if (o.type != "bpe" && o.type != "unigram") {
    return absl::InvalidArgumentError(StrCat("--type ", o.type, ": bpe or unigram"));
  }
  std::string text;
  if (o.input.empty()) {
    text = DefaultCorpus();
  } else {
    ZR_ASSIGN_OR_RETURN(text, ReadDataFile(o.input, int64_t{1} << 30));
  }
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (end > at) lines.emplace_back(text.substr(at, end - at));
    at = end + 1;
  }
  if (lines.empty()) return absl::InvalidArgumentError(StrCat(o.input, " holds no text"));
  const int threads = o.threads > 0
                          ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::string serialized;
  const std::string e = spm::Train(lines,
                                   {{"vocab_size", std::to_string(o.vocab_size)},
                                    {"model_type", o.type},
                                    {"character_coverage", "1.0"},
                                    {"byte_fallback", "true"},
                                    {"split_digits", "true"},
                                    {"normalization_rule_name", "identity"},
                                    {"remove_extra_whitespaces", "false"},
                                    {"num_threads", std::to_string(threads)},
                                    {"minloglevel", "2"}},
                                   &serialized);
  if (!e.empty()) return absl::InvalidArgumentError(StrCat("SentencePiece training: ", e));
  return WriteFileAtomically(o.output, serialized, "data train-tokenizer");
}

}  // namespace zerort
