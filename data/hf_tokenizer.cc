// Hugging Face tokenizer.json, BPE model ([Note: zerort's tokenizers], tokenizer.h): normalizers,
// pre-tokenizers, the BPE merge, byte fallback and the decoders, as Hugging Face's tokenizers
// (Rust) define them.
#include "zerort/data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <array>
#include <cstdlib>
#include <limits>
#include <queue>
#include <unordered_map>

#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"

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

// The byte length of the valid UTF-8 character at text[at], or 0 when the bytes there are not one
// (overlong forms, surrogates, code points past U+10FFFF and truncated sequences included).
size_t Utf8CharLength(std::string_view text, size_t at) {
  utf8proc_int32_t cp = 0;
  const utf8proc_ssize_t n =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                       static_cast<utf8proc_ssize_t>(text.size() - at), &cp);
  return n > 0 ? static_cast<size_t>(n) : 0;
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

// "<0x0A>": the byte-fallback token of a byte (Hugging Face's format).
std::string ByteToken(uint8_t b) { return fmt::format("<0x{:02X}>", b); }

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

// [Note: the tokenizer.json pipeline]
// Encode(text): the added tokens are found in the raw text first (the longest at the earliest
// position) and become their ids; each section between them runs
//   normalizer      NFC, Prepend(s) (s before a non-empty section), Replace(a, b) (every a), in
//                   the order the file lists them;
//   pre-tokenizer   Split(regex, Isolated), ByteLevel(add_prefix_space, use_regex: GPT-2's
//                   regex), Metaspace(replacement, prepend_scheme always/first/never, split): each
//                   step maps every piece of the one before into pieces;
//   model           per piece: ignore_merges takes a piece that is a whole token; else the
//                   piece's symbols (byte-level: one per byte, in GPT-2's alphabet; otherwise one
//                   per character, a character without a token becoming its <0xNN> byte tokens
//                   with byte_fallback, else the unk token, runs fused with fuse_unk) merged
//                   lowest rank first, leftmost among equals, each merge re-pairing with its
//                   neighbours (a priority queue over a linked list: O(n log n) in the piece's
//                   length, as Hugging Face's Word::merge_all).
// Metaspace's "first" prepends only to the section at the start of the text (Hugging Face: its
// original offset is 0), so a section after an added token gets no prefix.
// Decode(ids): the ids' token strings through the decoder steps (ByteLevel, Replace,
// ByteFallback, Fuse, Strip, Metaspace, or a Sequence of them), joined.
struct NormStep {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string a, b;
};
struct PreStep {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::shared_ptr<const Regex> regex;  // kSplit, and kByteLevel with use_regex
  bool add_prefix_space = false;       // kByteLevel
  std::string replacement;             // kMetaspace
  enum Scheme { kAlways, kFirst, kNever } scheme = kAlways;
  bool split = true;
};
struct DecodeStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string a, b;  // kReplace: from, to; kStrip: the character; kMetaspace: the replacement
  int start = 0, stop = 0;
  bool prepend = true;  // kMetaspace: prepend_scheme is not "never"
};

// A piece of a section: a view into the section or into an owned string of the pipeline.
struct Piece {
  std::string_view text;
  bool at_start;  // begins at offset 0 of the text given to Encode
};

class HfTokenizer final : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<HfTokenizer>> FromJson(const nlohmann::json& j,
                                                         const std::string& file);

  Status Encode(std::string_view text, std::vector<int32_t>& out) const override {
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
          return absl::Status(s.code(),
                              StrCat(s.message(), " (in the section from byte ", at, ")"));
        }
      }
      if (best == std::string_view::npos) break;
      out.push_back(best_id);
      at = best + best_len;
    }
    return absl::OkStatus();
  }

  StatusOr<std::string> Decode(std::span<const int32_t> ids) const override {
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
  std::optional<TextCut> LastCut(std::string_view text, size_t end) const override {
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

 private:
  Status EncodeSection(std::string_view section, bool at_start, std::vector<int32_t>& out) const {
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

  Status Normalize(std::string& s) const {
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

  static std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
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

  Status PreTokenize(const PreStep& step, const Piece& p,
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

  // One pre-token's ids: its symbols, merged.
  Status EncodePiece(std::string_view piece, std::vector<int32_t>& symbols,
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

  static uint32_t DecodeCodePoint(std::string_view ch) {
    utf8proc_int32_t cp = 0;
    utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(ch.data()),
                     static_cast<utf8proc_ssize_t>(ch.size()), &cp);
    return static_cast<uint32_t>(cp);
  }

  // Merges by rank over a linked list of symbols with a priority queue of candidate pairs
  // (lowest rank first, leftmost among equals): O(n log n) in the piece's length. A popped pair
  // is skipped when it went stale (its left symbol merged away or into another, or its right
  // neighbour changed), as Hugging Face's Word::merge_all.
  void Merge(std::vector<int32_t>& s) const {
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

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void Apply(const DecodeStep& step, std::span<const int32_t> ids,
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

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> token_;  // by id
  std::vector<bool> special_;       // added tokens: not byte-level text
  std::vector<std::pair<std::string, int32_t>> added_;
  std::unordered_map<uint64_t, std::pair<int, int32_t>> merges_;  // (a, b) -> (rank, a+b)
  std::array<int32_t, 256> byte_ids_{};  // a byte's symbol: its alphabet token or <0xNN>; -1
  std::vector<NormStep> normalizer_;
  std::vector<PreStep> pre_;
  std::vector<DecodeStep> decoder_;
  bool byte_level_ = false, byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
  enum class Cuts { kNone, kLines, kSpacesDropped, kSpacesKept } cuts_ = Cuts::kNone;
  int32_t unk_ = -1;
  size_t longest_added_ = 0;  // bytes

  friend class Loader;
};

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
    int64_t size = static_cast<int64_t>(vocab.size());
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
          ZR_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern, file_ + ": " + where));
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
        ZR_ASSIGN_OR_RETURN(step.regex,
                            Regex::Compile(Str(pattern, "Regex"), file_ + ": " + where));
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

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> HfTokenizerFromJson(const nlohmann::json& j,
                                                         const std::string& file) {
  ZR_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> t, Loader(j, file).Load());
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace zerort
