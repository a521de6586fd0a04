// [Note: zerort's tokenizers]
// Text to token ids and back. Tokenizer::Load reads
//   - a Hugging Face tokenizer.json with a BPE model (hf_tokenizer.cc, [Note: the tokenizer.json
//     pipeline] there), in both families the Hub holds:
//       byte-level (GPT-2, LLaMA-3, Qwen2/3, SmolLM, most current models): a ByteLevel
//       pre-tokenizer (GPT-2's regex, or Split steps with their own: PCRE2 with Unicode
//       properties), the byte-level alphabet, ignore_merges (LLaMA-3), NFC (Qwen);
//       SentencePiece-converted (LLaMA-2, Mistral, TinyLlama, Gemma): spaces as U+2581 through
//       Prepend/Replace normalizers or a Metaspace pre-tokenizer (prepend_scheme always, first
//       or never; split), characters as symbols, byte_fallback's <0xNN> tokens for a character
//       without one, unk_token with fuse_unk;
//     added tokens matched in the raw text first; merges by rank in O(n log n) per piece;
//     decoders ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace;
//   - a SentencePiece .model (libsentencepiece, behind sentencepiece_model.h).
// Anything else in a tokenizer.json (another model type, a normalizer, pre-tokenizer or decoder
// zerort does not implement, BPE dropout, a continuing_subword_prefix) is refused naming its
// JSON path, so a tokenizer never encodes differently from its reference in silence. Text must be
// valid UTF-8 (Hugging Face's tokenizers take Unicode strings): invalid bytes, lone surrogates'
// encodings included, are an error naming the byte; a NUL is a character like any other. A
// character that has no token, no byte fallback and no unk_token is an error (Hugging Face drops
// it silently). Checked against Hugging Face's JavaScript implementation
// (tests/data/tokenizer_reference.mjs) on Unicode, whitespace runs, digits, contractions and
// special tokens: identical ids.
// Untrusted input: the bounded JSON reader (256 MiB), every id in range and unique, every merge
// of two known tokens, the patterns compiled with a match limit.
//
// [Note: cutting a text]
// `data prepare` encodes a long text in blocks on several threads, so it needs places where the
// text can be cut with the ids of the two sides, concatenated, equal to the whole text's:
//   - byte-level tokenizers: after a line break that a non-space character follows (every
//     pre-token of their regexes starts there), unless a ByteLevel step adds a prefix space;
//   - tokenizers that turn spaces into U+2581 (SentencePiece models; LLaMA-2-style
//     tokenizer.json): at a single space between two other characters (neither U+2581: the
//     space becomes one, and a token of two would span the place), when no token holds
//     U+2581 after another character (so no piece spans the place); the space is dropped when
//     the second side's prefix (a dummy prefix, Prepend, Metaspace's always/first) puts it back;
//   - anything else: nowhere (the text is encoded whole).
// tests/data/tokenizer_test.cc checks every kind block-wise against the whole text.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/status.h"

namespace zerort {

// A place to cut a text ([Note: cutting a text]): the first side is text[0, first_end), the second
// text[second_begin, ...); the bytes between (a space a prefix puts back) belong to neither.
struct TextCut {
  size_t first_end = 0;
  size_t second_begin = 0;
};
// The first byte of `text` that does not begin a valid UTF-8 character (overlong forms,
// surrogates' encodings, code points past U+10FFFF and truncated sequences are not), if any.
std::optional<size_t> FirstInvalidUtf8(std::string_view text);
// InvalidArgument naming that byte ("the text is not valid UTF-8 at byte N (0xNN)"), or Ok.
Status RequireUtf8(std::string_view text);
// After the last '\n' before `end` that a non-space byte follows.
std::optional<TextCut> LastLineCut(std::string_view text, size_t end);
// At the last single ' ' before `end` between two characters that are not ASCII whitespace and
// not U+2581 (so three bytes must follow the space: `text` may be a prefix of more); `drop_space`:
// the space belongs to neither side.
std::optional<TextCut> LastSpaceCut(std::string_view text, size_t end, bool drop_space);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // Appends the ids of `text` (no BOS or EOS added). Thread-safe.
  virtual Status Encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // The text of `ids` (an id outside the vocabulary is an error naming it).
  virtual StatusOr<std::string> Decode(std::span<const int32_t> ids) const = 0;
  // Ids [0, vocab_size()), added tokens included.
  virtual int vocab_size() const = 0;
  // The id of an added (special) token, e.g. "<|endoftext|>".
  virtual std::optional<int32_t> AddedToken(std::string_view content) const = 0;
  // The last place before `end` where `text` may be cut ([Note: cutting a text]); nullopt when
  // there is none.
  virtual std::optional<TextCut> LastCut(std::string_view text, size_t end) const = 0;
  // The end-of-text token a corpus puts between documents: the first added token named like
  // one (<|endoftext|>, <|end_of_text|>, </s>, <eos>), if any.
  virtual std::optional<int32_t> EndOfText() const = 0;
};

// `zerort data train-tokenizer`: a SentencePiece model (BPE or unigram, byte fallback, digits
// split, identity normalisation, whitespace kept, unk 0, bos 1, eos 2: LLaMA's settings) trained
// on the lines of `input` (at most 1 GiB; empty:
// the built-in corpus), written to `output` (a .model file) through a .tmp renamed at the end.
struct TokenizerTraining {
  std::string input;
  std::string output;
  int vocab_size = 512;
  std::string type = "bpe";  // or "unigram"
  int threads = 0;           // 0: every core
};
Status TrainSentencePiece(const TokenizerTraining& options);

// The text side of a run (its sample's prompt and output): data.tokenizer's tokenizer, or byte
// tokens (vocabulary 256) when there is none.
class TextCodec {
 public:
  // `tokenizer` a tokenizer.json or empty; its vocabulary must fit `vocab_size`.
  static StatusOr<TextCodec> For(const std::string& tokenizer, int vocab_size);
  StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // Byte tokens' non-printable bytes escaped; a tokenizer's text as it decodes.
  StatusOr<std::string> Decode(std::span<const int32_t> ids) const;

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
};

}  // namespace zerort
