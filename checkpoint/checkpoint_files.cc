// A checkpoint's files as untrusted input: opening, bounded reading, metadata validation and
// file verification (see checkpoint_files.h).
#include "zerort/checkpoint/checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "zerort/checkpoint/checkpoint.h"
#include "zerort/runtime/json_reader.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {

std::string ChecksumHex(uint64_t v) { return fmt::format("{:016x}", v); }

// A file a checkpoint names is untrusted input: a plain name inside its step directory (no '/',
// not "." or ".."), opened without following a link (the step directory's last component too),
// non-blocking (a FIFO never hangs the open), and a regular file whose size is the metadata's
// (`expected_bytes`, or any when negative). Returns the descriptor, which the caller closes.
StatusOr<int> OpenCheckpointFile(const std::string& step_dir, const std::string& name,
                                 int64_t expected_bytes) {
  const std::string path = step_dir + "/" + name;
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return absl::DataLossError(StrCat(step_dir, "/metadata.json: file name \"", name,
                                      "\" is not a plain name inside the checkpoint"));
  }
  const int dir_fd = ::open(step_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir_fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(StrCat(step_dir, ": no such directory"));
    if (err == ELOOP || err == ENOTDIR) {
      return absl::DataLossError(StrCat(step_dir, ": not a directory (a link or a file)"));
    }
    return ErrnoError(StrCat("open ", step_dir), err);
  }
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  const int err = errno;
  ::close(dir_fd);
  if (fd < 0) {
    if (err == ENOENT) return absl::NotFoundError(StrCat(path, ": missing"));
    if (err == ELOOP) {
      return absl::DataLossError(
          StrCat(path, ": a symbolic link (a checkpoint's files are never links; not followed)"));
    }
    return ErrnoError(StrCat("open ", path), err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError(
        StrCat(path, ": not a regular file (a FIFO, device or directory is never read)"));
  }
  if (expected_bytes >= 0 && st.st_size != expected_bytes) {
    ::close(fd);
    return absl::DataLossError(StrCat(path, ": ", st.st_size, " bytes, metadata says ",
                                      expected_bytes, " (truncated or overwritten)"));
  }
  return fd;
}

// Reads a whole small file (metadata, latest) through OpenCheckpointFile, refusing more than
// `limit` bytes.
StatusOr<std::string> ReadSmallFile(const std::string& dir, const std::string& name,
                                    int64_t limit) {
  ZR_ASSIGN_OR_RETURN(const int fd, OpenCheckpointFile(dir, name, -1));
  StatusOr<std::string> text = ReadRegularFd(fd, StrCat(dir, "/", name), limit);
  if (!text.ok()) return absl::DataLossError(text.status().message());
  return text;
}

