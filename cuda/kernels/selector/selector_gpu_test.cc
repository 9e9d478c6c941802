// DFlash2's top-K kernels (cuda/kernels/selector/candidate_selector.h: threshold, the default, and plain) against a
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

#include "cuda/kernels/selector/candidate_selector.h"
#include "core/dtype.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/device_buffer.h"
#include "testing/gpu_test_util.h"

namespace dflash {
namespace {

constexpr float kMultiplier = 0.5f;
constexpr uint32_t kSeed = 20261202;  // printed by each table's test; every case starts from it

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

TopK device_top_k(const std::vector<float>& logits, int64_t vocab, int top_k, int rows, SelectorTopK kernel,
                  int shards = 1) {
  const DeviceBuffer<float> d_logits = gpu_test::to_device(logits);
  const size_t n = static_cast<size_t>(rows) * top_k;
  DeviceBuffer<int32_t> ids(n);
  DeviceBuffer<float> values(n), unary(n);
  DeviceBuffer<uint64_t> keys(static_cast<size_t>(selector_topk_keys(rows, vocab, top_k, shards)));
  SelectorArgs a;
  a.batch = rows;
  a.slots = 1;
  a.vocab = vocab;
  a.top_k = top_k;
  a.shards = shards;
  a.output_multiplier = kMultiplier;
  a.softcap = 0.0f;
  a.logits = d_logits.get();
  a.topk_keys = keys.get();
  a.topk_ids = ids.get();
  a.topk_values = values.get();
  a.unary = unary.get();
  launch_selector_topk(a, kernel, nullptr, false);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  return {gpu_test::to_host(ids), gpu_test::to_host(values), gpu_test::to_host(unary)};
}

TEST(SelectorTopKGpu, MatchesAHostSortInTheTopKOrder) {
  DFLASH_REQUIRE_GPU();
  prepare_selector_kernels();
  std::printf("[selector] seed %u\n", kSeed);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(kSeed);
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
    // Vocabulary shards (docs/spec/tensor-parallel.md §5.3): each shard's top K, merged, is the
    // one-device top K, ids and order (shards of fewer than K logits included).
    for (int shards : {2, 4, 8}) {
      if (c.vocab % shards != 0) continue;
      const TopK got = device_top_k(logits, c.vocab, c.top_k, c.rows, SelectorTopK::kThreshold, shards);
      const std::string difference = first_difference(got, want, c.top_k);
      EXPECT_EQ(difference, "") << shards << " shards";
      std::printf("[selector] %d shards %-36s: %s\n", shards, c.name, difference.empty() ? "exact" : difference.c_str());
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

// The edge scores and the walk (launch_selector_walk). Edge scores against an fp64 sum within the
// fp32 bound of their own arithmetic: each term is rounded twice (two products) and passes through
// at most ⌈r/32⌉ + 5 additions (its lane's, then the butterfly), then the unary's add: ⌈r/32⌉ + 8
// roundings of at most 2^-24 each, relative to |u| + Σ_j |A·Hh·Bs| (to first order). The walk exactly: a host
// scan of the device's own edge row S[t, prev, :] from slot 0, moving only to a strictly larger
// score (first maximum, lowest slot on ties; a NaN never moves it; a NaN in slot 0 stays), must
// give the same slots, tokens and walk_scores bits. Rows with rank 1 and Hh = 0 make the edge row
// the unary row, so that ties across lanes, NaN and ±inf reach the walk as planted.
struct WalkCase {
  const char* name;
  int batch, slots, top_k, rank;
  bool zero_hidden;
  // The unary score of slot c of mask row t.
  float (*unary)(int t, int c, std::mt19937& rng);
};

float unary_random(int, int, std::mt19937& rng) { return std::normal_distribution<float>(0.0f, 2.0f)(rng); }
float unary_ties_across_lanes(int, int c, std::mt19937&) { return c % 8 == 7 ? 5.0f : static_cast<float>(c % 5); }
float unary_nan_first(int, int c, std::mt19937& rng) {
  return c == 0 ? std::numeric_limits<float>::quiet_NaN() : unary_random(0, c, rng);
}
float unary_nan_then_max(int, int c, std::mt19937&) {
  return c == 3 ? std::numeric_limits<float>::quiet_NaN() : c == 10 ? 9.0f : static_cast<float>(c % 4);
}
float unary_equal(int, int, std::mt19937&) { return 0.75f; }
float unary_infinities(int, int c, std::mt19937&) {
  return c == 5 || c == 20 ? std::numeric_limits<float>::infinity() : c == 1 ? -std::numeric_limits<float>::infinity() : 1.0f;
}

const WalkCase kWalkCases[] = {
    {"DFlash2 geometry (K 16, r 256), batch 2", 2, 7, 16, 256, false, unary_random},
    {"K 256, r 24, batch 3", 3, 4, 256, 24, false, unary_random},
    {"K 40: ties across lanes", 1, 3, 40, 1, true, unary_ties_across_lanes},
    {"NaN in slot 0", 2, 3, 16, 1, true, unary_nan_first},
    {"NaN before the maximum", 1, 2, 16, 1, true, unary_nan_then_max},
    {"all equal", 1, 3, 33, 1, true, unary_equal},
    {"two +inf, one -inf", 1, 2, 24, 1, true, unary_infinities},
    {"K 1", 2, 5, 1, 8, false, unary_random},
};

struct WalkInputs {
  int64_t vocab = 1000;
  std::vector<int32_t> ids, anchors;
  std::vector<float> unary, hidden;
  std::vector<uint16_t> predecessor, successor;
};

WalkInputs walk_inputs(const WalkCase& c, std::mt19937& rng) {
  WalkInputs in;
  const int rows = c.batch * c.slots;
  in.vocab = std::max<int64_t>(1000, c.top_k);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < in.vocab * c.rank; ++i) {
    in.predecessor.push_back(float_to_bf16_bits(normal(rng)));
    in.successor.push_back(float_to_bf16_bits(normal(rng)));
  }
  std::vector<int32_t> pool(static_cast<size_t>(in.vocab));
  std::iota(pool.begin(), pool.end(), 0);
  for (int t = 0; t < rows; ++t) {
    std::shuffle(pool.begin(), pool.end(), rng);  // distinct ids in a row, as the top-K gives
    for (int k = 0; k < c.top_k; ++k) {
      in.ids.push_back(pool[static_cast<size_t>(k)]);
      in.unary.push_back(c.unary(t % c.slots, k, rng));
    }
    for (int j = 0; j < c.rank; ++j) in.hidden.push_back(c.zero_hidden ? 0.0f : normal(rng));
  }
  for (int b = 0; b < c.batch; ++b) in.anchors.push_back(static_cast<int32_t>(rng() % in.vocab));
  return in;
}

struct WalkResult {
  std::vector<float> edges, walk_scores;
  std::vector<int32_t> walk_index, tokens;
};

WalkResult device_walk(const WalkCase& c, const WalkInputs& in) {
  const int rows = c.batch * c.slots;
  const DeviceBuffer<int32_t> ids = gpu_test::to_device(in.ids), anchors = gpu_test::to_device(in.anchors);
  const DeviceBuffer<float> unary = gpu_test::to_device(in.unary), hidden = gpu_test::to_device(in.hidden);
  const DeviceBuffer<uint16_t> predecessor = gpu_test::to_device(in.predecessor);
  const DeviceBuffer<uint16_t> successor = gpu_test::to_device(in.successor);
  DeviceBuffer<int32_t> walk_index(rows), tokens(rows);
  DeviceBuffer<float> walk_scores(in.unary.size()), edges(static_cast<size_t>(rows) * c.top_k * c.top_k);
  SelectorArgs a;
  a.batch = c.batch;
  a.slots = c.slots;
  a.vocab = in.vocab;
  a.top_k = c.top_k;
  a.rank = c.rank;
  a.hidden_proj = hidden.get();
  a.predecessor = predecessor.get();
  a.successor = successor.get();
  a.anchors = anchors.get();
  a.topk_ids = ids.get();
  a.unary = unary.get();
  a.edge_scores = edges.get();
  a.walk_scores = walk_scores.get();
  a.walk_index = walk_index.get();
  a.tokens = tokens.get();
  launch_selector_walk(a, nullptr, false);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  return {gpu_test::to_host(edges), gpu_test::to_host(walk_scores), gpu_test::to_host(walk_index),
          gpu_test::to_host(tokens)};
}

// The first edge score outside its bound against the fp64 sum with slot 0's predecessor `anchors`,
// or "".
std::string first_edge_difference(const WalkCase& c, const WalkInputs& in, const std::vector<int32_t>& anchors,
                                  const std::vector<float>& edges) {
  const int k = c.top_k, r = c.rank;
  for (int row = 0; row < c.batch * c.slots; ++row) {
    const int slot = row % c.slots;
    const float* hh = in.hidden.data() + static_cast<size_t>(row) * r;
    for (int p = 0; p < k; ++p) {
      const int64_t pred = slot == 0 ? anchors[static_cast<size_t>(row / c.slots)] : in.ids[static_cast<size_t>((row - 1) * k + p)];
      for (int cand = 0; cand < k; ++cand) {
        const int64_t succ = in.ids[static_cast<size_t>(row * k + cand)];
        const double u = in.unary[static_cast<size_t>(row * k + cand)];
        double sum = 0.0, magnitude = std::fabs(u);
        for (int j = 0; j < r; ++j) {
          const double term = static_cast<double>(bf16_bits_to_float(in.predecessor[static_cast<size_t>(pred * r + j)])) *
                              hh[j] * bf16_bits_to_float(in.successor[static_cast<size_t>(succ * r + j)]);
          sum += term;
          magnitude += std::fabs(term);
        }
        const double want = u + sum;
        const float got = edges[(static_cast<size_t>(row) * k + p) * k + cand];
        const double bound = ((r + 31) / 32 + 8) * std::ldexp(1.0, -24) * magnitude;
        const bool same_special = std::isnan(want) ? std::isnan(got) : std::isinf(want) && got == want;
        if (!same_special && !(std::fabs(got - want) <= bound)) {
          char buffer[200];
          std::snprintf(buffer, sizeof buffer, "row %d, p %d, c %d: edge %.9g, fp64 %.9g, bound %.3g", row, p, cand, got,
                        want, bound);
          return buffer;
        }
      }
    }
  }
  return "";
}

// The first difference between the device's walk and a host scan of the device's edge rows, or "".
std::string first_walk_difference(const WalkCase& c, const WalkInputs& in, const WalkResult& got) {
  const int k = c.top_k;
  for (int b = 0; b < c.batch; ++b) {
    int prev = 0;
    for (int slot = 0; slot < c.slots; ++slot) {
      const int row = b * c.slots + slot;
      const float* scores = got.edges.data() + (static_cast<size_t>(row) * k + prev) * k;
      int best = 0;
      for (int cand = 1; cand < k; ++cand) {
        if (scores[cand] > scores[best]) best = cand;
      }
      for (int cand = 0; cand < k; ++cand) {
        if (!same_float(got.walk_scores[static_cast<size_t>(row * k + cand)], scores[cand])) {
          return "row " + std::to_string(row) + ": walk_scores[" + std::to_string(cand) + "] is not S[t, prev, c]";
        }
      }
      const int32_t token = in.ids[static_cast<size_t>(row * k + best)];
      if (got.walk_index[static_cast<size_t>(row)] != best || got.tokens[static_cast<size_t>(row)] != token) {
        return "row " + std::to_string(row) + ": slot " + std::to_string(got.walk_index[static_cast<size_t>(row)]) +
               " token " + std::to_string(got.tokens[static_cast<size_t>(row)]) + ", expected slot " + std::to_string(best) +
               " token " + std::to_string(token);
      }
      prev = best;
    }
  }
  return "";
}

TEST(SelectorWalkGpu, EdgeScoresWithinTheirBoundAndTheWalkEqualsAHostScan) {
  DFLASH_REQUIRE_GPU();
  prepare_selector_kernels();
  std::printf("[selector] seed %u\n", kSeed);
  for (const WalkCase& c : kWalkCases) {
    SCOPED_TRACE(c.name);
    std::mt19937 rng(kSeed);
    const WalkInputs in = walk_inputs(c, rng);
    const WalkResult got = device_walk(c, in);
    const std::string edges = first_edge_difference(c, in, in.anchors, got.edges);
    const std::string walk = first_walk_difference(c, in, got);
    EXPECT_EQ(edges, "");
    EXPECT_EQ(walk, "");
    std::printf("[selector] walk %-40s batch %d slots %d K %3d r %3d: edges %s, walk %s\n", c.name, c.batch, c.slots,
                c.top_k, c.rank, edges.empty() ? "within bound" : edges.c_str(), walk.empty() ? "exact" : walk.c_str());
    const WalkResult again = device_walk(c, in);
    EXPECT_TRUE(std::equal(again.edges.begin(), again.edges.end(), got.edges.begin(),
                           [](float x, float y) { return same_float(x, y); }));
    EXPECT_EQ(again.walk_index, got.walk_index);
  }
}

// Negative control: edge scores computed with another anchor as slot 0's predecessor must leave
// the bound.
TEST(SelectorWalkGpu, AWrongPredecessorIsReported) {
  DFLASH_REQUIRE_GPU();
  prepare_selector_kernels();
  const WalkCase& c = kWalkCases[0];
  std::mt19937 rng(kSeed);
  const WalkInputs in = walk_inputs(c, rng);
  const WalkResult got = device_walk(c, in);
  std::vector<int32_t> wrong = in.anchors;
  wrong[0] = static_cast<int32_t>((wrong[0] + 1) % in.vocab);
  const std::string difference = first_edge_difference(c, in, wrong, got.edges);
  std::printf("[selector] walk negative control: %s\n", difference.c_str());
  EXPECT_NE(difference, "");
}

}  // namespace
}  // namespace dflash
