// NvmeStore: the file, its regions, and the io_uring and pread/pwrite engines.
#include "zerort/offload/nvme_store.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "zerort/offload/task_pool.h"
#include "zerort/runtime/log.h"
#include "zerort/runtime/strings.h"

namespace zerort {

std::string_view IoEngineName(IoEngine engine) {
  switch (engine) {
    case IoEngine::kAuto:
      return "auto";
    case IoEngine::kIoUring:
      return "io_uring";
    case IoEngine::kThreads:
      return "threads";
  }
  return "invalid";
}

Status IoUringUsable() {
  io_uring ring;
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) return ErrnoError("io_uring_queue_init", -rc);
  io_uring_queue_exit(&ring);
  return absl::OkStatus();
}

// One request's completion: the blocks still outstanding and the first error.
struct IoHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  int64_t remaining = 0;  // blocks not yet complete
  Status status;          // the first failure
  bool done = false;

  void Complete(Status s) {
    bool finished;
    {
      std::lock_guard lock(mu);
      if (status.ok() && !s.ok()) status = std::move(s);
      finished = --remaining == 0;
      done = finished;
    }
    if (finished) cv.notify_all();
  }
};

Status IoHandle::Finish() {
  if (!state_) return absl::OkStatus();
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

namespace {

struct Block {
  std::shared_ptr<IoHandle::State> request;
  bool write = false;
  int64_t file_offset = 0;
  char* buf = nullptr;
  int64_t bytes = 0;
};

std::string Describe(const std::string& path, const Block& b) {
  return StrCat(b.write ? "write" : "read", " of ", path, " at offset ", b.file_offset, ", ",
                b.bytes, " bytes");
}

// A failed read or write is a runtime failure (exit 1), whatever errno says: EINVAL or EACCES
// from an I/O call do not mean the user's configuration was wrong.
Status IoError(std::string_view call, int err) {
  Status s = ErrnoError(call, err);
  if (s.code() == absl::StatusCode::kResourceExhausted) return s;
  return absl::InternalError(s.message());
}

}  // namespace

class NvmeStore::Engine {
 public:
  virtual ~Engine() = default;
  virtual IoEngine kind() const = 0;
  virtual void Submit(std::vector<Block> blocks) = 0;
};

namespace {

// pread/pwrite on a few threads; each block is one task.
class ThreadEngine final : public NvmeStore::Engine {
 public:
  ThreadEngine(int fd, std::string path, int threads)
      : fd_(fd), path_(std::move(path)), pool_(threads) {}
  IoEngine kind() const override { return IoEngine::kThreads; }
  void Submit(std::vector<Block> blocks) override {
    for (Block& b : blocks) {
      pool_.Submit([this, b]() -> Status {
        b.request->Complete(Transfer(b));
        return absl::OkStatus();
      });
    }
  }

 private:
  Status Transfer(const Block& b) const {
    int64_t done = 0;
    while (done < b.bytes) {
      const ssize_t n = b.write ? ::pwrite(fd_, b.buf + done, b.bytes - done, b.file_offset + done)
                                : ::pread(fd_, b.buf + done, b.bytes - done, b.file_offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        return IoError(StrCat(b.write ? "pwrite" : "pread", ": ", Describe(path_, b)), errno);
      if (n == 0)
        return absl::InternalError(StrCat("unexpected end of file: ", Describe(path_, b)));
      done += n;
    }
    return absl::OkStatus();
  }
  int fd_;
  std::string path_;
  TaskPool pool_;
};

// io_uring: the caller's thread submits, one reaper thread waits for completions and refills
// the queue from the blocks waiting for a slot.
class UringEngine final : public NvmeStore::Engine {
 public:
  static StatusOr<std::unique_ptr<UringEngine>> Create(int fd, std::string path,
                                                       const NvmeStoreOptions& o) {
    std::unique_ptr<UringEngine> e(new UringEngine(fd, std::move(path), o));
    const int rc =
        io_uring_queue_init(static_cast<unsigned>(std::max(o.queue_depth, 1)) + 1, &e->ring_, 0);
    if (rc < 0) return ErrnoError("io_uring_queue_init", -rc);
    e->ring_ok_ = true;
    e->reaper_ = std::thread([p = e.get()] { p->Reap(); });
    return e;
  }
  ~UringEngine() override {
    if (!ring_ok_) return;
    {
      std::unique_lock lock(mu_);
      idle_.wait(lock, [&] { return in_flight_ == 0 && waiting_.empty(); });
      stopping_ = true;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);  // wakes the reaper, which then exits
      io_uring_submit(&ring_);
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }
  IoEngine kind() const override { return IoEngine::kIoUring; }
  void Submit(std::vector<Block> blocks) override {
    std::lock_guard lock(mu_);
    for (Block& b : blocks) waiting_.push_back(std::move(b));
    Pump();
  }

 private:
  UringEngine(int fd, std::string path, const NvmeStoreOptions& o)
      : fd_(fd), path_(std::move(path)), options_(o) {}

  // Under mu_: moves waiting blocks into the ring while the queue depth allows. Without
  // overlap_events a new wave starts only when the previous one has completed.
  void Pump() {
    if (!options_.overlap_events && in_flight_ > 0) return;
    int queued = 0;
    while (!waiting_.empty() && in_flight_ < std::max(options_.queue_depth, 1)) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      Block* b = new Block(std::move(waiting_.front()));
      waiting_.pop_front();
      if (b->write) {
        io_uring_prep_write(sqe, fd_, b->buf, static_cast<unsigned>(b->bytes), b->file_offset);
      } else {
        io_uring_prep_read(sqe, fd_, b->buf, static_cast<unsigned>(b->bytes), b->file_offset);
      }
      io_uring_sqe_set_data(sqe, b);
      ++in_flight_;
      ++queued;
      if (options_.single_submit) SubmitOrFail();
    }
    if (queued > 0 && !options_.single_submit) SubmitOrFail();
  }

  void SubmitOrFail() {
    const int rc = io_uring_submit(&ring_);
    if (rc < 0) Logger()->error("io_uring_submit on {}: {}", path_, std::strerror(-rc));
  }

  void Reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        Logger()->error("io_uring_wait_cqe on {}: {}", path_, std::strerror(-rc));
        continue;
      }
      Block* b = static_cast<Block*>(io_uring_cqe_get_data(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (b == nullptr) {
        std::lock_guard lock(mu_);
        if (stopping_) return;
        continue;
      }
      std::unique_ptr<Block> block(b);
      std::lock_guard lock(mu_);
      --in_flight_;
      if (res >= 0 && res < block->bytes && res > 0) {
        // A short transfer: the rest goes back in the queue as its own block.
        Block rest = *block;
        rest.file_offset += res;
        rest.buf += res;
        rest.bytes -= res;
        waiting_.push_front(std::move(rest));
      } else if (res < 0) {
        block->request->Complete(IoError(
            StrCat("io_uring ", block->write ? "write" : "read", ": ", Describe(path_, *block)),
            -res));
      } else if (res == 0 && block->bytes > 0) {
        block->request->Complete(
            absl::InternalError(StrCat("unexpected end of file: ", Describe(path_, *block))));
      } else {
        block->request->Complete(absl::OkStatus());
      }
      Pump();
      if (in_flight_ == 0 && waiting_.empty()) idle_.notify_all();
    }
  }

  int fd_;
  std::string path_;
  NvmeStoreOptions options_;
  io_uring ring_{};
  bool ring_ok_ = false;
  std::mutex mu_;
  std::condition_variable idle_;
  std::deque<Block> waiting_;
  int in_flight_ = 0;
  bool stopping_ = false;
  std::thread reaper_;
};

}  // namespace

