// ReadDataFile: regular files only, bounded.
#include "engine/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/strings.h"

namespace zerort {

StatusOr<std::string> ReadDataFile(const std::string& path, int64_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        StrCat(path, ": cannot be read (", std::strerror(errno), ")"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        StrCat(path, ": not a regular file (a FIFO, device or directory is not read as data)"));
  }
  if (st.st_size > limit) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat(path, ": ", st.st_size, " bytes, more than the ",
                                             limit, " zerort reads into memory whole"));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  data.resize(done);
  return data;
}

}  // namespace zerort
