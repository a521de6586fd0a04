// DeepSpeed's csv_monitor files.
#include "zerort/engine/csv_monitor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "fmt/format.h"
#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {
StatusOr<std::unique_ptr<CsvMonitor>> CsvMonitor::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        StrCat("csv_monitor: cannot create ", dir, ": ", ec.message()));
  }
  return std::unique_ptr<CsvMonitor>(new CsvMonitor(dir));
}

CsvMonitor::~CsvMonitor() {
  for (const auto& [name, fd] : fds_) ::close(fd);
}

Status CsvMonitor::Write(std::string_view event, int64_t step, double value) {
  std::string file(event);
  for (char& c : file) {
    if (c == '/' || c == ' ') c = '_';
  }
  file += ".csv";
  const std::string path = StrCat(dir_, "/", file);
  auto it = fds_.find(file);
  if (it == fds_.end()) {
    const int fd =
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return ErrnoError(StrCat("open csv_monitor file ", path), errno);
    it = fds_.emplace(file, fd).first;
    // The header starts a new file only: a later run appends its rows under the first run's, as
    // DeepSpeed's monitor does (a second header mid-file is a row of text to a CSV reader).
    struct stat st {};
    if (::fstat(fd, &st) != 0) return ErrnoError(StrCat("stat csv_monitor file ", path), errno);
    if (st.st_size == 0) {
      const size_t slash = event.rfind('/');
      const std::string_view header =
          slash == std::string_view::npos ? event : event.substr(slash + 1);
      ZR_RETURN_IF_ERROR(
          WriteAll(fd, StrCat("step,", header, "\n"), StrCat("write csv_monitor file ", path)));
    }
  }
  return WriteAll(it->second, fmt::format("{},{}\n", step, value),
                  StrCat("write csv_monitor file ", path));
}

Status CsvMonitor::Flush() {
  for (const auto& [name, fd] : fds_) {
    if (::fsync(fd) != 0)
      return ErrnoError(StrCat("fsync csv_monitor file ", dir_, "/", name), errno);
  }
  return absl::OkStatus();
}

}  // namespace zerort
