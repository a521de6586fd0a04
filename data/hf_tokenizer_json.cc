// Hugging Face tokenizer.json, BPE model ([Note: zerort's tokenizers], tokenizer.h): the file read
// key by key into the pipeline hf_tokenizer_pipeline.h describes, refusing what zerort does not
// implement by its JSON path.
#include "zerort/data/hf_tokenizer.h"

#include <string>

#include "zerort/data/hf_tokenizer_pipeline.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace hf_tokenizer {

Status Refuse(const std::string& file, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(StrCat(file, ": ", path, " ", what,
                                           " (zerort reads tokenizer.json files with a BPE "
                                           "model: data/tokenizer.h)"));
}

// Reads a tokenizer.json into an HfTokenizer, refusing what it does not implement by JSON path.
class Loader {
 public:
  Loader(const nlohmann::json& j, const std::string& file) : j_(j), file_(file) {}

  StatusOr<std::unique_ptr<HfTokenizer>> Load() {
    t_ = std::make_unique<HfTokenizer>();
    if (!j_.is_object() || !j_.contains("model") || !j_.at("model").is_object()) {
      return Refuse(file_, "model", "is missing");
    }
    ZR_RETURN_IF_ERROR(ReadVocab(j_.at("model")));
    ZR_RETURN_IF_ERROR(ReadNormalizer(j_.value("normalizer", nlohmann::json())));
    ZR_RETURN_IF_ERROR(ReadPreTokenizer(j_.value("pre_tokenizer", nlohmann::json())));
    ZR_RETURN_IF_ERROR(bad_);
    ZR_RETURN_IF_ERROR(ReadModel(j_.at("model")));
    ZR_RETURN_IF_ERROR(ReadDecoder(j_.value("decoder", nlohmann::json())));
    ZR_RETURN_IF_ERROR(bad_);
    return std::move(t_);
  }

 private:
  static std::string Str(const nlohmann::json& o, const char* key) {
    return o.is_object() && o.contains(key) && o.at(key).is_string() ? o.at(key).get<std::string>()
                                                                     : "";
  }
  // A boolean key: `fallback` when absent or null; a value of another type is refused (the first
  // such is kept in bad_ and returned by Load).
  bool Flag(const nlohmann::json& o, const char* key, bool fallback, const std::string& where) {
    if (!o.is_object() || !o.contains(key) || o.at(key).is_null()) return fallback;
    if (o.at(key).is_boolean()) return o.at(key).get<bool>();
    if (bad_.ok()) {
      bad_ = Refuse(file_, StrCat(where, ".", key),
                    StrCat("= ", ShortDump(o.at(key)), ": not a boolean"));
    }
    return fallback;
  }
  // A list of steps: a Sequence's `list_key`, or the one object.
  static std::vector<nlohmann::json> Steps(const nlohmann::json& o, const char* list_key) {
    std::vector<nlohmann::json> steps;
    if (Str(o, "type") == "Sequence" && o.contains(list_key) && o.at(list_key).is_array()) {
      for (const auto& p : o.at(list_key)) steps.push_back(p);
    } else if (!o.is_null()) {
      steps.push_back(o);
    }
    return steps;
  }
  static std::string Where(const char* what, size_t i, size_t n) {
    return StrCat(what, n > 1 ? StrCat("[", i, "]") : "");
  }
  // A Replace's {"String": s} pattern (a Regex pattern is refused).
  StatusOr<std::string> ReplacePattern(const nlohmann::json& p, const std::string& where) {
    const nlohmann::json pattern = p.value("pattern", nlohmann::json());
    const std::string s = Str(pattern, "String");
    if (s.empty() || !p.contains("content") || !p.at("content").is_string()) {
      return Refuse(file_, where,
                    StrCat("= ", ShortDump(p),
                           " (a Replace needs a {\"String\": ...} pattern and a content)"));
    }
    return s;
  }

