// Token files (docs/design.md, "Data, checkpoints, metrics"): a 32-byte header, then
// little-endian tokens.
//   bytes 0-7   magic "ZRTOKENS"
//   bytes 8-11  format version (1), u32 little-endian
//   bytes 12-15 token width in bytes (1, 2 or 4), u32
//   bytes 16-23 token count, u64
//   bytes 24-27 vocabulary size the tokens were made for (256 for bytes), u32
//   bytes 28-31 reserved, zero
// A run reads token files through TokenSource (token_source.h: memory-mapped, this format and
// others); ReadTokenFile reads a small one whole (tests, tools) through the same parser, and names
// the file and what is wrong with it: short header, bad magic, unknown version, a size that
// disagrees with the count, tokens at or above the vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/status.h"
#include "zerort/runtime/user_file.h"

namespace zerort {

struct TokenFile {
  std::vector<int32_t> tokens;
  int vocab_size = 256;
  int width = 1;
};

Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens, int vocab_size);
StatusOr<TokenFile> ReadTokenFile(const std::string& path);

// Byte-level tokens of a text: one token per byte, vocabulary 256.
std::vector<int32_t> ByteTokens(std::string_view text);
std::string BytesText(const std::vector<int32_t>& tokens);  // printable, others escaped

// The built-in corpus of the default run: deterministic English-like text made by the project
// (sentences from a small grammar), about `bytes` long, so that a run needs no download.
std::string BuiltinCorpus(size_t bytes, uint64_t seed);
// The default run's corpus: 1 MiB of it, seed 20261121 (an empty data.path; `zerort data corpus`;
// `zerort data train-tokenizer` without --input).
std::string DefaultCorpus();

}  // namespace zerort
