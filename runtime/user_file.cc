// ReadDataFile: regular files only, bounded. WriteFileAtomically: checked, then renamed.
#include "zerort/runtime/user_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "zerort/runtime/strings.h"

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
  return ReadRegularFd(fd, path, limit);
}

StatusOr<std::string> ReadRegularFd(int fd, const std::string& path, int64_t limit) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(StrCat("stat ", path), err);
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

Status CheckOutputPath(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        StrCat(what, ": ", path,
               " exists and is not a regular file (a directory, FIFO or "
               "device is never replaced)"));
  }
  return absl::OkStatus();
}

Status CheckReplaceable(const std::string& path, bool overwrite, std::string_view what) {
  ZR_RETURN_IF_ERROR(CheckOutputPath(path, what));
  struct stat st {};
  if (overwrite || ::stat(path.c_str(), &st) != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat(what, ": ", path, " exists; pass --overwrite to replace it, or name a new file"));
}

Status CheckOutputDirectory(const std::string& dir, bool overwrite, std::string_view what) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(st)) return absl::OkStatus();
  if (!std::filesystem::is_directory(st)) {
    return absl::InvalidArgumentError(StrCat(what, ": ", dir, " exists and is not a directory"));
  }
  if (overwrite || std::filesystem::is_empty(dir, ec)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat(what, ": ", dir,
             " exists and is not empty; pass --overwrite to write into it (files of the same "
             "names are replaced) or name a new directory"));
}

Status WriteFileAtomically(const std::string& path, std::string_view text, std::string_view what) {
  ZR_RETURN_IF_ERROR(CheckOutputPath(path, what));
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoError(StrCat("open ", what, " ", tmp), errno);
  auto fail = [&](const char* call, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError(StrCat(call, " ", what, " ", tmp), err);
  };
  size_t done = 0;
  while (done < text.size()) {  // not WriteAll: a failure here also removes the .tmp
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write", n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 && errno != EINVAL) return fail("fsync", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(StrCat("close ", what, " ", tmp), err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(StrCat("rename ", what, " ", tmp, " to ", path), err);
  }
  return absl::OkStatus();
}

Status WriteAll(int fd, std::string_view bytes, std::string_view what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError(what, n < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace zerort
