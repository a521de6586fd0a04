// Sharded checkpoints: the commit protocol, logical addressing, verification.
#include "engine/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/checkpoint_files.h"
#include "runtime/host_collectives.h"
#include "runtime/log.h"
#include "runtime/strings.h"
#include "sharding/manager_state.h"

namespace zerort {
namespace fs = std::filesystem;
namespace {

struct Kind {
  StateKind buffer;
  const char* name;
};
constexpr Kind kKinds[] = {{StateKind::kMaster, "master"},
                           {StateKind::kExpAvg, "exp_avg"},
                           {StateKind::kExpAvgSq, "exp_avg_sq"}};
constexpr int kNumKinds = 3;

// Named by mesh coordinate: pipeline stage (when there are several), data-parallel rank,
// tensor-parallel rank.
std::string FileName(const CheckpointGroups& g, int dp_rank, const char* kind) {
  const std::string stage = g.pipeline_size > 1 ? StrCat("pp", g.pipeline_rank, "-") : "";
  return StrCat(stage, "dp", dp_rank, "-tp", g.tensor_rank, ".", kind, ".bin");
}

// A file written in pieces with its XXH3-64 checksum kept on the way; Close() fsyncs it. A
// writer that is destroyed without Close() closes the descriptor (the .tmp directory it is in is
// never committed).
class SyncedWriter {
 public:
  explicit SyncedWriter(std::string path) : path_(std::move(path)), hash_(XXH3_createState()) {
    XXH3_64bits_reset(hash_);
  }
  ~SyncedWriter() {
    if (fd_ >= 0) ::close(fd_);
    XXH3_freeState(hash_);
  }
  Status Open() {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd_ < 0 ? ErrnoError(StrCat("open ", path_), errno) : absl::OkStatus();
  }
  Status Append(const void* data, size_t bytes) {
    XXH3_64bits_update(hash_, data, bytes);
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError(StrCat("write ", path_), errno);
      p += n;
      bytes -= static_cast<size_t>(n);
      written_ += n;
    }
    return absl::OkStatus();
  }
  Status Close() {
    const int fd = std::exchange(fd_, -1);
    if (::fsync(fd) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(StrCat("fsync ", path_), err);
    }
    if (::close(fd) != 0) return ErrnoError(StrCat("close ", path_), errno);
    return absl::OkStatus();
  }
  int64_t bytes() const { return written_; }
  uint64_t checksum() const { return XXH3_64bits_digest(hash_); }

