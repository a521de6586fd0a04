// Sharded checkpoints (docs/design.md, "Data, checkpoints, metrics").
//
// Layout of `dir`:
//   step_<N>/metadata.json        written last: format version, step, config (null from an
//                                 embedder, with its own `user` JSON instead), the run state
//                                 (steps taken, consumed sequences, loss scaler), the mesh
//                                 (data x tensor x pipeline sizes), the parameter table in model
//                                 order (name, real global shape, padded shape, split dimension,
//                                 groups: the global frame), and per file its mesh coordinate,
//                                 size, XXH3-64 checksum and pieces (parameter, offset, length in
//                                 that part's local frame)
//   step_<N>/dp<r>-tp<t>.master.bin  fp32 master values of the pieces of data rank r, tensor part t
//                                 (pp<s>-dp<r>-tp<t>.* when the run had pipeline stages: stage s)
//   step_<N>/dp<r>-tp<t>.exp_avg.bin  the first moment (Adam) or momentum (SGD), same pieces
//   step_<N>/dp<r>-tp<t>.exp_avg_sq.bin  Adam's second moment, same pieces
//   latest                        "step_<N>": the newest complete checkpoint
// Pieces are addressed logically: a local range of a tensor-parallel part is, through the
// parameter's global frame, a set of N-dimensional boxes of the global tensor (one contiguous
// global run per ContiguousRun elements: a row-parallel weight's local rows are strided), so a
// checkpoint loads at any world size, ZeRO stage, tensor-parallel and pipeline size. Padding rows
// (a padded vocabulary) are never stored; replicated parameters are read from part 0; a unit tied
// across pipeline stages (the embedding on the first and last stage) is written once, by the
// member that counts it in the norm (the first stage), and every holder loads it by name. At stage
// 0 every data rank holds the same state and data rank 0 alone writes it (each tensor part and
// pipeline stage its own). Format 1 (files rank<r>.*.bin, one part, local == global) still loads.
//
// Commit protocol: rank 0 creates step_<N>.tmp/ with a marker naming the run (.zerort-run);
// every rank writes its files there and fsyncs them; each writer's file entry (sizes, checksums,
// pieces) and parameter table are gathered to world rank 0, which writes metadata.json (with the
// run id) and fsyncs it, then drops the marker; all ranks agree that every write succeeded; rank 0
// renames step_<N>.tmp to step_<N>, then replaces `latest` by a rename, and removes this run's
// step directories beyond keep_last_n. A crash at any point leaves the previous checkpoint and
// `latest` intact; directories without valid metadata (*.tmp) are never loaded. Whatever a
// `kill -9` at any instant leaves still says whose it is (a half-written marker, a removal that
// deletes the marker and metadata last, an empty directory), so the resumed run's next save
// clears it (checkpoint_save.cc, [Note: a kill at any instant]).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "zerort/runtime/communicator.h"
#include "zerort/sharding/loss_scaler.h"
#include "zerort/sharding/shard_manager.h"

