// The NVFP4 lm_head GEMM (cuda/kernels/nvfp4/gemm_nvfp4.h) against the reference's w4a16 emulation computed
// here in double: bf16 activations times e2m1 · e4m3 (core/nvfp4.h, exact), times weight_scale_2.
// Shapes cover K = 96 (the fixture's), K = 80 (K not a multiple of 32), K = 1040 (a partial
// last chunk), K = 4096 (Qwen3-8B), N not a multiple of the CTA's 128 columns; m covers one row
// up to more rows than one CTA takes. Also: batch invariance bit for bit, the fused argmax (ties to
// the lowest index), and proof that the check rejects a head read with its nibbles swapped.
//
// Error bound per element: e2m1 · e4m3 and the bf16 activation are exact in bf16, their product is
// exact in fp32; a sum of K of them in any order, each addition off by at most one fp32 ulp (2^-23
// relative; the tensor cores may truncate), is off by at most (K + 8)·2^-23·Σ|a·w'|; the global
// scale multiply adds one ulp of the result: |C - C_exact| <= (K + 10)·2^-23·gs·Σ|a·w'|.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "core/dtype.h"
#include "core/nvfp4.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/kernels/elementwise/elementwise.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/nvfp4/gemm_nvfp4.h"
#include "testing/gpu_test_util.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

constexpr uint64_t kSeed = 2026;

struct Expected {
  std::vector<double> value, bound;  // [m, n]
};

// swap_nibbles: the planted defect (element 2j read from the high nibble).
Expected expected(const NvFp4Weight& w, const Tensor& a, int64_t m, bool swap_nibbles) {
  NvFp4Weight read = w;
  if (swap_nibbles) {
    for (uint8_t& b : read.codes) b = static_cast<uint8_t>((b >> 4) | (b << 4));
  }
  Expected e;
  e.value.resize(static_cast<size_t>(m * w.rows));
  e.bound.resize(e.value.size());
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t n = 0; n < w.rows; ++n) {
    nvfp4_block_scaled_row(read, n, row.data());
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        const double p = static_cast<double>(a.row(i)[k]) * row[static_cast<size_t>(k)];
        sum += p;
        mag += std::fabs(p);
      }
      e.value[static_cast<size_t>(i * w.rows + n)] = sum * w.global_scale;
      e.bound[static_cast<size_t>(i * w.rows + n)] = static_cast<double>(w.cols + 10) * 0x1p-23 * mag * w.global_scale;
    }
  }
  return e;
}

double worst_ratio(const std::vector<float>& c, const Expected& e) {
  double worst = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (std::isnan(c[i])) return INFINITY;
    worst = std::max(worst, std::fabs(c[i] - e.value[i]) / std::max(e.bound[i], 1e-30));
  }
  return worst;
}

using gpu_test::upload_activations;

