// Saving a sharded checkpoint as named phases (PyTorch's distributed checkpoint saver plans,
// writes, finishes): prepare the step directory (rank 0), write shards (every writer), commit the
// metadata and the renames (rank 0), rotate (rank 0); every phase ends with an agreement over the
// world, so a failure anywhere stops every rank before the next phase and names the failing rank.
// A failed save removes its own .tmp; nothing committed is ever touched but by rotation.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "zerort/checkpoint/checkpoint.h"
#include "zerort/checkpoint/checkpoint_files.h"
#include "zerort/checkpoint/checkpoint_protocol.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/manager_state.h"

namespace zerort {
namespace fs = std::filesystem;
namespace {

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
constexpr char kMetadata[] = "metadata.json";

// [Note: a kill at any instant]
// `kill -9` can land between any two system calls of a save, and the run's next save (after
// --resume, with the same run id) must then clear what the killed one left rather than refuse it
// as somebody else's. Each instant leaves a directory that still says whose it is:
// - step_<N>.tmp made, its marker not yet created: an empty directory. Nothing is lost by
//   removing one (rmdir removes only an empty directory), so an empty one is never in the way.
// - the marker created, its line not yet written in full: a marker without its newline whose
//   text begins the run's id, alone in its directory (nothing else is written before it). Any
//   zerort run's id is 16 hex digits, so for an earlier run (an empty `run_id` below) the text
//   must be fewer hex digits than that. A cut marker beside anything else is nobody's.
// - a removal half done: RemoveStepDirectory deletes the evidence (metadata.json, the marker)
//   last, so a half-removed directory is still recognised; only an empty one is left at the end,
//   and rotation removes empty step directories.
// tests/cli/checkpoint_crash_test.py kills a save at each of its system calls in turn and resumes;
// CheckpointTest.KilledSavesAreCleared builds each of these leftovers by hand.

// Whether `marker`, the text of directory `dir`'s marker file, names run `run_id` (any run when
// it is empty).
bool MarkerNamesRun(const fs::path& dir, const std::string& marker, const std::string& run_id) {
  const size_t newline = marker.find('\n');
  if (newline != std::string::npos) {
    return run_id.empty() || marker.substr(0, newline) == run_id;
  }
  // Written in part by a save that was killed: then it is all the directory holds.
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  const fs::directory_iterator end;
  if (ec || it == end || it->path().filename() != kRunMarker) return false;
  it.increment(ec);
  if (ec || it != end) return false;
  if (!run_id.empty()) return run_id.starts_with(marker);
  return marker.size() < 16 && std::all_of(marker.begin(), marker.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) != 0;
         });
}

// Whether `path` (a step_<N> or step_<N>.tmp directory, not a link) was written by run `run_id`:
// its marker says so, or its metadata's run_id does.
// An empty `run_id` matches any zerort-written directory (a marker, or metadata with a format
// version): the earlier runs a user told a new run to overwrite.
bool OwnedByRun(const fs::path& path, const std::string& run_id) {
  std::error_code ec;
  if (fs::is_symlink(path, ec) || !fs::is_directory(path, ec)) return false;
  // Read as untrusted files: no link followed, regular files only, bounded.
  if (StatusOr<std::string> marker = ReadSmallFile(path.string(), kRunMarker, 64); marker.ok()) {
    return MarkerNamesRun(path, *marker, run_id);
  }
  StatusOr<std::string> text = ReadSmallFile(path.string(), kMetadata, kMaxMetadataBytes);
  if (!text.ok()) return false;
  StatusOr<nlohmann::json> j = ParseMetadataText(*text, (path / kMetadata).string());
  if (!j.ok() || !j->contains("format_version")) return false;
  if (run_id.empty()) return true;
  return j->contains("run_id") && (*j)["run_id"].is_string() &&
         (*j)["run_id"].get<std::string>() == run_id;
}

// An empty directory, not a link: what a save killed right after its mkdir leaves.
bool EmptyDirectory(const fs::path& path) {
  std::error_code ec;
  return !fs::is_symlink(path, ec) && fs::is_directory(path, ec) && fs::is_empty(path, ec) && !ec;
}

