// The CUTLASS mixed-input GEMM (cuda/kernels/gemm/gemm_cutlass_mixed.h) against the plain fallback GEMM
// (GemmKernel::kSimple, cuda/kernels/gemm/gemm_fallback.cu) at the block forward's q|k|v and down shapes and a
// ragged one (n and k not multiples of the 128 × 64 tiles), m = 1, 64, 128, 200, 512, with tiles of
// 128 and of 256 activation rows; run-to-run equality from a dirty workspace (stream-K's split is
// fixed for a shape); nothing written outside [m, n]; two planted bugs rejected; the residual added
// in place bit for bit as the fallbacks add it. (Through gemm() with every epilogue: gemm_gpu_test.)
//
// Bound (derivation). With K = k_pad terms (the padding is zero), S = Σ a·q exact and
// M = Σ |a·q|: every product of a bf16 activation and an E4M3 code is exact in fp32 (8 + 4
// significant bits). The tensor cores add them with at most K + 8 fp32 additions (a stream-K split
// adds its partial sums instead of continuing one: no more additions), each
// off by at most one ulp (2^-23 relative: the accumulation may truncate), and its epilogue's
// multiply by the row scale s rounds once more: |cand − s·S| <= (K + 9)·2^-23·s·M. The fallback
// adds in k order, rounding to nearest: |raw − S| <= K·2^-24·M; the test multiplies s·raw in
// double. So |cand − s·raw| <= (2K + 10)·2^-23·s·M. M itself comes from the fallback run on |a|
// and |q| (sign bits cleared): a sum of positive terms, so M <= M'·(1 + K·2^-23).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/kernels/quant/fp8_quant.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/gemm/gemm_cutlass_mixed.h"
#include "fixtures/random_drafter.h"
#include "testing/gpu_test_util.h"

