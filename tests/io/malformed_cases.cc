#include "tests/io/malformed_cases.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "fixtures/fixture.h"
#include "tests/io/fixture_edits.h"

namespace dflash::testing {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// The defects are planted with plain byte and JSON edits (tests/io/fixture_edits.h), independent of
// the readers under test.

std::string copy_base(const std::string& work_dir, const std::string& name,
                      const std::string& base = malformed_base_fixture()) {
  return copy_fixture(work_dir, name, base);
}

std::string trace(const std::string& dir) { return dir + "/trace.safetensors"; }
std::string manifest(const std::string& dir) { return dir + "/fixture.json"; }
std::string drafter_config(const std::string& dir) { return dir + "/drafter/config.json"; }
std::string drafter_model(const std::string& dir) { return dir + "/drafter/model.safetensors"; }

// A case edits a fresh copy of the base fixture; the helpers below name the usual edits.
using Case = MalformedCase;
Case raw_case(std::string name, std::string expected, std::function<void(const std::string& dir)> edit) {
  return {name, expected, [name, edit](const std::string& work) {
            const std::string dir = copy_base(work, name);
            edit(dir);
            return dir;
          }};
}
Case manifest_case(std::string name, std::string expected, std::function<void(ojson&)> edit) {
  return raw_case(name, expected, [edit](const std::string& dir) { edit_json(manifest(dir), edit); });
}
Case config_case(std::string name, std::string expected, std::function<void(ojson&)> edit) {
  return raw_case(name, expected, [edit](const std::string& dir) { edit_json(drafter_config(dir), edit); });
}
Case safetensors_case(std::string name, std::string expected, std::string (*file)(const std::string&),
                      std::function<void(ojson&, std::vector<uint8_t>&)> edit) {
  return raw_case(name, expected, [file, edit](const std::string& dir) { edit_safetensors(file(dir), edit); });
}

// The NVFP4 head's refusals (docs/spec/nvfp4-lm-head.md §7) edit a copy of nvfp4-tiny-gqa
// (V 500, K 96: weight U8 [500, 48], weight_scale F8_E4M3 [500, 6], scalar F32 scales).
std::string target_file(const std::string& dir) { return dir + "/target.safetensors"; }
Case nvfp4_case(std::string name, std::string expected, std::function<void(const std::string& dir)> edit) {
  return {name, expected, [name, edit](const std::string& work) {
            const std::string dir = copy_base(work, name, nvfp4_base_fixture());
            edit(dir);
            return dir;
          }};
}
Case nvfp4_manifest_case(std::string name, std::string expected, std::function<void(ojson&)> edit) {
  return nvfp4_case(name, expected, [edit](const std::string& dir) { edit_json(manifest(dir), edit); });
}
Case nvfp4_target_case(std::string name, std::string expected, std::function<void(ojson&, std::vector<uint8_t>&)> edit) {
  return nvfp4_case(name, expected, [edit](const std::string& dir) { edit_safetensors(target_file(dir), edit); });
}
std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}
// A new tensor appended to the data area.
void append_tensor(ojson& h, std::vector<uint8_t>& data, const std::string& name, const std::string& dtype,
                   std::vector<int64_t> shape, size_t bytes) {
  h[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes}}};
  data.resize(data.size() + bytes);
}

