// [Note: the file fuzzers]
// Every file format zerort reads from a user is untrusted input (token files, a Megatron index,
// safetensors and a model directory's weights, Hugging Face config.json and tokenizer files, a
// checkpoint's metadata.json alone and over its shard files, run configs). A fuzz target feeds
// one byte string to one format's reader, through the same entry a run uses (the bytes written to
// a file in a scratch directory, then opened by path), and then uses what it read the way a run
// would (reads the tokens, touches each tensor's first and last byte, fills the parameters,
// reads a checkpoint's tensors, encodes and decodes a text).
// An error Status is an answer; a crash, a sanitizer report or a hang is the bug. Two drivers run
// the targets:
//   - fuzz_replay (every build; tests/CMakeLists.txt runs it per target, under the sanitizer
//     build too): each target's seeds, which must be read without error (so a format change that
//     makes them stale fails the test instead of fuzzing nothing but the first check), then a
//     fixed number of seeded mutations of them (bytes flipped, inserted, removed, copied, integers
//     set to extremes, and for JSON a value replaced, removed or doubled in the parsed tree:
//     mutator.h);
//   - with -DZR_FUZZ=ON and clang, one libFuzzer program per target (zr_fuzz_<name>), coverage-
//     guided, for hours when wanted: docs/reliability.md says how.
// One target checks promises rather than a format: `tokenizer_text` feeds text to the golden
// tokenizers and checks what `data prepare` relies on (UTF-8 in, ids in the vocabulary, text back,
// cuts that do not change the ids). Found this way: a tokenizer.json whose vocab named an id past
// its entry count wrote past the id table (2026-12-02; a tokenizer_json seed keeps the case); a
// SentencePiece model that made libsentencepiece throw, one that loaded with no pieces, and a cut
// beside a U+2581 that changed LLaMA-2's ids (2026-12-03; docs/reliability.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/status.h"

namespace zerort::fuzz {

struct FuzzPaths {
  std::string scratch;  // empty before each input; the driver empties it afterwards
  std::string source;   // the repository (committed files a target reads: golden tokenizers)
};

struct FuzzTarget {
  std::string_view name;
  // Reads `data` through the format's reader (its file written in paths.scratch) and uses what it
  // read: the reader's Status.
  Status (*run)(std::span<const uint8_t> data, const FuzzPaths& paths);
  // Inputs the reader accepts, from the repository at `source_dir` (committed files) or made here.
  std::vector<std::string> (*seeds)(const std::string& source_dir);
  // More inputs to mutate, which the reader may refuse (real files of the format found elsewhere:
  // DeepSpeed's example configs); null when none.
  std::vector<std::string> (*more)(const std::string& source_dir);
  bool json;  // the input is JSON text (the drivers also mutate its parsed tree)
};

std::span<const FuzzTarget> FuzzTargets();
// nullptr when no target has that name.
const FuzzTarget* FindFuzzTarget(std::string_view name);

}  // namespace zerort::fuzz
