// The vocabulary-parallel argmax of docs/spec/tensor-parallel.md §5.2 (vocab_parallel.h) against the
// one-device argmax of the whole row, computed here by a plain scan (NaN first, then the greatest
// value, then the lowest index), on rows built to put the winner and its ties across shards.
#include "cuda/tp/vocab_parallel.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "cuda/runtime/device_buffer.h"
#include "testing/gpu_test_util.h"

namespace dflash {
namespace {

int32_t scan_argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t c = 1; c < n; ++c) {
    const bool nan = std::isnan(row[c]), best_nan = std::isnan(row[best]);
    if (best_nan) break;
    if (nan || row[c] > row[best]) best = c;
  }
  return static_cast<int32_t>(best);
}

TEST(VocabParallelGpu, MergeEqualsTheOneDeviceArgmaxAndGathersTheLogits) {
  DFLASH_REQUIRE_GPU();
  for (int ranks : {2, 4, 8}) {
    const int64_t shard = 75, vocab = ranks * shard, ld = 128, rows = 6;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.77f * static_cast<float>(i) + ranks);
    auto at = [&](int64_t row, int64_t col) -> float& { return logits[static_cast<size_t>(row * vocab + col)]; };
    at(1, vocab - 1) = 5.0f;                            // the winner in the last shard
    at(2, shard + 3) = 5.0f, at(2, vocab - 2) = 5.0f;   // a tie across shards: the lower global index
    at(3, 0) = 5.0f, at(3, shard) = 5.0f;               // a tie between the shards' first columns
    at(4, 2 * shard - 1) = std::numeric_limits<float>::quiet_NaN();  // NaN ranks above every number
    at(5, shard + 1) = -std::numeric_limits<float>::infinity();
    // The shards as the drafter holds them: rank r's [rows, shard] at r·rows·ld, leading dimension ld.
    std::vector<float> shards(static_cast<size_t>(ranks * rows * ld), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t c = 0; c < shard; ++c) shards[static_cast<size_t>((r * rows + m) * ld + c)] = at(m, r * shard + c);
      }
    }
    const DeviceBuffer<float> d_shards = gpu_test::to_device(shards);
    DeviceBuffer<float> gathered(static_cast<size_t>(rows * vocab));
    DeviceBuffer<int32_t> tokens(static_cast<size_t>(rows));
    VocabShards s;
    s.base = d_shards.get();
    s.rank_stride = rows * ld;
    s.ranks = ranks;
    s.rows = rows;
    s.shard_vocab = shard;
    s.ld = ld;
    launch_vocab_parallel_argmax(nullptr, s, gathered.get(), vocab, tokens.get());
    // The same logits read as column ranges of one [rows, vocab] matrix (a head computed whole).
    const DeviceBuffer<float> whole = gpu_test::to_device(logits);
    DeviceBuffer<int32_t> whole_tokens(static_cast<size_t>(rows));
    VocabShards columns = s;
    columns.base = whole.get();
    columns.rank_stride = shard;
    columns.ld = vocab;
    launch_vocab_parallel_argmax(nullptr, columns, nullptr, 0, whole_tokens.get());
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    const std::vector<int32_t> got = gpu_test::to_host(tokens), got_whole = gpu_test::to_host(whole_tokens);
    const std::vector<float> got_logits = gpu_test::to_host(gathered);
    for (int64_t m = 0; m < rows; ++m) {
      const int32_t want = scan_argmax(&at(m, 0), vocab);
      EXPECT_EQ(got[static_cast<size_t>(m)], want) << ranks << " ranks, row " << m;
      EXPECT_EQ(got_whole[static_cast<size_t>(m)], want) << ranks << " ranks, row " << m << " (columns of one matrix)";
    }
    // The hand-placed cases, independently of the scan: the last shard's winner, the lower index of
    // each tie, the NaN.
    EXPECT_EQ(got[1], vocab - 1);
    EXPECT_EQ(got[2], shard + 3);
    EXPECT_EQ(got[3], 0);
    EXPECT_EQ(got[4], 2 * shard - 1);
    for (size_t i = 0; i < logits.size(); ++i) {
      ASSERT_EQ(gpu_test::float_bits(got_logits[i]), gpu_test::float_bits(logits[i])) << "gathered logit " << i;
    }
  }
}

}  // namespace
}  // namespace dflash
