// CommSpans: collectives on the timeline and the exposed-communication metric.
#include "zerort/engine/comm_spans.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "zerort/runtime/strings.h"

namespace zerort {

CommSpans::~CommSpans() {
  if (world_ != nullptr) {
    world_->recorder().SetSpanSink(nullptr);
    world_->recorder().SetLinkBytes(nullptr);
  }
}

void CommSpans::Attach(Communicator& world) {
  world_ = &world;
  world.recorder().SetSpanSink(std::make_shared<const CollectiveSpanSink>(
      [this](const CollectiveSpan& span) { Add(span); }));
  world.recorder().SetLinkBytes(bytes_);
}

void CommSpans::SetTimeline(Timeline* timeline) {
  std::lock_guard lock(mu_);
  timeline_ = timeline;
}

void CommSpans::Add(const CollectiveSpan& span) {
  const double seconds = std::chrono::duration<double>(span.end - span.begin).count();
  std::lock_guard lock(mu_);
  comm_s_ += seconds;
  if (span.critical) {
    critical_s_ += seconds;
  } else if (off_critical_.size() < kStreamWaitsKept) {
    off_critical_.push_back(Ran{std::string(span.track), span.begin, span.end});
  }
  if (timeline_ != nullptr) {
    timeline_->Span(
        StrCat(CollectiveOpName(span.op), " ", span.group, " ", span.bytes, " B",
               span.crosses_nodes ? " inter-node" : "", span.label.empty() ? "" : " ", span.label),
        span.track, span.begin, span.end);
  }
}

CommSpans::Step CommSpans::Take(Stream& compute) {
  const std::vector<StreamWait> waits = compute.TakeWaits();
  std::lock_guard lock(mu_);
  // Each wait's overlap with the collectives that ran on the stream it waited for. A stream's
  // collectives run one at a time on its thread: sorted by start, their ends are sorted too.
  std::sort(off_critical_.begin(), off_critical_.end(), [](const Ran& a, const Ran& b) {
    return std::tie(a.track, a.begin) < std::tie(b.track, b.begin);
  });
  double waited_on_collectives = 0;
  for (const StreamWait& w : waits) {
    auto it = std::partition_point(off_critical_.begin(), off_critical_.end(), [&](const Ran& r) {
      return r.track < w.recorder || (r.track == w.recorder && r.end <= w.begin);
    });
    for (; it != off_critical_.end() && it->track == w.recorder && it->begin < w.end; ++it) {
      const auto overlap = std::min(w.end, it->end) - std::max(w.begin, it->begin);
      waited_on_collectives += std::chrono::duration<double>(overlap).count();
    }
  }
  Step step{.comm_s = comm_s_,
            .exposed_s = critical_s_ + waited_on_collectives,
            .intra_bytes = bytes_->intra.exchange(0),
            .inter_bytes = bytes_->inter.exchange(0)};
  comm_s_ = critical_s_ = 0;
  off_critical_.clear();
  return step;
}

}  // namespace zerort