// Every key a loader or `inspect` reads, with its type and range, before any of them reads it:
// a wrong type, a missing key or a value out of range is DataLoss naming the JSON path, never an
// exception. (Pieces are checked against the parameters, and for tiling, by CheckpointReader.)
Status ValidateMetadata(const std::string& path, const nlohmann::json& j) {
  constexpr int64_t kMaxCount = int64_t{1} << 53;
  auto bad = [&](const std::string& where, const nlohmann::json& v, const std::string& want) {
    std::string shown = v.dump();
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    return absl::DataLossError(StrCat(path, ": ", where, " = ", shown, ": expected ", want));
  };
  auto integer = [&](const nlohmann::json& parent, const std::string& key, const std::string& where,
                     int64_t lo, int64_t hi) -> Status {
    const nlohmann::json v = parent.is_object() && parent.contains(key) ? parent[key] : nullptr;
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      return bad(where, v, StrCat("an integer in [", lo, ", ", hi, "]"));
    }
    return absl::OkStatus();
  };
  auto object = [&](const nlohmann::json& parent, const std::string& key,
                    const std::string& where) -> Status {
    if (!parent.is_object() || !parent.contains(key) || !parent[key].is_object()) {
      return bad(where, parent.is_object() && parent.contains(key) ? parent[key] : nullptr,
                 "an object");
    }
    return absl::OkStatus();
  };
  auto string = [&](const nlohmann::json& parent, const std::string& key,
                    const std::string& where) -> Status {
    if (!parent.is_object() || !parent.contains(key) || !parent[key].is_string()) {
      return bad(where, parent.is_object() && parent.contains(key) ? parent[key] : nullptr,
                 "a string");
    }
    return absl::OkStatus();
  };
  ZR_RETURN_IF_ERROR(integer(j, "step", "step", 0, kMaxCount));
  if (j.contains("run_id")) ZR_RETURN_IF_ERROR(string(j, "run_id", "run_id"));
  if (j.contains("hf_config")) ZR_RETURN_IF_ERROR(object(j, "hf_config", "hf_config"));
  ZR_RETURN_IF_ERROR(object(j, "run_state", "run_state"));
  const nlohmann::json& rs = j["run_state"];
  ZR_RETURN_IF_ERROR(integer(rs, "step", "run_state.step", 0, kMaxCount));
  ZR_RETURN_IF_ERROR(
      integer(rs, "consumed_sequences", "run_state.consumed_sequences", 0, kMaxCount));
  ZR_RETURN_IF_ERROR(integer(rs, "manager_steps", "run_state.manager_steps", 0, kMaxCount));
  ZR_RETURN_IF_ERROR(object(rs, "loss_scaler", "run_state.loss_scaler"));
  const nlohmann::json& ls = rs["loss_scaler"];
  if (!ls.contains("scale") || !ls["scale"].is_number() || !(ls["scale"].get<double>() > 0) ||
      !std::isfinite(ls["scale"].get<double>())) {
    return bad("run_state.loss_scaler.scale", ls.value("scale", nlohmann::json()),
               "a finite number > 0");
  }
  for (const char* key : {"hysteresis_left", "iteration", "last_overflow_iteration", "skipped",
                          "consecutive_skips"}) {
    ZR_RETURN_IF_ERROR(
        integer(ls, key, StrCat("run_state.loss_scaler.", key), -kMaxCount, kMaxCount));
  }
  ZR_RETURN_IF_ERROR(object(j, "saved_with", "saved_with"));
  ZR_RETURN_IF_ERROR(integer(j["saved_with"], "world_size", "saved_with.world_size", 1, 1 << 24));
  ZR_RETURN_IF_ERROR(integer(j["saved_with"], "writers", "saved_with.writers", 1, 1 << 24));
  if (j.contains("mesh")) {
    ZR_RETURN_IF_ERROR(object(j, "mesh", "mesh"));
    for (const char* key : {"data", "tensor"}) {
      ZR_RETURN_IF_ERROR(integer(j["mesh"], key, StrCat("mesh.", key), 1, 1 << 16));
    }
    if (j["mesh"].contains("pipeline")) {
      ZR_RETURN_IF_ERROR(integer(j["mesh"], "pipeline", "mesh.pipeline", 1, 1 << 16));
    }
  }
  // `config`: zerort train's resolved run config, or null in an embedder's checkpoint (written
  // by ManagerCheckpoints, which has no model config; `user` is then the trainer's JSON).
  if (!SavedByEmbedder(j)) {
    ZR_RETURN_IF_ERROR(object(j, "config", "config"));
    const nlohmann::json& config = j["config"];
    ZR_RETURN_IF_ERROR(object(config, "model", "config.model"));
    for (const char* key : {"n_layer", "n_head", "d_model", "seq_len", "vocab_size"}) {
      ZR_RETURN_IF_ERROR(
          integer(config["model"], key, StrCat("config.model.", key), 1, int64_t{1} << 30));
    }
    ZR_RETURN_IF_ERROR(object(config, "zero_optimization", "config.zero_optimization"));
    ZR_RETURN_IF_ERROR(
        integer(config["zero_optimization"], "stage", "config.zero_optimization.stage", 0, 3));
    ZR_RETURN_IF_ERROR(object(config, "optimizer", "config.optimizer"));
    ZR_RETURN_IF_ERROR(string(config["optimizer"], "type", "config.optimizer.type"));
  }
  // Parameters: a name, a non-negative shape of at most 2^40 elements (the pieces must then
  // tile it, and the files hold them), a frame.
  if (!j.contains("params") || !j["params"].is_array()) {
    return bad("params", j.value("params", nlohmann::json()), "an array");
  }
  // A parameter named twice would be read from one entry's pieces and exported twice.
  auto once = [&](std::map<std::string, std::string>& seen, const std::string& name,
                  const std::string& where, const char* in) -> Status {
    const auto [it, first] = seen.emplace(name, where);
    if (first) return absl::OkStatus();
    return absl::DataLossError(StrCat(path, ": parameter '", name.substr(0, 200),
                                      "' is named twice in ", in, " (", it->second, " and ", where,
                                      ")"));
  };
  std::map<std::string, std::string> params_seen;
  for (size_t i = 0; i < j["params"].size(); ++i) {
    const nlohmann::json& p = j["params"][i];
    const std::string where = StrCat("params[", i, "]");
    ZR_RETURN_IF_ERROR(string(p, "name", where + ".name"));
    ZR_RETURN_IF_ERROR(once(params_seen, p["name"].get<std::string>(), where, "params"));
    for (const char* key : {"shape", "padded_shape"}) {
      if (!p.contains(key) && std::string(key) == "padded_shape") continue;
      const nlohmann::json v = p.contains(key) ? p[key] : nullptr;
      bool ok = v.is_array() && !v.empty() && v.size() <= 8;
      int64_t numel = 1;
      for (size_t d = 0; ok && d < v.size(); ++d) {
        ok = v[d].is_number_integer() && v[d].get<int64_t>() >= 1 &&
             v[d].get<int64_t>() <= (int64_t{1} << 40);
        // Capped before the product, never after it: 2^41 x 2^40 would wrap past 2^63.
        constexpr int64_t kCap = int64_t{1} << 41;
        if (ok) numel = numel > kCap / v[d].get<int64_t>() ? kCap : numel * v[d].get<int64_t>();
      }
      if (!ok || numel > (int64_t{1} << 40)) {
        return bad(StrCat(where, ".", key), v,
                   "1 to 8 dimensions >= 1 of at most 2^40 elements in all");
      }
    }
    if (p.contains("split_dim")) {
      ZR_RETURN_IF_ERROR(integer(p, "split_dim", where + ".split_dim", -1, 7));
    }
    if (p.contains("groups"))
      ZR_RETURN_IF_ERROR(integer(p, "groups", where + ".groups", 1, 1 << 16));
    if (p.contains("onebit_lamb")) {  // [Note: 1-bit LAMB]: c, last_factor, scaling
      const nlohmann::json& v = p["onebit_lamb"];
      bool ok = v.is_array() && v.size() == 3;
      for (size_t k = 0; ok && k < 3; ++k) {
        ok = v[k].is_number() && std::isfinite(v[k].get<double>()) && v[k].get<double>() >= 0 &&
             v[k].get<double>() <= 1e30;
      }
      if (!ok) {
        return bad(where + ".onebit_lamb", v,
                   "[coeff_freeze, last_factor, scaling], finite numbers >= 0 of at most 1e30");
      }
    }
  }
  if (!j["ranks"].is_array()) return bad("ranks", j["ranks"], "an array");
  for (size_t e = 0; e < j["ranks"].size(); ++e) {
    const nlohmann::json& r = j["ranks"][e];
    const std::string where = StrCat("ranks[", e, "]");
    if (!r.is_object()) return bad(where, r, "an object");
    for (const char* key : {"data", "tensor", "pipeline", "rank"}) {
      if (r.contains(key)) {
        ZR_RETURN_IF_ERROR(integer(r, key, StrCat(where, ".", key), 0, 1 << 24));
      }
    }
    if (!r.contains("pieces") || !r["pieces"].is_array()) {
      return bad(where + ".pieces", r.value("pieces", nlohmann::json()), "an array");
    }
    int64_t elements = 0;
    // A rank's shard is one contiguous range of its units' flat buffers: a parameter is one
    // piece of it at most.
    std::map<std::string, std::string> pieces_seen;
    for (size_t k = 0; k < r["pieces"].size(); ++k) {
      const nlohmann::json& piece = r["pieces"][k];
      const std::string at = StrCat(where, ".pieces[", k, "]");
      const bool ok = piece.is_array() && piece.size() == 3 && piece[0].is_string() &&
                      piece[1].is_number_integer() && piece[2].is_number_integer() &&
                      piece[1].get<int64_t>() >= 0 && piece[2].get<int64_t>() >= 0 &&
                      piece[1].get<int64_t>() <= (int64_t{1} << 40) &&
                      piece[2].get<int64_t>() <= (int64_t{1} << 40);
      if (!ok) return bad(at, piece, "[parameter name, offset >= 0, length >= 0]");
      ZR_RETURN_IF_ERROR(
          once(pieces_seen, piece[0].get<std::string>(), at, StrCat(where, ".pieces").c_str()));
      elements += piece[2].get<int64_t>();
    }
    ZR_RETURN_IF_ERROR(object(r, "files", where + ".files"));
    for (const auto& [kind, file] : r["files"].items()) {
      const std::string at = StrCat(where, ".files.", kind);
      ZR_RETURN_IF_ERROR(string(file, "name", at + ".name"));
      ZR_RETURN_IF_ERROR(string(file, "xxh3", at + ".xxh3"));
      // A file holds exactly its pieces, 4 bytes each.
      ZR_RETURN_IF_ERROR(integer(file, "bytes", at + ".bytes", elements * 4, elements * 4));
    }
  }
  return absl::OkStatus();
}