// Removes a step directory that OwnedByRun said is this run's, its evidence last ([Note: a kill
// at any instant]). Errors are ignored as before: what is left is still recognised next time.
void RemoveStepDirectory(const fs::path& path) {
  std::error_code ec;
  std::vector<fs::path> others;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    const std::string n = entry.path().filename().string();
    if (n != kMetadata && n != kRunMarker) others.push_back(entry.path());
  }
  for (const fs::path& p : others) fs::remove_all(p, ec);
  fs::remove(path / kMetadata, ec);
  fs::remove(path / kRunMarker, ec);
  fs::remove(path, ec);
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

// Which ranks write, in the layouts' frame: all of them, or rank 0 alone at stage 0.
int Writers(ShardManager& m) { return m.unit(0).layout().dp_size(); }

nlohmann::json ScalerJson(const LossScaler::State& s) {
  return {{"scale", s.scale},         {"hysteresis_left", s.hysteresis_left},
          {"iteration", s.iteration}, {"last_overflow_iteration", s.last_overflow_iteration},
          {"skipped", s.skipped},     {"consecutive_skips", s.consecutive_skips}};
}

// One save: the phases in order, each followed by the world's agreement.
class CheckpointSave {
 public:
  CheckpointSave(const std::string& dir, const RunState& state, ShardManager& m,
                 const CheckpointGroups& groups, int keep_last_n, bool replace_earlier_runs)
      : dir_(dir),
        state_(state),
        m_(m),
        groups_(groups),
        world_(*groups.world),
        dp_(*groups.dp),
        keep_last_n_(keep_last_n),
        replace_earlier_runs_(replace_earlier_runs),
        name_(StrCat("step_", state.step)),
        final_dir_(dir + "/" + name_),
        tmp_dir_(final_dir_ + ".tmp"),
        writers_(Writers(m)) {}

  Status Run() {
    const bool leader = world_.rank() == 0;
    ZR_RETURN_IF_ERROR(Agree(leader ? PrepareStepDirectory() : absl::OkStatus(),
                             "creating the checkpoint directory"));
    const Status result = [&]() -> Status {
      nlohmann::json described;  // null for a rank that writes nothing
      ZR_RETURN_IF_ERROR(Agree(WriteShards(described), "writing checkpoint shards"));
      ZR_ASSIGN_OR_RETURN(const std::vector<std::string> descriptions,
                          AllGatherHostStrings(world_, m_.device_allocator(), m_.compute_stream(),
                                               described.dump()));
      Status committed = absl::OkStatus();
      if (leader) committed = CommitMetadata(descriptions);
      if (leader && committed.ok()) committed = Rotate();
      return Agree(committed, "committing the checkpoint");
    }();
    if (!result.ok()) Abort();
    return result;
  }

 private:
  Status Agree(const Status& local, std::string_view what) {
    return AgreeOnCheckpoint(m_, world_, local, what);
  }
  // This run's, or with replace_earlier_runs any zerort run's (never a user's); an empty
  // directory holds nothing to lose ([Note: a kill at any instant]).
  bool Replaceable(const std::string& path) const {
    return EmptyDirectory(path) || OwnedByRun(path, state_.run_id) ||
           (replace_earlier_runs_ && OwnedByRun(path, ""));
  }
  Status PrepareStepDirectory();
  Status WriteShards(nlohmann::json& described);
  Status CommitMetadata(const std::vector<std::string>& descriptions);
  Status Rotate();
  void Abort();

  const std::string& dir_;
  const RunState& state_;
  ShardManager& m_;
  const CheckpointGroups& groups_;
  Communicator& world_;
  Communicator& dp_;
  const int keep_last_n_;
  const bool replace_earlier_runs_;
  const std::string name_, final_dir_, tmp_dir_;
  const int writers_;
};