std::vector<MalformedCase> nvfp4_cases() {
  return {
      nvfp4_manifest_case("nvfp4-group-size-config",
                          "target.quantization_config.group_size is 32; NVFP4 blocks are 16 elements",
                          [](ojson& m) { m["target"]["quantization_config"]["group_size"] = 32; }),
      nvfp4_manifest_case("nvfp4-group-size-fixture",
                          "field 'target.lm_head_nvfp4.group_size' is 32; NVFP4 blocks are 16 elements",
                          [](ojson& m) { m["target"]["lm_head_nvfp4"]["group_size"] = 32; }),
      nvfp4_target_case("nvfp4-group-size-implied",
                        "tensor 'lm_head.weight_scale': wrong shape, expected [500, 6] ([vocab_size, K/16]), got "
                        "[1000, 3] (it implies group size 32; NVFP4 needs 16)",
                        [](ojson& h, std::vector<uint8_t>&) { h["lm_head.weight_scale"]["shape"] = {1000, 3}; }),
      nvfp4_target_case("nvfp4-missing-block-scales",
                        "missing tensor 'lm_head.weight_scale' (the NVFP4 block scales of the U8 'lm_head.weight')",
                        [](ojson& h, std::vector<uint8_t>&) { h.erase("lm_head.weight_scale"); }),
      nvfp4_target_case("nvfp4-missing-global-scale",
                        "missing tensor 'lm_head.weight_scale_2' (the NVFP4 global scale weight_scale_2 of the U8 lm_head)",
                        [](ojson& h, std::vector<uint8_t>&) { h.erase("lm_head.weight_scale_2"); }),
      nvfp4_manifest_case("nvfp4-u8-without-declaration",
                          "lm_head 'lm_head.weight' is U8 (packed NVFP4?) but nothing declares an NVFP4 lm_head",
                          [](ojson& m) {
                            for (const char* key : {"lm_head_format", "lm_head_nvfp4", "quantization_config"})
                              m["target"].erase(key);
                          }),
      nvfp4_manifest_case("nvfp4-excluded-by-pattern",
                          "fixture.json: target.quantization_config.ignore (pattern 'lm_head*'))",
                          [](ojson& m) {
                            m["target"].erase("lm_head_format");
                            m["target"].erase("lm_head_nvfp4");
                            m["target"]["quantization_config"]["ignore"] = {"lm_head*"};
                          }),
      nvfp4_manifest_case("nvfp4-format-vs-config",
                          "target.lm_head_format is 'nvfp4' but ",
                          [](ojson& m) { m["target"]["quantization_config"]["quant_algo"] = "FP8"; }),
      nvfp4_manifest_case("nvfp4-format-unknown", "field 'target.lm_head_format' is 'fp4'; expected 'bf16' or 'nvfp4'",
                          [](ojson& m) { m["target"]["lm_head_format"] = "fp4"; }),
      nvfp4_target_case("nvfp4-declared-weight-not-u8",
                        "declares an NVFP4 lm_head but 'lm_head.weight' has dtype BF16 (NVFP4 needs U8)",
                        [](ojson& h, std::vector<uint8_t>&) {
                          h["lm_head.weight"]["dtype"] = "BF16";
                          h["lm_head.weight"]["shape"] = {500, 24};
                        }),
      nvfp4_target_case("nvfp4-weight-shape",
                        "tensor 'lm_head.weight': wrong shape for an NVFP4 head, expected [500, 48] ([vocab_size, K/2]), got [250, 96]",
                        [](ojson& h, std::vector<uint8_t>&) { h["lm_head.weight"]["shape"] = {250, 96}; }),
      nvfp4_target_case("nvfp4-block-scales-not-e4m3",
                        "tensor 'lm_head.weight_scale' has dtype BF16; NVFP4 block scales are F8_E4M3",
                        [](ojson& h, std::vector<uint8_t>&) {
                          h["lm_head.weight_scale"]["dtype"] = "BF16";
                          h["lm_head.weight_scale"]["shape"] = {500, 3};
                        }),
      nvfp4_target_case("nvfp4-block-scales-1d",
                        "has shape [3000]; block scales must be the 2-D checkpoint layout [V, K/16] (a 1-D one is a "
                        "swizzled runtime layout)",
                        [](ojson& h, std::vector<uint8_t>&) { h["lm_head.weight_scale"]["shape"] = {3000}; }),
      nvfp4_target_case("nvfp4-block-scales-u8",
                        "tensor 'lm_head.weight_scale' has dtype U8, a swizzled runtime layout",
                        [](ojson& h, std::vector<uint8_t>&) { h["lm_head.weight_scale"]["dtype"] = "U8"; }),
      nvfp4_target_case("nvfp4-block-scales-mxfp4", "tensor 'lm_head.weight_scale': unsupported dtype 'F8_E8M0'",
                        [](ojson& h, std::vector<uint8_t>&) { h["lm_head.weight_scale"]["dtype"] = "F8_E8M0"; }),
      nvfp4_target_case("nvfp4-block-scale-nan", "block scale of row 1, block 1 (0x7f) is NaN",
                        [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, "lm_head.weight_scale", 7, {0x7f}); }),
      nvfp4_target_case("nvfp4-block-scale-negative", "block scale of row 2, block 0 (0xb8) has its sign bit set",
                        [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, "lm_head.weight_scale", 12, {0xb8}); }),
      nvfp4_target_case("nvfp4-global-scale-zero",
                        "tensor 'lm_head.weight_scale_2' is 0.000000 (bits 0x00000000); the NVFP4 global scale "
                        "weight_scale_2 must be finite and > 0",
                        [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, "lm_head.weight_scale_2", 0, f32_bytes(0.0f)); }),
      nvfp4_target_case("nvfp4-global-scale-nan", "(bits 0x7fc00000); the NVFP4 global scale weight_scale_2 must be finite",
                        [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, "lm_head.weight_scale_2", 0, f32_bytes(NAN)); }),
      nvfp4_target_case("nvfp4-global-scale-split",
                        "tensor 'lm_head.weight_scale_2' has shape [2]; the NVFP4 global scale weight_scale_2 must hold "
                        "exactly one element ([] or [1]; a split per-partition scale is not supported)",
                        [](ojson& h, std::vector<uint8_t>& d) {
                          h.erase("lm_head.weight_scale_2");
                          append_tensor(h, d, "lm_head.weight_scale_2", "F32", {2}, 8);
                        }),
      nvfp4_target_case("nvfp4-input-scale-negative", "the NVFP4 input_scale must be finite and > 0",
                        [](ojson& h, std::vector<uint8_t>& d) { poke(h, d, "lm_head.input_scale", 0, f32_bytes(-1.0f)); }),
      nvfp4_target_case("nvfp4-compressed-tensors",
                        "tensor 'lm_head.weight_packed' is compressed-tensors NVFP4, which is not supported",
                        [](ojson& h, std::vector<uint8_t>& d) { append_tensor(h, d, "lm_head.weight_packed", "U8", {500, 48}, 24000); }),
      nvfp4_manifest_case("nvfp4-mxfp4-algo", "target.quantization_config.quant_algo is 'MXFP4': MXFP4 is not supported",
                          [](ojson& m) { m["target"]["quantization_config"]["quant_algo"] = "MXFP4"; }),
      nvfp4_target_case("nvfp4-embed-tokens",
                        "embed_tokens 'embed_tokens.weight' is quantized (NVFP4 embeddings are not supported",
                        [](ojson& h, std::vector<uint8_t>&) {
                          h["embed_tokens.weight"]["dtype"] = "U8";
                          h["embed_tokens.weight"]["shape"] = {500, 192};
                        }),
      nvfp4_case("nvfp4-scales-without-declaration", "tensor 'lm_head.weight_scale' is present but ",
                 [](const std::string& dir) {
                   edit_json(manifest(dir), [](ojson& m) {
                     for (const char* key : {"lm_head_format", "lm_head_nvfp4", "quantization_config"})
                       m["target"].erase(key);
                   });
                   edit_safetensors(target_file(dir), [](ojson& h, std::vector<uint8_t>&) {
                     h["lm_head.weight"]["dtype"] = "BF16";
                     h["lm_head.weight"]["shape"] = {500, 24};
                   });
                 }),
  };
}

