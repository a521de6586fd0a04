// Chrome trace-event JSON of each rank's work.
#include "zerort/engine/timeline.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "nlohmann/json.hpp"
#include "zerort/runtime/host_collectives.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {

int Timeline::Track(std::string_view name) {
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == name) return static_cast<int>(i);
  }
  tracks_.emplace_back(name);
  return static_cast<int>(tracks_.size() - 1);
}

void Timeline::Span(std::string_view name, std::string_view track, Clock::time_point begin,
                    Clock::time_point end) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  std::lock_guard lock(mu_);
  events_.push_back({std::string(name), Track(track),
                     duration_cast<microseconds>(begin.time_since_epoch()).count(),
                     duration_cast<microseconds>(end - begin).count()});
}

std::string Timeline::Serialize() const {
  std::lock_guard lock(mu_);
  std::string out;
  auto line = [&](const nlohmann::json& j) {
    out += j.dump();
    out += "\n";
  };
  line({{"ph", "M"},
        {"name", "process_name"},
        {"pid", rank_},
        {"args", {{"name", StrCat("rank ", rank_)}}}});
  line({{"ph", "M"},
        {"name", "process_sort_index"},
        {"pid", rank_},
        {"args", {{"sort_index", rank_}}}});
  for (size_t t = 0; t < tracks_.size(); ++t) {
    line({{"ph", "M"},
          {"name", "thread_name"},
          {"pid", rank_},
          {"tid", t},
          {"args", {{"name", tracks_[t]}}}});
  }
  for (const Event& e : events_) {
    line({{"ph", "X"},
          {"name", e.name},
          {"cat", tracks_[e.track]},
          {"pid", rank_},
          {"tid", e.track},
          {"ts", e.begin_us},
          {"dur", e.duration_us}});
  }
  return out;
}

Status Timeline::Write(Communicator& world, Allocator& host, Stream& stream,
                       const std::string& path) const {
  const std::string mine = Serialize();
  // Sizes first, then every rank's text padded to the longest.
  int64_t size = static_cast<int64_t>(mine.size());
  std::vector<int64_t> sizes(world.size());
  ZR_RETURN_IF_ERROR(AllGatherHostValues(world, host, stream, &size, sizes.data(), 1, DType::kI64));
  int64_t longest = 0;
  for (int64_t s : sizes) longest = std::max(longest, s);
  std::vector<char> padded(static_cast<size_t>(longest), ' '), all;
  std::copy(mine.begin(), mine.end(), padded.begin());
  all.resize(static_cast<size_t>(longest) * world.size());
  if (longest > 0) {
    ZR_RETURN_IF_ERROR(AllGatherHostValues(world, host, stream, padded.data(), all.data(),
                                           static_cast<size_t>(longest), DType::kU8));
  }
  if (world.rank() != 0) return absl::OkStatus();
  std::string out = "[\n";
  bool first = true;
  for (int r = 0; r < world.size(); ++r) {
    const std::string_view text(all.data() + r * longest, static_cast<size_t>(sizes[r]));
    size_t at = 0;
    while (at < text.size()) {
      const size_t end = text.find('\n', at);
      const size_t stop = end == std::string_view::npos ? text.size() : end;
      if (stop > at) {
        StrAppend(&out, first ? "" : ",\n", text.substr(at, stop - at));
        first = false;
      }
      at = stop + 1;
    }
  }
  out += "\n]\n";
  // Every write checked (a full disk is an error naming the file); nothing partial is left.
  return WriteFileAtomically(path, out, "logging.trace_file");
}

Status Timeline::CheckWritable(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  // A file beside it, made and removed: the directory takes a new file ([Note: a file written
  // beside its target] in runtime/user_file.h), as the trace's own write at the end will need.
  return FileReplacement::Begin(path, "logging.trace_file").status();
}

}  // namespace zerort