  Status ReadVocab(const nlohmann::json& m) {
    HfTokenizer& t = *t_;
    if (Str(m, "type") != "BPE") return Refuse(file_, "model.type", "is not \"BPE\"");
    if (!m.contains("vocab") || !m.at("vocab").is_object() || m.at("vocab").empty()) {
      return Refuse(file_, "model.vocab", "is not an object of tokens");
    }
    constexpr int64_t kMaxVocab = int64_t{1} << 24;
    const auto& vocab = m.at("vocab");
    if (static_cast<int64_t>(vocab.size()) > kMaxVocab) {
      return Refuse(file_, "model.vocab", StrCat("holds ", vocab.size(), " tokens (at most 2^24)"));
    }
    int64_t size = 0;  // the largest id + 1, of the vocab and the added tokens
    std::vector<std::pair<int64_t, std::string>> entries;
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocab) {
        return Refuse(file_, StrCat("model.vocab[\"", token, "\"]"),
                      StrCat("= ", ShortDump(id), ": not an id in [0, 2^24)"));
      }
      if (FirstInvalidUtf8(token)) {
        return Refuse(file_, "model.vocab",
                      StrCat("has a token that is not UTF-8: ", ShortDump(token)));
      }
      entries.emplace_back(id.get<int64_t>(), token);
      size = std::max(size, id.get<int64_t>() + 1);  // ids may leave holes
    }
    const nlohmann::json added = j_.value("added_tokens", nlohmann::json::array());
    if (!added.is_array()) return Refuse(file_, "added_tokens", "is not a list");
    for (size_t i = 0; i < added.size(); ++i) {
      const nlohmann::json& a = added[i];
      const std::string content = Str(a, "content");
      if (content.empty() || !a.contains("id") || !a.at("id").is_number_integer() ||
          a.at("id").get<int64_t>() < 0 || a.at("id").get<int64_t>() >= kMaxVocab) {
        return Refuse(file_, StrCat("added_tokens[", i, "]"),
                      "needs a content and an id in [0, 2^24)");
      }
      t.added_.emplace_back(content, static_cast<int32_t>(a.at("id").get<int64_t>()));
      t.longest_added_ = std::max(t.longest_added_, content.size());
      size = std::max(size, a.at("id").get<int64_t>() + 1);
    }
    t.token_.assign(static_cast<size_t>(size), "");
    t.special_.assign(static_cast<size_t>(size), false);
    std::vector<bool> seen(static_cast<size_t>(size), false);
    for (const auto& [id, token] : entries) {
      if (seen[static_cast<size_t>(id)]) {
        return Refuse(file_, "model.vocab", StrCat("gives id ", id, " twice"));
      }
      seen[static_cast<size_t>(id)] = true;
      t.token_[static_cast<size_t>(id)] = token;
      t.vocab_[token] = static_cast<int32_t>(id);
    }
    for (const auto& [content, id] : t.added_) {
      t.token_[static_cast<size_t>(id)] = content;
      t.special_[static_cast<size_t>(id)] = true;
    }
    return absl::OkStatus();
  }

  Status ReadNormalizer(const nlohmann::json& normalizer) {
    const std::vector<nlohmann::json> steps = Steps(normalizer, "normalizers");
    for (size_t i = 0; i < steps.size(); ++i) {
      const nlohmann::json& n = steps[i];
      const std::string where = Where("normalizer", i, steps.size());
      const std::string type = Str(n, "type");
      if (type == "NFC") {
        t_->normalizer_.push_back({NormStep::kNfc, "", ""});
      } else if (type == "Prepend" && !Str(n, "prepend").empty()) {
        t_->normalizer_.push_back({NormStep::kPrepend, Str(n, "prepend"), ""});
      } else if (type == "Replace") {
        ZR_ASSIGN_OR_RETURN(const std::string from, ReplacePattern(n, where));
        t_->normalizer_.push_back({NormStep::kReplace, from, Str(n, "content")});
      } else {
        return Refuse(file_, where,
                      StrCat("= ", ShortDump(n), " (NFC, Prepend, Replace or a Sequence of them)"));
      }
    }
    return absl::OkStatus();
  }

  Status ReadPreTokenizer(const nlohmann::json& pre) {
    const std::vector<nlohmann::json> steps = Steps(pre, "pretokenizers");
    for (size_t i = 0; i < steps.size(); ++i) {
      const nlohmann::json& p = steps[i];
      const std::string where = Where("pre_tokenizer", i, steps.size());
      const std::string type = Str(p, "type");
      if (t_->byte_level_) return Refuse(file_, where, "follows ByteLevel");
      PreStep step{};
      if (type == "ByteLevel") {
        t_->byte_level_ = true;
        step.kind = PreStep::kByteLevel;
        step.add_prefix_space = Flag(p, "add_prefix_space", false, where);
        if (Flag(p, "use_regex", true, where)) {
          ZR_ASSIGN_OR_RETURN(step.regex, CompileRegex(kGpt2Pattern, file_ + ": " + where));
        }
      } else if (type == "Split") {
        const nlohmann::json pattern = p.value("pattern", nlohmann::json());
        if (Str(pattern, "Regex").empty() || Str(p, "behavior") != "Isolated" ||
            Flag(p, "invert", false, where)) {
          return Refuse(file_, where,
                        StrCat("= ", ShortDump(p),
                               " (a Split needs a Regex pattern, behavior Isolated, invert "
                               "false)"));
        }
        step.kind = PreStep::kSplit;
        ZR_ASSIGN_OR_RETURN(step.regex, CompileRegex(Str(pattern, "Regex"), file_ + ": " + where));
      } else if (type == "Metaspace") {
        step.kind = PreStep::kMetaspace;
        step.replacement = Str(p, "replacement");
        if (step.replacement.empty() ||
            Utf8CharLength(step.replacement, 0) != step.replacement.size()) {
          return Refuse(file_, where + ".replacement", "is not one character");
        }
        step.split = Flag(p, "split", true, where);
        // tokenizers 0.14 and later say prepend_scheme; earlier files add_prefix_space.
        const std::string scheme =
            p.contains("prepend_scheme")
                ? Str(p, "prepend_scheme")
                : (Flag(p, "add_prefix_space", true, where) ? "always" : "never");
        if (scheme == "always") {
          step.scheme = PreStep::kAlways;
        } else if (scheme == "first") {
          step.scheme = PreStep::kFirst;
        } else if (scheme == "never") {
          step.scheme = PreStep::kNever;
        } else {
          return Refuse(file_, where + ".prepend_scheme",
                        StrCat("= ", ShortDump(p.at("prepend_scheme")), " (always, first, never)"));
        }
      } else {
        return Refuse(file_, where,
                      StrCat("= ", ShortDump(p), " (ByteLevel, Split, Metaspace or a Sequence)"));
      }
      t_->pre_.push_back(std::move(step));
    }
    return absl::OkStatus();
  }

  Status ReadModel(const nlohmann::json& m) {
    HfTokenizer& t = *t_;
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (!Str(m, key).empty()) return Refuse(file_, StrCat("model.", key), "is set");
    }
    if (m.contains("dropout") && !m.at("dropout").is_null() &&
        !(m.at("dropout").is_number() && m.at("dropout").get<double>() == 0.0)) {
      return Refuse(file_, "model.dropout",
                    StrCat("= ", ShortDump(m.at("dropout")),
                           ": BPE dropout samples different ids on every call"));
    }
    t.ignore_merges_ = Flag(m, "ignore_merges", false, "model");
    t.byte_fallback_ = Flag(m, "byte_fallback", false, "model");
    t.fuse_unk_ = Flag(m, "fuse_unk", false, "model");
    t.byte_ids_.fill(-1);
    if (t.byte_level_) {
      if (t.byte_fallback_) {
        return Refuse(file_, "model.byte_fallback",
                      "is set with a ByteLevel pre-tokenizer (every byte already has a token)");
      }
      const ByteAlphabet& a = Alphabet();
      for (int b = 0; b < 256; ++b) {
        auto it = t.vocab_.find(a.of_byte[b]);
        if (it == t.vocab_.end()) {
          return Refuse(file_, "model.vocab",
                        StrCat("lacks the byte-level token '", a.of_byte[b],
                               "' that a ByteLevel pre-tokenizer needs"));
        }
        t.byte_ids_[b] = it->second;
      }
    } else {
      for (int b = 0; b < 256; ++b) {
        if (auto it = t.vocab_.find(ByteToken(static_cast<uint8_t>(b))); it != t.vocab_.end()) {
          t.byte_ids_[b] = it->second;
        }
      }
    }
    if (m.contains("unk_token") && !m.at("unk_token").is_null()) {
      const std::string unk = Str(m, "unk_token");
      auto it = t.vocab_.find(unk);
      if (it == t.vocab_.end()) {
        return Refuse(file_, "model.unk_token",
                      StrCat("= ", ShortDump(m.at("unk_token")), " is not a token of the vocab"));
      }
      t.unk_ = it->second;
    }
    const nlohmann::json merges = m.value("merges", nlohmann::json::array());
    if (!merges.is_array()) return Refuse(file_, "model.merges", "is not a list");
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
      auto ia = t.vocab_.find(a), ib = t.vocab_.find(b), iab = t.vocab_.find(a + b);
      if (a.empty() || b.empty() || ia == t.vocab_.end() || ib == t.vocab_.end() ||
          iab == t.vocab_.end()) {
        return Refuse(file_, StrCat("model.merges[", i, "]"),
                      StrCat("= ", ShortDump(e), ": not two tokens whose join is a token"));
      }
      // A pair listed twice keeps its first (lowest) rank, as Hugging Face's merge map.
      t.merges_.emplace(HfTokenizer::PairKey(ia->second, ib->second),
                        std::pair{static_cast<int>(i), iab->second});
    }
    ZR_RETURN_IF_ERROR(ReadCuts());
    return absl::OkStatus();
  }

  // Where a long text may be cut ([Note: cutting a text], tokenizer.h). Byte-level: after a line
  // break that a non-space follows, unless a ByteLevel step adds a prefix space. A tokenizer that
  // turns spaces into a replacement character (Replace(" ", R) or Metaspace(R)), whose tokens
  // never hold R after another character: at a single space, dropped when a prefix R (Prepend(R),
  // Metaspace's always or first) would put it back, kept when nothing is prefixed. Otherwise
  // nowhere: the text is encoded whole.
  Status ReadCuts() {
    HfTokenizer& t = *t_;
    using Cuts = HfTokenizer::Cuts;
    if (t.byte_level_) {
      bool prefix = false;
      for (const PreStep& p : t.pre_) prefix = prefix || p.add_prefix_space;
      t.cuts_ = prefix ? Cuts::kNone : Cuts::kLines;
      return absl::OkStatus();
    }
    std::string replacement, prepended;
    bool other_prepend = false;
    for (const NormStep& n : t.normalizer_) {
      if (n.kind == NormStep::kReplace && n.a == " ") replacement = n.b;
      if (n.kind == NormStep::kPrepend) prepended = n.a;
    }
    bool prefixed = !prepended.empty();
    other_prepend = prefixed && prepended != replacement;
    for (const PreStep& p : t.pre_) {
      if (p.kind == PreStep::kMetaspace) {
        replacement = p.replacement;
        prefixed = prefixed || p.scheme != PreStep::kNever;
      }
    }
    if (replacement.empty() || other_prepend) return absl::OkStatus();
    for (const auto& [token, id] : t.vocab_) {
      size_t lead = 0;
      while (token.compare(lead, replacement.size(), replacement) == 0) lead += replacement.size();
      if (token.find(replacement, lead) != std::string::npos) return absl::OkStatus();
    }
    t.cuts_ = prefixed ? Cuts::kSpacesDropped : Cuts::kSpacesKept;
    return absl::OkStatus();
  }

  Status ReadDecoder(const nlohmann::json& decoder) {
    const std::vector<nlohmann::json> steps = Steps(decoder, "decoders");
    for (size_t i = 0; i < steps.size(); ++i) {
      const nlohmann::json& d = steps[i];
      const std::string where = Where("decoder", i, steps.size());
      const std::string type = Str(d, "type");
      DecodeStep step{};
      if (type == "ByteLevel") {
        step.kind = DecodeStep::kByteLevel;
      } else if (type == "Replace") {
        step.kind = DecodeStep::kReplace;
        ZR_ASSIGN_OR_RETURN(step.a, ReplacePattern(d, where));
        step.b = Str(d, "content");
      } else if (type == "ByteFallback") {
        step.kind = DecodeStep::kByteFallback;
      } else if (type == "Fuse") {
        step.kind = DecodeStep::kFuse;
      } else if (type == "Strip") {
        step.kind = DecodeStep::kStrip;
        step.a = Str(d, "content");
        auto count = [&](const char* key) {
          return d.contains(key) && d.at(key).is_number_unsigned()
                     ? static_cast<int>(std::min<uint64_t>(d.at(key).get<uint64_t>(), 1 << 20))
                     : -1;
        };
        step.start = count("start");
        step.stop = count("stop");
        if (step.a.empty() || step.start < 0 || step.stop < 0) {
          return Refuse(file_, where,
                        StrCat("= ", ShortDump(d), " (a Strip needs content, start and stop)"));
        }
      } else if (type == "Metaspace") {
        step.kind = DecodeStep::kMetaspace;
        step.a = Str(d, "replacement");
        if (step.a.empty()) return Refuse(file_, where + ".replacement", "is missing");
        const std::string scheme =
            d.contains("prepend_scheme")
                ? Str(d, "prepend_scheme")
                : (Flag(d, "add_prefix_space", true, where) ? "always" : "never");
        step.prepend = scheme != "never";
      } else {
        return Refuse(file_, where,
                      StrCat("= ", ShortDump(d),
                             " (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace or a "
                             "Sequence of them)"));
      }
      t_->decoder_.push_back(std::move(step));
    }
    if (t_->decoder_.empty() && t_->byte_level_) {
      t_->decoder_.push_back({DecodeStep::kByteLevel, "", "", 0, 0, true});
    }
    return absl::OkStatus();
  }

  const nlohmann::json& j_;
  const std::string& file_;
  std::unique_ptr<HfTokenizer> t_;
  Status bad_;  // the first key of the wrong type
};

}  // namespace hf_tokenizer

StatusOr<std::unique_ptr<Tokenizer>> HfTokenizerFromJson(const nlohmann::json& j,
                                                         const std::string& file) {
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<hf_tokenizer::HfTokenizer> t,
                      hf_tokenizer::Loader(j, file).Load());
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace zerort