ojson& entry(ojson& m, int step, int index) { return m["steps"][step]["propose"][index]; }

// Sequence 0's first context grows to `rows` rows (zeros), its later starts follow and its first
// expectations go (their shapes would follow the context), so the steps reach a window that long;
// `head` then sets the head fields under test.
Case long_context_case(std::string name, std::string expected, int64_t rows, std::function<void(ojson&)> head) {
  return raw_case(name, expected, [rows, head](const std::string& dir) {
    std::vector<std::string> dropped;
    int64_t added = 0;
    edit_json(manifest(dir), [&](ojson& m) {
      for (const auto& item : entry(m, 0, 0)["expect"].items()) {
        if (item.value().is_string()) dropped.push_back(item.value().get<std::string>());
        if (item.value().is_object()) {
          for (const auto& tap : item.value().items()) dropped.push_back(tap.value().get<std::string>());
        }
      }
      entry(m, 0, 0).erase("expect");
      added = rows - entry(m, 0, 0)["start"].get<int64_t>();
      for (ojson& step : m["steps"]) {
        if (!step.contains("propose")) continue;
        for (ojson& e : step["propose"]) {
          if (e["seq"] == 0) e["start"] = e["start"].get<int64_t>() + added;
        }
      }
      head(m["head"]);
    });
    edit_safetensors(trace(dir), [&](ojson& h, std::vector<uint8_t>& data) {
      for (const std::string& name : dropped) h.erase(name);
      ojson& ctx = h["s0.q0.ctx"];
      const int64_t features = ctx["shape"][1].get<int64_t>();
      const uint64_t bytes = static_cast<uint64_t>(rows * features * (ctx["dtype"] == "BF16" ? 2 : 4));
      ctx["shape"][0] = rows;  // the rows, zeros, at the end of the data area
      ctx["data_offsets"] = {data.size(), data.size() + bytes};
      data.resize(data.size() + bytes);
    });
  });
}

// ---- the target's side (fixture format v2) ----

