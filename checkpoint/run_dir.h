// One run per checkpoint directory: what `zerort train` checks and holds before it writes
// anything there (docs/design.md, "Untrusted input").
//
// - A run holds an exclusive lock on <dir>/.zerort.lock (flock, non-blocking; the holder's pid is
//   written in it) for its lifetime: a second run in the same directory is refused naming that
//   pid. The lock goes with the process (a crashed run leaves a file that is not locked).
// - A new run (no --resume) refuses a directory that already holds a zerort checkpoint (`latest`
//   or a step_<N> with metadata), and a metrics file that is not empty, unless --overwrite: it
//   never silently takes over an earlier run.
// - Every run has an id (16 hex digits; written in each checkpoint's metadata, kept on resume):
//   checkpoint rotation and the cleanup of failed saves delete only directories that carry it.
#pragma once

#include <memory>
#include <string>

#include "zerort/runtime/status.h"

namespace zerort {

class RunLock {
 public:
  // Creates `dir` if needed and takes its lock. AlreadyExists (exit 2) when another process
  // holds it, naming its pid.
  static StatusOr<std::unique_ptr<RunLock>> Acquire(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  explicit RunLock(int fd) : fd_(fd) {}
  int fd_;
};

// A new run's checks (overwrite: the user's explicit consent). AlreadyExists naming what is there
// and the three ways on: --resume, another directory or file, --overwrite.
Status CheckNewRunDirectory(const std::string& dir, bool overwrite);
// A file of the run's (`key`: logging.metrics_file, logging.trace_file) that holds bytes already;
// `on_resume` says what --resume does with it.
Status CheckNewRunFile(std::string_view key, const std::string& path, bool overwrite,
                       std::string_view on_resume);

// 16 lowercase hex digits, different for every call (random device, time and pid).
std::string NewRunId();

}  // namespace zerort
