// The tokenizer.json pipeline's steps and HfTokenizer's encoding and decoding
// ([Note: the tokenizer.json pipeline], hf_tokenizer_pipeline.h): normalizers, pre-tokenizers, the
// BPE merge, byte fallback and the decoders, as Hugging Face's tokenizers (Rust) define them.
#include "zerort/data/hf_tokenizer_pipeline.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>
#include <limits>
#include <queue>

#include "zerort/runtime/strings.h"

namespace zerort::hf_tokenizer {
namespace {

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    s.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    s.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

}  // namespace

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
  // Splits `text` (valid UTF-8) into its matches and the runs between them (Split, Isolated).
  Status Split(std::string_view text, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    struct Free {
      pcre2_match_data* md;
      ~Free() { pcre2_match_data_free(md); }
    } free_md{md};
    size_t at = 0, done = 0;
    while (at < text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
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

StatusOr<std::shared_ptr<const Regex>> CompileRegex(const std::string& pattern,
                                                    const std::string& where) {
  return Regex::Compile(pattern, where);
}

// The byte length of the valid UTF-8 character at text[at], or 0 when the bytes there are not one
// (overlong forms, surrogates, code points past U+10FFFF and truncated sequences included).
size_t Utf8CharLength(std::string_view text, size_t at) {
  utf8proc_int32_t cp = 0;
  const utf8proc_ssize_t n =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                       static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
  return n > 0 ? static_cast<size_t>(n) : 0;
}

ByteAlphabet::ByteAlphabet() {
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    of_byte[b] = Utf8(keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
    to_byte[of_byte[b]] = static_cast<uint8_t>(b);
  }
}

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet kAlphabet;
  return kAlphabet;
}

std::string ByteToken(uint8_t b) { return fmt::format("<0x{:02X}>", b); }

Status HfTokenizer::Encode(std::string_view text, std::vector<int32_t>& out) const {
  // Each added token's next occurrence, searched again only once passed: the text is scanned
  // once per added token (LLaMA-3 has 256), not once per token found.
  std::vector<size_t> next(added_.size());
  for (size_t i = 0; i < added_.size(); ++i) next[i] = text.find(added_[i].first);
  size_t at = 0;
  while (at < text.size()) {
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
    if (end > at) {
      const Status s = EncodeSection(text.substr(at, end - at), at == 0, out);
      if (!s.ok()) {
        return absl::Status(s.code(), StrCat(s.message(), " (in the section from byte ", at, ")"));
      }
    }
    if (best == std::string_view::npos) break;
    out.push_back(best_id);
    at = best + best_len;
  }
  return absl::OkStatus();
}

StatusOr<std::string> HfTokenizer::Decode(std::span<const int32_t> ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")"));
    }
    tokens.push_back(token_[static_cast<size_t>(id)]);
  }
  if (decoder_.empty()) {  // Hugging Face joins the tokens with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) StrAppend(&out, i ? " " : "", tokens[i]);
    return out;
  }
  for (const DecodeStep& step : decoder_) Apply(step, ids, tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::optional<int32_t> HfTokenizer::AddedToken(std::string_view content) const {
  for (const auto& [c, id] : added_) {
    if (c == content) return id;
  }
  return std::nullopt;
}

std::optional<int32_t> HfTokenizer::EndOfText() const {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"}) {
    if (auto id = AddedToken(name)) return id;
  }
  return std::nullopt;
}

std::optional<TextCut> HfTokenizer::LastCut(std::string_view text, size_t end) const {
  switch (cuts_) {
    case Cuts::kLines:
      return LastLineCut(text, end);
    case Cuts::kSpacesKept:
      return LastSpaceCut(text, end, /*drop_space=*/false);
    case Cuts::kSpacesDropped:
      // Not beside an added token: the prefix that puts the dropped space back is given to
      // the section after it by one layout (Prepend) and not by another (Metaspace "first").
      for (std::optional<TextCut> c = LastSpaceCut(text, end, /*drop_space=*/true); c;
           c = LastSpaceCut(text, c->first_end, /*drop_space=*/true)) {
        // The longest added token must fit after the cut (the text may be a prefix of more).
        bool beside = text.size() - c->second_begin < longest_added_;
        for (const auto& [content, id] : added_) {
          beside = beside || text.substr(0, c->first_end).ends_with(content) ||
                   text.substr(c->second_begin).starts_with(content);
        }
        if (!beside) return c;
      }
      return std::nullopt;
    case Cuts::kNone:
      break;
  }
  return std::nullopt;
}

