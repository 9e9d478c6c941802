#include "reference/prepared_weights.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <type_traits>

#include "core/error.h"
#include "core/fp8_checkpoint.h"

namespace dflash {
namespace {

template <typename T>
std::vector<T> to_vector(const Tensor& t) { return std::vector<T>(t.values.begin(), t.values.end()); }

// A static activation scale (w8a8's input_scale), when present: finite and > 0.
void check_input_scale(const std::optional<float>& scale, const std::string& name) {
  if (scale && !(std::isfinite(*scale) && *scale > 0.0f)) {
    throw bad_input("drafter weights: '" + name + "' is " + std::to_string(*scale) +
                    "; a static activation scale must be finite and > 0");
  }
}

void check_finite(const Tensor& t, const std::string& name) {
  const int64_t bad = first_non_finite(t.values.data(), static_cast<int64_t>(t.values.size()));
  if (bad >= 0) {
    throw bad_input("drafter weights: tensor '" + name + "' " + shape_string(t.shape) + " holds a non-finite value (" +
                    std::to_string(t.values[static_cast<size_t>(bad)]) + ") at flat index " + std::to_string(bad));
  }
}

// The target's head. NVFP4 is used as it is in every mode, never requantized to fp8
// (docs/spec/nvfp4-lm-head.md §6): in double, W exactly (e2m1 · e4m3 · weight_scale_2 needs at most
// 30 significant bits); in float, e2m1 · e4m3 (exact) with weight_scale_2 applied once to each dot
// product, as a w4a16 kernel does. Otherwise the float head, fp8-quantized where the policy says.
// A projection as the policy stores it (and, in a build with fault points, with its planted fp8
// GEMM bug). In w8a8 its input rows are quantized too, with `input_scale` when the checkpoint has one.
template <typename T>
Linear<T> projection(const Tensor& weight, const Tensor& bias, bool quantize_fp8, const std::string& name,
                     ThreadPool& pool, const StagePolicy& policy, bool lm_head = false,
                     const std::optional<float>& input_scale = std::nullopt) {
  const Fp8Activations activations{quantize_fp8 && policy.fp8_activations, input_scale};
  Linear<T> linear(weight, bias, quantize_fp8, name, pool, activations);
#ifdef DFLASH_FAULT_POINTS
  linear.plant_fault(policy.fp8_fault, lm_head);
#else
  (void)policy;
  (void)lm_head;
#endif
  return linear;
}

// A projection of a pre-quantized FP8 checkpoint (core/fp8_checkpoint.h): its float weight holds each
// code · scale rounded once to fp32. In double the reference takes the exact products from the stored
// codes wherever one needs more than fp32's 24 bits (an F32 scale); a decoded weight carries no bias, so
// such a projection with a bias cannot run in fp64 and is refused as unsupported.
template <typename T>
Linear<T> checkpoint_projection(const Tensor& weight, const Tensor& bias, const std::optional<Fp8Stored>& fp8,
                                bool quantize_fp8, const std::string& name, ThreadPool& pool, const StagePolicy& policy,
                                const std::optional<float>& input_scale) {
  if constexpr (std::is_same<T, double>::value) {
    if (fp8 && !fp8_dequantized_exactly_in_float(*fp8)) {
      if (!bias.values.empty()) {
        throw unsupported(name + ": FP8 checkpoint weights whose code · scale needs more than fp32's 24 bits, with a "
                          "bias: the fp64 reference holds such weights exactly only without a bias");
      }
      std::vector<double> values(static_cast<size_t>(fp8->rows * fp8->cols));
      for (int64_t n = 0; n < fp8->rows; ++n) fp8_dequantized_row(*fp8, n, values.data() + n * fp8->cols);
      return Linear<double>::decoded(std::move(values), fp8->rows, fp8->cols, {}, name);
    }
  }
  return projection<T>(weight, bias, quantize_fp8, name, pool, policy, false, input_scale);
}

template <typename T>
Linear<T> make_lm_head(const DrafterWeights& w, const StagePolicy& policy, ThreadPool& pool) {
  if (!w.nvfp4_head()) {
    return projection<T>(w.lm_head, Tensor(), policy.fp8_weights, "lm_head", pool, policy, true, w.lm_head_input_scale);
  }
  const NvFp4Weight& q = w.lm_head_nvfp4;
  std::vector<T> values(static_cast<size_t>(q.rows * q.cols));
  constexpr int64_t kRowsPerTask = 1024;
  pool.run(static_cast<size_t>((q.rows + kRowsPerTask - 1) / kRowsPerTask), [&](size_t task) {
    const int64_t end = std::min(q.rows, static_cast<int64_t>(task + 1) * kRowsPerTask);
    for (int64_t n = static_cast<int64_t>(task) * kRowsPerTask; n < end; ++n) {
      T* row = values.data() + n * q.cols;
      if constexpr (std::is_same<T, double>::value) {
        nvfp4_dequantized_row(q, n, row);
      } else {
        nvfp4_block_scaled_row(q, n, row);
      }
    }
  });
  std::vector<T> scale;
  if constexpr (!std::is_same<T, double>::value) scale.assign(static_cast<size_t>(q.rows), q.global_scale);
  return Linear<T>::decoded(std::move(values), q.rows, q.cols, std::move(scale), "lm_head (NVFP4)");
}

}  // namespace

void check_weights_finite(const DrafterWeights& w) {
  check_finite(w.fc, "fc.weight");
  check_finite(w.hidden_norm, "hidden_norm.weight");
  check_finite(w.norm, "norm.weight");
  check_finite(w.embed_tokens, "embed_tokens");
  check_finite(w.lm_head, "lm_head");
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    check_finite(L.input_layernorm, p + "input_layernorm.weight");
    check_finite(L.post_attention_layernorm, p + "post_attention_layernorm.weight");
    check_finite(L.q_proj, p + "self_attn.q_proj.weight");
    check_finite(L.k_proj, p + "self_attn.k_proj.weight");
    check_finite(L.v_proj, p + "self_attn.v_proj.weight");
    check_finite(L.o_proj, p + "self_attn.o_proj.weight");
    check_finite(L.q_bias, p + "self_attn.q_proj.bias");
    check_finite(L.k_bias, p + "self_attn.k_proj.bias");
    check_finite(L.v_bias, p + "self_attn.v_proj.bias");
    check_finite(L.o_bias, p + "self_attn.o_proj.bias");
    check_finite(L.q_norm, p + "self_attn.q_norm.weight");
    check_finite(L.k_norm, p + "self_attn.k_norm.weight");
    check_finite(L.gate_proj, p + "mlp.gate_proj.weight");
    check_finite(L.up_proj, p + "mlp.up_proj.weight");
    check_finite(L.down_proj, p + "mlp.down_proj.weight");
    check_input_scale(L.q_input_scale, p + "self_attn.q_proj.input_scale");
    check_input_scale(L.k_input_scale, p + "self_attn.k_proj.input_scale");
    check_input_scale(L.v_input_scale, p + "self_attn.v_proj.input_scale");
    check_input_scale(L.o_input_scale, p + "self_attn.o_proj.input_scale");
    check_input_scale(L.gate_input_scale, p + "mlp.gate_proj.input_scale");
    check_input_scale(L.up_input_scale, p + "mlp.up_proj.input_scale");
    check_input_scale(L.down_input_scale, p + "mlp.down_proj.input_scale");
    check_finite(L.attn_conv_base, p + "attention_conv.base_kernel");
    check_finite(L.attn_conv_proj, p + "attention_conv.kernel_projection.weight");
    check_finite(L.mlp_conv_base, p + "mlp_conv.base_kernel");
    check_finite(L.mlp_conv_proj, p + "mlp_conv.kernel_projection.weight");
  }
  check_input_scale(w.lm_head_input_scale, "lm_head.input_scale");
  check_finite(w.selector.hidden_projection, "candidate_selector.hidden_projection.weight");
  check_finite(w.selector.predecessor_codebook, "candidate_selector.predecessor_codebook");
  check_finite(w.selector.successor_codebook, "candidate_selector.successor_codebook");
}

