// Timeline: what each rank did when, written as Chrome trace-event JSON (`logging.trace_file`;
// opens in Perfetto and chrome://tracing): one process per rank, one track ("thread") per
// stream of work, complete events ("ph": "X") with microsecond times from the system clock (so
// ranks on different machines line up as well as their clocks do). The trainer records each
// micro-batch's forward + backward, the optimizer step, evaluation and checkpoint saves; the
// pipeline executor its forwards and backwards per micro-batch and chunk and its transfers; the
// shard manager's store each unit's forward and backward, the optimizer each unit's update and
// the NVMe tier's reads per chunk (Sink()); and every collective that ran in line goes on the
// track of the stream it ran on (CommSpans).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/runtime/allocator.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/span_sink.h"
#include "zerort/runtime/status.h"

namespace zerort {

class Timeline {
 public:
  using Clock = std::chrono::system_clock;

  // Tracks are numbered in the order first used; `rank` is this process's world rank.
  explicit Timeline(int rank) : rank_(rank) {}

  // Before any training (rank 0): `path` is not something other than a regular file, its
  // directory is created, and a file can be written beside it (a probe, removed at once).
  static Status CheckWritable(const std::string& path);

  void Span(std::string_view name, std::string_view track, Clock::time_point begin,
            Clock::time_point end);
  // Span as a SpanSink (the store's, the shard manager's, the pipeline executor's); this
  // timeline must outlive it.
  SpanSink Sink() {
    return [this](std::string_view name, std::string_view track, Clock::time_point begin,
                  Clock::time_point end) { Span(name, track, begin, end); };
  }

  // Records [construction, destruction) as a span.
  class Scope {
   public:
    Scope(Timeline* timeline, std::string name, std::string track)
        : timeline_(timeline),
          name_(std::move(name)),
          track_(std::move(track)),
          begin_(Clock::now()) {}
    ~Scope() {
      if (timeline_ != nullptr) timeline_->Span(name_, track_, begin_, Clock::now());
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline* timeline_;
    std::string name_, track_;
    Clock::time_point begin_;
  };

  size_t size() const {
    std::lock_guard lock(mu_);
    return events_.size();
  }
  // This rank's events and track names as trace-event JSON objects, one per line (no brackets).
  std::string Serialize() const;

  // Collective over `world`: gathers every rank's events to rank 0, which writes `path` (a JSON
  // array of trace events) through a temporary file and a rename. Host buffers.
  Status Write(Communicator& world, Allocator& host, Stream& stream, const std::string& path) const;

 private:
  struct Event {
    std::string name;
    int track;
    int64_t begin_us, duration_us;
  };
  int Track(std::string_view name);  // mu_ held
  int rank_;
  mutable std::mutex mu_;  // spans come from the host and from streams' threads (collectives)
  std::vector<std::string> tracks_;
  std::vector<Event> events_;
};

}  // namespace zerort
