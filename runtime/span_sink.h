// SpanSink: where a span of work goes (the trainer's timeline, `logging.trace_file`): its name,
// the track it belongs on, begin and end. Layers and the shard manager report to one when given;
// it may be called from a stream's thread.
#pragma once

#include <chrono>
#include <functional>
#include <string_view>

namespace zerort {

using SpanSink = std::function<void(std::string_view name, std::string_view track,
                                    std::chrono::system_clock::time_point begin,
                                    std::chrono::system_clock::time_point end)>;

}  // namespace zerort
