// The device quantization is bit-identical to core/fp8.cc's quantize_rows_e4m3: every code byte and
// every scale, on random rows, on edge rows (all zero, tiny, huge, negative zeros, exact RNE ties,
// saturation), and on the drafter's own fused weights after construction.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/fp8.h"
#include "testing/cuda_drafter_debug.h"
#include "cuda/kernels/quant/fp8_quant.h"
#include "testing/gpu_test_util.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

void expect_same_quantization(const QuantizedRows& device, const QuantizedRows& host, const std::string& what) {
  ASSERT_EQ(device.rows, host.rows) << what;
  ASSERT_EQ(device.cols, host.cols) << what;
  for (int64_t r = 0; r < host.rows; ++r) {
    ASSERT_EQ(gpu_test::float_bits(device.scales[static_cast<size_t>(r)]), gpu_test::float_bits(host.scales[static_cast<size_t>(r)]))
        << what << ": scale of row " << r;
    for (int64_t c = 0; c < host.cols; ++c) {
      const size_t i = static_cast<size_t>(r * host.cols + c);
      ASSERT_EQ(device.codes[i], host.codes[i]) << what << ": code [" << r << ", " << c << "]";
    }
  }
}

TEST(Fp8QuantGpu, RandomAndEdgeRowsMatchTheHostBitForBit) {
  DFLASH_REQUIRE_GPU();
  const int64_t cols = 300;
  Tensor w = Tensor::zeros({12, cols});
  for (int64_t r = 0; r < 6; ++r) {
    const float range = std::ldexp(1.0f, static_cast<int>(r * 7) - 20);  // 2^-20 .. 2^15
    for (int64_t c = 0; c < cols; ++c) w.row(r)[c] = random_bf16(3, static_cast<uint64_t>(r), static_cast<uint64_t>(c), -range, range);
  }
  // row 6: all zero (scale 1.0); row 7: negative zeros and one value
  for (int64_t c = 0; c < cols; ++c) w.row(7)[c] = -0.0f;
  w.row(7)[5] = 3.0f;
  // row 8: amax 448 -> scale 1, so w·inv = w: exact ties between E4M3 neighbours round to even
  const float ties[] = {448.0f, 1.0625f, 1.1875f, -1.0625f, 0x1p-10f, 3 * 0x1p-10f, 5 * 0x1p-10f, 0x1p-7f + 0x1p-11f,
                        240.0f, 232.0f, 0.0f, -0.0f, 0x1p-9f, 7 * 0x1p-9f, 15 * 0x1p-10f, 416.0f};
  for (int64_t c = 0; c < cols; ++c) w.row(8)[c] = ties[c % 16];
  // row 9: tiny magnitudes (bf16 subnormals), row 10: huge, row 11: a single non-zero
  for (int64_t c = 0; c < cols; ++c) w.row(9)[c] = round_to_bf16(std::ldexp(static_cast<float>((c % 7) - 3), -130));
  for (int64_t c = 0; c < cols; ++c) w.row(10)[c] = round_to_bf16(std::ldexp(static_cast<float>((c % 5) + 1), 120));
  w.row(11)[cols - 1] = -7.0f;
  for (float& v : w.values) ASSERT_EQ(round_to_bf16(v), v);
  expect_same_quantization(quantize_rows_e4m3_on_device(w), quantize_rows_e4m3(w), "edge rows");
}

