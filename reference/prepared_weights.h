// The drafter's weights in the form one compute type uses: projections as Linear<T> (fp8-quantized
// where the policy says), norm weights as T vectors. Built once per drafter.
#pragma once
#include <string>
#include <vector>

#include "core/config.h"
#include "core/weights.h"
#include "reference/linear.h"
#include "reference/stage_policy.h"
#include "reference/thread_pool.h"

namespace dflash {

template <typename T>
struct PreparedLayer {
  std::vector<T> input_norm, post_attention_norm, q_norm, k_norm;
  Linear<T> q_proj, k_proj, v_proj, o_proj;
  Linear<T> gate_proj, up_proj, down_proj;
  // DFlash2: kernel_projection stays bf16 in every mode (docs/spec/dflash2.md; the engine keeps it
  // unquantized); base kernels [2, k, H] as T.
  Linear<T> attn_conv_proj, mlp_conv_proj;
  std::vector<T> attn_conv_base, mlp_conv_base;
};

// DFlash2's candidate selector: hidden_projection stays bf16 in every mode; codebooks [V, r] as T.
template <typename T>
struct PreparedSelector {
  Linear<T> hidden_projection;
  std::vector<T> predecessor, successor;
};

template <typename T>
struct PreparedWeights {
  Linear<T> fc;  // never quantized (docs/spec/drafter.md §6)
  std::vector<T> hidden_norm, final_norm;
  std::vector<PreparedLayer<T>> layers;
  Linear<T> lm_head;
  PreparedSelector<T> selector;  // DFlash2 only
  const Tensor* embed_tokens = nullptr;  // [V, H], rows converted when looked up

  // Conversions and quantization run over `pool`.
  PreparedWeights(const DrafterWeights& weights, const StagePolicy& policy, ThreadPool& pool);
};

// Every weight tensor finite, else a bad_input naming the tensor and the first bad index.
void check_weights_finite(const DrafterWeights& weights);

}  // namespace dflash
