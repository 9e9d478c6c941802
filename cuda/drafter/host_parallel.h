// A plain parallel loop for host-side conversions (weights and context rows to bf16): the result
// never depends on how the range is split.
#pragma once
#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace dflash {

// Runs body(begin, end) over [0, count) on up to the machine's cores once count reaches
// min_parallel; an exception from any part is rethrown (the lowest part's first).
inline void parallel_for(int64_t count, int64_t min_parallel, const std::function<void(int64_t, int64_t)>& body) {
  const int64_t threads = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32);
  if (count < min_parallel || threads == 1) {
    body(0, count);
    return;
  }
  const int64_t per = (count + threads - 1) / threads;
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(threads));
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = t * per, end = std::min(count, begin + per);
    if (begin >= end) break;
    workers.emplace_back([&body, &errors, t, begin, end] {
      try {
        body(begin, end);
      } catch (...) {
        errors[static_cast<size_t>(t)] = std::current_exception();
      }
    });
  }
  for (auto& w : workers) w.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dflash
