// The watchdog thread: deadline checks, abort, trace dump, exit code 3; signal-time dumps.
#include "zerort/runtime/watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "zerort/runtime/exit_codes.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort {
namespace {

// The write end of the pipe of the watchdog that installed the signal handlers. A signal
// handler can reach nothing else; this is the one piece of process-wide state, set once.
std::atomic<int> g_signal_pipe{-1};

extern "C" void WatchdogSignalHandler(int signo) {
  const int fd = g_signal_pipe.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signo);
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);
  }
}

// A forwarded stop signal travels as 0x80 | signo, a signal the watchdog handles as signo.
constexpr unsigned char kForwarded = 0x80;

}  // namespace

void Watchdog::ForwardStopSignal(int signo) {
  const int fd = g_signal_pipe.load();
  if (fd >= 0 && signo > 0 && signo < kForwarded) {
    const unsigned char byte = static_cast<unsigned char>(kForwarded | signo);
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);
  }
}

void Watchdog::OnStopSignal(int signo) {
  std::vector<Entry> entries;
  {
    std::lock_guard lock(mu_);
    entries = entries_;
  }
  PendingStop pending{signo, Clock::now(), {}};
  for (const Entry& e : entries) {
    for (const CollectiveRecord& r : e.trace->Records()) {
      if (r.state == CollectiveState::kIssued) pending.in_flight.emplace_back(e.trace, r.seq);
    }
  }
  if (pending.in_flight.empty()) return;  // the run reaches its graceful stop
  Logger()->error(
      "received signal {} ({}) while {} collective(s) are in flight; collective state at that "
      "moment:\n{}",
      signo, strsignal(signo), pending.in_flight.size(), DumpAll());
  Logger()->flush();
  pending_stop_ = std::move(pending);
}

void Watchdog::CheckStopGrace() {
  if (!pending_stop_ || Clock::now() - pending_stop_->at < options_.stop_grace) return;
  const PendingStop pending = *std::move(pending_stop_);
  pending_stop_.reset();
  for (const auto& [trace, seq] : pending.in_flight) {
    for (const CollectiveRecord& r : trace->Records()) {
      if (r.seq != seq || r.state != CollectiveState::kIssued) continue;
      Fire(StrCat("collective ", CollectiveOpName(r.op), " seq ", r.seq, " of rank ", trace->rank(),
                  "/", trace->size(), " in group '", trace->group(), "' is still waiting ",
                  std::chrono::duration<double>(options_.stop_grace).count(), " s after signal ",
                  pending.signo, " (", strsignal(pending.signo),
                  "): the graceful stop cannot be reached (a peer died or hung); aborting the run "
                  "with exit code ",
                  kExitCollectiveTimeout));
      return;
    }
  }
}

Watchdog::Watchdog(Options options) : options_(std::move(options)) {
  ZR_CHECK(pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) == 0) << "pipe2 for the watchdog failed";
  thread_ = std::thread([this] { Run(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  const unsigned char byte = 0;
  [[maybe_unused]] ssize_t n = write(wake_pipe_[1], &byte, 1);
  thread_.join();
  int expected = wake_pipe_[1];
  g_signal_pipe.compare_exchange_strong(expected, -1);
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
}

void Watchdog::Register(CollectiveTrace* trace, std::function<void()> abort) {
  std::lock_guard lock(mu_);
  entries_.push_back(Entry{trace, std::move(abort)});
}

void Watchdog::Unregister(CollectiveTrace* trace) {
  std::lock_guard lock(mu_);
  std::erase_if(entries_, [trace](const Entry& e) { return e.trace == trace; });
}

Status Watchdog::InstallSignalDump() {
  int expected = -1;
  if (!g_signal_pipe.compare_exchange_strong(expected, wake_pipe_[1]) &&
      expected != wake_pipe_[1]) {
    return absl::FailedPreconditionError("another watchdog already handles SIGTERM/SIGINT");
  }
  struct sigaction action {};
  action.sa_handler = WatchdogSignalHandler;
  sigemptyset(&action.sa_mask);
  for (int signo : {SIGTERM, SIGINT}) {
    if (sigaction(signo, &action, nullptr) != 0) {
      return ErrnoError(StrCat("sigaction(", signo, ")"), errno);
    }
  }
  return absl::OkStatus();
}

std::string Watchdog::DumpAll() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const Entry& e : entries_) {
    if (!out.empty()) out += "\n";
    out += e.trace->Dump();
  }
  return out;
}

void Watchdog::Fire(const std::string& headline) {
  std::vector<Entry> entries;
  {
    std::lock_guard lock(mu_);
    if (fired_) return;
    fired_ = true;
    entries = entries_;
  }
  for (const Entry& e : entries) {
    if (e.abort) e.abort();
  }
  const std::string report = StrCat(headline, "\n", DumpAll());
  if (options_.on_timeout) {
    options_.on_timeout(report);
    return;
  }
  Logger()->error("{}", report);
  Logger()->flush();
  std::fflush(stderr);
  _exit(kExitCollectiveTimeout);
}

void Watchdog::Run() {
  while (!stop_) {
    pollfd pfd{wake_pipe_[0], POLLIN, 0};
    const int ready = poll(&pfd, 1, static_cast<int>(options_.poll_interval.count()));
    if (stop_) return;
    if (ready > 0) {
      unsigned char byte = 0;
      while (read(wake_pipe_[0], &byte, 1) == 1) {
        if (byte == 0) continue;  // a wake-up from the destructor
        if (byte & kForwarded) {
          OnStopSignal(byte & ~kForwarded);
          continue;
        }
        const int signo = byte;
        Logger()->error("received signal {} ({}); collective state at that moment:\n{}", signo,
                        strsignal(signo), DumpAll());
        Logger()->flush();
        std::signal(signo, SIG_DFL);
        std::raise(signo);
      }
    }
    CheckStopGrace();
    // The traces are polled under mu_: Unregister (a communicator's destructor) then waits for a
    // poll in progress, so a trace is never read after its communicator is gone (ThreadSanitizer
    // saw exactly that at the end of a two-rank run when the polls ran on a copy of the list).
    // Lock order: mu_, then a trace's own mutex, as in DumpAll.
    std::string headline;
    {
      std::lock_guard lock(mu_);
      if (fired_) continue;
      const Clock::time_point now = Clock::now();
      for (const Entry& e : entries_) {
        std::optional<CollectiveRecord> overdue = e.trace->PollOverdue(now);
        if (!overdue) continue;
        const double waited = std::chrono::duration<double>(now - overdue->issued).count();
        const std::string what = overdue->state == CollectiveState::kTimedOut
                                     ? StrCat("timed out after ", waited, " s")
                                     : StrCat("failed asynchronously");
        headline = StrCat("collective ", CollectiveOpName(overdue->op), " seq ", overdue->seq,
                          " of rank ", e.trace->rank(), "/", e.trace->size(), " in group '",
                          e.trace->group(), "' ", what, " (", overdue->bytes,
                          " bytes); aborting the run with exit code ", kExitCollectiveTimeout);
        break;
      }
    }
    if (!headline.empty()) Fire(headline);
  }
}

}  // namespace zerort
