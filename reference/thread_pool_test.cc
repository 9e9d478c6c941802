#include "reference/thread_pool.h"

#include <atomic>
#include <new>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dflash {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (size_t count : {0u, 1u, 3u, 1000u}) {
      std::vector<std::atomic<int>> hits(count);
      for (auto& h : hits) h = 0;
      pool.run(count, [&](size_t i) { hits[i]++; });
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " task " << i;
    }
  }
}

TEST(ThreadPool, RethrowsAndStaysUsable) {
  ThreadPool pool(3);
  std::atomic<int> done{0};
  EXPECT_THROW(pool.run(50,
                        [&](size_t i) {
                          if (i == 17) throw std::runtime_error("task 17");
                          done++;
                        }),
               std::runtime_error);
  EXPECT_EQ(done.load(), 49);  // the others still ran
  done = 0;
  pool.run(10, [&](size_t) { done++; });
  EXPECT_EQ(done.load(), 10);
}

TEST(ThreadPool, SurvivesAnExceptionInEveryTaskOnEveryThread) {
  // Every task throws, so the workers throw as well as the caller; one exception comes back, the
  // pool runs the next batch normally, and it shuts down cleanly.
  ThreadPool pool(4);
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> started{0};
    EXPECT_THROW(pool.run(64,
                          [&](size_t) {
                            started++;
                            throw std::bad_alloc();
                          }),
                 std::bad_alloc);
    EXPECT_EQ(started.load(), 64);
    std::atomic<int> done{0};
    pool.run(64, [&](size_t) { done++; });
    EXPECT_EQ(done.load(), 64);
  }
}

TEST(ThreadPool, RefusesZeroThreads) { EXPECT_THROW(ThreadPool(0), HarnessError); }

}  // namespace
}  // namespace dflash
