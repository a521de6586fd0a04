// A checkpoint's files are untrusted input (docs/design.md, "Untrusted input"): every file it
// names must be a plain name inside its step directory, opened without following links and
// non-blocking, a regular file of the metadata's size; small files are read bounded; metadata.json
// is validated key by key (type and range) before any loader or `inspect` reads it. Internal to
// checkpoint/ (not installed): checkpoint.cc's loaders, inspect and rotation use it.
#pragma once

#include <cstdint>
#include <string>

#include "nlohmann/json.hpp"
#include "zerort/runtime/status.h"

namespace zerort {

// XXH3-64 as the metadata writes it (16 lowercase hex digits).
std::string ChecksumHex(uint64_t v);

// Opens `name` inside `step_dir` as described above; `expected_bytes` < 0 accepts any size.
// NotFound when missing, DataLoss when not a plain name, a link or not a regular file. Returns the
// descriptor, which the caller closes.
StatusOr<int> OpenCheckpointFile(const std::string& step_dir, const std::string& name,
                                 int64_t expected_bytes);

// A whole small file of a checkpoint (metadata, latest, the run marker), at most `limit` bytes.
StatusOr<std::string> ReadSmallFile(const std::string& dir, const std::string& name, int64_t limit);

// Every key a loader or `inspect` reads, with its type and range: DataLoss naming the JSON path.
// (Pieces against the parameters, and tiling, are CheckpointReader's.)
Status ValidateMetadata(const std::string& path, const nlohmann::json& j);

// The largest metadata.json read: about 4,000 ranks' pieces of a GPT-2 XL-sized model.
inline constexpr int64_t kMaxMetadataBytes = int64_t{256} << 20;

// Metadata text through the bounded JSON reader (json_reader.h: size, depth, string length,
// duplicate keys; a top-level object): DataLoss naming `path` and the JSON path.
StatusOr<nlohmann::json> ParseMetadataText(const std::string& text, const std::string& path);

// step_dir/metadata.json read, parsed, its format version checked and validated. NotFound when
// missing (an interrupted save leaves step_<N>.tmp, never loaded).
StatusOr<nlohmann::json> ReadMetadata(const std::string& step_dir);

// A file's size and XXH3 checksum against its metadata entry, streaming in blocks.
Status VerifyFile(const std::string& step_dir, const nlohmann::json& entry);

}  // namespace zerort