// Rank 0: this run's stale .tmp of a crashed save is discarded; a step_<N>(.tmp) of anything else
// in the way is an error, before anything is written. The new .tmp carries the run's marker.
Status CheckpointSave::PrepareStepDirectory() {
  if (state_.run_id.empty()) {
    return absl::InvalidArgumentError("SaveCheckpoint: RunState.run_id is empty (NewRunId)");
  }
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return absl::InternalError(StrCat("create ", dir_, ": ", ec.message()));
  for (const std::string& in_way : {tmp_dir_, final_dir_}) {
    if (fs::exists(fs::symlink_status(in_way, ec)) && !Replaceable(in_way)) {
      return absl::AlreadyExistsError(
          StrCat(in_way, " exists and was not written by this run (run id ", state_.run_id,
                 "): move it away or choose another checkpoint.dir; zerort deletes only "
                 "what it wrote"));
    }
  }
  if (fs::exists(fs::symlink_status(tmp_dir_, ec))) RemoveStepDirectory(tmp_dir_);
  const bool made = fs::create_directory(tmp_dir_, ec);
  if (ec || !made) {
    return absl::InternalError(
        StrCat("create ", tmp_dir_, ": ", ec ? ec.message() : "a leftover could not be removed"));
  }
  const std::string marker = state_.run_id + "\n";
  return WriteAndSync(tmp_dir_ + "/" + kRunMarker, marker.data(), marker.size());
}

