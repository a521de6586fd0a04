// ReadDataFile: regular files only, bounded. FileReplacement: a new file, checked, then renamed.
#include "zerort/runtime/user_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

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

StatusOr<FileReplacement> FileReplacement::Begin(const std::string& path, std::string_view what) {
  ZR_RETURN_IF_ERROR(CheckOutputPath(path, what));
  for (int attempt = 0;; ++attempt) {
    uint32_t random = 0;
    if (::getrandom(&random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
      random = static_cast<uint32_t>(::getpid()) * 2654435761u + static_cast<uint32_t>(attempt);
    }
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), ".zerort-%08x.tmp", random);
    std::string temp = path + suffix;
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) return FileReplacement(path, std::move(temp), std::string(what), fd);
    if (errno != EEXIST || attempt == 15)
      return ErrnoError(StrCat("open ", what, " ", temp), errno);
  }
}

FileReplacement::FileReplacement(std::string target, std::string temp, std::string what, int fd)
    : target_(std::move(target)), temp_(std::move(temp)), what_(std::move(what)), fd_(fd) {}

FileReplacement::FileReplacement(FileReplacement&& other) noexcept
    : target_(std::move(other.target_)),
      temp_(std::move(other.temp_)),
      what_(std::move(other.what_)),
      fd_(std::exchange(other.fd_, -1)) {
  other.temp_.clear();
}

FileReplacement& FileReplacement::operator=(FileReplacement&& other) noexcept {
  if (this != &other) {
    Discard();
    target_ = std::move(other.target_);
    temp_ = std::move(other.temp_);
    what_ = std::move(other.what_);
    fd_ = std::exchange(other.fd_, -1);
    other.temp_.clear();
  }
  return *this;
}

FileReplacement::~FileReplacement() { Discard(); }

void FileReplacement::Discard() {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  if (!temp_.empty()) ::unlink(std::exchange(temp_, std::string()).c_str());
}

Status FileReplacement::Write(std::string_view bytes) {
  if (temp_.empty()) return absl::FailedPreconditionError(StrCat(what_, ": written after commit"));
  Status s = WriteAll(fd_, bytes, StrCat("write ", what_, " ", temp_));
  if (!s.ok()) Discard();
  return s;
}

Status FileReplacement::Commit() {
  if (temp_.empty()) return absl::FailedPreconditionError(StrCat(what_, ": committed twice"));
  auto fail = [&](const char* call, int err) {
    Status s = ErrnoError(StrCat(call, " ", what_, " ", temp_), err);
    Discard();
    return s;
  };
  if (::fsync(fd_) != 0 && errno != EINVAL) return fail("fsync", errno);
  if (::close(std::exchange(fd_, -1)) != 0) return fail("close", errno);
  if (std::rename(temp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    Status s = ErrnoError(StrCat("rename ", what_, " ", temp_, " to ", target_), err);
    Discard();
    return s;
  }
  temp_.clear();
  return absl::OkStatus();
}

Status WriteFileAtomically(const std::string& path, std::string_view text, std::string_view what) {
  ZR_ASSIGN_OR_RETURN(FileReplacement file, FileReplacement::Begin(path, what));
  ZR_RETURN_IF_ERROR(file.Write(text));
  return file.Commit();
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
