// NvmeStore: one file per process under `nvme_path` holding the offloaded buffers of this rank,
// read and written asynchronously with O_DIRECT. Two engines behind one interface:
//   io_uring  (Debian's liburing): requests split into blocks of aio.block_size, at most
//             aio.queue_depth blocks in flight, completions reaped by one thread that refills the
//             queue (aio.overlap_events) — the default where the kernel allows io_uring;
//   threads   pread/pwrite on aio.thread_count workers — chosen when io_uring is refused
//             (EPERM/ENOSYS under seccomp) or forced.
// Both write the same bytes to the same offsets. The file is created with O_EXCL and unlinked at
// once: it occupies space only while the process runs, and nothing is left in nvme_path after an
// exit of any kind (kill -9 included). Regions are reserved with fallocate, so a disk that cannot
// hold the state fails at reservation, naming the file; every I/O error is a Status naming the
// file, offset, length and call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zerort/runtime/memory.h"
#include "zerort/runtime/status.h"

namespace zerort {

enum class IoEngine { kAuto, kIoUring, kThreads };
std::string_view IoEngineName(IoEngine engine);  // "auto", "io_uring", "threads"
// OK when this process may set up an io_uring (what engine auto then picks); else why not,
// from io_uring_queue_init: ENOSYS (a kernel built without it, or an emulator such as QEMU's
// user mode), EPERM (the io_uring_disabled sysctl, or a seccomp profile: Docker's default since
// 25.0). The tests of the io_uring engine skip, saying this, where it is not OK.
Status IoUringUsable();

struct NvmeStoreOptions {
  std::string dir;                    // nvme_path: an existing, writable directory
  std::string file_tag = "zerort";    // the file is <dir>/<file_tag>.<pid>.swap
  IoEngine engine = IoEngine::kAuto;  // auto: io_uring, else threads (logged once, with why)
  int64_t block_bytes = 1 << 20;      // aio.block_size: DeepSpeed's default, 1 MiB
  int queue_depth = 8;                // aio.queue_depth: DeepSpeed's default
  int thread_count = 1;               // aio.thread_count: threads engine workers
  bool single_submit = false;         // aio.single_submit: one submit call per block
  bool overlap_events = true;         // aio.overlap_events: refill as blocks complete, not in waves
  bool direct = true;                 // O_DIRECT: bypass the page cache (what makes it "NVMe")
  MemoryTracker* tracker = nullptr;   // reserved regions are accounted on the nvme tier
  // Test hook: the fail_request-th request (1-based; 0 never) fails with fail_errno, no I/O done.
  int64_t fail_request = 0;
  int fail_errno = 5;  // EIO
};

// A reserved span of the file. `capacity` is `bytes` rounded up to kAlignment.
struct NvmeRegion {
  int64_t offset = 0;
  int64_t bytes = 0;
  int64_t capacity = 0;
  explicit operator bool() const { return capacity > 0; }
};

// An asynchronous read or write. Finish() waits for it and returns its Status; idempotent.
class IoHandle {
 public:
  IoHandle() = default;  // nothing in flight
  Status Finish();
  struct State;

 private:
  friend class NvmeStore;
  std::shared_ptr<State> state_;
};

class NvmeStore {
 public:
  static constexpr int64_t kAlignment = 4096;  // O_DIRECT offsets, lengths and buffers

  static StatusOr<std::unique_ptr<NvmeStore>> Create(const NvmeStoreOptions& options);
  ~NvmeStore();  // waits for what is in flight, closes the (already unlinked) file

  // Fails (InvalidArgument) when the file system of `dir` has less than `bytes` free, saying how
  // much is needed and free. For configuration checks, before anything is written.
  static Status CheckFreeSpace(const std::string& dir, int64_t bytes, std::string_view what);

  // Reserves `bytes` (rounded up to kAlignment) at the end of the file, with fallocate.
  StatusOr<NvmeRegion> Reserve(int64_t bytes, MemoryCategory category);

  // `offset` (in the region) is a multiple of kAlignment; `bytes` is rounded up to kAlignment
  // and must fit in the region: the host buffer must be kAlignment-aligned and hold the rounded
  // length. The buffer must stay alive until Finish.
  IoHandle StartRead(const NvmeRegion& region, int64_t offset, void* dst, int64_t bytes);
  IoHandle StartWrite(const NvmeRegion& region, int64_t offset, const void* src, int64_t bytes);

  IoEngine engine() const;
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  int fd() const { return fd_; }  // the unlinked file (tests read it through /proc/self/fd)

  class Engine;  // io_uring or threads (nvme_store.cc)

 private:
  NvmeStore() = default;
  IoHandle Start(bool write, const NvmeRegion& region, int64_t offset, void* buf, int64_t bytes);

  NvmeStoreOptions options_;
  std::string path_;
  int fd_ = -1;
  bool direct_ = true;
  int64_t end_ = 0;
  int64_t requests_ = 0;
  std::unique_ptr<Engine> engine_;
  struct Reserved {
    MemoryCategory category;
    int64_t bytes;
  };
  std::vector<Reserved> reserved_;
};

}  // namespace zerort