std::vector<uint8_t> i32_bytes(int32_t v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

// A new tensor of `values` appended to the data area.
template <typename T>
void append_values(ojson& h, std::vector<uint8_t>& data, const std::string& name, const std::string& dtype,
                   std::vector<int64_t> shape, const std::vector<T>& values) {
  const size_t begin = data.size();
  append_tensor(h, data, name, dtype, std::move(shape), values.size() * sizeof(T));
  std::memcpy(data.data() + begin, values.data(), values.size() * sizeof(T));
}

// The drafts of steps[0].propose[0] of batch-widths-release (B 8, V 400), read from the trace.
std::vector<int32_t> first_drafts(const ojson& h, const std::vector<uint8_t>& data) {
  std::vector<int32_t> tokens(7);
  std::memcpy(tokens.data(), data.data() + h["s0.q0.drafts"]["data_offsets"][0].get<size_t>(), 28);
  return tokens;
}

// Entry 0 of step 0 gains a valid target side (version 2): its tokens are the entry's draft tokens
// and its logits the entry's logits, as new trace tensors; `edit` then plants one defect.
using TargetEdit = std::function<void(ojson& manifest, ojson& header, std::vector<uint8_t>& data)>;
Case target_case(std::string name, std::string expected, TargetEdit edit) {
  return raw_case(name, expected, [edit](const std::string& dir) {
    RawSafetensors raw = read_raw(trace(dir));
    ojson& h = raw.header;
    append_values(h, raw.data, "s0.q0.target.tokens", "I32", {7}, first_drafts(h, raw.data));
    const size_t logits = h["s0.q0.logits"]["data_offsets"][0].get<size_t>();
    std::vector<float> values(7 * 400);
    std::memcpy(values.data(), raw.data.data() + logits, values.size() * 4);
    append_values(h, raw.data, "s0.q0.target.logits", "F32", {7, 400}, values);
    std::ifstream in(manifest(dir));
    ojson m = ojson::parse(in);
    m["version"] = 2;
    entry(m, 0, 0)["target"] = {{"tokens", "s0.q0.target.tokens"}, {"logits", "s0.q0.target.logits"}};
    edit(m, h, raw.data);
    write_text(manifest(dir), m.dump(1));
    write_raw(trace(dir), h.dump(), raw.data);
  });
}

// The same with the target's top-2 instead of its logits: values (1, 0.5) on ids (token, token + 1).
Case topk_case(std::string name, std::string expected, TargetEdit edit) {
  return target_case(name, expected, [edit](ojson& m, ojson& h, std::vector<uint8_t>& data) {
    const std::vector<int32_t> tokens = first_drafts(h, data);
    std::vector<float> values;
    std::vector<int32_t> ids;
    for (int32_t t : tokens) {
      values.insert(values.end(), {1.0f, 0.5f});
      ids.insert(ids.end(), {t, (t + 1) % 400});
    }
    append_values(h, data, "s0.q0.target.topk_values", "F32", {7, 2}, values);
    append_values(h, data, "s0.q0.target.topk_ids", "I32", {7, 2}, ids);
    h.erase("s0.q0.target.logits");
    ojson& target = entry(m, 0, 0)["target"];
    target.erase("logits");
    target["topk"] = {{"values", "s0.q0.target.topk_values"}, {"ids", "s0.q0.target.topk_ids"}};
    edit(m, h, data);
  });
}

std::vector<MalformedCase> target_side_cases() {
  return {
      target_case("target-side-in-version-1",
                  "field 'steps[0].propose[0].target' (seq 0) is a fixture format version 2 field, but field 'version' "
                  "is 1",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) { m["version"] = 1; }),
      target_case("target-unknown-field",
                  "field 'steps[0].propose[0].target.probabilities' (seq 0): unknown field of the target side",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) {
                    entry(m, 0, 0)["target"]["probabilities"] = "s0.q0.target.logits";
                  }),
      target_case("target-tokens-missing", "missing required field 'steps[0].propose[0].target.tokens' (seq 0)",
                  [](ojson& m, ojson& h, std::vector<uint8_t>&) {
                    entry(m, 0, 0)["target"].erase("tokens");
                    h.erase("s0.q0.target.tokens");
                  }),
      target_case("target-tokens-dtype",
                  "field 'steps[0].propose[0].target.tokens' (seq 0): tensor 's0.q0.target.tokens' has dtype F32; "
                  "expected I32",
                  [](ojson&, ojson& h, std::vector<uint8_t>&) { h["s0.q0.target.tokens"]["dtype"] = "F32"; }),
      target_case("target-tokens-shape",
                  "field 'steps[0].propose[0].target.tokens' (seq 0): tensor 's0.q0.target.tokens6' has shape [6]; "
                  "expected [7]",
                  [](ojson& m, ojson& h, std::vector<uint8_t>& d) {
                    append_values(h, d, "s0.q0.target.tokens6", "I32", {6}, std::vector<int32_t>(6, 0));
                    entry(m, 0, 0)["target"]["tokens"] = "s0.q0.target.tokens6";
                  }),
      target_case("target-token-out-of-range",
                  "field 'steps[0].propose[0].target.tokens' (seq 0): tensor 's0.q0.target.tokens' holds token 400 at "
                  "index 1, outside [0, vocab_size 400)",
                  [](ojson&, ojson& h, std::vector<uint8_t>& d) { poke(h, d, "s0.q0.target.tokens", 1, i32_bytes(400)); }),
      target_case("target-token-not-argmax", "which is not a maximum of its logits ('s0.q0.target.logits'",
                  [](ojson&, ojson& h, std::vector<uint8_t>& d) {
                    poke(h, d, "s0.q0.target.tokens", 0, i32_bytes((first_drafts(h, d)[0] + 1) % 400));
                  }),
      target_case("target-logits-shape",
                  "field 'steps[0].propose[0].target.logits' (seq 0): tensor 's0.q0.tap.embed' has shape [8, 64]; "
                  "expected [7, 400]",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) {
                    entry(m, 0, 0)["target"]["logits"] = "s0.q0.tap.embed";
                  }),
      target_case("target-logits-nan",
                  "field 'steps[0].propose[0].target.logits' (seq 0): tensor 's0.q0.target.logits' [7, 400] holds NaN "
                  "at row 0, column 5",
                  [](ojson&, ojson& h, std::vector<uint8_t>& d) { poke(h, d, "s0.q0.target.logits", 5, f32_bytes(NAN)); }),
      topk_case("target-logits-and-topk", "give the target's full 'logits' or its 'topk', not both",
                [](ojson& m, ojson& h, std::vector<uint8_t>& d) {
                  const size_t at = h["s0.q0.logits"]["data_offsets"][0].get<size_t>();
                  std::vector<float> values(7 * 400);
                  std::memcpy(values.data(), d.data() + at, values.size() * 4);
                  append_values(h, d, "s0.q0.target.logits", "F32", {7, 400}, values);
                  entry(m, 0, 0)["target"]["logits"] = "s0.q0.target.logits";
                }),
      topk_case("target-topk-unknown-field",
                "field 'steps[0].propose[0].target.topk.probs' (seq 0): unknown field of the target's top-k",
                [](ojson& m, ojson&, std::vector<uint8_t>&) { entry(m, 0, 0)["target"]["topk"]["probs"] = "x"; }),
      topk_case("target-topk-duplicate-id",
                "tensor 's0.q0.target.topk_ids' lists id ",
                [](ojson&, ojson& h, std::vector<uint8_t>& d) {
                  poke(h, d, "s0.q0.target.topk_ids", 1, i32_bytes(first_drafts(h, d)[0]));
                }),
      topk_case("target-topk-id-out-of-range",
                "field 'steps[0].propose[0].target.topk.ids' (seq 0): tensor 's0.q0.target.topk_ids' holds id -3 at "
                "flat index 3, outside [0, vocab_size 400)",
                [](ojson&, ojson& h, std::vector<uint8_t>& d) { poke(h, d, "s0.q0.target.topk_ids", 3, i32_bytes(-3)); }),
      topk_case("target-topk-too-wide",
                "tensor 's0.q0.target.wide' has shape [7, 401]; expected [7, k] with 1 <= k <= vocab_size 400",
                [](ojson& m, ojson& h, std::vector<uint8_t>& d) {
                  append_values(h, d, "s0.q0.target.wide", "F32", {7, 401}, std::vector<float>(7 * 401, 0.0f));
                  entry(m, 0, 0)["target"]["topk"]["values"] = "s0.q0.target.wide";
                }),
      topk_case("target-topk-token-not-top", "which is not the id of a largest value of its top-k",
                [](ojson&, ojson& h, std::vector<uint8_t>& d) { poke(h, d, "s0.q0.target.topk_values", 1, f32_bytes(2.0f)); }),
      target_case("acceptance-in-version-1",
                  "field 'acceptance' is a fixture format version 2 field, but field 'version' is 1",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) {
                    m["version"] = 1;
                    entry(m, 0, 0).erase("target");
                    m["acceptance"] = {{"per_position", {1.0}}};
                  }),
      target_case("acceptance-out-of-range",
                  "field 'acceptance.per_position': entry 1 is 1.200000; an acceptance probability lies in [0, 1]",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) { m["acceptance"] = {{"per_position", {1.0, 1.2}}}; }),
      target_case("acceptance-grows",
                  "field 'acceptance.per_position': entry 1 (0.700000) is larger than entry 0 (0.500000)",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) { m["acceptance"] = {{"per_position", {0.5, 0.7}}}; }),
      target_case("acceptance-too-long",
                  "field 'acceptance.per_position' has 8 entries, more than the 7 drafted positions of the widest block",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) {
                    m["acceptance"] = {{"per_position", std::vector<double>(8, 0.5)}};
                  }),
      target_case("acceptance-not-a-number",
                  "field 'acceptance.per_position[0]' must be a number, got \"high\"",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) { m["acceptance"] = {{"per_position", {"high"}}}; }),
      target_case("acceptance-unknown-field", "field 'acceptance.threshold': unknown field of the acceptance pin",
                  [](ojson& m, ojson&, std::vector<uint8_t>&) {
                    m["acceptance"] = {{"per_position", {1.0}}, {"threshold", 0.1}};
                  }),
  };
}

