// The timeline of a model's kernel calls: each ModelKernels operation's time on the kernels'
// stream, between two stream marks recorded around it ([Note: stream marks] in
// runtime/device.h), while a timeline is attached (`zerort bench model --timeline`).
//
// [Note: the operation timeline]
// A sample is the stream's time from the mark before an operation to the mark after it: on CUDA
// the device time of the kernels and library calls it issued (cudaEvent timing), on a CPU stream
// the host time of the work. `gap_before` is the stream's time from the previous operation's end
// to this one's start: the runtime's own fills and copies, waits for other streams (a gather, a
// reduce-scatter), and on CUDA the time the device waited for the host to issue more work. The
// summary groups the samples by kind (GEMMs per shape with their FLOP/s, attention, norms,
// element-wise, classifier, embedding, host reads), and the calls that are not GEMMs by
// operation, so that every later change to the step is judged against the same breakdown. Marks
// cost one event record each (about a microsecond on CUDA), so the timeline slows the step it times
// a little; its totals are compared with the untimed step's wall time in the same run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zerort/kernels/model_kernels.h"

namespace zerort {

struct OpSample {
  std::string name;        // the ModelKernels operation
  double flops = 0;        // GEMMs and attention (forwarding_kernels.h OpInfo); else 0
  int64_t shape[3] = {};   // GEMMs: rows, in, out; attention: batch, seq, channels
  double bytes = 0;        // the memory-bound operations' traffic ([Note: an operation's bytes])
  bool host_read = false;  // a call that brings values to the host (waits for the stream)
  double seconds = 0;      // stream time of the operation
  double gap_before = 0;   // stream time since the previous operation's end (0 for the first)
};

// What an operation's name says it does: "gemm", "attention", "norm", "classifier",
// "embedding", "host read" or "element-wise".
std::string_view OpKind(std::string_view name, bool host_read);

class OpTimeline {
 public:
  explicit OpTimeline(Device device) : device_(device) {}
  OpTimeline(const OpTimeline&) = delete;
  OpTimeline& operator=(const OpTimeline&) = delete;

  // Forgets the operations recorded so far (their marks are reused).
  void Clear() { pending_.clear(); }
  // The samples of the operations since the last Clear, in issue order, once the stream has
  // passed them (synchronize it first: a CPU mark not reached yet is an error).
  StatusOr<std::vector<OpSample>> Collect() const;

 private:
  friend class TimelineHook;
  struct Pending {
    OpSample sample;
    size_t begin = 0;  // marks_[begin], marks_[begin + 1]
  };
  StatusOr<size_t> TakeMarks();  // two marks for the next operation

  Device device_;
  std::vector<std::unique_ptr<StreamMark>> marks_;  // a pool; two per pending operation
  std::vector<Pending> pending_;
};

// `kernels`, every call recorded into `timeline` (which must outlive the result) between two
// marks on the kernels' stream, then run as `kernels` runs it.
std::unique_ptr<ModelKernels> TimeOperations(std::unique_ptr<ModelKernels> kernels,
                                             OpTimeline* timeline);

// The samples grouped: by kind, the GEMMs by operation and shape, and the other calls by
// operation (a kind's calls apart: the attention's forward from its backward, a norm's forward
// from its backward and from the fused residual's).
struct TimelineGroup {
  std::string key;  // a kind, "Matmul 8192x768x3072" or an operation
  int64_t calls = 0;
  double seconds = 0;
  double flops = 0;
  double bytes = 0;
};
struct TimelineSummary {
  std::vector<TimelineGroup> kinds;   // most time first
  std::vector<TimelineGroup> gemms;   // most time first
  std::vector<TimelineGroup> others;  // every call but the GEMMs, by operation; most time first
  double op_seconds = 0;              // the samples' sum
  double gap_seconds = 0;             // the gaps' sum
  double span_seconds = 0;            // first start to last end: op_seconds + gap_seconds
  int64_t calls = 0;
  int64_t host_reads = 0;
};
TimelineSummary Summarize(const std::vector<OpSample>& samples);

}  // namespace zerort
