// DFlash2's top-K kernels (cuda/candidate_selector.h: threshold, the default, and plain) against a
// host sort in the top-K order of docs/spec/dflash2.md §3.4: NaN first (lower id first among NaNs),
// then larger values, then lower ids. The expectation is std::sort of every (value, id) pair of the
// row, independent of the kernel's threshold pass. Ids and values must match exactly; the unary
// scores too (multiplier 0.5, no softcap: one exact product on both sides).
//
// One table of rows, one comparison loop. The rows cover the DFlash2 geometry (V 248320, K 16) on
// random logits, ties everywhere (all equal, a few levels), NaN and ±inf, logits that rise with the
// id (the K best in the last slice, also in a last slice shorter than K), a stride pattern in which
// many elements pass the threshold (so that the kernel falls back to K passes over the slice), K
// from 1 to 256, and vocabularies down to K itself. The negative control shows that the comparison
// sees a tie broken the wrong way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/candidate_selector.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "tests/gpu/gpu_test_util.h"

namespace dflash {
namespace {

constexpr float kMultiplier = 0.5f;

struct Case {
  const char* name;
  int64_t vocab;
  int top_k;
  int rows;
  // The logit of element v of row r.
  float (*logit)(int r, int64_t v, std::mt19937& rng);
};

float random_normal(int, int64_t, std::mt19937& rng) { return std::normal_distribution<float>(0.0f, 3.0f)(rng); }
float all_equal(int, int64_t, std::mt19937&) { return 1.25f; }
float few_levels(int, int64_t, std::mt19937& rng) { return static_cast<float>(static_cast<int>(rng() % 5) - 2); }
float rising(int r, int64_t v, std::mt19937&) { return static_cast<float>(v) * 1e-3f - static_cast<float>(r); }
float specials(int, int64_t v, std::mt19937& rng) {
  if (v % 97 == 13) return std::numeric_limits<float>::quiet_NaN();
  if (v % 89 == 5) return std::numeric_limits<float>::infinity();
  if (v % 83 == 7) return -std::numeric_limits<float>::infinity();
  return std::normal_distribution<float>(0.0f, 1.0f)(rng);
}
// Every element of a stride class v % kSelectorTopkThreads (one thread's elements of each slice)
// ranks above every element of the next class: the threads' firsts are the classes' lowest ids in
// each slice, and each of the K best classes passes whole.
float stride_classes(int, int64_t v, std::mt19937&) { return -static_cast<float>(v % kSelectorTopkThreads); }

const Case kCases[] = {
    {"DFlash2 geometry, random", 248320, 16, 7, random_normal},
    {"DFlash2 geometry, all equal", 248320, 16, 2, all_equal},
    {"DFlash2 geometry, five levels", 248320, 16, 3, few_levels},
    {"rising with the id, odd V", 100003, 16, 2, rising},
    {"NaN and inf", 5000, 32, 3, specials},
    {"stride classes, K 16", 248320, 16, 1, stride_classes},
    {"stride classes, K 256 (fallback)", 248320, 256, 1, stride_classes},
    {"K 1", 151936, 1, 2, random_normal},
    {"K 256, random", 151936, 256, 2, random_normal},
    {"last slice shorter than K", kSelectorTopkSlice + 5, 16, 2, rising},
    {"V 20, K 16", 20, 16, 2, random_normal},
    {"V = K = 16, equal", 16, 16, 1, all_equal},
};

bool ranks_before(float va, int ia, float vb, int ib) {
  const bool an = std::isnan(va), bn = std::isnan(vb);
  if (an != bn) return an;
  if (!an && va != vb) return va > vb;
  return ia < ib;
}

struct TopK {
  std::vector<int32_t> ids;
  std::vector<float> values, unary;
};

TopK expected_top_k(const std::vector<float>& logits, int64_t vocab, int top_k, int rows) {
  TopK e;
  std::vector<int> order(static_cast<size_t>(vocab));
  for (int r = 0; r < rows; ++r) {
    const float* row = logits.data() + static_cast<int64_t>(r) * vocab;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int x, int y) { return ranks_before(row[x], x, row[y], y); });
    for (int c = 0; c < top_k; ++c) {
      e.ids.push_back(order[static_cast<size_t>(c)]);
      e.values.push_back(row[order[static_cast<size_t>(c)]]);
      e.unary.push_back(row[order[static_cast<size_t>(c)]] * kMultiplier);
    }
  }
  return e;
}

bool same_float(float x, float y) {
  return (std::isnan(x) && std::isnan(y)) || gpu_test::float_bits(x) == gpu_test::float_bits(y);
}

