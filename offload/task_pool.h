// TaskPool: a few worker threads that run closures in submission order, each returning a Status
// that its Task handle hands back. The CPU twins of the offload tier run on it so that their
// overlap is real: host copies of the transfer engine and the pread/pwrite NVMe engine.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zerort/runtime/status.h"

namespace zerort {

// The handle of one submitted closure. Wait() blocks until it ran and returns its Status; it may
// be called any number of times (Start.../Finish... pairs are idempotent on their Finish side).
class Task {
 public:
  Task() = default;  // an empty task: already done, OK
  Status Wait() const;
  explicit operator bool() const { return state_ != nullptr; }

 private:
  friend class TaskPool;
  struct State {
    mutable std::mutex mu;
    mutable std::condition_variable cv;
    bool done = false;
    Status status;
  };
  std::shared_ptr<State> state_;
};

class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();  // runs what is queued, then joins
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  Task Submit(std::function<Status()> work);

 private:
  void Work();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<Task::State>>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace zerort