StatusOr<nlohmann::json> ParseMetadataText(const std::string& text, const std::string& path) {
  JsonLimits limits;
  limits.max_bytes = kMaxMetadataBytes;
  StatusOr<nlohmann::json> j = ParseJsonText(text, path, limits);
  if (!j.ok()) return absl::DataLossError(j.status().message());
  return j;
}

StatusOr<nlohmann::json> ReadMetadata(const std::string& step_dir) {
  const std::string path = step_dir + "/metadata.json";
  StatusOr<std::string> text = ReadSmallFile(step_dir, "metadata.json", kMaxMetadataBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        StrCat(path,
               ": missing (not a complete checkpoint; an interrupted save leaves "
               "step_<N>.tmp, which is never loaded)"));
  }
  ZR_RETURN_IF_ERROR(text.status());
  ZR_ASSIGN_OR_RETURN(nlohmann::json j, ParseMetadataText(*text, path));
  if (!j.contains("format_version") || !j.contains("ranks")) {
    return absl::DataLossError(StrCat(path, ": not zerort checkpoint metadata"));
  }
  if (j["format_version"] != 1 && j["format_version"] != kCheckpointFormatVersion) {
    return absl::DataLossError(StrCat(path, ": format version ", j["format_version"].dump(),
                                      ", this zerort reads 1 and ", kCheckpointFormatVersion));
  }
  ZR_RETURN_IF_ERROR(ValidateMetadata(path, j));
  return j;
}

