// Linear<T>: values against a float64 dot product with a derived bound, and bit-identical rows
// whatever the number of rows, their place in the product, or the thread count (docs/spec/drafter.md §5).
#include "reference/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"

namespace dflash {
namespace {

Tensor random_bf16(std::vector<int64_t> shape, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  Tensor t = Tensor::zeros(std::move(shape));
  for (float& v : t.values) v = round_to_bf16(dist(rng));
  return t;
}

template <typename T>
AlignedMatrix<T> random_rows(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-2, 2);
  AlignedMatrix<T> m(rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) m.row(r)[c] = static_cast<T>(dist(rng));
  }
  return m;
}

// 300 outputs: two chunks of different heights (the chunk height is a multiple of 8, at most 256),
// K = 100 not a multiple of any SIMD width.
constexpr int64_t kOut = 300, kIn = 100;

// |computed - exact| <= γ_K · Σ_k |w_k x_k| (+ the bias add and, for fp8, the scale product: 2 more
// roundings of the result), with γ_K = K·u / (1 - K·u), u the unit roundoff of T.
template <typename T>
void check_against_float64(bool fp8) {
  const Tensor w = random_bf16({kOut, kIn}, 0.3f, 1);
  const Tensor b = random_bf16({kOut}, 0.5f, 2);
  ThreadPool pool(1);
  const Linear<T> linear(w, b, fp8, "test", pool);
  const AlignedMatrix<T> x = random_rows<T>(5, kIn, 3);
  AlignedMatrix<T> y(5, kOut);
  linear.apply(x, 5, &y, pool);

  // The weights the product should use: W itself, or scale[n] · decode(q[n, k]).
  QuantizedRows q;
  if (fp8) q = quantize_rows_e4m3(w);
  const double u = std::numeric_limits<T>::epsilon() / 2;
  const double gamma = kIn * u / (1 - kIn * u);
  for (int64_t m = 0; m < 5; ++m) {
    for (int64_t n = 0; n < kOut; ++n) {
      double dot = 0, magnitude = 0;
      for (int64_t k = 0; k < kIn; ++k) {
        const double wk = fp8 ? e4m3_to_float(q.codes[n * kIn + k]) : w.row(n)[k];
        dot += wk * static_cast<double>(x.row(m)[k]);
        magnitude += std::fabs(wk * static_cast<double>(x.row(m)[k]));
      }
      const double scale = fp8 ? q.scales[n] : 1.0;
      const double exact = scale * dot + b.values[n];
      const double bound = (gamma * magnitude * scale) + 2 * u * (std::fabs(scale * dot) + std::fabs(exact));
      ASSERT_LE(std::fabs(static_cast<double>(y.row(m)[n]) - exact), bound) << "m=" << m << " n=" << n;
    }
  }
}

TEST(Linear, FloatMatchesFloat64Dot) { check_against_float64<float>(false); }
TEST(Linear, DoubleMatchesFloat64Dot) { check_against_float64<double>(false); }
TEST(Linear, Fp8UsesScaledDecodedCodes) { check_against_float64<float>(true); }

// w8a8: y[m, n] = a[m] · (s[n] · Σ_k dec(q[n,k]) · dec(c[m,k])) + b[n], with the activation codes c
// and scale a written out here from docs/spec/drafter.md §6 (amax, max(amax, 2^-9)/448 or the static
// scale, x · (1/a) encoded). Every product is exact in float, so the only rounding is the fp32 sum's
// (γ_K · Σ|products|) and the two scale products and the bias add on top.
void check_w8a8(std::optional<float> input_scale) {
  const Tensor w = random_bf16({kOut, kIn}, 0.3f, 1);
  const Tensor b = random_bf16({kOut}, 0.5f, 2);
  ThreadPool pool(2);
  const Linear<float> linear(w, b, true, "test", pool, Fp8Activations{true, input_scale});
  AlignedMatrix<float> x = random_rows<float>(5, kIn, 3);
  for (int64_t k = 0; k < kIn; ++k) x.row(4)[k] = 0.0f;  // an all-zero row: only the bias is left
  AlignedMatrix<float> y(5, kOut);
  linear.apply(x, 5, &y, pool);

  const QuantizedRows q = quantize_rows_e4m3(w);
  const double u = std::numeric_limits<float>::epsilon() / 2;
  const double gamma = kIn * u / (1 - kIn * u);
  for (int64_t m = 0; m < 5; ++m) {
    float amax = 0.0f;
    for (int64_t k = 0; k < kIn; ++k) amax = std::max(amax, std::fabs(x.row(m)[k]));
    const float a = input_scale ? *input_scale : std::max(amax, 0x1p-9f) / 448.0f;
    const float inv = 1.0f / a;
    std::vector<double> c(kIn);
    for (int64_t k = 0; k < kIn; ++k) c[k] = e4m3_to_float(float_to_e4m3_satfinite(x.row(m)[k] * inv));
    for (int64_t n = 0; n < kOut; ++n) {
      double dot = 0, magnitude = 0;
      for (int64_t k = 0; k < kIn; ++k) {
        const double p = e4m3_to_float(q.codes[n * kIn + k]) * c[k];
        dot += p;
        magnitude += std::fabs(p);
      }
      const double scaled = static_cast<double>(a) * (static_cast<double>(q.scales[n]) * dot);
      const double exact = scaled + b.values[n];
      const double bound = gamma * magnitude * a * q.scales[n] + 3 * u * (std::fabs(scaled) + std::fabs(exact));
      ASSERT_LE(std::fabs(static_cast<double>(y.row(m)[n]) - exact), bound) << "m=" << m << " n=" << n;
      if (m == 4) ASSERT_EQ(y.row(m)[n], b.values[n]) << "n=" << n;
    }
  }
}