 private:
  std::string path_;
  int fd_ = -1;
  XXH3_state_t* hash_;
  int64_t written_ = 0;
};

// The marker a save puts in its step_<N>.tmp until the metadata (which names the run) is written.
constexpr char kRunMarker[] = ".zerort-run";

// Whether `path` (a step_<N> or step_<N>.tmp directory, not a link) was written by run `run_id`:
// its marker says so, or its metadata's run_id does.
// An empty `run_id` matches any zerort-written directory (a marker, or metadata with a format
// version): the earlier runs a user told a new run to overwrite.
bool OwnedByRun(const fs::path& path, const std::string& run_id) {
  std::error_code ec;
  if (fs::is_symlink(path, ec) || !fs::is_directory(path, ec)) return false;
  // Read as untrusted files: no link followed, regular files only, bounded.
  if (StatusOr<std::string> marker = ReadSmallFile(path.string(), kRunMarker, 64); marker.ok()) {
    const std::string id = marker->substr(0, marker->find('\n'));
    return run_id.empty() || id == run_id;
  }
  StatusOr<std::string> text = ReadSmallFile(path.string(), "metadata.json", kMaxMetadataBytes);
  if (!text.ok()) return false;
  StatusOr<nlohmann::json> j = ParseMetadataText(*text, (path / "metadata.json").string());
  if (!j.ok() || !j->contains("format_version")) return false;
  if (run_id.empty()) return true;
  return j->contains("run_id") && (*j)["run_id"].is_string() &&
         (*j)["run_id"].get<std::string>() == run_id;
}

Status WriteAndSync(const std::string& path, const void* data, size_t bytes) {
  SyncedWriter w(path);
  ZR_RETURN_IF_ERROR(w.Open());
  ZR_RETURN_IF_ERROR(w.Append(data, bytes));
  return w.Close();
}

Status SyncDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(StrCat("open directory ", path), errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(StrCat("fsync directory ", path), err);
  return absl::OkStatus();
}

// Every rank learns whether every rank succeeded, and gets the first failing rank's message (so
// the error names the damaged file on every rank, not only where it was read).
Status Agree(ShardManager& m, Communicator& group, const Status& local, std::string_view what) {
  constexpr size_t kMessage = 1024;
  std::vector<uint8_t> mine(kMessage, 0), all(kMessage * group.size());
  if (!local.ok()) {
    const std::string text = StrCat(local.message());
    mine[0] = static_cast<uint8_t>(static_cast<int>(local.code()));
    std::copy_n(text.begin(), std::min(text.size(), kMessage - 2), mine.begin() + 1);
  }
  ZR_RETURN_IF_ERROR(AllGatherHostValues(group, m.device_allocator(), m.compute_stream(),
                                         mine.data(), all.data(), kMessage, DType::kU8));
  if (!local.ok()) return local;
  for (int r = 0; r < group.size(); ++r) {
    const uint8_t* entry = all.data() + r * kMessage;
    if (entry[0] == 0) continue;
    const std::string text(reinterpret_cast<const char*>(entry + 1));
    return absl::Status(static_cast<absl::StatusCode>(entry[0]),
                        StrCat(text, " (", what, ", reported by rank ", r, ")"));
  }
  return absl::OkStatus();
}

// Which ranks write, in the layouts' frame: all of them, or rank 0 alone at stage 0.
int Writers(ShardManager& m) { return m.unit(0).layout().dp_size(); }

nlohmann::json ScalerJson(const LossScaler::State& s) {
  return {{"scale", s.scale},         {"hysteresis_left", s.hysteresis_left},
          {"iteration", s.iteration}, {"last_overflow_iteration", s.last_overflow_iteration},
          {"skipped", s.skipped},     {"consecutive_skips", s.consecutive_skips}};
}

LossScaler::State ScalerFromJson(const nlohmann::json& j) {
  LossScaler::State s;
  s.scale = j.at("scale");
  s.hysteresis_left = j.at("hysteresis_left");
  s.iteration = j.at("iteration");
  s.last_overflow_iteration = j.at("last_overflow_iteration");
  s.skipped = j.at("skipped");
  s.consecutive_skips = j.at("consecutive_skips");
  return s;
}

}  // namespace

