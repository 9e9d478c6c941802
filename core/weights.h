// The drafter's weights (docs/spec/drafter.md §2) as float host tensors (bf16 values convert exactly), and
// the target's embed_tokens / lm_head. Loading accounts for every tensor of the checkpoint.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/fp8_checkpoint.h"
#include "core/nvfp4.h"
#include "core/tensor.h"

namespace dflash {

struct LayerWeights {
  Tensor input_layernorm;           // [H]
  Tensor post_attention_layernorm;  // [H]
  Tensor q_proj, k_proj, v_proj;    // [nh·d, H], [nkv·d, H], [nkv·d, H]
  Tensor o_proj;                    // [H, nh·d]
  Tensor q_bias, k_bias, v_bias, o_bias;  // [nh·d], [nkv·d], [nkv·d], [H]; empty without attention_bias
  Tensor q_norm, k_norm;            // [d]
  Tensor gate_proj, up_proj;        // [I, H]
  Tensor down_proj;                 // [H, I]
  // Static per-tensor activation scales of a pre-quantized FP8 checkpoint (`input_scale`), used in
  // w8a8 mode in place of the per-token dynamic scale (docs/spec/drafter.md §6); absent: dynamic.
  std::optional<float> q_input_scale, k_input_scale, v_input_scale, o_input_scale;
  std::optional<float> gate_input_scale, up_input_scale, down_input_scale;
  // DFlash2 only (docs/spec/dflash2.md §2), empty otherwise.
  Tensor attn_conv_base, mlp_conv_base;  // [2, k, H]: [side, tap, channel]
  Tensor attn_conv_proj, mlp_conv_proj;  // kernel_projection [2·k·ng, H]
  // From a pre-quantized FP8 checkpoint only (docs/spec/fp8-checkpoints.md): a projection's stored E4M3
  // codes and scales, whose products the float weight above holds (rounded once to fp32 where a product
  // needs more bits); empty for a projection stored unquantized.
  std::optional<Fp8Stored> q_proj_fp8, k_proj_fp8, v_proj_fp8, o_proj_fp8;
  std::optional<Fp8Stored> gate_proj_fp8, up_proj_fp8, down_proj_fp8;
};

// DFlash2's candidate selector (docs/spec/dflash2.md §2), empty for plain DFlash.
struct SelectorWeights {
  Tensor hidden_projection;     // [r, H]
  Tensor predecessor_codebook;  // [V, r]
  Tensor successor_codebook;    // [V, r]
};

struct DrafterWeights {
  Tensor fc;           // [H, nT·Ht]
  Tensor hidden_norm;  // [H]
  Tensor norm;         // [H]
  std::vector<LayerWeights> layers;
  SelectorWeights selector;  // DFlash2 only
  Tensor embed_tokens;  // [V, H] (from the target)
  Tensor lm_head;       // [V, H] (from the target; a copy of embed_tokens for a tied target); empty when
                        // the target's head is NVFP4
  NvFp4Weight lm_head_nvfp4;  // the target's head in NVFP4 (docs/spec/nvfp4-lm-head.md), used as it is
  std::optional<float> lm_head_input_scale;  // as LayerWeights' *_input_scale, for the lm_head
  bool nvfp4_head() const { return !lm_head_nvfp4.empty(); }
};

// Where the target's tensors are: a .safetensors file, a sharded checkpoint's
// model.safetensors.index.json, or a directory holding either.
struct TargetSource {
  std::string path;
  std::string embed_tokens_name = "embed_tokens.weight";  // also tried with a "model." prefix
  std::string lm_head_name = "lm_head.weight";            // absent + tied config: embed_tokens
  // The fixture says the target ties lm_head to embed_tokens (target.tie_word_embeddings); a
  // target directory can also say so in its config.json.
  bool tied = false;
  // The head's format as a fixture states it (target.lm_head_format): "bf16" or "nvfp4"; empty: the
  // target directory's config.json quantization_config / hf_quant_config.json declare it (bf16
  // without a declaration). Declaration and tensors must agree (a U8 head needs an NVFP4
  // declaration, a declared NVFP4 head a U8 weight).
  std::string lm_head_format;
  std::optional<NvFp4Names> nvfp4_names;   // target.lm_head_nvfp4; default: ModelOpt's names beside the weight
  nlohmann::json quantization_config;      // target.quantization_config; null: none in the fixture
  std::string manifest;                    // the fixture that gave these fields, for messages
};

// Loads `<drafter_dir>/model.safetensors` (or a sharded index there) and the target's tensors,
// checking every name, shape and dtype against `config`. Missing, unused, wrongly shaped or
// wrongly typed tensors are errors naming the file and tensor.
DrafterWeights load_drafter_weights(const DrafterConfig& config, const std::string& drafter_dir,
                                    const TargetSource& target);

// Checks an in-memory weight set against the config (shapes, biases present iff attention_bias).
void validate_drafter_weights(const DrafterConfig& config, const DrafterWeights& weights);

// Every drafter tensor under its checkpoint name (docs/spec/drafter.md §2, without the "model." prefix) with
// its expected shape, in one fixed order; biases only with attention_bias. The loader's tensor
// accounting and the checkpoint writer share this list.
struct NamedWeight {
  std::string name;
  std::vector<int64_t> shape;
  const Tensor* tensor;
};
std::vector<NamedWeight> drafter_tensor_list(const DrafterConfig& config, const DrafterWeights& weights);

// The drafter tensors of drafter_tensor_list, each from get(name, expected shape) (a plugin's tensor
// views, plugin/export/); embed_tokens and lm_head are the caller's. Not validated.
DrafterWeights assemble_drafter_tensors(
    const DrafterConfig& config, const std::function<Tensor(const std::string& name, const std::vector<int64_t>& shape)>& get);

}  // namespace dflash
