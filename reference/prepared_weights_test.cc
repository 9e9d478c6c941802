// PreparedWeights on a pre-quantized FP8 checkpoint (core/fp8_checkpoint.h): in fp64 every projection
// multiplies by the exact products code · scale, also where a product needs more bits than the float
// weight holds; a projection that would need them with a bias is refused as unsupported.
#include "reference/prepared_weights.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/fp8.h"
#include "fixtures/fp8_checkpoint_writer.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

// H 32, one layer, nh 2 / nkv 1, d 16, I 64, V 64.
DrafterConfig small_config(bool bias) {
  const nlohmann::json j = {{"hidden_size", 32},      {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                            {"num_key_value_heads", 1}, {"head_dim", 16},        {"intermediate_size", 64},
                            {"vocab_size", 64},        {"attention_bias", bias}, {"block_size", 4},
                            {"dflash_config", {{"mask_token_id", 63}, {"target_layer_ids", {0, 2}}}}};
  return parse_drafter_config(j, "small");
}

// y = e_k · Wᵀ for every unit row e_k: column k of W, with no rounding in the sum (one nonzero term).
AlignedMatrix<double> columns(const Linear<double>& linear, ThreadPool& pool) {
  const int64_t K = linear.in_features();
  AlignedMatrix<double> x(K, K), y(K, linear.out_features());
  for (int64_t r = 0; r < K; ++r) {
    for (int64_t c = 0; c < K; ++c) x.row(r)[c] = r == c ? 1.0 : 0.0;
  }
  linear.apply(x, K, &y, pool);
  return y;
}

// The exact product, from the code's fields (not core's decoder).
double exact_weight(const Fp8Stored& s, int64_t n, int64_t k) {
  const uint8_t code = s.codes[static_cast<size_t>(n * s.cols + k)];
  const int e = (code >> 3) & 0xf, m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return ((code & 0x80) ? -magnitude : magnitude) * static_cast<double>(s.scales[static_cast<size_t>(n)]);
}

TEST(PreparedWeightsFp8Checkpoint, Fp64ProjectionsUseTheExactProducts) {
  for (const std::string scheme : {"modelopt", "compressed-tensors"}) {
    SCOPED_TRACE(scheme);
    const DrafterConfig c = small_config(false);
    const DrafterWeights w =
        quantize_fp8_checkpoint(c, make_random_drafter_weights(c, 3, RandomWeightRanges{}, 1), scheme, 3);
    const Fp8Stored& q = *w.layers[0].q_proj_fp8;
    ThreadPool pool(1);
    const PreparedWeights<double> prepared(w, StagePolicy::for_precision(Precision::kFp64), pool);
    const AlignedMatrix<double> y = columns(prepared.layers[0].q_proj, pool);
    int64_t mismatched = 0, beyond_float = 0;
    for (int64_t n = 0; n < q.rows; ++n) {
      for (int64_t k = 0; k < q.cols; ++k) {
        const double exact = exact_weight(q, n, k);
        mismatched += y.row(k)[n] != exact;
        beyond_float += static_cast<double>(w.layers[0].q_proj.row(n)[k]) != exact;
      }
    }
    EXPECT_EQ(mismatched, 0);
    // ModelOpt's F32 scales make products the float weight cannot hold (what the check above catches);
    // compressed-tensors' BF16 scales do not.
    if (scheme == "modelopt") {
      EXPECT_GT(beyond_float, 0);
    } else {
      EXPECT_EQ(beyond_float, 0);
    }
  }
}

TEST(PreparedWeightsFp8Checkpoint, ABiasedProjectionBeyondFloatIsUnsupportedInFp64Only) {
  const DrafterConfig c = small_config(true);
  const DrafterWeights w = quantize_fp8_checkpoint(c, make_random_drafter_weights(c, 4, RandomWeightRanges{}, 1), "modelopt", 4);
  ThreadPool pool(1);
  try {
    PreparedWeights<double> prepared(w, StagePolicy::for_precision(Precision::kFp64), pool);
    ADD_FAILURE() << "no error";
  } catch (const HarnessError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("layers.0.self_attn.q_proj: FP8 checkpoint weights whose code"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(PreparedWeights<float>(w, StagePolicy::for_precision(Precision::kFp32), pool));
}

}  // namespace
}  // namespace dflash