TEST(Linear, W8a8QuantizesEachRowPerToken) { check_w8a8(std::nullopt); }
TEST(Linear, W8a8UsesTheStaticInputScale) { check_w8a8(0.004f); }  // rows up to 2 clip at 448 · 0.004 = 1.792

TEST(Linear, W8a8DiffersFromFp8) {
  // The quantized activations must not silently be the bf16 ones.
  const Tensor w = random_bf16({kOut, kIn}, 0.3f, 4);
  ThreadPool pool(1);
  const Linear<float> fp8(w, Tensor(), true, "fp8", pool), w8a8(w, Tensor(), true, "w8a8", pool, Fp8Activations{true, {}});
  const AlignedMatrix<float> x = random_rows<float>(1, kIn, 5);
  AlignedMatrix<float> a(1, kOut), b(1, kOut);
  fp8.apply(x, 1, &a, pool);
  w8a8.apply(x, 1, &b, pool);
  int differing = 0;
  for (int64_t n = 0; n < kOut; ++n) differing += a.row(0)[n] != b.row(0)[n];
  EXPECT_GT(differing, kOut / 2);
}

TEST(Linear, Fp8DiffersFromBf16Weights) {
  // The quantized product must not silently be the bf16 one.
  const Tensor w = random_bf16({kOut, kIn}, 0.3f, 4);
  ThreadPool pool(1);
  const Linear<float> plain(w, Tensor(), false, "plain", pool), quantized(w, Tensor(), true, "fp8", pool);
  EXPECT_TRUE(quantized.quantized());
  EXPECT_FALSE(plain.quantized());
  const AlignedMatrix<float> x = random_rows<float>(1, kIn, 5);
  AlignedMatrix<float> a(1, kOut), b(1, kOut);
  plain.apply(x, 1, &a, pool);
  quantized.apply(x, 1, &b, pool);
  int differing = 0;
  for (int64_t n = 0; n < kOut; ++n) differing += a.row(0)[n] != b.row(0)[n];
  EXPECT_GT(differing, kOut / 2);
}

template <typename T>
void check_row_invariance(bool fp8, bool w8a8 = false) {
  const Tensor w = random_bf16({kOut, kIn}, 0.3f, 6);
  const Tensor bias = random_bf16({kOut}, 0.5f, 7);
  ThreadPool one(1), four(4);
  const Linear<T> linear(w, bias, fp8, "test", one, Fp8Activations{w8a8, {}});
  ASSERT_LT(linear.chunk_rows(), kOut);  // at least two chunks, so chunking is exercised
  const AlignedMatrix<T> many = random_rows<T>(37, kIn, 8);
  AlignedMatrix<T> y_many(37, kOut), y_many_threads(37, kOut);
  linear.apply(many, 37, &y_many, one);
  linear.apply(many, 37, &y_many_threads, four);
  for (int64_t m : {0, 1, 17, 36}) {
    // The same row alone, and at another index of a smaller product.
    AlignedMatrix<T> alone(1, kIn), shifted(3, kIn);
    std::memcpy(alone.row(0), many.row(m), kIn * sizeof(T));
    std::memcpy(shifted.row(2), many.row(m), kIn * sizeof(T));
    AlignedMatrix<T> y_alone(1, kOut), y_shifted(3, kOut);
    linear.apply(alone, 1, &y_alone, four);
    linear.apply(shifted, 3, &y_shifted, one);
    ASSERT_EQ(std::memcmp(y_alone.row(0), y_many.row(m), kOut * sizeof(T)), 0) << "row " << m << " alone";
    ASSERT_EQ(std::memcmp(y_shifted.row(2), y_many.row(m), kOut * sizeof(T)), 0) << "row " << m << " shifted";
    ASSERT_EQ(std::memcmp(y_many_threads.row(m), y_many.row(m), kOut * sizeof(T)), 0) << "row " << m << " threads";
  }
}