Status HfTokenizer::EncodeSection(std::string_view section, bool at_start,
                                  std::vector<int32_t>& out) const {
  ZR_RETURN_IF_ERROR(RequireUtf8(section));
  std::string normalized;
  if (!normalizer_.empty()) {
    normalized.assign(section);
    ZR_RETURN_IF_ERROR(Normalize(normalized));
    section = normalized;
  }
  std::vector<std::unique_ptr<std::string>> owned;  // pieces a step rewrote
  std::vector<Piece> pieces = {{section, at_start}}, next;
  for (const PreStep& step : pre_) {
    next.clear();
    for (const Piece& p : pieces) ZR_RETURN_IF_ERROR(PreTokenize(step, p, owned, next));
    pieces.swap(next);
  }
  // Words repeat: each distinct piece of this call is merged once (bounded: a call's pieces).
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;
  std::vector<int32_t> symbols;
  for (const Piece& p : pieces) {
    if (p.text.empty()) continue;
    if (auto it = seen.find(p.text); it != seen.end()) {
      const auto [from, n] = it->second;
      for (size_t i = 0; i < n; ++i) out.push_back(out[from + i]);
      continue;
    }
    const size_t from = out.size();
    ZR_RETURN_IF_ERROR(EncodePiece(p.text, symbols, out));
    seen.emplace(p.text, std::pair{from, out.size() - from});
  }
  return absl::OkStatus();
}

Status HfTokenizer::Normalize(std::string& s) const {
  for (const NormStep& n : normalizer_) {
    switch (n.kind) {
      case NormStep::kNfc: {
        // The explicit length: a NUL is a character like any other.
        utf8proc_uint8_t* nfc = nullptr;
        const utf8proc_ssize_t len =
            utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                         static_cast<utf8proc_ssize_t>(s.size()), &nfc,
                         static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (len < 0) {
          return absl::InvalidArgumentError(StrCat("NFC normalisation: ", utf8proc_errmsg(len)));
        }
        s.assign(reinterpret_cast<char*>(nfc), static_cast<size_t>(len));
        std::free(nfc);
        break;
      }
      case NormStep::kPrepend:
        if (!s.empty()) s.insert(0, n.a);
        break;
      case NormStep::kReplace:
        s = ReplaceAll(s, n.a, n.b);
        break;
    }
  }
  return absl::OkStatus();
}

std::string HfTokenizer::ReplaceAll(std::string_view s, std::string_view from,
                                    std::string_view to) {
  std::string out;
  if (from.empty()) return std::string(s);
  size_t at = 0;
  for (size_t p; (p = s.find(from, at)) != std::string_view::npos; at = p + from.size()) {
    out.append(s.substr(at, p - at));
    out.append(to);
  }
  out.append(s.substr(at));
  return out;
}

