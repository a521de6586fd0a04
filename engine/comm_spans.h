// CommSpans: the trainer's view of its collectives: each one on the timeline's track of the
// stream it ran on (`logging.trace_file`), and the step's communication and exposed
// communication for the metrics line and metrics.jsonl ([Note: exposed communication]).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zerort/engine/timeline.h"
#include "zerort/runtime/communicator.h"
#include "zerort/runtime/device.h"

namespace zerort {

// [Note: exposed communication]
// The communication on a step's critical path, the time it adds to the step:
//  - every collective that ran in line: on the host thread (no stream, an immediate CPU stream,
//    which is every stream of the synchronous CPU device, or CUDA buffers staged through the
//    host) or on the compute stream's own thread (CollectiveSpan::critical);
//  - plus, of each wait of the compute stream's work for an event recorded on another stream
//    (Stream::TakeWaits), the part during which a collective ran on that stream: on the
//    asynchronous CPU device the gathers and reduce-scatters run on the "comm" stream's thread
//    while the compute stream runs kernels, and only what the compute stream had to wait for is
//    exposed. A wait's other part (the comm stream's own copies, its waits for the compute
//    stream, its jitter, its turn on a communicator) is not communication; counting it made
//    exposed exceed all communication on short steps.
// So exposed is at most the communication: equal to it on the synchronous device, below it as
// overlap grows. Not counted: a host thread blocked on the communication stream while the
// compute stream still had work (hidden, correctly) or had none (exposed, missed); collectives
// that end on a CUDA stream (NCCL), whose end only the watchdog's probe sees: a CUDA run reports
// only its staged and host collectives. I/O has its own exposed measures (fetch wait, grad io,
// optimizer io wait: OffloadStats).
class CommSpans {
 public:
  CommSpans() = default;
  ~CommSpans();  // detaches from the world communicator, which outlives the trainer
  CommSpans(const CommSpans&) = delete;
  CommSpans& operator=(const CommSpans&) = delete;

  // Every collective of `world` and of the groups split from it later is counted from now on:
  // its time, and the bytes it sent by link ([Note: bytes on the wire], runtime/comm_recorder.h).
  void Attach(Communicator& world);
  // Collectives go to `timeline` too (null: not traced), one track per stream.
  void SetTimeline(Timeline* timeline);

  struct Step {
    double comm_s = 0;     // every collective that ran in line, wherever
    double exposed_s = 0;  // on the critical path ([Note: exposed communication])
    // Bytes this rank sent in groups within one node and in groups that cross nodes, whether
    // the collective ran in line or on a CUDA stream.
    int64_t intra_bytes = 0, inter_bytes = 0;
  };
  // Since the previous call; `compute` is the model's compute stream (its waits are taken).
  Step Take(Stream& compute);

 private:
  void Add(const CollectiveSpan& span);

  Communicator* world_ = nullptr;
  std::shared_ptr<LinkBytes> bytes_ = std::make_shared<LinkBytes>();
  std::mutex mu_;  // collectives report from their streams' threads
  Timeline* timeline_ = nullptr;
  double comm_s_ = 0, critical_s_ = 0;  // since the last Take
  struct Ran {                          // a collective off the critical path, since the last Take
    std::string track;
    std::chrono::system_clock::time_point begin, end;
  };
  std::vector<Ran> off_critical_;
};

}  // namespace zerort