TEST(Linear, RowsAreBitIdenticalAcrossBatchShapesAndThreads) {
  check_row_invariance<float>(false);
  check_row_invariance<double>(false);
  check_row_invariance<float>(true);
  check_row_invariance<float>(true, true);  // w8a8: each row quantized on its own
}

TEST(Linear, PreparationDoesNotDependOnThreads) {
  // 2500 rows: three preparation blocks of at most 1024 rows.
  const Tensor w = random_bf16({2500, 16}, 0.3f, 10);
  ThreadPool one(1), four(4);
  const AlignedMatrix<float> x = random_rows<float>(1, 16, 11);
  for (bool fp8 : {false, true}) {
    const Linear<float> a(w, Tensor(), fp8, "a", one), b(w, Tensor(), fp8, "b", four);
    AlignedMatrix<float> ya(1, 2500), yb(1, 2500);
    a.apply(x, 1, &ya, one);
    b.apply(x, 1, &yb, one);
    EXPECT_EQ(std::memcmp(ya.row(0), yb.row(0), 2500 * sizeof(float)), 0) << "fp8 " << fp8;
  }
  const Linear<double> c(w, Tensor(), false, "c", one), d(w, Tensor(), false, "d", four);
  const AlignedMatrix<double> xd = random_rows<double>(1, 16, 11);
  AlignedMatrix<double> yc(1, 2500), yd(1, 2500);
  c.apply(xd, 1, &yc, one);
  d.apply(xd, 1, &yd, one);
  EXPECT_EQ(std::memcmp(yc.row(0), yd.row(0), 2500 * sizeof(double)), 0);
}

TEST(Linear, ShapeMismatchIsAnError) {
  ThreadPool pool(1);
  const Linear<float> linear(random_bf16({8, 4}, 1, 9), Tensor(), false, "small", pool);
  AlignedMatrix<float> x(2, 5), y(2, 8);
  EXPECT_THROW(linear.apply(x, 2, &y, pool), HarnessError);
  EXPECT_THROW(Linear<float>(random_bf16({8, 4}, 1, 9), random_bf16({7}, 1, 9), false, "bias", pool), HarnessError);
  EXPECT_THROW(Linear<double>(random_bf16({8, 4}, 1, 9), Tensor(), true, "fp8 in double", pool), HarnessError);
  EXPECT_THROW(Linear<float>(random_bf16({8, 4}, 1, 9), Tensor(), false, "w8a8 without fp8 weights", pool,
                             Fp8Activations{true, {}}),
               HarnessError);
}