// The first difference, or "" when the two agree exactly.
std::string first_difference(const TopK& got, const TopK& want, int top_k) {
  for (size_t i = 0; i < want.ids.size(); ++i) {
    if (got.ids[i] != want.ids[i] || !same_float(got.values[i], want.values[i]) ||
        !same_float(got.unary[i], want.unary[i])) {
      char buffer[200];
      std::snprintf(buffer, sizeof buffer, "row %zu, candidate %zu: id %d value %.9g unary %.9g, expected id %d value %.9g unary %.9g",
                    i / top_k, i % top_k, got.ids[i], got.values[i], got.unary[i], want.ids[i], want.values[i],
                    want.unary[i]);
      return buffer;
    }
  }
  return "";
}

TopK device_top_k(const std::vector<float>& logits, int64_t vocab, int top_k, int rows, SelectorTopK kernel) {
  DeviceBuffer<float> d_logits(logits.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(d_logits.get(), logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice));
  const size_t n = static_cast<size_t>(rows) * top_k;
  DeviceBuffer<int32_t> ids(n);
  DeviceBuffer<float> values(n), unary(n);
  DeviceBuffer<uint64_t> keys(static_cast<size_t>(selector_topk_keys(rows, vocab, top_k)));
  SelectorArgs a;
  a.batch = rows;
  a.slots = 1;
  a.vocab = vocab;
  a.top_k = top_k;
  a.output_multiplier = kMultiplier;
  a.softcap = 0.0f;
  a.logits = d_logits.get();
  a.topk_keys = keys.get();
  a.topk_ids = ids.get();
  a.topk_values = values.get();
  a.unary = unary.get();
  launch_selector_topk(a, kernel, nullptr, false);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  TopK got;
  got.ids.resize(n);
  got.values.resize(n);
  got.unary.resize(n);
  DFLASH_CUDA_CHECK(cudaMemcpy(got.ids.data(), ids.get(), n * sizeof(int32_t), cudaMemcpyDeviceToHost));
  DFLASH_CUDA_CHECK(cudaMemcpy(got.values.data(), values.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  DFLASH_CUDA_CHECK(cudaMemcpy(got.unary.data(), unary.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
  return got;
}

TEST(SelectorTopKGpu, MatchesAHostSortInTheTopKOrder) {
  DFLASH_REQUIRE_GPU();
  prepare_selector_kernels();
  const uint32_t seed = 20261202;
  std::printf("[selector] seed %u\n", seed);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(seed);
    std::vector<float> logits(static_cast<size_t>(c.rows) * c.vocab);
    for (int r = 0; r < c.rows; ++r) {
      for (int64_t v = 0; v < c.vocab; ++v) logits[static_cast<size_t>(r * c.vocab + v)] = c.logit(r, v, rng);
    }
    const TopK want = expected_top_k(logits, c.vocab, c.top_k, c.rows);
    for (SelectorTopK kernel : {SelectorTopK::kThreshold, SelectorTopK::kPlain}) {
      const char* kernel_name = kernel == SelectorTopK::kPlain ? "plain" : "threshold";
      const TopK got = device_top_k(logits, c.vocab, c.top_k, c.rows, kernel);
      const std::string difference = first_difference(got, want, c.top_k);
      EXPECT_EQ(difference, "") << kernel_name;
      std::printf("[selector] %-9s %-36s V %7lld K %3d rows %d: %s\n", kernel_name, c.name,
                  static_cast<long long>(c.vocab), c.top_k, c.rows, difference.empty() ? "exact" : difference.c_str());
      // Run to run: the same bits.
      const TopK again = device_top_k(logits, c.vocab, c.top_k, c.rows, kernel);
      EXPECT_EQ(first_difference(again, got, c.top_k), "") << kernel_name;
    }
  }
}

// Negative control: with every value equal, the top K is the K lowest ids; an expectation that
// breaks the tie toward the higher id must be reported.
TEST(SelectorTopKGpu, ATieBrokenTheOtherWayIsReported) {
  DFLASH_REQUIRE_GPU();
  prepare_selector_kernels();
  const int64_t vocab = 248320;
  const int top_k = 16;
  const std::vector<float> logits(static_cast<size_t>(vocab), 1.25f);
  TopK wrong = expected_top_k(logits, vocab, top_k, 1);
  for (int c = 0; c < top_k; ++c) wrong.ids[static_cast<size_t>(c)] = static_cast<int32_t>(vocab - 1 - c);
  const std::string difference =
      first_difference(device_top_k(logits, vocab, top_k, 1, SelectorTopK::kThreshold), wrong, top_k);
  std::printf("[selector] negative control: %s\n", difference.c_str());
  EXPECT_NE(difference, "");
}

}  // namespace
}  // namespace dflash
