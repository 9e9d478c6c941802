#include "reference/thread_pool.h"

#include "core/error.h"

namespace dflash {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) throw bad_input("reference drafter: thread count must be >= 1, got " + std::to_string(threads));
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// Takes task numbers until none are left; records the first exception.
void ThreadPool::drain(const std::function<void(size_t)>& task) {
  for (;;) {
    size_t i;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (next_ >= count_) return;
      i = next_++;
    }
    try {
      task(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t)>* task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      // Woken after every number was handed out: the caller may already have returned, and its
      // task with it. Only join while numbers are left; busy_ then keeps the caller waiting.
      if (next_ >= count_) continue;
      task = task_;
      ++busy_;
    }
    drain(*task);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --busy_;
    }
    work_done_.notify_all();
  }
}

void ThreadPool::run(size_t count, const std::function<void(size_t)>& task) {
  if (count == 0) return;
  if (workers_.empty() || count == 1) {
    for (size_t i = 0; i < count; ++i) task(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &task;
    count_ = count;
    next_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  work_ready_.notify_all();
  drain(task);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // Every number handed out and every worker out of this generation's task.
    work_done_.wait(lock, [&] { return next_ >= count_ && busy_ == 0; });
    task_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace dflash