// Each writer writes its pieces of each state, in unit and piece order, one unit's shard in
// memory at a time (read from whichever tier holds it). Every tensor-parallel rank and pipeline
// stage writes its own parts; a tied unit's twin (not counted in the norm) is skipped. Each
// writer describes what it wrote: its file entry and its units' parameter table.
Status CheckpointSave::WriteShards(nlohmann::json& described) {
  if (dp_.rank() >= writers_ || groups_.replica_rank > 0) return absl::OkStatus();
  auto saved = [&](int u) { return m_.unit_options(u).counts_in_norm; };
  auto position = [&](int u) {
    return groups_.unit_positions.empty() ? u : groups_.unit_positions.at(static_cast<size_t>(u));
  };
  nlohmann::json files = nlohmann::json::object();
  for (int k = 0; k < kNumKinds; ++k) {
    if (!m_.optimizer().HasState(kKinds[k].buffer)) continue;
    const std::string file_name = FileName(groups_, dp_.rank(), kKinds[k].name);
    SyncedWriter file(tmp_dir_ + "/" + file_name);
    ZR_RETURN_IF_ERROR(file.Open());
    std::vector<float> shard;
    for (int u = 0; u < m_.num_units(); ++u) {
      if (!saved(u)) continue;
      const ShardedUnit& unit = m_.unit(u);
      shard.resize(static_cast<size_t>(unit.layout().shard_numel()));
      ZR_RETURN_IF_ERROR(ShardManagerState(m_).ReadState(u, kKinds[k].buffer, shard));
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
  for (int u = 0; u < m_.num_units(); ++u) {
    if (!saved(u)) continue;
    const FlatLayout& layout = m_.unit(u).layout();
    for (const ShardPiece& piece : layout.ShardPieces(m_.unit(u).layout_rank())) {
      pieces.push_back(
          {layout.params()[piece.param].name, piece.param_range.begin, piece.param_range.size()});
    }
    const std::span<const OneBitLambParam> lamb = m_.optimizer().LambParams(u);
    for (size_t i = 0; i < layout.params().size(); ++i) {
      if (dp_.rank() != 0) break;  // the other data ranks' tables are the same
      const ParamSpec& p = layout.params()[i];
      params.push_back({{"name", p.name},
                        {"shape", p.real_shape()},
                        {"padded_shape", p.global_shape()},
                        {"split_dim", p.frame.split_dim},
                        {"groups", p.frame.groups},
                        {"unit", m_.unit(u).name()},
                        {"position", position(u)}});
      if (!lamb.empty()) {  // [Note: 1-bit LAMB]: alike on every data rank at stage 0
        params.back()["onebit_lamb"] = {lamb[i].coeff_freeze, lamb[i].last_factor, lamb[i].scaling};
      }
    }
  }
  described = {{"entry",
                {{"rank", world_.rank()},
                 {"data", dp_.rank()},
                 {"tensor", groups_.tensor_rank},
                 {"pipeline", groups_.pipeline_rank},
                 {"pieces", pieces},
                 {"files", files}}},
               {"params", params}};
  return absl::OkStatus();
}

// Rank 0 writes the metadata last, then commits by renames: the step directory, then `latest`.
// The parameter table is the union of the writers' tables (tensor parts and data ranks describe
// the same parameters) in model order.
Status CheckpointSave::CommitMetadata(const std::vector<std::string>& descriptions) {
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
  nlohmann::json meta = {
      {"format_version", kCheckpointFormatVersion},
      {"run_id", state_.run_id},
      {"step", state_.step},
      {"run_state",
       {{"step", state_.step},
        {"consumed_sequences", state_.consumed_sequences},
        {"manager_steps", state_.applied_steps},
        {"loss_scaler", ScalerJson(state_.scaler)}}},
      {"saved_with", {{"world_size", world_.size()}, {"writers", writers_}}},
      {"mesh",
       {{"data", dp_.size()},
        {"tensor", groups_.tensor_size},
        {"pipeline", groups_.pipeline_size}}},
      {"config", state_.config},
      {"params", params},
      {"ranks", ranks},
  };
  if (!state_.user.is_null()) meta["user"] = state_.user;
  if (!state_.hf_config.is_null()) meta["hf_config"] = state_.hf_config;
  const std::string text = meta.dump(1);
  ZR_RETURN_IF_ERROR(WriteAndSync(tmp_dir_ + "/" + kMetadata, text.data(), text.size()));
  std::error_code ec;
  fs::remove(tmp_dir_ + "/" + kRunMarker, ec);  // the metadata names the run now
  ZR_RETURN_IF_ERROR(SyncDir(tmp_dir_));
  if (fs::exists(fs::symlink_status(final_dir_, ec))) {  // the same step saved again
    if (!Replaceable(final_dir_)) {
      return absl::AlreadyExistsError(
          StrCat(final_dir_, " appeared during the save and was not written by this run"));
    }
    RemoveStepDirectory(final_dir_);
  }
  fs::rename(tmp_dir_, final_dir_, ec);
  if (ec) {
    return absl::InternalError(StrCat("rename ", tmp_dir_, " to ", final_dir_, ": ", ec.message()));
  }
  const std::string latest_tmp = dir_ + "/latest.tmp";
  const std::string latest_text = name_ + "\n";
  ZR_RETURN_IF_ERROR(WriteAndSync(latest_tmp, latest_text.data(), latest_text.size()));
  fs::rename(latest_tmp, dir_ + "/latest", ec);
  if (ec) return absl::InternalError(StrCat("rename ", latest_tmp, ": ", ec.message()));
  return SyncDir(dir_);
}

// Rank 0, after the commit: this run's directories only, step_<N> (N as zerort writes it)
// beyond keep_last_n, and step_<N>.tmp left by an earlier failed save; and any empty
// step_<N>(.tmp), which holds nothing ([Note: a kill at any instant]).
Status CheckpointSave::Rotate() {
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind("step_", 0) != 0) continue;
    const bool tmp = n.ends_with(".tmp");
    const std::string digits = n.substr(5, n.size() - 5 - (tmp ? 4 : 0));
    char* end = nullptr;
    const long long v = std::strtoll(digits.c_str(), &end, 10);
    if (digits.empty() || end == nullptr || *end != '\0' || StrCat(v) != digits) continue;
    if (EmptyDirectory(entry.path())) {  // the end of a removal a kill cut short
      fs::remove(entry.path(), ec);
      continue;
    }
    if (!OwnedByRun(entry.path(), state_.run_id)) continue;
    if (tmp) {
      RemoveStepDirectory(entry.path());
    } else {
      steps.emplace_back(v, entry.path());
    }
  }
  std::sort(steps.begin(), steps.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(keep_last_n_); keep_last_n_ > 0 && i < steps.size(); ++i) {
    if (steps[i].second.filename() == name_) continue;
    RemoveStepDirectory(steps[i].second);
  }
  return absl::OkStatus();
}

// A failed save removes its own .tmp (rank 0 created it; nothing of it was committed).
void CheckpointSave::Abort() {
  if (world_.rank() == 0 && !state_.run_id.empty() &&
      (EmptyDirectory(tmp_dir_) || OwnedByRun(tmp_dir_, state_.run_id))) {
    RemoveStepDirectory(tmp_dir_);
  }
}

}  // namespace

Status SaveCheckpoint(const std::string& dir, const RunState& state, ShardManager& m,
                      const CheckpointGroups& groups, int keep_last_n, bool replace_earlier_runs) {
  return CheckpointSave(dir, state, m, groups, keep_last_n, replace_earlier_runs).Run();
}

}  // namespace zerort
