// CommRecorder: what a communicator records of the collectives it runs, apart from running
// them: its trace (the records the watchdog reads, labelled by the caller), the spans of those
// that ran in line (to a sink: the trainer's timeline, the exposed-communication metric), and the
// bytes it sends, by link ([Note: bytes on the wire]). Each Communicator owns one (`recorder()`);
// a group split from it afterwards starts with its sink and its byte counters.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "zerort/runtime/collective_trace.h"

namespace zerort {

// [Note: bytes on the wire]
// What one rank sends for a collective over a group of n ranks, under the ring algorithms NCCL
// and MPI use for large messages (NCCL's "bus bytes"): an all-gather or reduce-scatter of B bytes
// in all sends (n-1)/n B, an all-reduce of B bytes 2 (n-1)/n B (a reduce-scatter, then an
// all-gather), a broadcast (n-1)/n B (a pipelined ring, averaged over the ranks); a send or an
// exchange its sends' bytes, a receive nothing. A collective of a group that crosses nodes counts
// whole as inter-node: a ring over two nodes pushes every byte through an inter-node link, which
// then sets its time. One function computes a collective's share, RingBytesSent
// (collective_trace.h): the communicator's count, the estimator's (estimate/comm_model.h) and
// `zerort bench comm`'s bus bandwidth use it. What the estimator derives on its own is which
// collectives a step issues, over which groups, and their sizes.
struct LinkBytes {
  std::atomic<int64_t> intra{0};  // bytes sent in groups within one node
  std::atomic<int64_t> inter{0};  // bytes sent in groups that cross nodes
};

// A collective a communicator ran to its end in line (host backends: MPI and loopback, and CUDA
// buffers staged through the host), for the trace (`logging.trace_file`: one track per stream)
// and the exposed-communication metric. Collectives that end later on a CUDA stream (NCCL) are
// not reported: their end is known only to the watchdog's probe.
struct CollectiveSpan {
  CollectiveOp op = CollectiveOp::kBarrier;
  std::string_view group;  // the communicator's name
  std::string_view label;  // the caller's (CommRecorder::SetLabel), e.g. "gather blocks.3"
  size_t bytes = 0;
  bool crosses_nodes = false;  // the group's ranks are on more than one node
  std::string_view track;      // the stream it ran on; "host" for none (or staged)
  // Nothing overlapped it: it ran on the host thread (no stream, an immediate CPU stream, or
  // staged) or on the compute stream's thread. One on a queued communication stream is not
  // critical by itself; the compute stream's waits for it while it ran are (Stream::TakeWaits).
  bool critical = true;
  std::chrono::system_clock::time_point begin, end;
};
using CollectiveSpanSink = std::function<void(const CollectiveSpan&)>;

class CommRecorder {
 public:
  CommRecorder(const CommRecorder&) = delete;
  CommRecorder& operator=(const CommRecorder&) = delete;

  // Labels the following records of the trace (e.g. "gather blocks.3"); "" clears it.
  void SetLabel(std::string label) { trace_.SetLabel(std::move(label)); }
  const CollectiveTrace& trace() const { return trace_; }
  // Every collective the communicator runs in line from now on is reported to `sink` (null:
  // none), as are those of groups split from it afterwards; called on the thread that ran it.
  void SetSpanSink(std::shared_ptr<const CollectiveSpanSink> sink) { span_sink_ = std::move(sink); }
  // Every collective the communicator issues from now on adds its wire bytes to `bytes` (null:
  // none), as do those of groups split from it afterwards ([Note: bytes on the wire]).
  void SetLinkBytes(std::shared_ptr<LinkBytes> bytes) { link_bytes_ = std::move(bytes); }

 private:
  friend class Communicator;
  friend class PointToPoint;
  CommRecorder(std::string group, std::string backend, int rank, int size, size_t capacity)
      : trace_(std::move(group), std::move(backend), rank, size, capacity) {}

  bool reports_spans() const { return span_sink_ != nullptr; }
  void Report(const CollectiveSpan& span) const {
    if (span_sink_) (*span_sink_)(span);
  }
  void CountWire(size_t bytes, bool crosses_nodes) {
    if (link_bytes_ == nullptr || bytes == 0) return;
    (crosses_nodes ? link_bytes_->inter : link_bytes_->intra)
        .fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  }
  // A group split from this communicator reports where this one does.
  void PassOn(CommRecorder& split) const {
    split.span_sink_ = span_sink_;
    split.link_bytes_ = link_bytes_;
  }

  CollectiveTrace trace_;
  std::shared_ptr<const CollectiveSpanSink> span_sink_;
  std::shared_ptr<LinkBytes> link_bytes_;
};

}  // namespace zerort