Status HfTokenizer::PreTokenize(const PreStep& step, const Piece& p,
                                std::vector<std::unique_ptr<std::string>>& owned,
                                std::vector<Piece>& out) const {
  std::string_view text = p.text;
  auto own = [&](std::string s) {
    owned.push_back(std::make_unique<std::string>(std::move(s)));
    return std::string_view(*owned.back());
  };
  auto split = [&](std::string_view t) -> Status {
    if (step.regex == nullptr) {
      out.push_back({t, p.at_start});
      return absl::OkStatus();
    }
    std::vector<std::string_view> parts;
    ZR_RETURN_IF_ERROR(step.regex->Split(t, parts));
    for (size_t i = 0; i < parts.size(); ++i) out.push_back({parts[i], p.at_start && i == 0});
    return absl::OkStatus();
  };
  switch (step.kind) {
    case PreStep::kSplit:
      return split(text);
    case PreStep::kByteLevel:
      if (step.add_prefix_space && !text.empty() && text[0] != ' ') {
        text = own(StrCat(" ", text));
      }
      return split(text);
    case PreStep::kMetaspace: {
      std::string s = ReplaceAll(text, " ", step.replacement);
      const bool prepend =
          step.scheme == PreStep::kAlways || (step.scheme == PreStep::kFirst && p.at_start);
      if (prepend && !s.starts_with(step.replacement)) s.insert(0, step.replacement);
      text = own(std::move(s));
      if (!step.split) {
        out.push_back({text, p.at_start});
        return absl::OkStatus();
      }
      // MergedWithNext: each replacement begins a piece.
      size_t begin = 0;
      for (size_t at = step.replacement.size(); at < text.size();) {
        const size_t r = text.find(step.replacement, at);
        if (r == std::string_view::npos) break;
        if (r > begin) {
          out.push_back({text.substr(begin, r - begin), p.at_start && begin == 0});
          begin = r;
        }
        at = r + step.replacement.size();
      }
      out.push_back({text.substr(begin), p.at_start && begin == 0});
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

Status HfTokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>& symbols,
                                std::vector<int32_t>& out) const {
  symbols.clear();
  if (byte_level_) {
    const ByteAlphabet& a = Alphabet();
    std::string mapped;
    for (char c : piece) {
      const uint8_t b = static_cast<uint8_t>(c);
      symbols.push_back(byte_ids_[b]);
      if (ignore_merges_) mapped += a.of_byte[b];
    }
    if (ignore_merges_) {
      if (auto it = vocab_.find(mapped); it != vocab_.end()) {
        out.push_back(it->second);
        return absl::OkStatus();
      }
    }
  } else {
    if (ignore_merges_) {
      if (auto it = vocab_.find(std::string(piece)); it != vocab_.end()) {
        out.push_back(it->second);
        return absl::OkStatus();
      }
    }
    bool last_unk = false;
    for (size_t at = 0; at < piece.size();) {
      const size_t n = Utf8CharLength(piece, at);  // valid: checked per section
      const std::string ch(piece.substr(at, n));
      at += n;
      if (auto it = vocab_.find(ch); it != vocab_.end()) {
        symbols.push_back(it->second);
        last_unk = false;
        continue;
      }
      bool bytes = byte_fallback_;
      for (char c : ch) bytes = bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (bytes) {
        for (char c : ch) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        last_unk = false;
        continue;
      }
      if (unk_ < 0) {
        return absl::InvalidArgumentError(StrCat("the BPE model has no token for '", ch, "' (U+",
                                                 fmt::format("{:04X}", DecodeCodePoint(ch)),
                                                 "), no byte fallback for it and no "
                                                 "unk_token"));
      }
      if (!(fuse_unk_ && last_unk)) symbols.push_back(unk_);
      last_unk = true;
    }
  }
  Merge(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
  return absl::OkStatus();
}

uint32_t HfTokenizer::DecodeCodePoint(std::string_view ch) {
  utf8proc_int32_t cp = 0;
  utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(ch.data()),
                   static_cast<utf8proc_ssize_t>(ch.size()), &cp);
  return static_cast<uint32_t>(cp);
}

void HfTokenizer::Merge(std::vector<int32_t>& s) const {
  const int n = static_cast<int>(s.size());
  if (n < 2) return;
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  std::vector<char> alive(static_cast<size_t>(n), 1);
  for (int i = 0; i < n; ++i) {
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int rank, pos;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto offer = [&](int pos) {
    const int r = next[static_cast<size_t>(pos)];
    if (r < 0) return;
    auto it = merges_.find(PairKey(s[static_cast<size_t>(pos)], s[static_cast<size_t>(r)]));
    if (it != merges_.end()) queue.push({it->second.first, pos, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) offer(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    const auto pos = static_cast<size_t>(c.pos);
    if (!alive[pos] || next[pos] < 0) continue;
    const auto right = static_cast<size_t>(next[pos]);
    auto it = merges_.find(PairKey(s[pos], s[right]));
    if (it == merges_.end() || it->second.second != c.merged) continue;  // stale
    s[pos] = c.merged;
    alive[right] = 0;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = c.pos;
    if (prev[pos] >= 0) offer(prev[pos]);
    offer(c.pos);
  }
  size_t w = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (alive[i]) s[w++] = s[i];
  }
  s.resize(w);
}

uint64_t HfTokenizer::PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

void HfTokenizer::Apply(const DecodeStep& step, std::span<const int32_t> ids,
                        std::vector<std::string>& tokens) const {
  switch (step.kind) {
    case DecodeStep::kByteLevel: {
      const ByteAlphabet& a = Alphabet();
      const bool aligned = tokens.size() == ids.size();  // no earlier step joined tokens
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (aligned && special_[static_cast<size_t>(ids[i])]) continue;
        std::string bytes;
        const std::string& t = tokens[i];
        for (size_t at = 0; at < t.size();) {  // each character of the byte-level alphabet
          size_t n = 1;
          while (at + n < t.size() && (static_cast<uint8_t>(t[at + n]) & 0xC0) == 0x80) ++n;
          auto it = a.to_byte.find(t.substr(at, n));
          if (it != a.to_byte.end()) {
            bytes.push_back(static_cast<char>(it->second));
          } else {
            bytes += t.substr(at, n);  // not byte-level (a hand-made entry): as it is
          }
          at += n;
        }
        tokens[i] = std::move(bytes);
      }
      return;
    }
    case DecodeStep::kReplace:
      for (std::string& t : tokens) t = ReplaceAll(t, step.a, step.b);
      return;
    case DecodeStep::kByteFallback: {
      std::vector<std::string> out;
      std::string bytes;
      auto flush = [&] {
        if (bytes.empty()) return;
        if (!FirstInvalidUtf8(bytes)) {
          out.push_back(bytes);
        } else {
          for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");  // U+FFFD
        }
        bytes.clear();
      };
      for (std::string& t : tokens) {
        if (t.size() == 6 && t.starts_with("<0x") && t.ends_with(">") &&
            std::isxdigit(static_cast<unsigned char>(t[3])) &&
            std::isxdigit(static_cast<unsigned char>(t[4]))) {
          bytes.push_back(static_cast<char>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16)));
          continue;
        }
        flush();
        out.push_back(std::move(t));
      }
      flush();
      tokens.swap(out);
      return;
    }
    case DecodeStep::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      return;
    }
    case DecodeStep::kStrip:
      for (std::string& t : tokens) {
        for (int i = 0; i < step.start && t.starts_with(step.a); ++i) t.erase(0, step.a.size());
        for (int i = 0; i < step.stop && t.ends_with(step.a); ++i) {
          t.erase(t.size() - step.a.size());
        }
      }
      return;
    case DecodeStep::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = ReplaceAll(tokens[i], step.a, i == 0 && step.prepend ? "" : " ");
      }
      return;
  }
}

}  // namespace zerort::hf_tokenizer
