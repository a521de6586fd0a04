// The run lock, a new run's refusal to take over an earlier run, run ids.
#include "zerort/checkpoint/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "zerort/runtime/strings.h"
#include "zerort/runtime/user_file.h"

namespace zerort {
namespace fs = std::filesystem;

StatusOr<std::unique_ptr<RunLock>> RunLock::Acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(StrCat("checkpoint.dir ", dir, ": ", ec.message()));
  }
  const std::string path = dir + "/.zerort.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoError(StrCat("open ", path), errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    [[maybe_unused]] ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    if (err != EWOULDBLOCK) return ErrnoError(StrCat("flock ", path), err);
    std::string holder(pid);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return absl::AlreadyExistsError(
        StrCat("checkpoint.dir ", dir, " is in use by another run (process ",
               holder.empty() ? "unknown" : holder, ", holding ", path,
               "): wait for it to end or choose another checkpoint.dir"));
  }
  const std::string pid = StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(StrCat("write ", path), err);
  }
  return std::unique_ptr<RunLock>(new RunLock(fd));
}

RunLock::~RunLock() { ::close(fd_); }  // closing releases the flock

Status CheckNewRunDirectory(const std::string& dir, bool overwrite) {
  if (overwrite) return absl::OkStatus();
  std::error_code ec;
  std::string found;
  if (fs::exists(fs::symlink_status(dir + "/latest", ec))) {
    // Read as untrusted: a regular file, bounded (a link to /dev/zero or a FIFO is not read).
    StatusOr<std::string> text = ReadDataFile(dir + "/latest", 256);
    const std::string name = text.ok() ? text->substr(0, text->find('\n')) : "";
    found = StrCat("latest -> ", name.empty() ? "(unreadable or empty)" : name);
  } else {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string n = entry.path().filename().string();
      if (n.rfind("step_", 0) == 0 && fs::exists(entry.path() / "metadata.json", ec)) {
        found = n;
        break;
      }
    }
  }
  if (found.empty()) return absl::OkStatus();
  return absl::AlreadyExistsError(
      StrCat("checkpoint.dir ", dir, " holds an earlier run's checkpoints (", found,
             "): pass --resume to continue it, choose another checkpoint.dir, or pass --overwrite "
             "to start a new run there (an earlier run's steps are never deleted by it)"));
}

Status CheckNewRunFile(std::string_view key, const std::string& path, bool overwrite,
                       std::string_view on_resume) {
  if (overwrite) return absl::OkStatus();
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size == 0) return absl::OkStatus();
  return absl::AlreadyExistsError(
      StrCat(key, " ", path, " already holds ", size, " bytes of an earlier run: pass --resume to ",
             on_resume, ", choose another file, or pass --overwrite to replace it"));
}

std::string NewRunId() {
  std::random_device device;
  std::seed_seq seed{
      device(), device(), static_cast<unsigned>(::getpid()),
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::mt19937_64 generator(seed);
  return fmt::format("{:016x}", generator());
}

}  // namespace zerort