template <typename T>
PreparedWeights<T>::PreparedWeights(const DrafterWeights& w, const StagePolicy& policy, ThreadPool& pool)
    : fc(w.fc, Tensor(), /*quantize_fp8=*/false, "fc", pool),
      hidden_norm(to_vector<T>(w.hidden_norm)),
      final_norm(to_vector<T>(w.norm)),
      lm_head(make_lm_head<T>(w, policy, pool)),
      embed_tokens(&w.embed_tokens) {
  const bool q8 = policy.fp8_weights;
  layers.reserve(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "layers." + std::to_string(l) + ".";
    PreparedLayer<T> out;
    out.input_norm = to_vector<T>(L.input_layernorm);
    out.post_attention_norm = to_vector<T>(L.post_attention_layernorm);
    out.q_norm = to_vector<T>(L.q_norm);
    out.k_norm = to_vector<T>(L.k_norm);
    out.q_proj = checkpoint_projection<T>(L.q_proj, L.q_bias, L.q_proj_fp8, q8, p + "self_attn.q_proj", pool, policy, L.q_input_scale);
    out.k_proj = checkpoint_projection<T>(L.k_proj, L.k_bias, L.k_proj_fp8, q8, p + "self_attn.k_proj", pool, policy, L.k_input_scale);
    out.v_proj = checkpoint_projection<T>(L.v_proj, L.v_bias, L.v_proj_fp8, q8, p + "self_attn.v_proj", pool, policy, L.v_input_scale);
    out.o_proj = checkpoint_projection<T>(L.o_proj, L.o_bias, L.o_proj_fp8, q8, p + "self_attn.o_proj", pool, policy, L.o_input_scale);
    out.gate_proj = checkpoint_projection<T>(L.gate_proj, Tensor(), L.gate_proj_fp8, q8, p + "mlp.gate_proj", pool, policy, L.gate_input_scale);
    out.up_proj = checkpoint_projection<T>(L.up_proj, Tensor(), L.up_proj_fp8, q8, p + "mlp.up_proj", pool, policy, L.up_input_scale);
    out.down_proj = checkpoint_projection<T>(L.down_proj, Tensor(), L.down_proj_fp8, q8, p + "mlp.down_proj", pool, policy, L.down_input_scale);
    // docs/spec/tensor-parallel.md §3: o_proj and down_proj are the row-parallel GEMMs, the only
    // computation TP = N changes. Each rank holds TP = 1's codes and full-row fp8 scales (§2), so
    // the K-split of these weights is its slice of TP = 1's, byte for byte.
    out.o_proj.set_row_parallel(policy.tp_size, policy.tp_reduce_bf16);
    out.down_proj.set_row_parallel(policy.tp_size, policy.tp_reduce_bf16);
#ifdef DFLASH_FAULT_POINTS
    if (l == 0 && policy.tp_fault == TpFault::kMissingAllReduce) out.o_proj.plant_missing_all_reduce();
#endif
    if (!L.attn_conv_proj.values.empty()) {
      out.attn_conv_proj = Linear<T>(L.attn_conv_proj, Tensor(), false, p + "attention_conv.kernel_projection", pool);
      out.mlp_conv_proj = Linear<T>(L.mlp_conv_proj, Tensor(), false, p + "mlp_conv.kernel_projection", pool);
      out.attn_conv_base = to_vector<T>(L.attn_conv_base);
      out.mlp_conv_base = to_vector<T>(L.mlp_conv_base);
    }
    layers.push_back(std::move(out));
  }
  if (!w.selector.hidden_projection.values.empty()) {
    selector.hidden_projection =
        Linear<T>(w.selector.hidden_projection, Tensor(), false, "candidate_selector.hidden_projection", pool);
    selector.predecessor = to_vector<T>(w.selector.predecessor_codebook);
    selector.successor = to_vector<T>(w.selector.successor_codebook);
  }
}

template struct PreparedWeights<float>;
template struct PreparedWeights<double>;

}  // namespace dflash
