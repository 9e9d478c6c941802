// The device reduction of docs/spec/tensor-parallel.md §4 (tp_reduce.h) on the hand-made partials
// of §10 check 5, bit for bit, each with the result a wrong order or rounding would give instead;
// and the fake shards' form (partials at a rank stride, the bias, the residual) against the same
// fp32 operations on the host.
#include "cuda/tp/tp_reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "cuda/runtime/device_buffer.h"
#include "testing/gpu_test_util.h"

namespace dflash {
namespace {

uint32_t reduce_bits(const std::vector<float>& partials, TpWire wire) {
  const int ranks = static_cast<int>(partials.size());
  DeviceBuffer<float> out(1);
  if (wire == TpWire::kFp32) {
    const DeviceBuffer<float> p = gpu_test::to_device(partials);
    launch_tp_reduce(nullptr, p.get(), ranks, 1, wire, out.get());
  } else {
    std::vector<uint16_t> bits;
    for (float v : partials) bits.push_back(float_to_bf16_bits(v));  // p_r = bf16(P_r), as sent
    const DeviceBuffer<uint16_t> p = gpu_test::to_device(bits);
    launch_tp_reduce(nullptr, p.get(), ranks, 1, wire, out.get());
  }
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  return gpu_test::float_bits(gpu_test::to_host(out)[0]);
}

TEST(TpReduceGpu, LinearFromRankZeroAsTheContractStates) {
  DFLASH_REQUIRE_GPU();
  const float e24 = std::ldexp(1.0f, -24), e9 = std::ldexp(1.0f, -9);
  // fp32, N = 4: 1 + 2^-24 three times, linearly: each addition rounds back to 1.0. A binary tree
  // would give 0x3F800001, the reversed order 0x3F800002.
  EXPECT_EQ(reduce_bits({1.0f, e24, e24, e24}, TpWire::kFp32), 0x3F800000u);
  EXPECT_EQ(reduce_bits({e24, e24, e24, 1.0f}, TpWire::kFp32), 0x3F800002u);  // the order matters
  // bf16, N = 4: fp32 sum 1 + 3·2^-9, rounded once: bf16 0x3F81 (1 + 2^-7); rounding after every
  // addition would give 1.0.
  EXPECT_EQ(reduce_bits({1.0f, e9, e9, e9}, TpWire::kBf16), 0x3F810000u);
  // bf16, N = 2: p_1 = bf16(2^-8 + 2^-16) = 2^-8, 1 + 2^-8 ties to even: 1.0 (unrounded partials:
  // 1 + 2^-7).
  EXPECT_EQ(reduce_bits({1.0f, std::ldexp(1.0f, -8) + std::ldexp(1.0f, -16)}, TpWire::kBf16), 0x3F800000u);
}

TEST(TpReduceGpu, EveryElementOfManyRanks) {
  DFLASH_REQUIRE_GPU();
  const int ranks = 8;
  const int64_t count = 1000;
  std::vector<float> partials(static_cast<size_t>(ranks * count));
  for (size_t i = 0; i < partials.size(); ++i) partials[i] = std::sin(0.1f * static_cast<float>(i)) * 1e3f;
  const DeviceBuffer<float> p = gpu_test::to_device(partials);
  DeviceBuffer<float> out(static_cast<size_t>(count));
  launch_tp_reduce(nullptr, p.get(), ranks, count, TpWire::kFp32, out.get());
  const std::vector<float> got = gpu_test::to_host(out);
  for (int64_t i = 0; i < count; ++i) {
    float s = partials[static_cast<size_t>(i)];
    for (int r = 1; r < ranks; ++r) s = s + partials[static_cast<size_t>(r * count + i)];
    ASSERT_EQ(gpu_test::float_bits(got[static_cast<size_t>(i)]), gpu_test::float_bits(s)) << "element " << i;
  }
}

// The host's §4, one element: p_r as sent, summed from rank 0, rounded once on a bf16 wire.
float host_reduce(const std::vector<float>& p, TpWire wire) {
  auto sent = [&](float v) { return wire == TpWire::kBf16 ? round_to_bf16(v) : v; };
  float s = sent(p[0]);
  for (size_t r = 1; r < p.size(); ++r) s = s + sent(p[r]);
  return wire == TpWire::kBf16 ? round_to_bf16(s) : s;
}

TEST(TpReduceGpu, RowsAtARankStrideWithBiasAndResidual) {
  DFLASH_REQUIRE_GPU();
  const int ranks = 4;
  const int64_t rows = 3, cols = 70, ld = 72, stride = rows * ld + 8;
  std::vector<float> partials(static_cast<size_t>(ranks * stride), 0.0f), bias(cols), residual(rows * cols);
  for (size_t i = 0; i < partials.size(); ++i) partials[i] = std::sin(0.37f * static_cast<float>(i)) * 64.0f;
  for (int64_t c = 0; c < cols; ++c) bias[static_cast<size_t>(c)] = 0.01f * static_cast<float>(c) - 0.3f;
  for (size_t i = 0; i < residual.size(); ++i) residual[i] = std::cos(0.11f * static_cast<float>(i));
  // The hand case of the first test in element [0, 0]: 1 + 2^-24 three times is 1 in rank order.
  const float e24 = std::ldexp(1.0f, -24);
  for (int r = 0; r < ranks; ++r) partials[static_cast<size_t>(r * stride)] = r == 0 ? 1.0f : e24;
  for (TpWire wire : {TpWire::kFp32, TpWire::kBf16}) {
    const DeviceBuffer<float> p = gpu_test::to_device(partials), b = gpu_test::to_device(bias);
    DeviceBuffer<float> h = gpu_test::to_device(residual), out(static_cast<size_t>(rows * cols));
    TpPartials in;
    in.base = p.get();
    in.rank_stride = stride;
    in.ranks = ranks;
    in.rows = rows;
    in.cols = cols;
    in.ld = ld;
    launch_tp_reduce_rows(nullptr, in, wire, b.get(), out.get(), cols, h.get(), cols);
    // The same partials read from the last rank down (a negative stride): another order.
    DeviceBuffer<float> reversed(static_cast<size_t>(rows * cols));
    TpPartials down = in;
    down.base += (ranks - 1) * stride;
    down.rank_stride = -stride;
    launch_tp_reduce_rows(nullptr, down, wire, b.get(), reversed.get(), cols, nullptr, 0);
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    const std::vector<float> got = gpu_test::to_host(out), got_h = gpu_test::to_host(h), got_rev = gpu_test::to_host(reversed);
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t c = 0; c < cols; ++c) {
        std::vector<float> element;
        for (int r = 0; r < ranks; ++r) element.push_back(partials[static_cast<size_t>(r * stride + m * ld + c)]);
        const float o = host_reduce(element, wire) + bias[static_cast<size_t>(c)];
        const size_t i = static_cast<size_t>(m * cols + c);
        ASSERT_EQ(gpu_test::float_bits(got[i]), gpu_test::float_bits(o)) << "out [" << m << ", " << c << "]";
        ASSERT_EQ(gpu_test::float_bits(got_h[i]), gpu_test::float_bits(residual[i] + o)) << "h [" << m << ", " << c << "]";
      }
    }
    // Negative control: in fp32 the reversed order sums [0, 0] to 1 + 2^-22, not rank order's 1.
    if (wire == TpWire::kFp32) EXPECT_NE(gpu_test::float_bits(got_rev[0]), gpu_test::float_bits(got[0]));
  }
}

}  // namespace
}  // namespace dflash
