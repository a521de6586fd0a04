// The training loop of `zerort train`: builds the shard manager, the GPT model and the data from a
// RunConfig, then runs micro-batches with gradient accumulation, the LR schedule, the rank-0
// metrics line (every steps_per_print steps) and metrics.jsonl (every step), evaluation every
// eval_interval steps and at the end, checkpoints (every checkpoint.interval steps, at the end,
// and when a rank receives SIGTERM or SIGUSR1: the ranks agree at the next step boundary, save,
// and stop), resumption from checkpoint.dir/latest, and a text sample at the end. Every rank
// calls Train with the world (MPI, or a loopback group of one); with
// parallel.tensor_parallel_size > 1 the trainer splits it into a data x tensor mesh (Megatron's
// order, tensor fastest) and hands the groups out explicitly.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "zerort/config/config.h"
#include "zerort/config/run_options.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/device.h"
#include "zerort/runtime/memory.h"
#include "zerort/runtime/topology.h"

namespace zerort {

struct TrainerContext {
  Communicator* world = nullptr;  // every rank of the run (required)
  std::string world_source;       // where its size came from ("mpirun (OMPI_COMM_WORLD_SIZE)")
  int local_rank = 0;             // picks the GPU on a multi-GPU node
  // The device a session already chose for train.device (Session::device()), so that the choice,
  // and its warning when a GPU is passed over, is made once; unset: Train chooses by local_rank.
  std::optional<Device> device;
  std::FILE* out = stdout;    // rank 0's metrics lines and sample
  bool progress_bar = false;  // draw one on `out` (rank 0): only when it is a terminal
  bool resume = false;        // continue from checkpoint.dir/latest
  bool overwrite = false;     // a new run where an earlier run's checkpoints or metrics are
  int local_world_size = 1;   // ranks on this node (they share its host memory)
  const Topology* topology = nullptr;  // which ranks share a node (null: one node)
  FaultHooks faults;                   // tests only (the CLI reads them from the environment)
};

struct TrainResult {
  int64_t steps = 0;                // optimizer steps run
  double final_loss = 0;            // global mean loss of the last step
  double val_loss = -1;             // last evaluation; -1 when there was none
  std::string sample;               // the text sampled at the end
  bool non_finite = false;          // the run stopped on a non-finite loss (exit code 4)
  bool stopped_by_signal = false;   // SIGTERM/SIGUSR1: saved a checkpoint and stopped early
  int64_t resumed_from = -1;        // the step the run resumed from; -1: a fresh run
  MemorySnapshot last_step_memory;  // peaks of the last step's training (evaluation excluded)
};

StatusOr<TrainResult> Train(RunConfig config, const TrainerContext& context);

}  // namespace zerort