std::vector<MalformedCase> build_cases() {
  return {
      // ---- safetensors files ----
      raw_case("truncated-file", "trace.safetensors: file is 5 bytes, too short for the 8-byte header length",
               [](const std::string& dir) {
                 std::vector<uint8_t> bytes = read_bytes(trace(dir));
                 bytes.resize(5);
                 write_bytes(trace(dir), bytes);
               }),
      raw_case("header-length-past-eof", "trace.safetensors: header length 305480 runs past the end of the file",
               [](const std::string& dir) {
                 std::vector<uint8_t> bytes = read_bytes(trace(dir));
                 const uint64_t n = bytes.size() + 100;  // 305380 + 100
                 std::memcpy(bytes.data(), &n, 8);
                 write_bytes(trace(dir), bytes);
               }),
      raw_case("header-not-json", "trace.safetensors: header: not valid JSON",
               [](const std::string& dir) {
                 write_raw(trace(dir), R"({"s0.q0.ctx": {"dtype": )", std::vector<uint8_t>(64));
               }),
      raw_case("header-not-object", "trace.safetensors: header is not a JSON object",
               [](const std::string& dir) { write_raw(trace(dir), "[1, 2, 3]", std::vector<uint8_t>(64)); }),
      safetensors_case("bad-dtype", "tensor 's0.q0.logits': unsupported dtype 'Q4_K'", trace,
                       [](ojson& h, std::vector<uint8_t>&) { h["s0.q0.logits"]["dtype"] = "Q4_K"; }),
      safetensors_case("offsets-out-of-range", "out of range: the data area holds 287940 bytes", trace,
                       [](ojson& h, std::vector<uint8_t>& data) {
                         auto& offsets = h["s5.q2.logits"]["data_offsets"];
                         offsets[0] = offsets[0].get<uint64_t>() + data.size();
                         offsets[1] = offsets[1].get<uint64_t>() + data.size();
                       }),
      safetensors_case("overlapping-offsets", "have overlapping data_offsets", trace,
                       [](ojson& h, std::vector<uint8_t>&) {
                         // s0.q0.drafts (28 bytes) moved to start 4 bytes into s0.q0.logits.
                         const uint64_t begin = h["s0.q0.logits"]["data_offsets"][0].get<uint64_t>() + 4;
                         h["s0.q0.drafts"]["data_offsets"] = {begin, begin + 28};
                       }),
      safetensors_case("span-mismatch",
                       "tensor 's0.q0.logits': byte span 11200 of data_offsets does not match shape [7, 401]", trace,
                       [](ojson& h, std::vector<uint8_t>&) {
                         h["s0.q0.logits"]["shape"] = {7, 401};
                       }),
      raw_case("duplicate-tensor-name", "trace.safetensors: header: duplicate key 's0.q0.logits' at the top level",
               [](const std::string& dir) {
                 RawSafetensors raw = read_raw(trace(dir));
                 std::string text = raw.header.dump();
                 const std::string again = ",\"s0.q0.logits\":" + raw.header["s0.q0.logits"].dump() + "}";
                 text.replace(text.size() - 1, 1, again);
                 write_raw(trace(dir), text, raw.data);
               }),
      safetensors_case("negative-dim", "tensor 's0.q0.logits': negative dimension -7 at index 0 of 'shape'", trace,
                       [](ojson& h, std::vector<uint8_t>&) {
                         h["s0.q0.logits"]["shape"] = {-7, 400};
                       }),
      safetensors_case("element-count-overflows",
                       "tensor 's0.q0.drafts': byte span 28 of data_offsets does not match shape [1099511627776, "
                       "8388608, 0] x 4 bytes (I32): the element count overflows",
                       trace,
                       [](ojson& h, std::vector<uint8_t>&) {
                         // A partial product of 2^63 before the zero: no size may be formed from it.
                         h["s0.q0.drafts"]["shape"] = {uint64_t{1} << 40, uint64_t{1} << 23, 0};
                       }),
      raw_case("header-length-over-limit",
               "trace.safetensors: header length 209715200 exceeds the limit 104857600 bytes",
               [](const std::string& dir) {
                 // A sparse file: the length is inside the file, the bytes are never written.
                 const uint64_t n = 200u << 20;
                 std::vector<uint8_t> bytes(8);
                 std::memcpy(bytes.data(), &n, 8);
                 write_bytes(trace(dir), bytes);
                 fs::resize_file(trace(dir), 8 + n);
               }),
      safetensors_case("rank-over-limit", "tensor 's0.q0.logits': rank of 'shape' = 9 exceeds the limit 8", trace,
                       [](ojson& h, std::vector<uint8_t>&) {
                         h["s0.q0.logits"]["shape"] = {1, 1, 1, 1, 1, 1, 1, 7, 400};
                       }),
      safetensors_case("dim-over-limit",
                       "tensor 's0.q0.logits': dimension 1 of 'shape' = 2199023255553 exceeds the limit 1099511627776",
                       trace,
                       [](ojson& h, std::vector<uint8_t>&) {
                         h["s0.q0.logits"]["shape"] = {0, (uint64_t{1} << 41) + 1};
                       }),

      // ---- fixture.json ----
      raw_case("fixture-bad-json", "fixture.json: not valid JSON",
               [](const std::string& dir) {
                 std::ifstream in(manifest(dir));
                 std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
                 write_text(manifest(dir), text.substr(0, text.size() / 2));
               }),
      raw_case("fixture-duplicate-key", "fixture.json: duplicate key 'version' at the top level",
               [](const std::string& dir) {
                 std::ifstream in(manifest(dir));
                 std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
                 text.replace(text.find('{'), 1, "{\"version\": 1,");
                 write_text(manifest(dir), text);
               }),
      raw_case("json-too-deep", "fixture.json: JSON nested deeper than 64 levels",
               [](const std::string& dir) {
                 std::ifstream in(manifest(dir));
                 std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
                 text.replace(text.find('{'), 1, "{\"deep\": " + std::string(100, '[') + std::string(100, ']') + ",");
                 write_text(manifest(dir), text);
               }),
      manifest_case("missing-field", "fixture.json: missing required field 'trace'",
                    [](ojson& m) { m.erase("trace"); }),
      manifest_case("wrong-field-type", "field 'steps[0].propose[0].start' (seq 0) must be an integer, got \"20\"",
                    [](ojson& m) { entry(m, 0, 0)["start"] = "20"; }),
      manifest_case("higher-version", "field 'version' is 3, higher than the supported 2; refusing",
                    [](ojson& m) { m["version"] = 3; }),
      manifest_case("wrong-format", "field 'format' is 'dflash-trace', expected 'dflash-fixture'",
                    [](ojson& m) { m["format"] = "dflash-trace"; }),
      manifest_case("missing-expect-precision", "missing required field 'provenance.expect_precision'",
                    [](ojson& m) { m.erase("provenance"); }),
      manifest_case("unknown-tensor-name",
                    "field 'steps[2].propose[1].ctx' (seq 1): unknown tensor name 's2.q1.context'",
                    [](ojson& m) { entry(m, 2, 1)["ctx"] = "s2.q1.context"; }),
      manifest_case("unknown-tap-name",
                    "field 'steps[0].propose[0].expect.taps.L0.query' (seq 0): unknown tap name 'L0.query'",
                    [](ojson& m) {
                      ojson& taps = entry(m, 0, 0)["expect"]["taps"];
                      taps["L0.query"] = taps["L0.q"];
                      taps.erase("L0.q");
                    }),
      manifest_case("wrong-tap-shape",
                    "field 'steps[0].propose[0].expect.taps.L0.k' (seq 0): tensor 's0.q0.tap.L0.q' has shape [8, 64]; "
                    "expected [8, 32]",
                    [](ojson& m) { entry(m, 0, 0)["expect"]["taps"]["L0.k"] = "s0.q0.tap.L0.q"; }),
      manifest_case("unreferenced-trace-tensor", "tensor 's5.q2.drafts' is named by no step",
                    [](ojson& m) { entry(m, 5, 0)["expect"].erase("draft_tokens"); }),
      manifest_case("anchor-out-of-range",
                    "field 'steps[0].propose[0].anchor' (seq 0) = 400 is outside [0, vocab_size 400)",
                    [](ojson& m) { entry(m, 0, 0)["anchor"] = 400; }),

      // ---- trace tensors against the manifest ----
      safetensors_case(
          "wrong-ctx-shape",
          "field 'steps[0].propose[0].ctx' (seq 0): tensor 's0.q0.ctx' has shape [128, 20]; expected [C, 128]", trace,
          [](ojson& h, std::vector<uint8_t>&) {
            h["s0.q0.ctx"]["shape"] = {128, 20};
          }),
      safetensors_case(
          "wrong-logits-dtype",
          "field 'steps[0].propose[0].expect.logits' (seq 0): tensor 's0.q0.logits' has dtype I32; expected F32", trace,
          [](ojson& h, std::vector<uint8_t>&) { h["s0.q0.logits"]["dtype"] = "I32"; }),
      safetensors_case("nan-in-ctx",
                       "field 'steps[0].propose[0].ctx' (seq 0): tensor 's0.q0.ctx' [20, 128] holds NaN at row 3, column 77",
                       trace,
                       [](ojson& h, std::vector<uint8_t>& data) {
                         poke(h, data, "s0.q0.ctx", 3 * 128 + 77, {0xc0, 0x7f});
                       }),
      safetensors_case("inf-in-logits", "tensor 's4.q2.logits' [7, 400] holds Inf at row 2, column 3", trace,
                       [](ojson& h, std::vector<uint8_t>& data) {
                         poke(h, data, "s4.q2.logits", 2 * 400 + 3, {0x00, 0x00, 0x80, 0x7f});
                       }),
      safetensors_case("draft-token-out-of-range",
                       "tensor 's0.q0.drafts' holds token 400 at index 2, outside [0, vocab_size 400)", trace,
                       [](ojson& h, std::vector<uint8_t>& data) {
                         poke(h, data, "s0.q0.drafts", 2, {0x90, 0x01, 0x00, 0x00});
                       }),
      raw_case(
          "empty-ctx-new-sequence",
          "field 'steps[0].propose[0].ctx' (seq 0): tensor 's0.q0.none' has no rows, but seq 0 has no context yet",
          [](const std::string& dir) {
            edit_safetensors(trace(dir), [](ojson& h, std::vector<uint8_t>& data) {
              h["s0.q0.none"] = {{"dtype", "BF16"}, {"shape", {0, 128}}, {"data_offsets", {data.size(), data.size()}}};
            });
            edit_json(manifest(dir), [](ojson& m) {
              entry(m, 0, 0)["ctx"] = "s0.q0.none";
              entry(m, 0, 0)["start"] = 0;
            });
          }),

      // ---- the steps' sequence rules ----
      manifest_case(
          "context-gap",
          "field 'steps[1].propose[0].start' (seq 0): context gap: the 3 rows of 's1.q0.ctx' cover positions 21..23, "
          "but the sequence's next context position is 20",
          [](ojson& m) { entry(m, 1, 0)["start"] = 24; }),
      manifest_case(
          "context-overlap",
          "field 'steps[1].propose[0].start' (seq 0): context overlap: the 3 rows of 's1.q0.ctx' start at position 19, "
          "but positions up to 19 were already given",
          [](ojson& m) { entry(m, 1, 0)["start"] = 22; }),
      manifest_case("released-sequence-reused",
                    "field 'steps[4].propose[1].seq' (seq 1): seq 1 was released at steps[3] and is used again",
                    [](ojson& m) { entry(m, 4, 1)["seq"] = 1; }),
      manifest_case("released-twice", "field 'steps[4].release[0]': seq 1 is released twice (already at steps[3])",
                    [](ojson& m) {
                      m["steps"].insert(m["steps"].begin() + 4, ojson{{"release", {1}}});
                    }),
      manifest_case("release-unknown-sequence",
                    "field 'steps[3].release[0]': seq 7 is not active (it was never proposed)",
                    [](ojson& m) { m["steps"][3]["release"] = {7}; }),
      manifest_case("same-sequence-twice", "field 'steps[2].propose[2].seq' (seq 1): seq 1 appears twice in one step",
                    [](ojson& m) { entry(m, 2, 2)["seq"] = 1; }),
      manifest_case("batch-over-max", "steps[2]: a batch of 3 sequences is larger than head.max_batch 2",
                    [](ojson& m) { m["head"]["max_batch"] = 2; }),
      manifest_case("mixed-block-widths",
                    "steps[2]: entries ask for block widths that clamp to different B (3 for seq 0, 5 for seq 1)",
                    [](ojson& m) { entry(m, 2, 1)["block_width"] = 5; }),
      manifest_case("propose-and-release", "steps[3]: a step has exactly one of 'propose' and 'release'",
                    [](ojson& m) { m["steps"][3]["propose"] = ojson::array(); }),

      // ---- bounds on the fixture's sizes (core/limits.h) ----
      manifest_case("start-over-limit",
                    "field 'steps[0].propose[0].start' (seq 0) = 3000000000 exceeds the limit 2147483648",
                    [](ojson& m) { entry(m, 0, 0)["start"] = 3000000000LL; }),
      manifest_case("gamma-over-limit", "fixture.json: head: field 'gamma' = 5000 exceeds the limit 1024",
                    [](ojson& m) { m["head"]["gamma"] = 5000; }),
      manifest_case("ctx-cap-over-limit",
                    "fixture.json: head: field 'ctx_cap' = 1000000000000 exceeds the limit 16777216",
                    [](ojson& m) { m["head"]["ctx_cap"] = 1000000000000LL; }),
      manifest_case("max-batch-over-limit", "fixture.json: head: field 'max_batch' = 100000 exceeds the limit 1024",
                    [](ojson& m) { m["head"]["max_batch"] = 100000; }),
      manifest_case("kv-page-size-over-limit",
                    "fixture.json: head: field 'kv_page_size' = 100000 exceeds the limit 4096",
                    [](ojson& m) { m["head"]["kv_page_size"] = 100000; }),
      long_context_case("pool-pages-over-limit",
                        "fixture.json: head: pool pages: max_batch x pages per window = 1024 x 20009 = 20489216 "
                        "exceeds the limit 16777216",
                        20000,
                        [](ojson& head) {
                          head["ctx_cap"] = 100000;
                          head["max_batch"] = 1024;
                          head["kv_page_size"] = 1;
                        }),
      long_context_case("kv-cache-over-limit",
                        "fixture.json: head: KV cache elements: layers x per-layer elements = 2 x 1312817152 = "
                        "2625634304 exceeds the limit 2147483648",
                        20000,
                        [](ojson& head) {
                          head["ctx_cap"] = 100000;
                          head["max_batch"] = 1024;
                        }),

      // ---- the drafter config ----
      config_case("sliding-window", "key 'use_sliding_window' is true with sliding_window 4096",
                  [](ojson& c) {
                    c["use_sliding_window"] = true;
                    c["sliding_window"] = 4096;
                  }),
      config_case("dflash2-key", "config key 'dflash_config.conv_kernel_size' belongs to DFlash2",
                  [](ojson& c) { c["dflash_config"]["conv_kernel_size"] = 4; }),
      config_case("non-silu", "key 'hidden_act' is 'gelu_pytorch_tanh'; only silu is supported",
                  [](ojson& c) { c["hidden_act"] = "gelu_pytorch_tanh"; }),
      config_case("unknown-config-key", "unknown config key 'partial_rotary_factor' may change the math; refusing",
                  [](ojson& c) { c["partial_rotary_factor"] = 0.5; }),
      config_case("missing-mask-token", "key 'dflash_config.mask_token_id' is missing",
                  [](ojson& c) { c["dflash_config"].erase("mask_token_id"); }),

      // ---- bounds on the config's sizes (core/limits.h) ----
      config_case("hidden-size-over-limit", "config.json: key 'hidden_size' = 70000 exceeds the limit 65536",
                  [](ojson& c) { c["hidden_size"] = 70000; }),
      config_case("intermediate-size-over-limit",
                  "config.json: key 'intermediate_size' = 300000 exceeds the limit 262144",
                  [](ojson& c) { c["intermediate_size"] = 300000; }),
      config_case("layers-over-limit", "config.json: key 'num_hidden_layers' = 300 exceeds the limit 256",
                  [](ojson& c) { c["num_hidden_layers"] = 300; }),
      config_case("heads-over-limit", "config.json: key 'num_attention_heads' = 65536 exceeds the limit 1024",
                  [](ojson& c) {
                    // nh·d wraps a 32-bit int to 0: refused by its own bound first.
                    c["num_attention_heads"] = 65536;
                    c["num_key_value_heads"] = 65536;
                    c["head_dim"] = 65536;
                  }),
      config_case("kv-heads-over-limit", "config.json: key 'num_key_value_heads' = 2048 exceeds the limit 1024",
                  [](ojson& c) { c["num_key_value_heads"] = 2048; }),
      config_case("head-dim-over-limit", "config.json: key 'head_dim' = 2048 exceeds the limit 1024",
                  [](ojson& c) { c["head_dim"] = 2048; }),
      config_case("q-dim-over-limit",
                  "config.json: key 'num_attention_heads' x 'head_dim' = 1024 x 1024 = 1048576 exceeds the limit 262144",
                  [](ojson& c) {
                    c["num_attention_heads"] = 1024;
                    c["head_dim"] = 1024;
                  }),
      config_case("vocab-over-limit", "config.json: key 'vocab_size' = 5000000 exceeds the limit 4194304",
                  [](ojson& c) { c["vocab_size"] = 5000000; }),
      config_case("block-size-over-limit", "config.json: key 'block_size' = 2000 exceeds the limit 1024",
                  [](ojson& c) { c["block_size"] = 2000; }),
      config_case("num-target-layers-over-limit", "config.json: key 'num_target_layers' = 5000 exceeds the limit 1024",
                  [](ojson& c) { c["num_target_layers"] = 5000; }),
      config_case("target-layer-id-over-limit",
                  "config.json: key 'dflash_config.target_layer_ids' entry = 5000 exceeds the limit 1023",
                  [](ojson& c) {
                    c.erase("num_target_layers");
                    c["dflash_config"]["target_layer_ids"] = {2, 5000};
                  }),
      config_case("target-layer-count-over-limit",
                  "config.json: key 'dflash_config.target_layer_ids' count = 1025 exceeds the limit 1024",
                  [](ojson& c) { c["dflash_config"]["target_layer_ids"] = std::vector<int>(1025, 2); }),
      config_case("ctx-features-over-limit",
                  "config.json: target layers x target hidden size (nT·Ht) = 100 x 65536 = 6553600 exceeds the limit "
                  "4194304",
                  [](ojson& c) {
                    c["hidden_size"] = 65536;
                    c["dflash_config"]["target_layer_ids"] = std::vector<int>(100, 2);
                  }),

      // ---- the drafter checkpoint and the target ----
      safetensors_case("missing-drafter-tensor",
                       "missing tensor 'layers.1.mlp.up_proj.weight' (expected shape [128, 64])", drafter_model,
                       [](ojson& h, std::vector<uint8_t>&) { h.erase("layers.1.mlp.up_proj.weight"); }),
      safetensors_case("unused-drafter-tensor", "unused tensor 'layers.0.self_attn.q_proj.bias'", drafter_model,
                       [](ojson& h, std::vector<uint8_t>& data) {
                         h["layers.0.self_attn.q_proj.bias"] = {
                             {"dtype", "BF16"}, {"shape", {64}}, {"data_offsets", {data.size(), data.size() + 128}}};
                         data.resize(data.size() + 128);
                       }),
      safetensors_case("wrongly-shaped-tensor", "tensor 'fc.weight': wrong shape, expected [64, 128], got [128, 64]",
                       drafter_model,
                       [](ojson& h, std::vector<uint8_t>&) {
                         h["fc.weight"]["shape"] = {128, 64};
                       }),
      safetensors_case("drafter-tensor-both-prefixes",
                       "tensor 'norm.weight' is present both as 'model.norm.weight' and as 'norm.weight'",
                       drafter_model,
                       [](ojson& h, std::vector<uint8_t>& data) {
                         h["model.norm.weight"] = {
                             {"dtype", "BF16"}, {"shape", {64}}, {"data_offsets", {data.size(), data.size() + 128}}};
                         data.resize(data.size() + 128);
                       }),
      safetensors_case("drafter-wrong-dtype",
                       "tensor 'norm.weight' has dtype I32; drafter weights must be BF16, F16 or F32", drafter_model,
                       [](ojson& h, std::vector<uint8_t>&) {
                         h["norm.weight"]["dtype"] = "I32";
                         h["norm.weight"]["shape"] = {32};
                       }),
      safetensors_case(
          "target-lm-head-missing", "lm_head 'lm_head.weight' not found",
          [](const std::string& dir) { return dir + "/target.safetensors"; },
          [](ojson& h, std::vector<uint8_t>&) { h.erase("lm_head.weight"); }),
  };
}

std::vector<MalformedCase> all_cases() {
  std::vector<MalformedCase> cases = build_cases();
  for (MalformedCase& c : nvfp4_cases()) cases.push_back(std::move(c));
  for (MalformedCase& c : target_side_cases()) cases.push_back(std::move(c));
  for (MalformedCase& c : fp8_checkpoint_cases()) cases.push_back(std::move(c));
  return cases;
}

}  // namespace

std::string nvfp4_base_fixture() { return std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/nvfp4-tiny-gqa"; }

std::string malformed_base_fixture() {
  return std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle/batch-widths-release";
}

const std::vector<MalformedCase>& malformed_cases() {
  static const std::vector<MalformedCase> cases = all_cases();
  return cases;
}

void load_fixture_and_weights(const std::string& path) {
  Fixture fixture = read_fixture(path);
  fixture.load_weights();
}

}  // namespace dflash::testing