Status SaveCheckpoint(const std::string& dir, const RunState& state, ShardManager& m,
                      const CheckpointGroups& groups, int keep_last_n, bool replace_earlier_runs) {
  Communicator& world = *groups.world;
  Communicator& dp = *groups.dp;
  const std::string name = StrCat("step_", state.step);
  const std::string final_dir = dir + "/" + name;
  const std::string tmp_dir = final_dir + ".tmp";
  const int writers = Writers(m);
  const bool writer = dp.rank() < writers;

  // Phase 1: rank 0 prepares the directory: this run's stale .tmp of a crashed save is discarded;
  // a step_<N>(.tmp) of anything else in the way is an error, before anything is written.
  Status local = absl::OkStatus();
  if (world.rank() == 0) {
    local = [&]() -> Status {
      if (state.run_id.empty()) {
        return absl::InvalidArgumentError("SaveCheckpoint: RunState.run_id is empty (NewRunId)");
      }
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) return absl::InternalError(StrCat("create ", dir, ": ", ec.message()));
      // This run's, or with replace_earlier_runs any zerort run's (never a user's).
      auto replaceable = [&](const std::string& path) {
        return OwnedByRun(path, state.run_id) || (replace_earlier_runs && OwnedByRun(path, ""));
      };
      for (const std::string& in_way : {tmp_dir, final_dir}) {
        if (fs::exists(fs::symlink_status(in_way, ec)) && !replaceable(in_way)) {
          return absl::AlreadyExistsError(
              StrCat(in_way, " exists and was not written by this run (run id ", state.run_id,
                     "): move it away or choose another checkpoint.dir; zerort deletes only "
                     "what it wrote"));
        }
      }
      fs::remove_all(tmp_dir, ec);
      if (!ec) fs::create_directory(tmp_dir, ec);
      if (ec) return absl::InternalError(StrCat("create ", tmp_dir, ": ", ec.message()));
      const std::string marker = state.run_id + "\n";
      return WriteAndSync(tmp_dir + "/" + kRunMarker, marker.data(), marker.size());
    }();
  }
  ZR_RETURN_IF_ERROR(Agree(m, world, local, "creating the checkpoint directory"));
  const Status result = [&]() -> Status {
    // Phase 2: each writer writes its pieces of each state, in unit and piece order, one unit's
    // shard in memory at a time (read from whichever tier holds it). Every tensor-parallel rank and
    // pipeline stage writes its own parts; a tied unit's twin (not counted in the norm) is skipped.
    // Each writer describes what it wrote: its file entry and its units' parameter table.
    auto saved = [&](int u) { return m.unit_options(u).counts_in_norm; };
    auto position = [&](int u) {
      return groups.unit_positions.empty() ? u : groups.unit_positions.at(static_cast<size_t>(u));
    };
    nlohmann::json described;  // null for a rank that writes nothing
    local = [&]() -> Status {
      if (!writer) return absl::OkStatus();
      nlohmann::json files = nlohmann::json::object();
      for (int k = 0; k < kNumKinds; ++k) {
        if (!m.optimizer().HasState(kKinds[k].buffer)) continue;
        const std::string file_name = FileName(groups, dp.rank(), kKinds[k].name);
        SyncedWriter file(tmp_dir + "/" + file_name);
        ZR_RETURN_IF_ERROR(file.Open());
        std::vector<float> shard;
        for (int u = 0; u < m.num_units(); ++u) {
          if (!saved(u)) continue;
          ShardedUnit& unit = m.unit(u);
          shard.resize(static_cast<size_t>(unit.layout().shard_numel()));
          ZR_RETURN_IF_ERROR(ShardManagerState(m).ReadState(u, kKinds[k].buffer, shard));
          for (const ShardPiece& piece : unit.layout().ShardPieces(unit.layout_rank())) {
            ZR_RETURN_IF_ERROR(file.Append(shard.data() + piece.shard_range.begin,
                                           piece.shard_range.size() * sizeof(float)));
          }
        }
        ZR_RETURN_IF_ERROR(file.Close());
        files[kKinds[k].name] = {
            {"name", file_name}, {"bytes", file.bytes()}, {"xxh3", ChecksumHex(file.checksum())}};
      }
      nlohmann::json pieces = nlohmann::json::array();
      nlohmann::json params = nlohmann::json::array();
      for (int u = 0; u < m.num_units(); ++u) {
        if (!saved(u)) continue;
        const FlatLayout& layout = m.unit(u).layout();
        for (const ShardPiece& piece : layout.ShardPieces(m.unit(u).layout_rank())) {
          pieces.push_back({layout.params()[piece.param].name, piece.param_range.begin,
                            piece.param_range.size()});
        }
        for (const ParamSpec& p : layout.params()) {
          if (dp.rank() != 0) break;  // the other data ranks' tables are the same
          params.push_back({{"name", p.name},
                            {"shape", p.real_shape()},
                            {"padded_shape", p.global_shape()},
                            {"split_dim", p.frame.split_dim},
                            {"groups", p.frame.groups},
                            {"unit", m.unit(u).name()},
                            {"position", position(u)}});
        }
      }
      described = {{"entry",
                    {{"rank", world.rank()},
                     {"data", dp.rank()},
                     {"tensor", groups.tensor_rank},
                     {"pipeline", groups.pipeline_rank},
                     {"pieces", pieces},
                     {"files", files}}},
                   {"params", params}};
      return absl::OkStatus();
    }();
    ZR_RETURN_IF_ERROR(Agree(m, world, local, "writing checkpoint shards"));
    ZR_ASSIGN_OR_RETURN(
        std::vector<std::string> descriptions,
        AllGatherHostStrings(world, m.device_allocator(), m.compute_stream(), described.dump()));

    // Phase 3: rank 0 writes the metadata last, then commits by renames. The parameter table is
    // the union of the writers' tables (tensor parts and data ranks describe the same parameters)
    // in model order.
    local = [&]() -> Status {
      if (world.rank() != 0) return absl::OkStatus();
      nlohmann::json params = nlohmann::json::array();
      nlohmann::json ranks = nlohmann::json::array();
      std::set<std::string> listed;
      for (const std::string& text : descriptions) {
        const nlohmann::json d = nlohmann::json::parse(text);
        if (d.is_null()) continue;
        ranks.push_back(d.at("entry"));
        for (const auto& p : d.at("params")) {
          if (listed.insert(p.at("name").get<std::string>()).second) params.push_back(p);
        }
      }
      std::stable_sort(params.begin(), params.end(), [](const auto& a, const auto& b) {
        return a.at("position").template get<int>() < b.at("position").template get<int>();
      });
      for (auto& p : params) p.erase("position");
      const nlohmann::json meta = {
          {"format_version", kCheckpointFormatVersion},
          {"run_id", state.run_id},
          {"step", state.step},
          {"run_state",
           {{"step", state.step},
            {"consumed_sequences", state.consumed_sequences},
            {"manager_steps", state.manager_steps},
            {"loss_scaler", ScalerJson(state.scaler)}}},
          {"saved_with", {{"world_size", world.size()}, {"writers", writers}}},
          {"mesh",
           {{"data", dp.size()},
            {"tensor", groups.tensor_size},
            {"pipeline", groups.pipeline_size}}},
          {"config", state.config},
          {"params", params},
          {"ranks", ranks},
      };
      const std::string text = meta.dump(1);
      ZR_RETURN_IF_ERROR(WriteAndSync(tmp_dir + "/metadata.json", text.data(), text.size()));
      std::error_code ec;
      fs::remove(tmp_dir + "/" + kRunMarker, ec);  // the metadata names the run now
      ZR_RETURN_IF_ERROR(SyncDir(tmp_dir));
      if (fs::exists(fs::symlink_status(final_dir, ec))) {  // the same step saved again
        if (!OwnedByRun(final_dir, state.run_id) &&
            !(replace_earlier_runs && OwnedByRun(final_dir, ""))) {
          return absl::AlreadyExistsError(
              StrCat(final_dir, " appeared during the save and was not written by this run"));
        }
        fs::remove_all(final_dir, ec);
      }
      fs::rename(tmp_dir, final_dir, ec);
      if (ec)
        return absl::InternalError(
            StrCat("rename ", tmp_dir, " to ", final_dir, ": ", ec.message()));
      const std::string latest_tmp = dir + "/latest.tmp";
      const std::string latest_text = name + "\n";
      ZR_RETURN_IF_ERROR(WriteAndSync(latest_tmp, latest_text.data(), latest_text.size()));
      fs::rename(latest_tmp, dir + "/latest", ec);
      if (ec) return absl::InternalError(StrCat("rename ", latest_tmp, ": ", ec.message()));
      ZR_RETURN_IF_ERROR(SyncDir(dir));
      // Rotation and cleanup, of this run's directories only: step_<N> (N as zerort writes it)
      // beyond keep_last_n, and step_<N>.tmp left by an earlier failed save.
      std::vector<std::pair<int64_t, fs::path>> steps;
      for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string n = entry.path().filename().string();
        if (n.rfind("step_", 0) != 0 || !OwnedByRun(entry.path(), state.run_id)) continue;
        const bool tmp = n.ends_with(".tmp");
        const std::string digits = n.substr(5, n.size() - 5 - (tmp ? 4 : 0));
        char* end = nullptr;
        const long long v = std::strtoll(digits.c_str(), &end, 10);
        if (digits.empty() || end == nullptr || *end != '\0' || StrCat(v) != digits) continue;
        if (tmp) {
          fs::remove_all(entry.path(), ec);
        } else {
          steps.emplace_back(v, entry.path());
        }
      }
      std::sort(steps.begin(), steps.end(), [](auto& a, auto& b) { return a.first > b.first; });
      for (size_t i = static_cast<size_t>(keep_last_n); keep_last_n > 0 && i < steps.size(); ++i) {
        if (steps[i].second.filename() == name) continue;
        fs::remove_all(steps[i].second, ec);
      }
      return absl::OkStatus();
    }();
    return Agree(m, world, local, "committing the checkpoint");
  }();
  // A failed save removes its own .tmp (rank 0 created it; nothing of it was committed).
  if (!result.ok() && world.rank() == 0 && !state.run_id.empty() &&
      OwnedByRun(tmp_dir, state.run_id)) {
    std::error_code ec;
    fs::remove_all(tmp_dir, ec);
  }
  return result;
}

StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  const std::string path = dir + "/latest";
  StatusOr<std::string> text = ReadSmallFile(dir, "latest", 256);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(StrCat(path, ": no checkpoint to resume from"));
  }
  ZR_RETURN_IF_ERROR(text.status());
  std::string name = text->substr(0, text->find('\n'));
  // step_<N>, N as zerort writes it: nothing else (no path, no "..") is followed.
  const std::string digits = name.rfind("step_", 0) == 0 ? name.substr(5) : "";
  if (digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos ||
      (digits.size() > 1 && digits[0] == '0')) {
    return absl::DataLossError(StrCat(path, ": \"", name.substr(0, 64),
                                      "\" does not name a step_<N> directory of this checkpoint"));
  }
  const std::string step_dir = dir + "/" + name;
  ZR_RETURN_IF_ERROR(ReadMetadata(step_dir).status());
  return step_dir;
}

StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& step_dir) {
  CheckpointReader r;
  r.dir_ = step_dir;
  ZR_ASSIGN_OR_RETURN(r.metadata_, ReadMetadata(step_dir));
  try {
    // Format 1: one tensor-parallel part, local == global. Format 2: every parameter's global
    // frame, and files by (data, tensor) coordinate holding local ranges of that part.
    const int tensor =
        r.metadata_.contains("mesh") ? r.metadata_["mesh"].at("tensor").get<int>() : 1;
    std::map<std::string, ParamSpec> frames;  // part 0's spec; parts differ only in `part`
    for (const auto& p : r.metadata_.at("params")) {
      const std::string name = p.at("name");
      const Shape shape = p.at("shape").get<Shape>();
      r.params_.emplace_back(name, shape);
      const Shape padded = p.contains("padded_shape") ? p["padded_shape"].get<Shape>() : shape;
      const GlobalFrame frame{.split_dim = p.value("split_dim", -1),
                              .parts = tensor,
                              .part = 0,
                              .groups = p.value("groups", 1)};
      StatusOr<ParamSpec> split = SplitParam(name, padded, true, frame);
      if (!split.ok()) {
        return absl::DataLossError(
            StrCat(step_dir, "/metadata.json: the saved frame of ", split.status().message()));
      }
      ParamSpec spec = *std::move(split);
      if (padded != shape && !shape.empty()) spec.frame.valid_rows = shape[0];
      frames.emplace(name, std::move(spec));
    }
    const nlohmann::json& ranks = r.metadata_.at("ranks");
    for (int e = 0; e < static_cast<int>(ranks.size()); ++e) {
      const int part = ranks[e].value("tensor", 0);
      int64_t file_offset = 0;
      for (const auto& piece : ranks[e].at("pieces")) {
        const std::string name = piece.at(0);
        const int64_t begin = piece.at(1), length = piece.at(2);
        auto f = frames.find(name);
        if (f == frames.end()) {
          return absl::DataLossError(
              StrCat(step_dir, "/metadata.json: piece of '", name, "', which is not in params"));
        }
        ParamSpec spec = f->second;
        const bool replicated = spec.frame.split_dim < 0 || tensor == 1;
        if (part < 0 || part >= tensor || begin < 0 || length < 0 ||
            begin + length > spec.numel()) {
          return absl::DataLossError(StrCat(step_dir, "/metadata.json: piece of '", name, "' [",
                                            begin, ", +", length, ") of part ", part,
                                            " is outside it"));
        }
        // A replicated parameter is saved by every tensor-parallel part: part 0's copy is read.
        if (!replicated || part == 0) {
          spec.frame.part = replicated ? 0 : part;
          for (const GlobalRun& run : RealGlobalRuns(spec, begin, begin + length)) {
            r.where_[name].push_back(
                {e, run.global, run.length, file_offset + (run.local - begin)});
          }
        }
        file_offset += length;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(StrCat(step_dir, "/metadata.json: ", e.what()));
  }
  for (auto& [name, saved] : r.where_) {
    std::sort(saved.begin(), saved.end(),
              [](const Saved& a, const Saved& b) { return a.offset < b.offset; });
    for (size_t i = 1; i < saved.size(); ++i) {
      if (saved[i].offset < saved[i - 1].offset + saved[i - 1].length) {
        return absl::DataLossError(StrCat(step_dir, "/metadata.json: element ", saved[i].offset,
                                          " of '", name, "' is stored twice"));
      }
    }
  }
  // The pieces tile every parameter: disjoint (above) and covering it, so no hole is ever read
  // as zeros (lengths that add up but leave a gap are caught here).
  for (const auto& [name, shape] : r.params_) {
    int64_t covered = 0;
    if (auto it = r.where_.find(name); it != r.where_.end()) {
      for (const Saved& saved : it->second) covered += saved.length;
    }
    if (covered != NumElements(shape)) {
      return absl::DataLossError(StrCat(step_dir, "/metadata.json: the pieces of '", name,
                                        "' cover ", covered, " of its ", NumElements(shape),
                                        " elements"));
    }
  }
  return r;
}

struct CheckpointReader::OpenFile {
  int fd = -1;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

bool CheckpointReader::HasKind(const std::string& kind) const {
  const nlohmann::json& ranks = metadata_.at("ranks");
  return !ranks.empty() && ranks[0].at("files").contains(kind);
}

Status CheckpointReader::Verify(int rank_entry, const std::string& kind) {
  if (verified_.contains({rank_entry, kind})) return absl::OkStatus();
  const nlohmann::json& files = metadata_.at("ranks")[rank_entry].at("files");
  if (!files.contains(kind)) {
    return absl::InvalidArgumentError(StrCat(dir_, " holds no ", kind,
                                             " state (saved with another optimizer?), which this "
                                             "run's optimizer needs"));
  }
  ZR_RETURN_IF_ERROR(VerifyFile(dir_, files.at(kind)));
  verified_.insert({rank_entry, kind});
  return absl::OkStatus();
}

StatusOr<std::vector<float>> CheckpointReader::Read(const std::string& name,
                                                    const std::string& kind, int64_t begin,
                                                    int64_t end) {
  int64_t covered = 0;
  auto it = where_.find(name);
  if (it == where_.end()) {
    return absl::InvalidArgumentError(
        StrCat(dir_, " has no parameter '", name, "' (a different model?)"));
  }
  // The files of the range are verified (sizes and checksums) before its memory is allocated:
  // metadata cannot make zerort allocate more than the checkpoint's own files hold.
  for (const Saved& saved : it->second) {
    if (saved.offset < end && saved.offset + saved.length > begin) {
      ZR_RETURN_IF_ERROR(Verify(saved.rank_entry, kind));
    }
  }
  std::vector<float> out(static_cast<size_t>(end - begin));
  try {
    // The first run that ends after `begin`; runs are sorted and disjoint.
    const std::vector<Saved>& runs = it->second;
    auto first = std::partition_point(runs.begin(), runs.end(), [&](const Saved& saved) {
      return saved.offset + saved.length <= begin;
    });
    for (auto run = first; run != runs.end() && run->offset < end; ++run) {
      const Saved& saved = *run;
      const int64_t lo = std::max(begin, saved.offset);
      const int64_t hi = std::min(end, saved.offset + saved.length);
      if (lo >= hi) continue;
      ZR_RETURN_IF_ERROR(Verify(saved.rank_entry, kind));
      const std::string path = dir_ + "/" +
                               metadata_.at("ranks")[saved.rank_entry]
                                   .at("files")
                                   .at(kind)
                                   .at("name")
                                   .get<std::string>();
      std::shared_ptr<OpenFile>& file = open_[{saved.rank_entry, kind}];
      if (file == nullptr) {
        const nlohmann::json& entry = metadata_.at("ranks")[saved.rank_entry].at("files").at(kind);
        auto opened = std::make_shared<OpenFile>();
        ZR_ASSIGN_OR_RETURN(opened->fd,
                            OpenCheckpointFile(dir_, entry.at("name").get<std::string>(),
                                               entry.at("bytes").get<int64_t>()));
        file = std::move(opened);
      }
      const size_t bytes = static_cast<size_t>(hi - lo) * sizeof(float);
      const off_t at = static_cast<off_t>((saved.file_offset + (lo - saved.offset)) * 4);
      const ssize_t n = ::pread(file->fd, out.data() + (lo - begin), bytes, at);
      if (n != static_cast<ssize_t>(bytes)) {
        return n < 0 ? ErrnoError(StrCat("read ", path), errno)
                     : absl::DataLossError(StrCat(path, ": short read"));
      }
      covered += hi - lo;
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(StrCat(dir_, "/metadata.json: ", e.what()));
  }
  if (covered != end - begin) {
    return absl::DataLossError(StrCat(dir_, ": the ", kind, " of '", name, "' [", begin, ", ", end,
                                      ") is not fully stored"));
  }
  return out;
}

StatusOr<std::vector<float>> CheckpointReader::ReadAll(const std::string& name,
                                                       const std::string& kind) {
  for (const auto& [n, shape] : params_) {
    if (n == name) return Read(name, kind, 0, NumElements(shape));
  }
  return absl::InvalidArgumentError(
      StrCat(dir_, " has no parameter '", name, "' (a different model?)"));
}

StatusOr<RunState> LoadCheckpoint(const std::string& step_dir, ShardManager& m,
                                  const CheckpointGroups& groups) {
  // Phase 1 (no collectives): read and verify this rank's shards and install them one unit at a
  // time (master, moments, and the compute values cast from the master). Pieces are read by
  // their global positions, so any data x tensor layout loads any other.
  RunState state;
  Status local = [&]() -> Status {
    ZR_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
    try {
      const nlohmann::json& rs = reader.metadata().at("run_state");
      state.step = rs.at("step");
      state.consumed_sequences = rs.at("consumed_sequences");
      state.manager_steps = rs.at("manager_steps");
      state.scaler = ScalerFromJson(rs.at("loss_scaler"));
      state.config = reader.metadata().at("config");
      if (reader.metadata().contains("run_id")) {
        state.run_id = reader.metadata()["run_id"].get<std::string>();
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(StrCat(step_dir, "/metadata.json: ", e.what()));
    }
    std::map<std::string, Shape> shapes(reader.params().begin(), reader.params().end());
    for (int u = 0; u < m.num_units(); ++u) {
      ShardedUnit& unit = m.unit(u);
      const FlatLayout& layout = unit.layout();
      for (const ParamSpec& p : layout.params()) {
        auto s = shapes.find(p.name);
        if (s == shapes.end()) {
          return absl::InvalidArgumentError(
              StrCat(step_dir, " has no parameter '", p.name, "' (a different model?)"));
        }
        if (s->second != p.real_shape()) {
          return absl::InvalidArgumentError(
              StrCat(step_dir, ": parameter '", p.name, "' has shape ",
                     fmt::format("{}", fmt::join(s->second, "x")), ", this model's is ",
                     fmt::format("{}", fmt::join(p.real_shape(), "x"))));
        }
      }
      for (int k = kNumKinds - 1; k >= 0; --k) {
        if (!m.optimizer().HasState(kKinds[k].buffer)) continue;
        std::vector<float> shard(static_cast<size_t>(layout.shard_numel()), 0.0f);
        for (const ShardPiece& piece : layout.ShardPieces(unit.layout_rank())) {
          const ParamSpec& p = layout.params()[piece.param];
          // Padding rows are not stored: they stay zero.
          for (const GlobalRun& run :
               RealGlobalRuns(p, piece.param_range.begin, piece.param_range.end)) {
            ZR_ASSIGN_OR_RETURN(
                std::vector<float> values,
                reader.Read(p.name, kKinds[k].name, run.global, run.global + run.length));
            std::copy(
                values.begin(), values.end(),
                shard.begin() + piece.shard_range.begin + (run.local - piece.param_range.begin));
          }
        }
        ZR_RETURN_IF_ERROR(ShardManagerState(m).LoadState(u, kKinds[k].buffer, shard));
      }
    }
    return absl::OkStatus();
  }();
  ZR_RETURN_IF_ERROR(Agree(m, *groups.world, local, StrCat("loading ", step_dir)));
  // Phase 2 (collective where the stage all-gathers): the full compute parameters.
  ZR_RETURN_IF_ERROR(ShardManagerState(m).RefreshComputeCopies());
  ZR_RETURN_IF_ERROR(ShardManagerState(m).RestoreCounters(state.manager_steps, state.scaler));
  return state;
}

StatusOr<CheckpointSummary> InspectCheckpoint(const std::string& step_dir) {
  CheckpointSummary out;
  out.dir = step_dir;
  // What the loaders would refuse in the metadata (types, ranges, tiling), refused here too.
  ZR_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  out.metadata = reader.metadata();
  try {
    for (const auto& rank : out.metadata.at("ranks")) {
      for (const auto& [kind, entry] : rank.at("files").items()) {
        const int64_t bytes = entry.at("bytes");
        out.bytes += bytes;
        const Status verified = VerifyFile(step_dir, entry);
        out.ok = out.ok && verified.ok();
        out.files.push_back(StrCat(entry.at("name").get<std::string>(), ": ", bytes, " bytes, ",
                                   verified.ok() ? "checksum ok" : verified.message()));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(StrCat(step_dir, "/metadata.json: ", e.what()));
  }
  return out;
}

}  // namespace zerort
