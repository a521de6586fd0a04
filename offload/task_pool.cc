// TaskPool: FIFO worker threads with Status-returning handles.
#include "zerort/offload/task_pool.h"

namespace zerort {

Status Task::Wait() const {
  if (!state_) return absl::OkStatus();
  std::unique_lock lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { Work(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

Task TaskPool::Submit(std::function<Status()> work) {
  Task task;
  task.state_ = std::make_shared<Task::State>();
  {
    std::lock_guard lock(mu_);
    queue_.emplace_back(std::move(work), task.state_);
  }
  cv_.notify_one();
  return task;
}

void TaskPool::Work() {
  for (;;) {
    std::pair<std::function<Status()>, std::shared_ptr<Task::State>> item;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    Status status = item.first();
    {
      std::lock_guard lock(item.second->mu);
      item.second->status = std::move(status);
      item.second->done = true;
    }
    item.second->cv.notify_all();
  }
}

}  // namespace zerort
