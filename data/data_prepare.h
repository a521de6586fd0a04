// `zerort data prepare`: a text corpus into a zerort token file, streamed.
//
// The input is read in blocks (never whole; a SentencePiece tokenizer takes a plain text of up to
// 256 MiB whole, since it adds a dummy prefix at each call's start), each cut where no pre-token
// can span the cut (after
// a line break that a non-space character follows: every supported pattern starts a new
// pre-token there, so the ids equal those of the whole text), split again into one piece per
// thread and encoded on all of them, the pieces' ids written in order. Documents: a `.jsonl` file
// holds one per line (its "text" string, Megatron's preprocess_data convention); any other file
// is one document. With a tokenizer the end-of-text token (Tokenizer::EndOfText) follows each
// document. Without one, byte tokens (vocabulary 256, no end-of-text token). The output is
// written to OUT.tmp (the header's count patched at the end), fsynced and renamed: a failed or
// interrupted run leaves no OUT.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "zerort/runtime/status.h"

namespace zerort {

struct PrepareOptions {
  std::string input;
  std::string output;
  std::string tokenizer;                    // a tokenizer.json; empty: byte tokens
  int threads = 0;                          // 0: every core
  int64_t block_bytes = int64_t{64} << 20;  // read at a time
};

struct PrepareSummary {
  int64_t bytes = 0, tokens = 0, documents = 0;
  int vocab_size = 256;
  double seconds = 0;
};

// `progress(done, total)` (input bytes) after each block, when given.
StatusOr<PrepareSummary> PrepareTokenFile(const PrepareOptions& options,
                                          const std::function<void(int64_t, int64_t)>& progress);

}  // namespace zerort
