// TimeOperations: the timeline hook over ForwardingKernels, and the summary (op_timeline.h).
#include "zerort/kernels/op_timeline.h"

#include <algorithm>
#include <map>
#include <optional>
#include <type_traits>
#include <utility>

#include "zerort/kernels/forwarding_kernels.h"
#include "zerort/runtime/strings.h"

namespace zerort {

std::string_view OpKind(std::string_view name, bool host_read) {
  auto starts = [&](std::string_view p) { return name.substr(0, p.size()) == p; };
  if (host_read) return "host read";
  if (starts("Matmul") || starts("GeluMatmul")) return "gemm";
  if (starts("Attention")) return "attention";
  if (name.find("Norm") != std::string_view::npos) return "norm";
  if (starts("CrossEntropy") || starts("Vocab") || starts("AddToLossLedger")) return "classifier";
  if (starts("Embedding")) return "embedding";
  return "element-wise";
}

StatusOr<size_t> OpTimeline::TakeMarks() {
  const size_t begin = 2 * pending_.size();
  while (marks_.size() < begin + 2) {
    ZR_ASSIGN_OR_RETURN(auto mark, CreateStreamMark(device_));
    marks_.push_back(std::move(mark));
  }
  return begin;
}

StatusOr<std::vector<OpSample>> OpTimeline::Collect() const {
  std::vector<OpSample> out;
  out.reserve(pending_.size());
  for (size_t i = 0; i < pending_.size(); ++i) {
    OpSample s = pending_[i].sample;
    const size_t b = pending_[i].begin;
    ZR_ASSIGN_OR_RETURN(s.seconds, marks_[b + 1]->SecondsSince(*marks_[b]));
    if (i > 0) {
      ZR_ASSIGN_OR_RETURN(s.gap_before,
                          marks_[b]->SecondsSince(*marks_[pending_[i - 1].begin + 1]));
    }
    out.push_back(std::move(s));
  }
  return out;
}

class TimelineHook {
 public:
  explicit TimelineHook(OpTimeline* timeline) : t_(timeline) {}
  Stream& stream(ModelKernels& inner) {
    stream_ = &inner.stream();
    return *stream_;
  }
  template <typename Work>
  Status Op(const internal::OpInfo& info, Work&& work) {
    OpSample s{.name = info.name, .flops = info.flops, .bytes = info.bytes};
    std::copy(std::begin(info.shape), std::end(info.shape), s.shape);
    return Timed(std::move(s), std::forward<Work>(work));
  }
  template <typename Read>
  auto HostRead(const char* name, Read&& read) -> decltype(read()) {
    using Result = decltype(read());
    std::optional<Result> result;
    const Status timed = Timed(OpSample{.name = name, .host_read = true}, [&]() -> Status {
      result.emplace(read());
      if constexpr (std::is_same_v<Result, Status>) {
        return *result;
      } else {
        return result->status();
      }
    });
    if (!timed.ok()) return timed;
    return std::move(*result);
  }
  void Finish() {}

 private:
  template <typename Work>
  Status Timed(OpSample sample, Work&& work) {
    ZR_ASSIGN_OR_RETURN(const size_t begin, t_->TakeMarks());
    ZR_RETURN_IF_ERROR(t_->marks_[begin]->Record(*stream_));
    ZR_RETURN_IF_ERROR(work());
    ZR_RETURN_IF_ERROR(t_->marks_[begin + 1]->Record(*stream_));
    t_->pending_.push_back({std::move(sample), begin});
    return absl::OkStatus();
  }

  OpTimeline* t_;
  Stream* stream_ = nullptr;  // the inner kernels' (set by ForwardingKernels' constructor)
};

std::unique_ptr<ModelKernels> TimeOperations(std::unique_ptr<ModelKernels> kernels,
                                             OpTimeline* timeline) {
  auto timed = std::make_unique<internal::ForwardingKernels<TimelineHook>>(std::move(kernels),
                                                                           TimelineHook(timeline));
  (void)timed->stream();  // the hook learns the stream its marks go on
  return timed;
}

TimelineSummary Summarize(const std::vector<OpSample>& samples) {
  TimelineSummary out;
  std::map<std::string, TimelineGroup> kinds, gemms, others;
  for (const OpSample& s : samples) {
    const std::string kind(OpKind(s.name, s.host_read));
    TimelineGroup& k = kinds[kind];
    k.key = kind;
    ++k.calls;
    k.seconds += s.seconds;
    k.flops += s.flops;
    k.bytes += s.bytes;
    const bool gemm = kind == "gemm";
    const std::string key =
        gemm ? StrCat(s.name, " ", s.shape[0], "x", s.shape[1], "x", s.shape[2]) : s.name;
    TimelineGroup& g = (gemm ? gemms : others)[key];
    g.key = key;
    ++g.calls;
    g.seconds += s.seconds;
    g.flops += s.flops;
    g.bytes += s.bytes;
    out.op_seconds += s.seconds;
    out.gap_seconds += s.gap_before;
    ++out.calls;
    out.host_reads += s.host_read;
  }
  out.span_seconds = out.op_seconds + out.gap_seconds;
  auto sorted = [](const std::map<std::string, TimelineGroup>& m) {
    std::vector<TimelineGroup> v;
    for (const auto& [key, g] : m) v.push_back(g);
    std::stable_sort(v.begin(), v.end(), [](const TimelineGroup& a, const TimelineGroup& b) {
      return a.seconds > b.seconds;
    });
    return v;
  };
  out.kinds = sorted(kinds);
  out.gemms = sorted(gemms);
  out.others = sorted(others);
  return out;
}

}  // namespace zerort
