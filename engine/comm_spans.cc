// CommSpans: collectives on the timeline and the exposed-communication metric.
#include "engine/comm_spans.h"

#include <chrono>

#include "runtime/strings.h"

namespace zerort {

CommSpans::~CommSpans() {
  if (world_ != nullptr) world_->SetSpanSink(nullptr);
}

void CommSpans::Attach(Communicator& world) {
  world_ = &world;
  world.SetSpanSink(std::make_shared<const CollectiveSpanSink>(
      [this](const CollectiveSpan& span) { Add(span); }));
}

void CommSpans::SetTimeline(Timeline* timeline) {
  std::lock_guard lock(mu_);
  timeline_ = timeline;
}

void CommSpans::Add(const CollectiveSpan& span) {
  const double seconds = std::chrono::duration<double>(span.end - span.begin).count();
  std::lock_guard lock(mu_);
  comm_s_ += seconds;
  if (span.critical) critical_s_ += seconds;
  if (timeline_ != nullptr) {
    timeline_->Span(StrCat(CollectiveOpName(span.op), " ", span.group, " ", span.bytes, " B",
                           span.label.empty() ? "" : " ", span.label),
                    span.track, span.begin, span.end);
  }
}

CommSpans::Step CommSpans::Take(const Stream& compute) {
  const auto waited = compute.WaitedSeconds();
  const auto it = waited.find("comm");
  const double compute_waited = it == waited.end() ? 0.0 : it->second;
  std::lock_guard lock(mu_);
  Step step{.comm_s = comm_s_, .exposed_s = critical_s_ + compute_waited - compute_waited_seen_};
  comm_s_ = critical_s_ = 0;
  compute_waited_seen_ = compute_waited;
  return step;
}

}  // namespace zerort
