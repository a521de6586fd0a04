// Sharded checkpoints: loading, logical addressing, verification (the save's phases are
// checkpoint_save.cc).
#include "zerort/checkpoint/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "zerort/checkpoint/checkpoint_files.h"
#include "zerort/checkpoint/checkpoint_protocol.h"
#include "zerort/checkpoint/config_match.h"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"
#include "zerort/sharding/manager_state.h"

namespace zerort {
namespace fs = std::filesystem;
namespace {

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

// Every rank learns whether every rank succeeded, and gets the first failing rank's message (so
// the error names the damaged file on every rank, not only where it was read).
Status AgreeOnCheckpoint(ShardManager& m, Communicator& group, const Status& local,
                         std::string_view what) {
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

StatusOr<std::string> ResolveStepDir(const std::string& checkpoint) {
  if (fs::exists(checkpoint + "/metadata.json")) return checkpoint;
  if (fs::exists(checkpoint + "/latest")) return LatestCheckpoint(checkpoint);
  return absl::NotFoundError(StrCat(checkpoint,
                                    ": neither a checkpoint step directory (with "
                                    "metadata.json) nor a checkpoint directory (with "
                                    "latest)"));
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
      state.applied_steps = rs.at("manager_steps");
      state.scaler = ScalerFromJson(rs.at("loss_scaler"));
      state.config = reader.metadata().value("config", nlohmann::json());
      state.user = reader.metadata().value("user", nlohmann::json());
      state.hf_config = reader.metadata().value("hf_config", nlohmann::json());
      if (reader.metadata().contains("run_id")) {
        state.run_id = reader.metadata()["run_id"].get<std::string>();
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::DataLossError(StrCat(step_dir, "/metadata.json: ", e.what()));
    }
    std::map<std::string, Shape> shapes(reader.params().begin(), reader.params().end());
    // [Note: 1-bit LAMB]: a checkpoint of another optimizer lacks v_fresh and the frozen
    // coefficients, which only a step after the warm-up reads.
    const OptimizerOptions& opt = m.options().optimizer;
    const bool lamb_compressing =
        opt.kind == OptimizerKind::kOneBitLamb && OneBitCompressing(opt, state.applied_steps + 1);
    std::map<std::string, const nlohmann::json*> lamb_saved;
    for (const auto& p : reader.metadata().at("params")) {
      if (opt.kind == OptimizerKind::kOneBitLamb && p.contains("onebit_lamb"))
        lamb_saved[p.at("name").get<std::string>()] = &p["onebit_lamb"];
    }
    for (int u = 0; u < m.num_units(); ++u) {
      const ShardedUnit& unit = m.unit(u);
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
        if (kKinds[k].buffer == StateKind::kExpAvgSqFresh && !lamb_compressing &&
            !reader.HasKind(kKinds[k].name)) {
          ZR_RETURN_IF_ERROR(ShardManagerState(m).LoadState(u, kKinds[k].buffer, shard));
          continue;  // zeros, as DeepSpeed's until freeze_step copies the variance
        }
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
      const std::span<OneBitLambParam> scalars = m.optimizer().LambParams(u);
      for (size_t i = 0; i < scalars.size(); ++i) {
        const std::string& name = layout.params()[i].name;
        auto saved = lamb_saved.find(name);
        if (saved == lamb_saved.end()) {
          if (lamb_compressing) {
            return absl::InvalidArgumentError(
                StrCat(step_dir, " holds no 1-bit LAMB coefficients for '", name,
                       "' (saved with another optimizer?), which a resume after freeze_step (step ",
                       state.applied_steps,
                       ") needs: resume it before freeze_step or with its optimizer"));
          }
          scalars[i] = OneBitLambParam{};
          continue;
        }
        const nlohmann::json& v = *saved->second;
        scalars[i] = OneBitLambParam{.coeff_freeze = v[0].get<float>(),
                                     .last_factor = v[1].get<float>(),
                                     .scaling = v[2].get<float>()};
      }
    }
    return absl::OkStatus();
  }();
  ZR_RETURN_IF_ERROR(AgreeOnCheckpoint(m, *groups.world, local, StrCat("loading ", step_dir)));
  // Phase 2 (collective where the stage all-gathers): the full compute parameters.
  ZR_RETURN_IF_ERROR(ShardManagerState(m).RefreshComputeCopies());
  ZR_RETURN_IF_ERROR(ShardManagerState(m).RestoreCounters(state.applied_steps, state.scaler));
  return state;
}

StatusOr<CheckpointSummary> InspectCheckpoint(const std::string& step_dir) {
  CheckpointSummary out;
  out.dir = step_dir;
  // What the loaders would refuse in the metadata (types, ranges, tiling), refused here too.
  ZR_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(step_dir));
  out.metadata = reader.metadata();
  const Status params = CheckSavedParams(out.metadata, reader.params(), step_dir);
  if (!params.ok()) out.params = std::string(params.message());
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
