// The reference's NVFP4 head (reference/prepared_weights.cc) on the bundled nvfp4-tiny-gqa head:
//  - bf16 and fp8 modes use the head as it is (never requantized): the same bits in both, equal to
//    an independent loop (e2m1 · e4m3 in float, summed in double, times weight_scale_2) within the
//    fp32 summation bound γ_K · Σ|x·W'| · weight_scale_2 (K = 96: γ = 96 · 2^-24) plus one rounding
//    of the result; a per-row E4M3 requantization of the same head (what fp8 mode must not do)
//    breaks that bound (the negative control);
//  - fp64 mode multiplies by the exact head: within 1e-13 of the same loop in double.
// Activation rows are seeded bf16 values (seed printed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "core/dtype.h"
#include "core/nvfp4.h"
#include "fixtures/fixture.h"
#include "reference/linear.h"
#include "reference/prepared_weights.h"
#include "reference/stage_policy.h"

namespace dflash {
namespace {

constexpr uint32_t kSeed = 26;
constexpr int64_t kRows = 5;

const DrafterWeights& fixture_weights() {
  static Fixture f = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/nvfp4-tiny-gqa");
  return f.load_weights();
}

template <typename T>
AlignedMatrix<T> activations(int64_t cols) {
  std::mt19937 rng(kSeed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  AlignedMatrix<T> x(kRows, cols);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < cols; ++c) x.row(r)[c] = static_cast<T>(round_to_bf16(u(rng)));
  return x;
}

template <typename T>
AlignedMatrix<T> apply(const Linear<T>& head, const AlignedMatrix<T>& x, ThreadPool& pool) {
  AlignedMatrix<T> y(kRows, head.out_features());
  head.apply(x, kRows, &y, pool);
  return y;
}

// Largest |got - exact| / bound over the head, where exact and bound come from an independent loop.
double worst_over_bound(const NvFp4Weight& q, const AlignedMatrix<float>& x, const AlignedMatrix<float>& y) {
  const double gamma = static_cast<double>(q.cols) * std::ldexp(1.0, -24);
  std::vector<float> w(static_cast<size_t>(q.cols));
  double worst = 0;
  for (int64_t n = 0; n < q.rows; ++n) {
    nvfp4_block_scaled_row(q, n, w.data());
    for (int64_t m = 0; m < kRows; ++m) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < q.cols; ++k) {
        exact += static_cast<double>(x.row(m)[k]) * w[k];
        magnitude += std::fabs(static_cast<double>(x.row(m)[k]) * w[k]);
      }
      exact *= q.global_scale;
      const double bound = gamma * magnitude * q.global_scale + std::ldexp(std::fabs(exact), -23) + 1e-30;
      worst = std::max(worst, std::fabs(y.row(m)[n] - exact) / bound);
    }
  }
  return worst;
}

TEST(Nvfp4Head, Bf16AndFp8ModesUseTheHeadAsItIs) {
  std::printf("activation seed %u\n", kSeed);
  const DrafterWeights& w = fixture_weights();
  ASSERT_TRUE(w.nvfp4_head());
  ThreadPool pool(2);
  const PreparedWeights<float> bf16(w, StagePolicy::for_precision(Precision::kBf16), pool);
  const PreparedWeights<float> fp8(w, StagePolicy::for_precision(Precision::kFp8), pool);
  const AlignedMatrix<float> x = activations<float>(w.lm_head_nvfp4.cols);
  const AlignedMatrix<float> y_bf16 = apply(bf16.lm_head, x, pool), y_fp8 = apply(fp8.lm_head, x, pool);
  for (int64_t m = 0; m < kRows; ++m)
    for (int64_t n = 0; n < w.lm_head_nvfp4.rows; ++n) ASSERT_EQ(y_bf16.row(m)[n], y_fp8.row(m)[n]) << m << "," << n;
  const double worst = worst_over_bound(w.lm_head_nvfp4, x, y_bf16);
  std::printf("w4a16 emulation: worst |error| / fp32 bound %.3f\n", worst);
  EXPECT_LE(worst, 1.0);

  // Negative control: the same head requantized per row to E4M3 falls outside the bound.
  const NvFp4Weight& q = w.lm_head_nvfp4;
  Tensor dequantized({q.rows, q.cols}, std::vector<float>(static_cast<size_t>(q.rows * q.cols)));
  std::vector<double> row(static_cast<size_t>(q.cols));
  for (int64_t n = 0; n < q.rows; ++n) {
    nvfp4_dequantized_row(q, n, row.data());
    for (int64_t k = 0; k < q.cols; ++k) dequantized.row(n)[k] = static_cast<float>(row[k]);
  }
  const Linear<float> requantized(dequantized, Tensor(), /*quantize_fp8=*/true, "requantized", pool);
  const double requantized_worst = worst_over_bound(q, x, apply(requantized, x, pool));
  std::printf("negative control (E4M3-requantized head): worst |error| / bound %.1f\n", requantized_worst);
  EXPECT_GT(requantized_worst, 1.0);
}

TEST(Nvfp4Head, Fp64ModeMultipliesByTheExactHead) {
  const DrafterWeights& w = fixture_weights();
  ThreadPool pool(2);
  const PreparedWeights<double> fp64(w, StagePolicy::for_precision(Precision::kFp64), pool);
  const AlignedMatrix<double> x = activations<double>(w.lm_head_nvfp4.cols);
  const AlignedMatrix<double> y = apply(fp64.lm_head, x, pool);
  const NvFp4Weight& q = w.lm_head_nvfp4;
  std::vector<double> row(static_cast<size_t>(q.cols));
  double worst = 0;
  for (int64_t n = 0; n < q.rows; ++n) {
    nvfp4_dequantized_row(q, n, row.data());
    for (int64_t m = 0; m < kRows; ++m) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < q.cols; ++k) {
        exact += x.row(m)[k] * row[k];
        magnitude += std::fabs(x.row(m)[k] * row[k]);
      }
      worst = std::max(worst, std::fabs(y.row(m)[n] - exact) / (magnitude + 1e-300));
    }
  }
  std::printf("fp64: worst |error| / sum|x w| %.2e\n", worst);
  EXPECT_LE(worst, 1e-13);
}

}  // namespace
}  // namespace dflash
