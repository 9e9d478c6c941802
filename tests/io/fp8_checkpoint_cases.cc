// The refusals of docs/spec/fp8-checkpoints.md §4, as rows of the malformed-input table: each edits a copy
// of a bundled FP8 checkpoint fixture (fixtures/fp8ckpt/) and names the substring the error must carry.
//   ct-gqa:       compressed-tensors, H 96, two layers; q/k/v/o per channel (BF16 [rows, 1], dynamic
//                 per-token), gate/up/down per tensor (BF16 [1] with a BF16 [1] input_scale),
//                 layers.1.mlp.down_proj ignored (BF16).
//   modelopt-mha: ModelOpt FP8, H 64, one layer; per-tensor F32 [] scales and input scales,
//                 layers.0.mlp.up_proj and fc excluded; config.json and hf_quant_config.json both declare it.
#include <cmath>
#include <cstring>
#include <string>

#include "tests/io/fixture_edits.h"
#include "tests/io/malformed_cases.h"

namespace dflash::testing {
namespace {

std::string config_json(const std::string& dir) { return dir + "/drafter/config.json"; }
std::string hf_quant_config(const std::string& dir) { return dir + "/drafter/hf_quant_config.json"; }
std::string model(const std::string& dir) { return dir + "/drafter/model.safetensors"; }

std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}
std::vector<uint8_t> bf16_bytes(uint16_t bits) { return {static_cast<uint8_t>(bits & 0xff), static_cast<uint8_t>(bits >> 8)}; }

MalformedCase on_base(const std::string& base, std::string name, std::string expected,
                      std::function<void(const std::string& dir)> edit) {
  return {name, expected, [name, base, edit](const std::string& work) {
            const std::string dir = copy_fixture(work, name, base);
            edit(dir);
            return dir;
          }};
}

// compressed-tensors: an edit of config.json's quantization_config, or of model.safetensors.
MalformedCase ct_config(std::string name, std::string expected, std::function<void(ojson& qc)> edit) {
  return on_base(fp8_compressed_tensors_base_fixture(), name, expected, [edit](const std::string& dir) {
    edit_json(config_json(dir), [&](ojson& c) { edit(c["quantization_config"]); });
  });
}
MalformedCase ct_tensors(std::string name, std::string expected, std::function<void(ojson&, std::vector<uint8_t>&)> edit) {
  return on_base(fp8_compressed_tensors_base_fixture(), name, expected,
                 [edit](const std::string& dir) { edit_safetensors(model(dir), edit); });
}

// ModelOpt: the same edit of both declarations (they must agree), or of model.safetensors.
MalformedCase mo_declarations(std::string name, std::string expected, std::function<void(ojson& q, bool legacy)> edit) {
  return on_base(fp8_modelopt_base_fixture(), name, expected, [edit](const std::string& dir) {
    edit_json(config_json(dir), [&](ojson& c) { edit(c["quantization_config"], false); });
    edit_json(hf_quant_config(dir), [&](ojson& h) { edit(h["quantization"], true); });
  });
}
MalformedCase mo_tensors(std::string name, std::string expected, std::function<void(ojson&, std::vector<uint8_t>&)> edit) {
  return on_base(fp8_modelopt_base_fixture(), name, expected,
                 [edit](const std::string& dir) { edit_safetensors(model(dir), edit); });
}

const std::string kQ0 = "layers.0.self_attn.q_proj";

}  // namespace

std::string fp8_compressed_tensors_base_fixture() { return std::string(DFLASH_SOURCE_DIR) + "/fixtures/fp8ckpt/ct-gqa"; }
std::string fp8_modelopt_base_fixture() { return std::string(DFLASH_SOURCE_DIR) + "/fixtures/fp8ckpt/modelopt-mha"; }