Status NvmeStore::CheckFreeSpace(const std::string& dir, int64_t bytes, std::string_view what) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) {
    return absl::InvalidArgumentError(
        StrCat(what, ": nvme_path '", dir, "': ", std::strerror(errno)));
  }
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (free_bytes < bytes) {
    return absl::InvalidArgumentError(
        StrCat(what, " needs ", fmt::format("{:.2f}", bytes / 1073741824.0), " GiB (", bytes,
               " bytes) in ", dir, ", which has ", fmt::format("{:.2f}", free_bytes / 1073741824.0),
               " GiB free: free some space or choose another nvme_path"));
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<NvmeStore>> NvmeStore::Create(const NvmeStoreOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("nvme_path is empty");
  struct stat st {};
  if (::stat(options.dir.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        StrCat("nvme_path '", options.dir, "': ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(StrCat("nvme_path '", options.dir, "' is not a directory"));
  }
  if (options.block_bytes < kAlignment || options.block_bytes % kAlignment != 0) {
    return absl::InvalidArgumentError(StrCat("aio block size ", options.block_bytes,
                                             " is not a positive multiple of ", kAlignment));
  }
  std::unique_ptr<NvmeStore> s(new NvmeStore());
  s->options_ = options;
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  s->direct_ = options.direct;
  // Stores of one process can share a tag (ranks of different data-parallel groups, the same
  // data-parallel rank, in one process): a name taken is skipped for the next.
  for (int k = 0; k < 1000; ++k) {
    s->path_ = StrCat(options.dir, "/", options.file_tag, ".", ::getpid(),
                      k == 0 ? "" : StrCat(".", k), ".swap");
    s->fd_ = ::open(s->path_.c_str(), flags | (s->direct_ ? O_DIRECT : 0), 0600);
    if (s->fd_ < 0 && s->direct_ && errno == EINVAL) {
      // A file system without O_DIRECT (old tmpfs, some FUSE): the page cache it is.
      Logger()->warn("nvme_path {}: no O_DIRECT on this file system; using buffered I/O",
                     options.dir);
      s->direct_ = false;
      s->fd_ = ::open(s->path_.c_str(), flags, 0600);
    }
    if (s->fd_ >= 0 || errno != EEXIST) break;
  }
  if (s->fd_ < 0) {
    const int err = errno;
    return absl::InvalidArgumentError(StrCat("nvme_path '", options.dir, "': cannot create ",
                                             s->path_, ": ", std::strerror(err)));
  }
  // Unlinked at once: the space is the process's while it runs and returns on any exit.
  ::unlink(s->path_.c_str());

  IoEngine engine = options.engine;
  if (engine != IoEngine::kThreads) {
    StatusOr<std::unique_ptr<UringEngine>> uring = UringEngine::Create(s->fd_, s->path_, options);
    if (uring.ok()) {
      s->engine_ = std::move(*uring);
    } else if (engine == IoEngine::kIoUring) {
      return Annotate(uring.status(), "aio engine io_uring was asked for");
    } else {
      Logger()->info("io_uring is not available ({}); NVMe I/O uses {} pread/pwrite thread(s)",
                     uring.status().message(), options.thread_count);
    }
  }
  if (!s->engine_) {
    s->engine_ =
        std::make_unique<ThreadEngine>(s->fd_, s->path_, std::max(options.thread_count, 1));
  }
  return s;
}

NvmeStore::~NvmeStore() {
  engine_.reset();  // waits for everything in flight
  if (fd_ >= 0) ::close(fd_);
  if (options_.tracker != nullptr) {
    for (const Reserved& r : reserved_) {
      options_.tracker->OnFree(MemoryTier::kNvme, r.category, r.bytes);
    }
  }
}

IoEngine NvmeStore::engine() const { return engine_->kind(); }

StatusOr<NvmeRegion> NvmeStore::Reserve(int64_t bytes, MemoryCategory category) {
  if (bytes <= 0) return absl::InvalidArgumentError(StrCat("NVMe region of ", bytes, " bytes"));
  NvmeRegion region{end_, bytes, RoundUp(bytes, kAlignment)};
  const int rc = ::posix_fallocate(fd_, region.offset, region.capacity);
  if (rc != 0) {
    return absl::ResourceExhaustedError(StrCat("fallocate of ", region.capacity,
                                               " bytes at offset ", region.offset, " in ", path_,
                                               ": ", std::strerror(rc)));
  }
  end_ += region.capacity;
  reserved_.push_back({category, bytes});
  if (options_.tracker != nullptr) options_.tracker->OnAllocate(MemoryTier::kNvme, category, bytes);
  return region;
}

IoHandle NvmeStore::StartRead(const NvmeRegion& region, int64_t offset, void* dst, int64_t bytes) {
  return Start(false, region, offset, dst, bytes);
}

IoHandle NvmeStore::StartWrite(const NvmeRegion& region, int64_t offset, const void* src,
                               int64_t bytes) {
  return Start(true, region, offset, const_cast<void*>(src), bytes);
}

IoHandle NvmeStore::Start(bool write, const NvmeRegion& region, int64_t offset, void* buf,
                          int64_t bytes) {
  IoHandle handle;
  handle.state_ = std::make_shared<IoHandle::State>();
  auto fail = [&](Status s) {
    handle.state_->status = std::move(s);
    handle.state_->done = true;
    return handle;
  };
  ++requests_;
  const int64_t length = RoundUp(bytes, kAlignment);
  const int64_t file_offset = region.offset + offset;
  const char* op = write ? "write" : "read";
  if (bytes <= 0 || offset < 0 || offset % kAlignment != 0 || offset + length > region.capacity ||
      reinterpret_cast<uintptr_t>(buf) % kAlignment != 0) {
    return fail(absl::InvalidArgumentError(StrCat("NVMe ", op, " of ", bytes, " bytes at offset ",
                                                  offset, " of a region of ", region.capacity,
                                                  " bytes (offset, buffer and length must be ",
                                                  kAlignment, "-aligned and inside the region)")));
  }
  if (options_.fail_request > 0 && requests_ == options_.fail_request) {
    return fail(IoError(StrCat("injected fault: ", op, " of ", path_, " at offset ", file_offset,
                               ", ", length, " bytes"),
                        options_.fail_errno));
  }
  std::vector<Block> blocks;
  for (int64_t done = 0; done < length; done += options_.block_bytes) {
    const int64_t n = std::min(options_.block_bytes, length - done);
    blocks.push_back({handle.state_, write, file_offset + done, static_cast<char*>(buf) + done, n});
  }
  handle.state_->remaining = static_cast<int64_t>(blocks.size());
  engine_->Submit(std::move(blocks));
  return handle;
}

}  // namespace zerort
