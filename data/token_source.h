// TokenSource: a run's tokens as one read-only sequence, memory-mapped from a file in the width it
// was stored in and read window by window: never copied whole, so a corpus may be larger than
// memory (resident memory grows with the windows read, not with the file).
//
// [Note: the token files zerort reads]
//   zerort         "ZRTOKENS" header (token_file.h), tokens of 1, 2 or 4 bytes; the only format
//                  that records its vocabulary
//   llm.c          a 1024-byte header of 256 little-endian int32: magic 20240520, version (1:
//                  uint16 tokens, GPT-2's; 2: uint32, LLaMA-3's), token count; then the tokens
//                  (llm.c's dev/data shards)
//   Megatron       an indexed dataset: PREFIX.idx ("MMIDIDX\0\0", version 1, dtype code,
//                  sequence and document counts, then the sequences' sizes (int32), byte offsets
//                  (int64) and the document index (int64)) and PREFIX.bin, the sequences back to
//                  back; named by its prefix or either file; integer dtypes only
//   uint16/uint32  a raw little-endian array without a header (nanoGPT's train.bin): only with
//                  data.format "uint16" or "uint32", since nothing in its bytes says what it is
// Every header is checked against the file's size before anything is mapped: unknown magic,
// version or dtype, counts that overflow, sizes that disagree, offsets outside the file, each
// named with the file. A token at or above the vocabulary is found when its window is read and
// named by file and index (checking every token of a 20 GB file at open would take a minute).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/status.h"

namespace zerort {

enum class TokenFormat : uint8_t { kDetect, kUint16, kUint32 };
// "detect" (by the file's header), "uint16", "uint32". (Not "auto": in a DeepSpeed config that
// asks zerort to resolve a value.)
StatusOr<TokenFormat> ParseTokenFormat(std::string_view name);

class TokenSource {
 public:
  // `path`: a file of one of the formats above (kDetect), or a raw array (kUint16, kUint32).
  static StatusOr<std::unique_ptr<TokenSource>> Open(const std::string& path, TokenFormat format);
  // Tokens held in memory (the built-in corpus, tests), named `name`.
  static std::unique_ptr<TokenSource> FromTokens(std::vector<int32_t> tokens, int vocab_size,
                                                 std::string name);
  ~TokenSource();
  TokenSource(const TokenSource&) = delete;
  TokenSource& operator=(const TokenSource&) = delete;

  int64_t size() const { return count_; }
  // The vocabulary the file says its tokens were made for; 0 when the format does not say.
  int vocab_size() const { return vocab_; }
  int width() const { return width_; }  // bytes per stored token (4 in memory)
  const std::string& name() const { return name_; }
  std::string_view format_name() const { return format_; }
  // Tokens [offset, offset + out.size()) as int32. A token outside [0, vocab) fails the read,
  // naming the file and the token's index.
  Status Read(int64_t offset, std::span<int32_t> out, int vocab) const;

 private:
  TokenSource() = default;
  std::string name_;
  std::string_view format_ = "memory";
  std::vector<int32_t> memory_;  // FromTokens
  void* map_ = nullptr;          // the whole data file, read-only
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // the first token
  int width_ = 4;
  bool is_signed_ = false;  // Megatron's int8/int16/int32/int64
  int64_t count_ = 0;
  int vocab_ = 0;
};

}  // namespace zerort
