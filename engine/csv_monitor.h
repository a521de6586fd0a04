// CsvMonitor: DeepSpeed's csv_monitor, written by rank 0. Each event name ("Train/Samples/lr")
// is one file in <output_path>/<job_name>/ named by the event with '/' and ' ' made '_'
// ("Train_Samples_lr.csv"), whose first row is "step,<last part of the name>" and each further
// row "<step>,<value>", the step counting global samples, as DeepSpeed writes them. Files are
// appended to (a resumed run continues them); every write is checked.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "zerort/runtime/status.h"

namespace zerort {

class CsvMonitor {
 public:
  // Creates `dir` (and its parents) if needed.
  static StatusOr<std::unique_ptr<CsvMonitor>> Open(const std::string& dir);
  ~CsvMonitor();
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;

  Status Write(std::string_view event, int64_t step, double value);
  // fsyncs every file (at the end of a run).
  Status Flush();

 private:
  explicit CsvMonitor(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::map<std::string, int> fds_;  // file name -> descriptor
};

}  // namespace zerort
