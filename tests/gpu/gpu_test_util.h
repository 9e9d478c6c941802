// Shared pieces of the GPU tests: the skip when no device can run them, bf16 test data, and the
// comparison of a CUDA stage against the reference under the bf16-boundary tolerance model of
// docs/cuda-drafter.md ("Tolerance against the reference").
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/stages.h"
#include "core/tensor.h"
#include "cuda/cuda_drafter.h"
#include "cuda/device_buffer.h"

// Every GPU test starts with this: no device means a skip that says why, never a silent pass.
#define DFLASH_REQUIRE_GPU()                                           \
  do {                                                                 \
    std::string dflash_why;                                            \
    if (!::dflash::cuda_device_available(&dflash_why)) {               \
      GTEST_SKIP() << "no usable CUDA device: " << dflash_why;         \
    }                                                                  \
  } while (0)

namespace dflash::gpu_test {

constexpr double kBf16UnitRoundoff = 0x1p-8;

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// bf16 storage boundaries on the longest path from the inputs to a tap (docs/cuda-drafter.md).
inline int bf16_boundaries(const std::string& tap, int num_layers) {
  StageId stage;
  if (!parse_stage_name(tap, num_layers, &stage)) {
    ADD_FAILURE() << "no tolerance for tap " << tap;
    return 0;
  }
  const int base = 5 * stage.layer;
  switch (stage.kind) {
    case StageKind::kEmbed: return 0;
    case StageKind::kCtxProj: return 1;
    case StageKind::kFinalNorm:
    case StageKind::kLogits: return 5 * num_layers + 1;
    case StageKind::kAttnNorm: return base + 1;
    case StageKind::kQ:
    case StageKind::kK:
    case StageKind::kV: return base + 2;
    case StageKind::kAttn:
    case StageKind::kOProj: return base + 3;
    case StageKind::kMlpNorm: return base + 4;
    case StageKind::kMlp:
    case StageKind::kOut: return base + 5;
  }
  return 0;
}

struct StageComparison {
  double max_rel = 0;      // max |a - e| / max|e row|
  double max_rms_rel = 0;  // max over rows of ||a - e|| / ||e||
  double max_bound = 0, rms_bound = 0;
  int64_t worst_row = -1;
  bool nan = false;
  bool ok() const { return !nan && max_rel <= max_bound && max_rms_rel <= rms_bound; }
};

// n bf16 boundaries: per-element |Δ| <= 2·n·u·max|e row| (one ulp per boundary, aligned), and per
// row ||Δ|| <= 2·sqrt(n)·u·||e|| (one ulp per element per boundary, independent).
inline StageComparison compare_stage(const Tensor& actual, const Tensor& expected, int boundaries) {
  StageComparison c;
  c.max_bound = 2.0 * boundaries * kBf16UnitRoundoff;
  c.rms_bound = 2.0 * std::sqrt(static_cast<double>(boundaries)) * kBf16UnitRoundoff;
  if (actual.shape != expected.shape) {
    ADD_FAILURE() << "shape " << shape_string(actual.shape) << " vs " << shape_string(expected.shape);
    c.nan = true;
    return c;
  }
  for (int64_t r = 0; r < expected.rows(); ++r) {
    double row_max = 0, diff2 = 0, ref2 = 0, diff_max = 0;
    for (int64_t j = 0; j < expected.cols(); ++j) {
      const double a = actual.row(r)[j], e = expected.row(r)[j];
      if (std::isnan(a) || std::isnan(e)) c.nan = true;
      row_max = std::max(row_max, std::fabs(e));
      diff_max = std::max(diff_max, std::fabs(a - e));
      diff2 += (a - e) * (a - e);
      ref2 += e * e;
    }
    const double rel = row_max > 0 ? diff_max / row_max : diff_max;
    const double rms = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    if (rel > c.max_rel || rms > c.max_rms_rel) c.worst_row = r;
    c.max_rel = std::max(c.max_rel, rel);
    c.max_rms_rel = std::max(c.max_rms_rel, rms);
  }
  return c;
}

// Rows whose expected top-1/top-2 margin exceeds `margin_rel`·max|row| must pick the same token.
struct TokenComparison {
  int decisive = 0, decisive_mismatches = 0, close_mismatches = 0;
};
inline TokenComparison compare_tokens(const std::vector<int32_t>& actual, const std::vector<int32_t>& expected,
                                      const Tensor& expected_logits, double margin_rel) {
  TokenComparison t;
  for (size_t r = 0; r < expected.size(); ++r) {
    const float* row = expected_logits.row(static_cast<int64_t>(r));
    double top1 = -INFINITY, top2 = -INFINITY, row_max = 0;
    for (int64_t j = 0; j < expected_logits.cols(); ++j) {
      const double v = row[j];
      row_max = std::max(row_max, std::fabs(v));
      if (v > top1) {
        top2 = top1;
        top1 = v;
      } else if (v > top2) {
        top2 = v;
      }
    }
    const bool decisive = top1 - top2 > margin_rel * row_max;
    const bool same = actual[r] == expected[r];
    if (decisive) {
      ++t.decisive;
      if (!same) ++t.decisive_mismatches;
    } else if (!same) {
      ++t.close_mismatches;
    }
  }
  return t;
}

// The rows of `a` as bf16 bits on the device, `ld` elements apart (the padding zero).
inline DeviceBuffer<uint16_t> upload_activations(const Tensor& a, int64_t ld) {
  std::vector<uint16_t> bits(static_cast<size_t>(a.rows() * ld), 0);
  for (int64_t r = 0; r < a.rows(); ++r)
    for (int64_t c = 0; c < a.cols(); ++c) bits[static_cast<size_t>(r * ld + c)] = float_to_bf16_bits(a.row(r)[c]);
  DeviceBuffer<uint16_t> d(bits.size());
  EXPECT_EQ(cudaSuccess, cudaMemcpy(d.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

}  // namespace dflash::gpu_test