namespace zerort {

// 2: files by mesh coordinate and every parameter's global frame; format 1 still loads.
inline constexpr int kCheckpointFormatVersion = 2;

// The groups a checkpoint is saved and loaded over: the world (every rank agrees on success),
// the data-parallel group (whose ranks hold different shards) and this rank's tensor-parallel and
// pipeline coordinates. Without model parallelism world and dp are the same group.
struct CheckpointGroups {
  Communicator* world = nullptr;
  Communicator* dp = nullptr;
  int tensor_size = 1;
  int tensor_rank = 0;
  int pipeline_size = 1;
  int pipeline_rank = 0;
  // The model-wide position of each of this rank's units (a pipeline stage holds some of the
  // model's units), so that the metadata lists parameters in model order whatever the split.
  // Empty: the units' own order.
  std::vector<int> unit_positions;
  // Hybrid sharding ([Note: hybrid sharding]): `dp` is the shard group and this is the rank's
  // index in its replicate group; the replicas hold the same shards, so replica 0 alone writes.
  int replica_rank = 0;
};

// What a resumed run needs besides the shards.
struct RunState {
  // The trainer's step: steps of the run so far, skipped ones included (the LR schedule's clock;
  // names the directory step_<step>).
  int64_t step = 0;
  int64_t consumed_sequences = 0;  // global training sequences consumed (the data position)
  // Optimizer updates applied: the shard manager's count, without the steps skipped on an fp16
  // overflow (Adam's bias correction counts these). "manager_steps" in metadata.json.
  int64_t applied_steps = 0;
  LossScaler::State scaler;
  // The resolved run config that wrote it (zerort train); null in an embedder's checkpoint
  // (checkpoint/manager_checkpoint.h), which has no model config.
  nlohmann::json config;
  // An embedder's own JSON (anything it wants back on load); null for zerort train.
  nlohmann::json user;
  // The Hugging Face config.json the run's weights came from (model.init_from, or `checkpoint
  // import`), kept through resumes so that `checkpoint export` writes its keys back (bos and eos
  // ids, max_position_embeddings, rope_scaling, sliding_window, ...); null otherwise.
  nlohmann::json hf_config;
  // The run's id (checkpoint/run_dir.h NewRunId; kept on resume): rotation and the cleanup of a
  // failed save delete only step directories that carry it. Required by SaveCheckpoint; "" when
  // loaded from a checkpoint written before ids existed.
  std::string run_id;
};

// Collective over the world. Writes dir/step_<state.step> and moves `latest` to it. Deletes only
// directories of this run (state.run_id): an older step_<N> beyond keep_last_n, its own leftover
// step_<N>.tmp, the same step saved again; a failed save removes its own .tmp. A step_<N> or
// step_<N>.tmp of another run (or a user's) in the way is an error (AlreadyExists) naming it;
// with replace_earlier_runs (`zerort train --overwrite`) an earlier zerort run's is replaced,
// a user's never.
Status SaveCheckpoint(const std::string& dir, const RunState& state, ShardManager& manager,
                      const CheckpointGroups& groups, int keep_last_n,
                      bool replace_earlier_runs = false);

// The step directory `latest` names, after checking that its metadata parses.
StatusOr<std::string> LatestCheckpoint(const std::string& dir);

// `checkpoint` is a step directory (with metadata.json) or a checkpoint directory (its `latest`).
StatusOr<std::string> ResolveStepDir(const std::string& checkpoint);

// Whether a checkpoint's metadata.json was written by a trainer that embeds zerort
// (checkpoint/manager_checkpoint.h): `config` null or absent, where zerort train writes its run
// config. export and train --resume refuse such a checkpoint; inspect prints its `user` JSON.
inline bool SavedByEmbedder(const nlohmann::json& metadata) {
  return metadata.value("config", nlohmann::json()).is_null();
}

// Collective over the world: fills every unit's master and optimizer state from `step_dir`
// (checksums verified for every file read; a truncated or corrupted file is refused naming it),
// whatever data x tensor layout saved it, and restores the manager's counters. Returns the run
// state stored with it.
StatusOr<RunState> LoadCheckpoint(const std::string& step_dir, ShardManager& manager,
                                  const CheckpointGroups& groups);

// Reads a step directory by parameter name: any element range (of the real global tensor) of any
// parameter's master or moment, wherever (whichever rank's file, whichever part) it was saved. Each
// file's size and checksum are verified once, streaming, before its first use; then only the needed
// bytes are read.
class CheckpointReader {
 public:
  static StatusOr<CheckpointReader> Open(const std::string& step_dir);

  const nlohmann::json& metadata() const { return metadata_; }
  const std::string& dir() const { return dir_; }
  // Parameter names and shapes in saved order.
  const std::vector<std::pair<std::string, Shape>>& params() const { return params_; }
  // Elements [begin, end) of parameter `name`'s `kind` ("master", "exp_avg", "exp_avg_sq").
  StatusOr<std::vector<float>> Read(const std::string& name, const std::string& kind, int64_t begin,
                                    int64_t end);
  StatusOr<std::vector<float>> ReadAll(const std::string& name, const std::string& kind);
  bool HasKind(const std::string& kind) const;

 private:
  struct Saved {
    int rank_entry;
    int64_t offset, length, file_offset;  // global frame (real); elements into the file
  };
  Status Verify(int rank_entry, const std::string& kind);
  std::string dir_;
  nlohmann::json metadata_;
  std::vector<std::pair<std::string, Shape>> params_;
  std::map<std::string, std::vector<Saved>> where_;  // by parameter, sorted, disjoint
  std::set<std::pair<int, std::string>> verified_;
  // Shard files opened once each (a row-parallel part is read row by row).
  struct OpenFile;
  std::map<std::pair<int, std::string>, std::shared_ptr<OpenFile>> open_;
};

struct CheckpointSummary {
  std::string dir;
  nlohmann::json metadata;
  int64_t bytes = 0;               // sum of the shard files
  std::vector<std::string> files;  // "name: size, checksum ok|MISMATCH|missing"
  bool ok = true;                  // every file present with its size and checksum
  // Empty when the saved parameters are the ones the saved run config's model declares (or there
  // is no config: an embedder's checkpoint); else the first difference (CheckSavedParams).
  std::string params;
};
// Reads metadata.json and checks every file and the saved parameters against the saved config's
// model (for `zerort checkpoint inspect`).
StatusOr<CheckpointSummary> InspectCheckpoint(const std::string& step_dir);

}  // namespace zerort
