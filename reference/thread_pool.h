// A fixed set of worker threads that run numbered tasks. Callers make a task's output depend only
// on its number (never on which thread ran it or in what order), which is how the reference stays
// bit-identical for any thread count.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dflash {

class ThreadPool {
 public:
  // threads >= 1 (the calling thread counts as one).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(i) once for every i in [0, count) and returns when all are done. The first exception
  // a task throws is rethrown here after the others finish.
  void run(size_t count, const std::function<void(size_t)>& task);

 private:
  void worker_loop();
  void drain(const std::function<void(size_t)>& task);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_, work_done_;
  const std::function<void(size_t)>* task_ = nullptr;
  size_t count_ = 0;
  size_t next_ = 0;         // next task number to hand out (under mutex_)
  size_t busy_ = 0;         // workers inside the current generation
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace dflash
