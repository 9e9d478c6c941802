// The q/k norm + RoPE kernel (tuned and simple) rotates by core/rope.h's angles, cos and sin at
// positions up to 128k, for default RoPE (theta 1e6, d 128) and gpt-oss style YaRN (x32 from 4096,
// theta 150000, d 64).
//
// Inputs chosen so that every other operation is exact or identical on both sides: each head
// holds 1 in its first half and 0 in its second, the norm weights are 1 and eps is 0, so the
// sum of squares is d/2 exactly and the RMSNorm factor r = 1/sqrt(0.5) is formed by IEEE sqrt and
// division on both sides. Output j is then bf16(r·cos_j) and output j + d/2 is bf16(r·sin_j),
// computed here from rope_cos_sin and compared bit for bit for q and k. At 128k one ulp of an
// angle moves cos by up to 2^-7, far above a bf16 ulp, so a different angle formation shows; the
// negative control moves one inv_freq entry by one ulp on the device and must be reported. Two
// launch shapes: the positions once with one q head (a CTA per group of heads), and repeated to
// 140+ rows with 13 q heads (a CTA per row, its warps looping over the row's heads).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/rope.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/kernels/elementwise/elementwise.h"
#include "testing/gpu_test_util.h"

namespace dflash {
namespace {

std::vector<int64_t> positions(int repeats) {
  std::vector<int64_t> p = {0, 1, 2, 3, 7, 511, 512, 4095, 4096, 4097, 32767, 32768, 65535, 65536, 131071, 131072};
  for (int64_t q = 997; q < 131072; q += 997 * 7) p.push_back(q);
  std::vector<int64_t> all;
  for (int i = 0; i < repeats; ++i) all.insert(all.end(), p.begin(), p.end());
  return all;
}

struct Shape {
  int repeats;  // of the position list
  int q_heads;
};
constexpr Shape kShapes[] = {{1, 1}, {4, 13}};

struct Config {
  const char* name;
  RopeConfig rope;
  int head_dim;
};

std::vector<Config> configs() {
  RopeConfig plain;
  plain.theta = 1e6;
  RopeConfig yarn;
  yarn.type = RopeConfig::Type::kYarn;
  yarn.theta = 150000.0;
  yarn.factor = 32.0;
  yarn.original_max_position_embeddings = 4096;
  yarn.truncate = false;
  return {{"default theta 1e6, d 128", plain, 128}, {"YaRN x32 from 4096, d 64", yarn, 64}};
}

using gpu_test::to_device;

// Runs the kernel on shape.q_heads q heads and one kv head per position; counts outputs (every q
// head and k) whose bits differ from the host's bf16(r·cos), bf16(r·sin).
int64_t count_mismatches(RowKernel kernel, const Config& c, const RopeTable& table, const std::vector<float>& device_inv_freq,
                         Shape shape, std::string* first) {
  const int d = c.head_dim, half = d / 2, hq = shape.q_heads, parts = hq + 2;
  const std::vector<int64_t> pos = positions(shape.repeats);
  const int64_t rows = static_cast<int64_t>(pos.size());
  std::vector<float> src(static_cast<size_t>(rows * parts * d), 0.0f);  // q heads | k | v per row
  for (int64_t r = 0; r < rows; ++r) {
    for (int part = 0; part < parts; ++part) {
      for (int j = 0; j < half; ++j) src[static_cast<size_t>((r * parts + part) * d + j)] = 1.0f;
    }
  }
  const std::vector<float> ones(static_cast<size_t>(d), 1.0f);
  DeviceBuffer<float> d_src = to_device(src), d_norm = to_device(ones), d_inv_freq = to_device(device_inv_freq);
  DeviceBuffer<int64_t> d_pos = to_device(pos);
  DeviceBuffer<uint16_t> q_out(static_cast<size_t>(rows * hq * d)), k_out(static_cast<size_t>(rows * d)),
      v_out(static_cast<size_t>(rows * d));
  QkNormRopeArgs a;
  a.src = d_src.get();
  a.ld_src = parts * d;
  a.q_col = 0;
  a.k_col = hq * d;
  a.v_col = (hq + 1) * d;
  a.num_heads = hq;
  a.num_kv_heads = 1;
  a.head_dim = d;
  a.q_norm = d_norm.get();
  a.k_norm = d_norm.get();
  a.inv_freq = d_inv_freq.get();
  a.attention_scaling = table.attention_scaling;
  a.eps = 0.0f;
  a.positions = d_pos.get();
  a.q_out = q_out.get();
  a.ld_q = hq * d;
  a.k_out = k_out.get();
  a.v_out = v_out.get();
  a.ld_kv = d;
  a.rows = rows;
  launch_qk_norm_rope(kernel, a, nullptr);
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> q(static_cast<size_t>(rows * hq * d)), k(static_cast<size_t>(rows * d));
  DFLASH_CUDA_CHECK(cudaMemcpy(q.data(), q_out.get(), q.size() * 2, cudaMemcpyDeviceToHost));
  DFLASH_CUDA_CHECK(cudaMemcpy(k.data(), k_out.get(), k.size() * 2, cudaMemcpyDeviceToHost));

  const float r = 1.0f / std::sqrt(0.5f);  // IEEE sqrt and division, as inverse_rms
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  int64_t count = 0;
  for (int64_t row = 0; row < rows; ++row) {
    rope_cos_sin(table, pos[static_cast<size_t>(row)], cs.data(), sn.data());
    for (int j = 0; j < d; ++j) {
      const float want = j < half ? r * cs[static_cast<size_t>(j)] : r * sn[static_cast<size_t>(j - half)];
      const uint16_t bits = float_to_bf16_bits(round_to_bf16(want));
      for (int head = 0; head <= hq; ++head) {  // q heads 0..hq-1, then k
        const uint16_t got = head < hq ? q[static_cast<size_t>((row * hq + head) * d + j)] : k[static_cast<size_t>(row * d + j)];
        if (got == bits) continue;
        if (count++ == 0) {
          *first = (head < hq ? "q head " + std::to_string(head) : std::string("k")) + " position " +
                   std::to_string(pos[static_cast<size_t>(row)]) + " element " + std::to_string(j) + ": got " +
                   std::to_string(bf16_bits_to_float(got)) + ", expected " + std::to_string(bf16_bits_to_float(bits));
        }
      }
    }
  }
  return count;
}

TEST(RopeGpu, KernelsRotateByTheReferenceAnglesUpToPosition128k) {
  DFLASH_REQUIRE_GPU();
  for (const Config& c : configs()) {
    const RopeTable table = make_rope_table(c.rope, c.head_dim);
    for (RowKernel kernel : {RowKernel::kTuned, RowKernel::kSimple}) {
      for (const Shape& shape : kShapes) {
        const std::string what = std::string(c.name) + ", " + (kernel == RowKernel::kTuned ? "tuned" : "simple") + ", " +
                                 std::to_string(positions(shape.repeats).size()) + " rows x " +
                                 std::to_string(shape.q_heads) + " q heads";
        std::string first;
        const int64_t bad = count_mismatches(kernel, c, table, table.inv_freq, shape, &first);
        EXPECT_EQ(bad, 0) << what << ": " << first;

        // Negative control: inv_freq[0] (= 1) one ulp lower on the device only.
        std::vector<float> nudged = table.inv_freq;
        nudged[0] = std::nextafter(nudged[0], 0.0f);
        std::string control_first;
        const int64_t control = count_mismatches(kernel, c, table, nudged, shape, &control_first);
        EXPECT_GT(control, 0) << what << ": a one-ulp inv_freq change went unnoticed";
        std::printf("[rope] %-52s positions to 131072: %lld outputs differ (0 expected); one-ulp inv_freq[0]: %lld differ\n",
                    what.c_str(), static_cast<long long>(bad), static_cast<long long>(control));
      }
    }
  }
}

}  // namespace
}  // namespace dflash