// docs/spec/tensor-parallel.md §10 item 5: the row-parallel reduction on hand-made partials. W is
// one row of ones, so rank r's partial is the sum of its slice of x: one element per rank here.
float reduce_partials(const std::vector<float>& partials, bool bf16_reduce, float bias = 0.0f) {
  const int64_t n = static_cast<int64_t>(partials.size());
  ThreadPool pool(1);
  const Tensor w({1, n}, std::vector<float>(static_cast<size_t>(n), 1.0f));
  const Tensor b({1}, {bias});
  Linear<float> linear(w, b, false, "o_proj", pool);
  linear.set_row_parallel(static_cast<int>(n), bf16_reduce);
  AlignedMatrix<float> x(1, n), y(1, 1);
  std::copy(partials.begin(), partials.end(), x.row(0));
  linear.apply(x, 1, &y, pool);
  return y.row(0)[0];
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

TEST(LinearRowParallel, ReducesInRankOrderFromRankZero) {
  const float t = 0x1p-24f;
  // Linear from p_0: 1 + 2^-24 rounds back to 1 three times. A tree would give 0x3F800001, the
  // reversed order or a start at rank 1 0x3F800002.
  EXPECT_EQ(bits(reduce_partials({1.0f, t, t, t}, false)), 0x3F800000u);
  EXPECT_EQ(bits(reduce_partials({t, t, t, 1.0f}, false)), 0x3F800002u);  // the same values, another rank order
}

TEST(LinearRowParallel, Bf16RoundsEachPartialAndTheSumOnce) {
  const float e = 0x1p-9f;
  // Partials exact in bf16, the sum 1 + 3·2^-9 rounded once: 1 + 2^-7 (rounding after every
  // addition would give 1.0).
  EXPECT_EQ(float_to_bf16_bits(reduce_partials({1.0f, e, e, e}, true)), 0x3F81u);
  // 2^-8 + 2^-16 rounds to 2^-8 as it travels; 1 + 2^-8 is a tie, to even: 1.0. Unrounded
  // partials would give 1 + 2^-7, and the fp32 setting keeps 1 + 2^-8 + 2^-16.
  EXPECT_EQ(reduce_partials({1.0f, 0x1p-8f + 0x1p-16f}, true), 1.0f);
  EXPECT_EQ(reduce_partials({1.0f, 0x1p-8f + 0x1p-16f}, false), 1.0f + 0x1p-8f + 0x1p-16f);
}

TEST(LinearRowParallel, BiasOnceAfterTheReduction) {
  // The bias 1 once: 0.25 + 0.25 + 1 = 1.5. On each rank's partial it would give 2.5.
  EXPECT_EQ(reduce_partials({0.25f, 0.25f}, false, 1.0f), 1.5f);
  // bf16: the sum is rounded before the bias is added in fp32: bf16(1 + 2^-9) = 1, + 2^-20.
  EXPECT_EQ(reduce_partials({1.0f, 0x1p-9f}, true, 0x1p-20f), 1.0f + 0x1p-20f);
}

TEST(LinearRowParallel, OneRankIsThePlainProductAndNRanksStayInTheBound) {
  const Tensor w = random_bf16({kOut, kIn}, 0.3f, 1);
  const Tensor b = random_bf16({kOut}, 0.5f, 2);
  ThreadPool pool(2);
  for (bool fp8 : {false, true}) {
    const Linear<float> plain(w, b, fp8, "plain", pool);
    Linear<float> one(w, b, fp8, "one", pool), four(w, b, fp8, "four", pool);
    one.set_row_parallel(1, true);  // N = 1 never rounds (§11 item 3)
    four.set_row_parallel(4, false);
    const AlignedMatrix<float> x = random_rows<float>(7, kIn, 3);
    AlignedMatrix<float> y_plain(7, kOut), y_one(7, kOut), y_four(7, kOut);
    plain.apply(x, 7, &y_plain, pool);
    one.apply(x, 7, &y_one, pool);
    four.apply(x, 7, &y_four, pool);
    QuantizedRows q;
    if (fp8) q = quantize_rows_e4m3(w);
    const double u = 0x1p-24;
    const double gamma = kIn * u / (1 - kIn * u);
    size_t differing = 0;
    for (int64_t m = 0; m < 7; ++m) {
      ASSERT_EQ(std::memcmp(y_plain.row(m), y_one.row(m), sizeof(float) * kOut), 0) << "row " << m;
      for (int64_t n = 0; n < kOut; ++n) {
        double magnitude = 0;
        for (int64_t k = 0; k < kIn; ++k) {
          const double wk = fp8 ? e4m3_to_float(q.codes[n * kIn + k]) * double{q.scales[n]} : w.row(n)[k];
          magnitude += std::fabs(wk * x.row(m)[k]);
        }
        // §9.1: two summation orders of one sum, each within γ_K·Σ|x_k| (+ the scale's and the bias's
        // roundings on each side).
        const double bound = 2 * gamma * magnitude + 4 * u * (std::fabs(y_plain.row(m)[n]) + 1);
        EXPECT_LE(std::fabs(double{y_four.row(m)[n]} - y_plain.row(m)[n]), bound) << "m=" << m << " n=" << n;
        differing += y_four.row(m)[n] != y_plain.row(m)[n];
      }
    }
    EXPECT_GT(differing, 0u) << "four ranks summed as one: the K split did not happen";
  }
}

TEST(LinearRowParallel, RefusesRanksThatDoNotDivideK) {
  const Tensor w = random_bf16({4, 6}, 0.3f, 1);
  ThreadPool pool(1);
  Linear<float> linear(w, Tensor(), false, "down_proj", pool);
  EXPECT_THROW(linear.set_row_parallel(4, false), HarnessError);
}

}  // namespace
}  // namespace dflash
