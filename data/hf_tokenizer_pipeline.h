// The tokenizer.json pipeline (internal to data/): the steps a Hugging Face tokenizer.json
// describes and HfTokenizer, which runs them ([Note: the tokenizer.json pipeline] below;
// hf_tokenizer.cc), and what hf_tokenizer_json.cc's Loader needs to build one from the file
// ([Note: zerort's tokenizers] in tokenizer.h says what is read and what is refused).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zerort/data/tokenizer.h"
#include "zerort/runtime/status.h"

namespace zerort::hf_tokenizer {

// GPT-2's pre-tokenisation pattern (ByteLevel with use_regex).
inline constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// A compiled PCRE2 pattern (Unicode properties), shared by every thread; `where` names it in
// errors. Defined in hf_tokenizer.cc.
class Regex;
StatusOr<std::shared_ptr<const Regex>> CompileRegex(const std::string& pattern,
                                                    const std::string& where);

// The byte length of the valid UTF-8 character at text[at], or 0 when the bytes there are not one
// (overlong forms, surrogates, code points past U+10FFFF and truncated sequences included).
size_t Utf8CharLength(std::string_view text, size_t at);

// GPT-2's bytes_to_unicode: the printable bytes as themselves, the others as 256 + n; as UTF-8.
struct ByteAlphabet {
  std::array<std::string, 256> of_byte;
  std::unordered_map<std::string, uint8_t> to_byte;
  ByteAlphabet();
};
const ByteAlphabet& Alphabet();

// "<0x0A>": the byte-fallback token of a byte (Hugging Face's format).
std::string ByteToken(uint8_t b);

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

class Loader;  // hf_tokenizer_json.cc

class HfTokenizer final : public Tokenizer {
 public:
  Status Encode(std::string_view text, std::vector<int32_t>& out) const override;

  StatusOr<std::string> Decode(std::span<const int32_t> ids) const override;

  int vocab_size() const override { return static_cast<int>(token_.size()); }
  std::optional<int32_t> AddedToken(std::string_view content) const override;
  std::optional<int32_t> EndOfText() const override;
  std::optional<TextCut> LastCut(std::string_view text, size_t end) const override;

 private:
  Status EncodeSection(std::string_view section, bool at_start, std::vector<int32_t>& out) const;

  Status Normalize(std::string& s) const;

  static std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to);

  Status PreTokenize(const PreStep& step, const Piece& p,
                     std::vector<std::unique_ptr<std::string>>& owned,
                     std::vector<Piece>& out) const;

  // One pre-token's ids: its symbols, merged.
  Status EncodePiece(std::string_view piece, std::vector<int32_t>& symbols,
                     std::vector<int32_t>& out) const;

  static uint32_t DecodeCodePoint(std::string_view ch);

  // Merges by rank over a linked list of symbols with a priority queue of candidate pairs
  // (lowest rank first, leftmost among equals): O(n log n) in the piece's length. A popped pair
  // is skipped when it went stale (its left symbol merged away or into another, or its right
  // neighbour changed), as Hugging Face's Word::merge_all.
  void Merge(std::vector<int32_t>& s) const;

  static uint64_t PairKey(int32_t a, int32_t b);

  void Apply(const DecodeStep& step, std::span<const int32_t> ids,
             std::vector<std::string>& tokens) const;

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

}  // namespace zerort::hf_tokenizer
