// MetricsSink: where a run's per-step figures go, on rank 0 (torchtitan's metrics component):
// one JSON record per step in logging.metrics_file (checked writes; fsynced and closed at the
// end), DeepSpeed's csv_monitor files, the printed line every steps_per_print steps, and the
// progress bar on a terminal. The trainer measures; the sink derives the rates (tokens/s,
// TFLOP/s and MFU per device) and formats. A failed write is kept (write_error) for the trainer
// to agree on over the world at the next step boundary: the run stops with exit 1 naming the file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "zerort/engine/csv_monitor.h"
#include "zerort/runtime/memory.h"
#include "zerort/runtime/status.h"
#include "zerort/sharding/sharded_unit.h"

namespace zerort {

struct MetricsSinkOptions {
  std::string metrics_file;   // "": no metrics file
  bool resume = false;        // append to it instead of starting it
  bool overwrite = false;     // replace an earlier run's metrics file
  std::string csv_dir;        // csv_monitor's <output_path>/<job_name>; "": none
  std::FILE* out = stdout;    // the printed lines
  bool progress_bar = false;  // drawn on `out` between printed lines
  int64_t steps = 0;          // train.steps
  int64_t steps_per_print = 10;
  int64_t train_batch_size = 0;  // sequences per step (all ranks)
  int seq_len = 1;
  double flops_per_token = 0;  // the model's training FLOPs per token
  int devices = 1;             // every rank shares the work: rates are per device
  double peak_flops = 0;       // a device's dense bf16 peak; 0: unknown (no MFU)
  bool fp16 = false;           // print the loss scale
  bool wall_clock_breakdown = false;
};

// What one optimizer step produced, measured by the trainer.
struct StepMetrics {
  int64_t step = 0;  // 1-based: the step just taken
  double loss = 0;   // data-parallel mean
  double grad_norm = 0;
  double lr = 0;
  float loss_scale = 1;
  bool skipped = false;
  int64_t skipped_steps = 0;
  int64_t tokens = 0;     // consumed so far
  double seconds = 0;     // the step's wall time
  MemorySnapshot memory;  // the step's peaks
  double val_loss = -1;   // -1: no evaluation at this step
  // wall_clock_breakdown: disjoint seconds of the step (forward and backward without their
  // gathers and reductions; other: data, the loss's mean, a pipeline's transfers).
  struct WallClock {
    double forward = 0, backward = 0, reduce = 0, optimizer = 0, gather = 0, other = 0;
  } wall;
  std::optional<OffloadStats> offload;  // the step's offload seconds (with an offload tier)
  // Seconds of the step's collectives that ran in line, and of those on the critical path
  // ([Note: exposed communication], engine/comm_spans.h).
  double comm_s = 0, exposed_comm_s = 0;
  // Bytes rank 0 sent in the step within a node and across nodes ([Note: bytes on the wire]).
  int64_t comm_bytes_intra = 0, comm_bytes_inter = 0;
};

class MetricsSink {
 public:
  // Rank 0 opens the files: an earlier run's metrics file is refused without overwrite (resume
  // appends), a FIFO nobody reads is an error rather than a hang.
  static StatusOr<std::unique_ptr<MetricsSink>> Open(const MetricsSinkOptions& options);
  ~MetricsSink();

  void Step(const StepMetrics& m);
  const Status& write_error() const { return write_error_; }
  // Flushes the CSV files, fsyncs and closes the metrics file.
  Status Close();

 private:
  explicit MetricsSink(const MetricsSinkOptions& options) : o_(options) {}
  void Emit(const nlohmann::json& record, const std::string& line);

  MetricsSinkOptions o_;
  int fd_ = -1;
  std::unique_ptr<CsvMonitor> csv_;
  Status write_error_;
};

}  // namespace zerort