// Checks a file's size and checksum against its metadata entry, reading it in blocks.
Status VerifyFile(const std::string& step_dir, const nlohmann::json& entry) {
  const std::string path = step_dir + "/" + entry.at("name").get<std::string>();
  const int64_t bytes = entry.at("bytes");
  StatusOr<int> opened = OpenCheckpointFile(step_dir, entry.at("name").get<std::string>(), bytes);
  if (absl::IsNotFound(opened.status())) {
    return absl::DataLossError(StrCat(path, ": missing (the metadata names it)"));
  }
  ZR_RETURN_IF_ERROR(opened.status());
  const int fd = *opened;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  // A block the file's size (OpenCheckpointFile has checked it against the metadata), 4 KiB to
  // 1 MiB, not zero-filled: a checkpoint of many small shard files verifies without touching
  // 1 MiB per file (the checkpoint fuzzer's mutants: 130 -> 28 s under AddressSanitizer, whose
  // allocator hands each 1 MiB block fresh, zeroed pages).
  const size_t block_size = static_cast<size_t>(std::clamp<int64_t>(bytes, 4096, 1 << 20));
  const std::unique_ptr<char[]> block = std::make_unique_for_overwrite<char[]>(block_size);
  int64_t size = 0;
  for (;;) {
    const ssize_t n = ::read(fd, block.get(), block_size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    XXH3_64bits_update(state, block.get(), static_cast<size_t>(n));
    size += n;
  }
  ::close(fd);
  const std::string sum = ChecksumHex(XXH3_64bits_digest(state));
  XXH3_freeState(state);
  if (size != bytes) {
    return absl::DataLossError(
        StrCat(path, ": ", size, " bytes, metadata says ", bytes, " (truncated or overwritten)"));
  }
  if (sum != entry.at("xxh3").get<std::string>()) {
    return absl::DataLossError(StrCat(path, ": XXH3 checksum ", sum, ", metadata says ",
                                      entry.at("xxh3").get<std::string>(), " (corrupted)"));
  }
  return absl::OkStatus();
}

}  // namespace zerort