std::vector<MalformedCase> fp8_checkpoint_cases() {
  return {
      // Block-wise and group-wise scales: by declaration, and by a scale tensor's shape.
      ct_config("fp8-ct-block-strategy", "block-wise weight scales (strategy 'block', block_structure [128,128])",
                [](ojson& qc) {
                  qc["config_groups"]["group_0"]["weights"]["strategy"] = "block";
                  qc["config_groups"]["group_0"]["weights"]["block_structure"] = {128, 128};
                }),
      ct_config("fp8-ct-group-strategy", "group-wise weight scales (strategy 'group', group_size 32)",
                [](ojson& qc) {
                  qc["config_groups"]["group_1"]["weights"]["strategy"] = "group";
                  qc["config_groups"]["group_1"]["weights"]["group_size"] = 32;
                }),
      ct_tensors("fp8-ct-block-scale-tensor",
                 "tensor 'layers.0.self_attn.q_proj.weight_scale' has shape [2, 2] for a [96, 96] weight: block-wise or "
                 "group-wise scales are not supported",
                 [](ojson& h, std::vector<uint8_t>&) {
                   ojson& t = h[kQ0 + ".weight_scale"];
                   t["shape"] = {2, 2};
                   t["data_offsets"][1] = t["data_offsets"][0].get<size_t>() + 8;
                 }),
      mo_declarations("fp8-mo-block-algo", "quant_algo is 'FP8_PB_WO': block-wise weight scales are not supported",
                      [](ojson& q, bool) { q["quant_algo"] = "FP8_PB_WO"; }),
      // FP8 KV-cache scales: by declaration, and by tensor.
      ct_config("fp8-ct-kv-cache-scheme", "kv_cache_scheme is set: FP8 KV-cache quantization is not supported",
                [](ojson& qc) {
                  qc["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "float"}, {"strategy", "tensor"}, {"dynamic", false},
                                           {"symmetric", true}};
                }),
      mo_declarations("fp8-mo-kv-cache-algo", "kv_cache_quant_algo is \"FP8\": FP8 KV-cache scales are not supported",
                      [](ojson& q, bool) { q["kv_cache_quant_algo"] = "FP8"; }),
      ct_tensors("fp8-ct-k-scale-tensor",
                 "tensor 'layers.0.self_attn.k_scale' is an FP8 KV-cache (attention) scale: KV-cache quantization is not "
                 "supported",
                 [](ojson& h, std::vector<uint8_t>& d) {
                   append_tensor(h, d, "layers.0.self_attn.k_scale", "F32", {}, f32_bytes(0.02f));
                 }),
      ct_tensors("fp8-ct-k-proj-output-scale",
                 "tensor 'layers.1.self_attn.k_proj.output_scale' is an FP8 KV-cache (attention) scale",
                 [](ojson& h, std::vector<uint8_t>& d) {
                   append_tensor(h, d, "layers.1.self_attn.k_proj.output_scale", "BF16", {1}, bf16_bytes(0x3c00));
                 }),
      // Activation schemes other than dynamic per-token or static per-tensor.
      ct_config("fp8-ct-activation-group",
                "activation scheme strategy 'group' with dynamic true, group_size 128 is not supported",
                [](ojson& qc) {
                  qc["config_groups"]["group_0"]["input_activations"]["strategy"] = "group";
                  qc["config_groups"]["group_0"]["input_activations"]["group_size"] = 128;
                }),
      ct_config("fp8-ct-activation-dynamic-tensor", "activation scheme strategy 'tensor' with dynamic true is not supported",
                [](ojson& qc) { qc["config_groups"]["group_1"]["input_activations"]["dynamic"] = true; }),
      ct_config("fp8-ct-activation-local", "activation scheme strategy 'tensor' with dynamic \"local\" is not supported",
                [](ojson& qc) { qc["config_groups"]["group_1"]["input_activations"]["dynamic"] = "local"; }),
      ct_config("fp8-ct-output-activations", "output_activations is set: output (KV-cache or attention) quantization",
                [](ojson& qc) {
                  qc["config_groups"]["group_0"]["output_activations"] = qc["config_groups"]["group_0"]["input_activations"];
                }),
      // Scales of the wrong shape or dtype.
      ct_tensors("fp8-ct-channel-scale-shape",
                 "tensor 'layers.0.self_attn.q_proj.weight_scale': wrong shape, expected [96, 1] (one scale per output row",
                 [](ojson& h, std::vector<uint8_t>&) { h[kQ0 + ".weight_scale"]["shape"] = {96}; }),
      ct_tensors("fp8-ct-tensor-scale-shape",
                 "tensor 'layers.0.mlp.gate_proj.weight_scale': wrong shape, expected [] or [1] (one scale per tensor",
                 [](ojson& h, std::vector<uint8_t>& d) {
                   // A per-row scale where group_1 declares one per tensor (the old bytes stay, unreferenced).
                   append_tensor(h, d, "layers.0.mlp.gate_proj.weight_scale", "BF16", {192, 1},
                                 std::vector<uint8_t>(384, 0x3c));
                 }),
      mo_tensors("fp8-mo-scale-dtype", "has dtype I32; modelopt FP8 weight scales are F32",
                 [](ojson& h, std::vector<uint8_t>&) { h[kQ0 + ".weight_scale"]["dtype"] = "I32"; }),
      mo_tensors("fp8-mo-input-scale-shape",
                 "tensor 'layers.0.self_attn.k_proj.input_scale': wrong shape, expected [] or [1] (one static activation "
                 "scale per tensor)",
                 [](ojson& h, std::vector<uint8_t>&) { h["layers.0.self_attn.k_proj.input_scale"]["shape"] = {1, 1}; }),
      // A declared-quantized weight whose dtype is not F8_E4M3.
      ct_tensors("fp8-ct-weight-u8",
                 "tensor 'layers.0.self_attn.q_proj.weight' has dtype U8 but ",
                 [](ojson& h, std::vector<uint8_t>&) { h[kQ0 + ".weight"]["dtype"] = "U8"; }),
      // Non-finite and non-positive scales, NaN codes.
      ct_tensors("fp8-ct-nan-channel-scale", "the weight scale of row 3 is nan; scales must be finite and > 0",
                 [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, kQ0 + ".weight_scale", 3, bf16_bytes(0x7fc0)); }),
      ct_tensors("fp8-ct-negative-tensor-scale", "the weight scale is -1.000000; scales must be finite and > 0",
                 [](ojson& h, std::vector<uint8_t>& d) {
                   poke(h, d, "layers.0.mlp.up_proj.weight_scale", 0, bf16_bytes(0xbf80));
                 }),
      mo_tensors("fp8-mo-zero-scale", "the weight scale is 0.000000; scales must be finite and > 0",
                 [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, kQ0 + ".weight_scale", 0, f32_bytes(0.0f)); }),
      mo_tensors("fp8-mo-inf-input-scale", "the input scale is inf; scales must be finite and > 0",
                 [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, kQ0 + ".input_scale", 0, f32_bytes(INFINITY)); }),
      ct_tensors("fp8-ct-nan-code", "code 0x7f at row 0, column 5 is NaN; FP8 weights must be finite",
                 [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, kQ0 + ".weight", 5, {0x7f}); }),
      // Scales and tensors missing, or present where the scheme has none.
      ct_tensors("fp8-ct-missing-weight-scale", "missing tensor 'layers.0.self_attn.q_proj.weight_scale' (the FP8 weight scale",
                 [](ojson& h, std::vector<uint8_t>&) { h.erase(kQ0 + ".weight_scale"); }),
      ct_tensors("fp8-ct-missing-input-scale",
                 "missing tensor 'layers.0.mlp.gate_proj.input_scale' (the static per-tensor activation scale",
                 [](ojson& h, std::vector<uint8_t>&) { h.erase("layers.0.mlp.gate_proj.input_scale"); }),
      ct_tensors("fp8-ct-input-scale-with-dynamic", "is a static activation scale but ",
                 [](ojson& h, std::vector<uint8_t>& d) {
                   append_tensor(h, d, kQ0 + ".input_scale", "BF16", {1}, bf16_bytes(0x3c00));
                 }),
      ct_tensors("fp8-ct-zero-point", "tensor 'layers.0.self_attn.q_proj.weight_zero_point' is a zero point",
                 [](ojson& h, std::vector<uint8_t>& d) {
                   append_tensor(h, d, kQ0 + ".weight_zero_point", "BF16", {96, 1}, std::vector<uint8_t>(192, 0));
                 }),
      // The ignore list and the tensors disagree, both ways; a module the harness keeps unquantized.
      ct_config("fp8-ct-ignored-but-fp8", "tensor 'layers.0.self_attn.q_proj.weight' is F8_E4M3 but ",
                [](ojson& qc) { qc["ignore"].push_back("re:.*layers\\.0\\.self_attn\\.q_proj$"); }),
      ct_config("fp8-ct-quantized-but-bf16", "tensor 'layers.1.mlp.down_proj.weight' has dtype BF16 but ",
                [](ojson& qc) { qc["ignore"] = {"lm_head"}; }),
      ct_tensors("fp8-ct-scale-of-ignored", "belongs to 'layers.1.mlp.down_proj', which ",
                 [](ojson& h, std::vector<uint8_t>& d) {
                   append_tensor(h, d, "layers.1.mlp.down_proj.weight_scale", "BF16", {1}, bf16_bytes(0x3c00));
                 }),
      ct_config("fp8-ct-fc-targeted", "target 'fc' quantizes 'fc', which the harness keeps unquantized",
                [](ojson& qc) { qc["config_groups"]["group_0"]["targets"].push_back("fc"); }),
      mo_declarations("fp8-mo-fc-not-excluded", "quant_algo 'FP8' quantizes 'fc', which the harness keeps unquantized",
                      [](ojson& q, bool legacy) {
                        ojson& list = q[legacy ? "exclude_modules" : "ignore"];
                        ojson kept = ojson::array();
                        for (const auto& p : list) if (p != "fc") kept.push_back(p);
                        list = kept;
                      }),
      ct_config("fp8-ct-two-groups", "is targeted by both config_groups.group_0",
                [](ojson& qc) { qc["config_groups"]["group_1"]["targets"].push_back("re:.*q_proj$"); }),
      on_base(fp8_compressed_tensors_base_fixture(), "fp8-ct-undeclared",
              "tensor 'layers.0.self_attn.q_proj.weight' is F8_E4M3 but the drafter declares no quantization",
              [](const std::string& dir) { edit_json(config_json(dir), [](ojson& c) { c.erase("quantization_config"); }); }),
      // Declarations this harness does not read.
      ct_config("fp8-ct-int-weights", "only 'float' (FP8 E4M3) is supported, not integer quantization",
                [](ojson& qc) { qc["config_groups"]["group_0"]["weights"]["type"] = "int"; }),
      ct_config("fp8-ct-asymmetric", "symmetric is false; asymmetric quantization (zero points) is not supported",
                [](ojson& qc) { qc["config_groups"]["group_1"]["weights"]["symmetric"] = false; }),
      ct_config("fp8-ct-pack-format", "format is 'pack-quantized'; FP8 weights are read in the 'float-quantized'",
                [](ojson& qc) { qc["format"] = "pack-quantized"; }),
      ct_config("fp8-ct-bad-regex", "is not a regular expression this harness reads",
                [](ojson& qc) { qc["ignore"].push_back("re:(?P<name>x)"); }),
      ct_config("fp8-ct-counted-repetition", "uses counted repetition ('{'), which is not read",
                [](ojson& qc) { qc["ignore"].push_back("re:.*layers\\.[0-9]{1,2}\\.mlp$"); }),
      // The limits of docs/limits.md.
      ct_config("fp8-ct-pattern-too-long", "exceeds the limit 256 (docs/limits.md)",
                [](ojson& qc) { qc["ignore"].push_back(std::string(257, 'x')); }),
      ct_config("fp8-ct-too-many-patterns", "module patterns (targets and ignore) = 4099 exceeds the limit 4096",
                [](ojson& qc) {
                  for (int i = 0; i < 4095; ++i) qc["ignore"].push_back("layers." + std::to_string(i) + ".mlp.gate_proj");
                }),
      mo_declarations("fp8-mo-nvfp4-algo", "quant_algo is 'NVFP4'; drafter checkpoints are read as FP8",
                      [](ojson& q, bool) { q["quant_algo"] = "NVFP4"; }),
      on_base(fp8_modelopt_base_fixture(), "fp8-mo-declarations-disagree", "declare different quantization",
              [](const std::string& dir) {
                edit_json(hf_quant_config(dir), [](ojson& h) { h["quantization"]["exclude_modules"] = {"lm_head", "fc"}; });
              }),
  };
}

}  // namespace dflash::testing