namespace dflash {
namespace {

constexpr int64_t kMaxM = 512;
constexpr uint32_t kSentinel = 0xffffffffu;  // a NaN no kernel writes

struct Weight {
  int64_t n = 0, k = 0, k_pad = 0;
  DeviceBuffer<uint8_t> codes, abs_codes;
  DeviceBuffer<float> scale;  // [n + 4]: the planted bug reads four rows further
  std::vector<float> host_scale;
  DeviceMatrixView view(bool abs = false) const {
    DeviceMatrixView w;
    w.format = WeightFormat::kE4M3;
    w.n = n;
    w.k = k;
    w.k_pad = k_pad;
    w.data = abs ? abs_codes.get() : codes.get();
    w.scale = scale.get();
    return w;
  }
};

// Random bf16 rows, row r scaled by 1 + r % 7 so that rows' scales differ (the planted
// neighbour-scale bug must show), quantized on the device as the drafter quantizes its weights.
void make_weight(Weight& w, int64_t n, int64_t k, uint64_t seed, cudaStream_t stream) {
  w.n = n;
  w.k = k;
  w.k_pad = pad_k(k);
  std::vector<uint16_t> bits(static_cast<size_t>(n * w.k_pad), 0);
  const float range = static_cast<float>(std::sqrt(3.0 / static_cast<double>(k)));
  for (int64_t r = 0; r < n; ++r) {
    const float f = static_cast<float>(1 + r % 7);
    for (int64_t c = 0; c < k; ++c) {
      const uint64_t i = static_cast<uint64_t>(r * k + c);
      bits[static_cast<size_t>(r * w.k_pad + c)] = float_to_bf16_bits(f * random_bf16(seed, 1, i, -range, range));
    }
  }
  DeviceBuffer<uint16_t> staged(bits.size());
  ASSERT_EQ(cudaSuccess, cudaMemcpy(staged.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  w.codes.allocate(bits.size());
  w.scale.allocate(static_cast<size_t>(n + 4));
  ASSERT_EQ(cudaSuccess, cudaMemset(w.scale.get(), 0, w.scale.bytes()));
  launch_quantize_rows_e4m3(stream, staged.get(), n, w.k_pad, w.codes.get(), w.scale.get());
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
  std::vector<uint8_t> codes(bits.size());
  ASSERT_EQ(cudaSuccess, cudaMemcpy(codes.data(), w.codes.get(), codes.size(), cudaMemcpyDeviceToHost));
  for (uint8_t& c : codes) c &= 0x7f;
  w.abs_codes.allocate(codes.size());
  ASSERT_EQ(cudaSuccess, cudaMemcpy(w.abs_codes.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
  w.host_scale.resize(static_cast<size_t>(n));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(w.host_scale.data(), w.scale.get(), static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost));
}

class CutlassMixedGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    DFLASH_REQUIRE_GPU();
    std::string why;
    if (!cutlass_mixed_supported(&why)) GTEST_SKIP() << why;
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  // The candidate's out[m, ld_out] (one more row and 4 more columns than it may write, all
  // sentinels before the launch), as bits. With `source` ([m, ld_out] bits) out starts as the
  // source over its first m rows and the launch adds itself to it in place (the residual stream).
  std::vector<uint32_t> run_candidate(const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                                      const std::vector<uint32_t>* source = nullptr, int tile_rows = 128) {
    const int64_t ld_out = w.n + 4;
    DeviceBuffer<float> out(static_cast<size_t>((m + 1) * ld_out));
    EXPECT_EQ(cudaSuccess, cudaMemset(out.get(), 0xff, out.bytes()));
    if (source != nullptr) {
      EXPECT_EQ(cudaSuccess,
                cudaMemcpy(out.get(), source->data(), static_cast<size_t>(m * ld_out) * 4, cudaMemcpyHostToDevice));
    }
    const size_t bytes = std::max<size_t>(1, cutlass_mixed_workspace_bytes(m, w.n, w.k_pad));
    DeviceBuffer<uint8_t> workspace(bytes);
    // Dirty workspace: stream-K must clear what it relies on.
    EXPECT_EQ(cudaSuccess, cudaMemset(workspace.get(), 0x5a, workspace.bytes()));
    launch_gemm_cutlass_mixed(stream_, a, lda, m, w, out.get(), ld_out, workspace.get(), workspace.bytes(),
                              source != nullptr ? out.get() : nullptr, tile_rows);
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
    std::vector<uint32_t> bits(out.size());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(bits.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
    return bits;
  }

  // The fallback's unscaled fp32 sums [m, n].
  std::vector<float> run_fallback(const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w) {
    DeviceBuffer<float> raw(static_cast<size_t>(m * w.n));
    launch_gemm_simple(stream_, a, lda, m, w, raw.get());
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
    std::vector<float> host(raw.size());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(host.data(), raw.get(), raw.bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

  cudaStream_t stream_ = nullptr;
};

struct Check {
  int64_t violations = 0, outside_written = 0;
  double worst_ratio = 0;  // max |cand − s·raw| / bound over elements with a bound > 0
};

// The candidate's m rows against s·raw within the bound; everything outside [m, n] untouched.
Check check(const std::vector<uint32_t>& cand, int64_t m, const Weight& w, const std::vector<float>& raw,
            const std::vector<float>& mag) {
  Check out;
  const int64_t ld_out = w.n + 4, k = w.k_pad;
  const double factor = (2.0 * static_cast<double>(k) + 10.0) * 0x1p-23 * (1.0 + static_cast<double>(k) * 0x1p-23);
  for (int64_t r = 0; r <= m; ++r) {
    for (int64_t c = 0; c < ld_out; ++c) {
      const uint32_t bits = cand[static_cast<size_t>(r * ld_out + c)];
      if (r == m || c >= w.n) {
        if (bits != kSentinel) ++out.outside_written;
        continue;
      }
      float v;
      std::memcpy(&v, &bits, 4);
      const double s = w.host_scale[static_cast<size_t>(c)];
      const double ref = s * raw[static_cast<size_t>(r * w.n + c)];
      const double bound = factor * s * mag[static_cast<size_t>(r * w.n + c)];
      const double err = std::fabs(static_cast<double>(v) - ref);
      if (!(err <= bound)) ++out.violations;  // NaN counts
      if (bound > 0) out.worst_ratio = std::max(out.worst_ratio, err / bound);
    }
  }
  return out;
}

struct ShapeCase {
  const char* name;
  int64_t n, k;
};

TEST_F(CutlassMixedGemm, MatchesTheFallbackWithinTheBoundAndRejectsPlantedBugs) {
  const ShapeCase shapes[] = {{"q|k|v", 6144, 4096}, {"down", 4096, 12288}, {"ragged", 1000, 1000}};
  for (const ShapeCase& shape : shapes) {
    SCOPED_TRACE(shape.name);
    Weight w;
    make_weight(w, shape.n, shape.k, 25, stream_);
    // kMaxM + 1 rows: the planted row-shift bug reads one row past m.
    const Tensor a = make_random_context(kMaxM + 1, shape.k, 26);
    const DeviceBuffer<uint16_t> d_a = gpu_test::upload_activations(a, w.k_pad);
    Tensor abs_a = a;
    for (float& v : abs_a.values) v = std::fabs(v);
    const DeviceBuffer<uint16_t> d_abs_a = gpu_test::upload_activations(abs_a, w.k_pad);
    // Rows are independent in the fallback: the 512-row sums serve every m.
    const std::vector<float> raw = run_fallback(d_a.get(), w.k_pad, kMaxM + 1, w.view());
    const std::vector<float> mag = run_fallback(d_abs_a.get(), w.k_pad, kMaxM + 1, w.view(true));

    for (int tile : {128, 256}) {
      for (int64_t m : {int64_t{1}, int64_t{64}, int64_t{128}, int64_t{200}, kMaxM}) {
        SCOPED_TRACE("m " + std::to_string(m) + ", tiles of " + std::to_string(tile) + " rows");
        const std::vector<uint32_t> cand = run_candidate(d_a.get(), w.k_pad, m, w.view(), nullptr, tile);
        const Check c = check(cand, m, w, raw, mag);
        std::printf("[gemm] cutlass mixed %s n %lld k %lld m %lld tile %d: worst error/bound %.3g, violations %lld\n",
                    shape.name, static_cast<long long>(shape.n), static_cast<long long>(w.k_pad),
                    static_cast<long long>(m), tile, c.worst_ratio, static_cast<long long>(c.violations));
        EXPECT_EQ(c.violations, 0);
        EXPECT_EQ(c.outside_written, 0);
        // Stream-K's split is fixed for a shape: the same bits again (a dirty workspace each time).
        if (m == 128 || m == 200) {
          EXPECT_EQ(cand, run_candidate(d_a.get(), w.k_pad, m, w.view(), nullptr, tile)) << "run-to-run bits differ";
        }
      }
    }

    // Negative controls: the same check must reject an epilogue reading the scale four rows on,
    // and a main loop reading the activations one row on.
    DeviceMatrixView shifted_scale = w.view();
    shifted_scale.scale = w.scale.get() + 4;
    const Check bad_scale = check(run_candidate(d_a.get(), w.k_pad, 128, shifted_scale), 128, w, raw, mag);
    const Check bad_rows = check(run_candidate(d_a.get() + w.k_pad, w.k_pad, 128, w.view()), 128, w, raw, mag);
    std::printf("[planted] cutlass mixed %s m 128: neighbour scale %lld, shifted rows %lld of %lld elements rejected\n",
                shape.name, static_cast<long long>(bad_scale.violations), static_cast<long long>(bad_rows.violations),
                static_cast<long long>(128 * shape.n));
    EXPECT_GT(bad_scale.violations, 0) << "the check cannot see a neighbour row's scale";
    EXPECT_GT(bad_rows.violations, 128 * shape.n / 2) << "the check cannot see shifted activation rows";
  }
}

// The residual add in the epilogue (in place: source = out): each element must be the bits of
// fp32(product + residual), the product as the plain launch stores it, both rounded to nearest
// (the fallbacks' residual epilogue), nothing outside [m, n] written. A launch that ignored the
// source, or contracted the two roundings into one FMA, would differ.
TEST_F(CutlassMixedGemm, AddsTheResidualInPlaceWithTheFallbacksRounding) {
  const ShapeCase shapes[] = {{"o", 4096, 4096}, {"down", 4096, 12288}, {"ragged", 1000, 1000}};
  for (const ShapeCase& shape : shapes) {
    SCOPED_TRACE(shape.name);
    Weight w;
    make_weight(w, shape.n, shape.k, 31, stream_);
    const Tensor a = make_random_context(kMaxM, shape.k, 32);
    const DeviceBuffer<uint16_t> d_a = gpu_test::upload_activations(a, w.k_pad);
    const int64_t ld_out = w.n + 4;
    const std::vector<std::pair<int64_t, int>> runs = {{64, 128}, {200, 128}, {kMaxM, 128}, {kMaxM, 256}};
    for (const auto& [m, tile] : runs) {
      SCOPED_TRACE("m " + std::to_string(m) + ", tiles of " + std::to_string(tile) + " rows");
      std::vector<uint32_t> residual(static_cast<size_t>(m * ld_out));
      for (size_t i = 0; i < residual.size(); ++i) residual[i] = gpu_test::float_bits(random_bf16(33, 1, i, -3.0f, 3.0f));
      const std::vector<uint32_t> product = run_candidate(d_a.get(), w.k_pad, m, w.view(), nullptr, tile);
      const std::vector<uint32_t> sum = run_candidate(d_a.get(), w.k_pad, m, w.view(), &residual, tile);
      int64_t mismatches = 0, outside_written = 0, added = 0;
      for (int64_t r = 0; r <= m; ++r) {
        for (int64_t c = 0; c < ld_out; ++c) {
          const size_t i = static_cast<size_t>(r * ld_out + c);
          if (r == m) {
            outside_written += sum[i] != kSentinel;
            continue;
          }
          if (c >= w.n) {
            outside_written += sum[i] != residual[i];  // the padding columns keep the source
            continue;
          }
          float p, s;
          std::memcpy(&p, &product[i], 4);
          std::memcpy(&s, &residual[i], 4);
          const float want = p + s;  // one IEEE fp32 addition, round to nearest
          mismatches += gpu_test::float_bits(want) != sum[i];
          added += gpu_test::float_bits(want) != product[i];
        }
      }
      std::printf("[gemm] cutlass mixed + residual %s n %lld k %lld m %lld tile %d: %lld of %lld differ from product + residual\n",
                  shape.name, static_cast<long long>(shape.n), static_cast<long long>(w.k_pad), static_cast<long long>(m),
                  tile, static_cast<long long>(mismatches), static_cast<long long>(m * shape.n));
      EXPECT_EQ(mismatches, 0);
      EXPECT_EQ(outside_written, 0);
      // The comparison can fail: adding the residual changes (almost) every element.
      EXPECT_GT(added, m * shape.n / 2);
    }
  }
}

TEST_F(CutlassMixedGemm, RefusesArgumentsItCannotServe) {
  Weight w;
  make_weight(w, 64, 64, 27, stream_);
  DeviceBuffer<uint16_t> a(static_cast<size_t>(64 * 64));
  DeviceBuffer<float> out(static_cast<size_t>(64 * 64));
  auto refused = [&](DeviceMatrixView view, int64_t lda, int64_t ld_out, const std::string& field) {
    try {
      launch_gemm_cutlass_mixed(stream_, a.get(), lda, 64, view, out.get(), ld_out, nullptr, 0);
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const HarnessError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  DeviceMatrixView odd_n = w.view();
  odd_n.n = 63;
  refused(odd_n, 64, 64, "n 63");
  refused(w.view(), 60, 64, "lda 60");
  refused(w.view(), 64, 62, "ld_out 62");
  DeviceMatrixView with_bias = w.view();
  with_bias.bias = w.scale.get();
  refused(with_bias, 64, 64, "bias");
  DeviceMatrixView bf16 = w.view();
  bf16.format = WeightFormat::kBf16;
  refused(bf16, 64, 64, "E4M3");
  try {
    launch_gemm_cutlass_mixed(stream_, a.get(), 64, 64, w.view(), out.get(), 64, nullptr, 0, nullptr, 192);
    ADD_FAILURE() << "accepted tiles of 192 rows";
  } catch (const HarnessError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("tile rows 192"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dflash