class GemmNvfp4Test : public ::testing::Test {
 protected:
  void SetUp() override {
    DFLASH_REQUIRE_GPU();
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  // The logits of m rows (every element must be written: the buffer starts as NaN).
  std::vector<float> run(const DeviceNvFp4Linear& w, const DeviceBuffer<uint16_t>& a, int64_t lda, int64_t m) {
    DeviceBuffer<float> out(static_cast<size_t>(m * w.n));
    const std::vector<float> poison(out.size(), NAN);
    EXPECT_EQ(cudaSuccess, cudaMemcpy(out.get(), poison.data(), out.bytes(), cudaMemcpyHostToDevice));
    GemmEpilogue ep;
    ep.out = out.get();
    ep.ld_out = w.n;
    launch_gemm_nvfp4(stream_, false, a.get(), lda, m, w.view(), ep);
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
    std::vector<float> host(out.size());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(host.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(GemmNvfp4Test, MatchesTheW4a16EmulationAtEveryRowCountAndIsBatchInvariant) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  struct Shape {
    int64_t n, k;
  };
  // One and four m16 tiles per CTA, and more rows than one CTA takes (grid.y > 1).
  const int64_t row_counts[] = {1, 2, 7, 15, 16, 17, 32, 33, 60, 64, 65};
  const int64_t max_m = 130;
  for (const Shape& s : {Shape{500, 96}, Shape{333, 80}, Shape{257, 1040}, Shape{1000, 4096}}) {
    const NvFp4Weight head = make_random_nvfp4_head(s.n, s.k, kSeed + static_cast<uint64_t>(s.k));
    const DeviceNvFp4Linear w = upload_nvfp4(head);
    const int64_t lda = pad_k(s.k);
    const Tensor a = make_random_context(max_m, s.k, kSeed + 1);
    const DeviceBuffer<uint16_t> da = upload_activations(a, lda);
    const Expected e = expected(head, a, max_m, false);
    const std::vector<float> all = run(w, da, lda, max_m);
    const double worst = worst_ratio(all, e);
    std::printf("[nvfp4] gemm n %lld k %lld: worst |error| / bound %.3f\n", static_cast<long long>(s.n), static_cast<long long>(s.k), worst);
    EXPECT_LE(worst, 1.0) << "n " << s.n << " k " << s.k;
    // The check can fail: the same kernel output against a head read with its nibbles swapped.
    EXPECT_GT(worst_ratio(all, expected(head, a, max_m, true)), 1.0) << "n " << s.n << " k " << s.k;
    for (int64_t m : row_counts) {
      const std::vector<float> part = run(w, da, lda, m);
      for (size_t i = 0; i < part.size(); ++i) {
        ASSERT_EQ(gpu_test::float_bits(part[i]), gpu_test::float_bits(all[i]))
            << "n " << s.n << " k " << s.k << ": m " << m << " changes element " << i << " (batch invariance)";
      }
    }
  }
}

TEST_F(GemmNvfp4Test, FusedArgmaxMatchesTheLogitsAndTiesGoToTheLowestIndex) {
  const int64_t m = 15, n = 2500, k = 128, lda = pad_k(k);
  for (int variant = 0; variant < 3; ++variant) {
    // 0: random; 1: every code 0 -> all logits 0 -> token 0; 2: rows 1 and 1024 equal and largest
    // (positive codes), everything else 0 -> token 1.
    NvFp4Weight head = make_random_nvfp4_head(n, k, kSeed + 7);
    Tensor a = make_random_context(m, k, kSeed + 8);
    if (variant > 0) {
      std::fill(head.codes.begin(), head.codes.end(), 0);
      if (variant == 2) {
        for (int64_t b = 0; b < k / 2; ++b) head.codes[static_cast<size_t>(1 * k / 2 + b)] = head.codes[static_cast<size_t>(1024 * k / 2 + b)] = 0x22;
        for (int64_t blk = 0; blk < k / 16; ++blk) {
          head.block_scales[static_cast<size_t>(1 * k / 16 + blk)] = head.block_scales[static_cast<size_t>(1024 * k / 16 + blk)] = 0x38;
        }
        for (float& v : a.values) v = round_to_bf16(std::fabs(v) + 0.5f);
      }
    }
    const DeviceNvFp4Linear w = upload_nvfp4(head);
    const DeviceBuffer<uint16_t> da = upload_activations(a, lda);
    DeviceBuffer<float> logits(static_cast<size_t>(m * n)), values(static_cast<size_t>(m * argmax_blocks(n)));
    DeviceBuffer<int32_t> indices(values.size()), fused(static_cast<size_t>(m));
    GemmEpilogue ep;
    ep.out = logits.get();
    ep.ld_out = n;
    ep.argmax_value = values.get();
    ep.argmax_index = indices.get();
    ep.ld_argmax = argmax_blocks(n);
    launch_gemm_nvfp4(stream_, false, da.get(), lda, m, w.view(), ep);
    launch_argmax_reduce(values.get(), indices.get(), m, argmax_blocks(n), fused.get(), stream_);
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
    std::vector<float> host(logits.size());
    std::vector<int32_t> f(static_cast<size_t>(m));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(host.data(), logits.get(), logits.bytes(), cudaMemcpyDeviceToHost));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(f.data(), fused.get(), fused.bytes(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < m; ++i) {
      int32_t best = 0;  // host argmax of the stored logits, lowest index on ties
      for (int64_t j = 1; j < n; ++j) {
        if (host[static_cast<size_t>(i * n + j)] > host[static_cast<size_t>(i * n + best)]) best = static_cast<int32_t>(j);
      }
      ASSERT_EQ(f[static_cast<size_t>(i)], best) << "variant " << variant << " row " << i;
      if (variant == 1) {
        ASSERT_EQ(best, 0);
      }
      if (variant == 2) {
        ASSERT_EQ(best, 1);
      }
    }
  }
}

}  // namespace
}  // namespace dflash