// W8A8's per-token quantization: the same edge rows (plus a NaN, which amax ignores and which
// quantizes to the NaN code), dynamic and with a static scale, against core/fp8.cc bit for bit,
// with zeros past k. Negative control: a code off by one or a scale off by one ulp is seen.
TEST(Fp8QuantGpu, ActivationRowsMatchTheHostBitForBit) {
  DFLASH_REQUIRE_GPU();
  const int64_t cols = 300;
  Tensor x = Tensor::zeros({8, cols});
  for (int64_t r = 0; r < 4; ++r) {
    const float range = std::ldexp(1.0f, static_cast<int>(r * 9) - 14);  // 2^-14 .. 2^13
    for (int64_t c = 0; c < cols; ++c) x.row(r)[c] = random_bf16(5, static_cast<uint64_t>(r), static_cast<uint64_t>(c), -range, range);
  }
  // row 4: zeros (amax floor 2^-9); row 5: tiny values under the floor; row 6: a NaN among values;
  // row 7: huge values (the largest saturates at 448 after the fp32 product)
  for (int64_t c = 0; c < cols; ++c) x.row(5)[c] = round_to_bf16(std::ldexp(static_cast<float>((c % 7) - 3), -14));
  for (int64_t c = 0; c < cols; ++c) x.row(6)[c] = round_to_bf16(static_cast<float>(c % 11) - 5.0f);
  x.row(6)[17] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t c = 0; c < cols; ++c) x.row(7)[c] = round_to_bf16(std::ldexp(static_cast<float>((c % 5) + 1), 100));
  for (float static_scale : {0.0f, 0.0123f}) {
    const ActivationCodes device = quantize_activations_e4m3_on_device(x, static_scale);
    ASSERT_EQ(device.k_pad, 320);
    int64_t compared = 0;
    for (int64_t r = 0; r < x.rows(); ++r) {
      const float scale = static_scale > 0 ? static_scale : activation_scale_e4m3(x.row(r), cols);
      std::vector<uint8_t> host(static_cast<size_t>(cols));
      quantize_activation_e4m3(x.row(r), cols, scale, host.data());
      const std::string what = "row " + std::to_string(r) + (static_scale > 0 ? " (static scale)" : "");
      ASSERT_EQ(gpu_test::float_bits(device.scales[static_cast<size_t>(r)]), gpu_test::float_bits(scale)) << what;
      ASSERT_NE(gpu_test::float_bits(device.scales[static_cast<size_t>(r)]), gpu_test::float_bits(std::nextafter(scale, 1.0f)));
      for (int64_t c = 0; c < device.k_pad; ++c) {
        const uint8_t got = device.codes[static_cast<size_t>(r * device.k_pad + c)];
        const uint8_t want = c < cols ? host[static_cast<size_t>(c)] : uint8_t{0};
        ASSERT_EQ(got, want) << what << ", column " << c;
        ASSERT_NE(got, static_cast<uint8_t>(want ^ 1)) << what;
        ++compared;
      }
    }
    EXPECT_EQ(compared, 8 * 320);
  }
}

TEST(Fp8QuantGpu, TheDrafterHoldsTheHostQuantizationOfEveryProjection) {
  DFLASH_REQUIRE_GPU();
  DrafterGeometry g;
  g.name = "small";
  g.hidden = 192, g.layers = 2, g.heads = 4, g.kv_heads = 2, g.head_dim = 48, g.intermediate = 200, g.vocab = 777;
  g.block = 4, g.target_layer_ids = {1, 3}, g.bias = true, g.mask_token_id = 5;
  const DrafterConfig config = make_config(g);
  const auto weights = make_random_weights(config, 17);
  HeadSettings settings;
  settings.precision = Precision::kFp8;
  settings.ctx_cap = 64;
  CudaDrafter drafter(config, weights, settings, CudaOptions{});
  auto check_rows = [&](const QuantizedRows& device, int64_t device_row, int64_t device_stride, const Tensor& source,
                        const std::string& what) {
    const QuantizedRows host = quantize_rows_e4m3(source);
    for (int64_t r = 0; r < host.rows; ++r) {
      const int64_t dr = device_row + r * device_stride;
      ASSERT_EQ(gpu_test::float_bits(device.scales[static_cast<size_t>(dr)]), gpu_test::float_bits(host.scales[static_cast<size_t>(r)]))
          << what << " row " << r;
      for (int64_t c = 0; c < device.cols; ++c) {
        const uint8_t expect = c < host.cols ? host.codes[static_cast<size_t>(r * host.cols + c)] : 0;  // zero padding
        ASSERT_EQ(device.codes[static_cast<size_t>(dr * device.cols + c)], expect) << what << " [" << r << ", " << c << "]";
      }
    }
  };
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerWeights& lw = weights->layers[static_cast<size_t>(l)];
    const std::string p = "layer " + std::to_string(l) + " ";
    const QuantizedRows qkv = download_fp8_weight(drafter, "qkv", l);
    check_rows(qkv, 0, 1, lw.q_proj, p + "q_proj");
    check_rows(qkv, config.q_dim(), 1, lw.k_proj, p + "k_proj");
    check_rows(qkv, config.q_dim() + config.kv_dim(), 1, lw.v_proj, p + "v_proj");
    check_rows(download_fp8_weight(drafter, "o", l), 0, 1, lw.o_proj, p + "o_proj");
    const QuantizedRows gate_up = download_fp8_weight(drafter, "gate_up", l);
    check_rows(gate_up, 0, 2, lw.gate_proj, p + "gate_proj");
    check_rows(gate_up, 1, 2, lw.up_proj, p + "up_proj");
    check_rows(download_fp8_weight(drafter, "down", l), 0, 1, lw.down_proj, p + "down_proj");
  }
  check_rows(download_fp8_weight(drafter, "lm_head", 0), 0, 1, weights->lm_head, "lm_head");
}

}  // namespace
}  // namespace dflash
