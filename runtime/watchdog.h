// The hang watchdog. Every collective carries a deadline in its communicator's trace; one
// watchdog thread per process checks the registered traces (and the completion probes of
// stream backends). When a collective is past its deadline, or a backend reports an
// asynchronous error, the watchdog aborts every registered communicator, logs the last
// collectives of each, and ends the process with exit code 3 (kExitCollectiveTimeout), so no
// rank waits forever on a peer that skipped a collective or died. Optionally it also logs the
// traces when the process receives SIGTERM or SIGINT (what a launcher sends to the surviving
// ranks once one has failed) before letting the signal take its default action. A program that
// handles SIGTERM itself (the trainer stops gracefully at the next step) forwards it with
// ForwardStopSignal instead: the traces are logged at once if a collective is in flight, and if
// that collective is still waiting after `stop_grace` the process cannot reach its graceful stop
// (a peer died or hung), so it aborts with exit code 3 as on a timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "zerort/runtime/collective_trace.h"
#include "zerort/runtime/status.h"

namespace zerort {

class Watchdog {
 public:
  struct Options {
    std::chrono::milliseconds poll_interval{100};
    // Called with the report instead of logging it and exiting with code 3 (for tests that
    // observe a timeout in-process). The default (empty) is the real behaviour.
    std::function<void(const std::string& report)> on_timeout;
    // How long a collective in flight at a forwarded stop signal may go on before the process
    // aborts (mpirun sends SIGKILL 1 s after SIGTERM).
    std::chrono::milliseconds stop_grace{500};
  };

  explicit Watchdog(Options options);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog();

  // `abort` (may be empty) cancels the communicator's outstanding work, e.g. ncclCommAbort.
  void Register(CollectiveTrace* trace, std::function<void()> abort);
  void Unregister(CollectiveTrace* trace);

  // Logs every registered trace on SIGTERM/SIGINT, then re-raises the signal. The handler only
  // writes to a pipe; the logging happens on the watchdog thread.
  Status InstallSignalDump();

  // Every registered trace, one block per communicator.
  std::string DumpAll() const;

  // Async-signal-safe: tells the watchdog that installed the signal dump that the program's own
  // handler received `signo` (1..127) and means to stop gracefully (see the class comment).
  static void ForwardStopSignal(int signo);

 private:
  struct Entry {
    CollectiveTrace* trace;
    std::function<void()> abort;
  };
  void Run();
  void Fire(const std::string& headline);
  // A forwarded stop signal: the collectives in flight when it came (trace, seq), and when.
  void OnStopSignal(int signo);
  void CheckStopGrace();
  struct PendingStop {
    int signo = 0;
    Clock::time_point at;
    std::vector<std::pair<CollectiveTrace*, uint64_t>> in_flight;
  };
  std::optional<PendingStop> pending_stop_;  // watchdog thread only

  Options options_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  int wake_pipe_[2] = {-1, -1};  // [0] read by the thread, [1] written by Stop and signals
  std::atomic<bool> stop_{false};
  bool fired_ = false;
  std::thread thread_;
};

}  // namespace zerort
