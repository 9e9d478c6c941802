#include "plugin/export/proposer_export.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/nvfp4.h"

namespace dflash {
namespace {

ProposerFactory& factory_slot() {
  static ProposerFactory factory;
  return factory;
}

// One exported drafter: the DraftProposer, the sequences it has begun, each sequence's last taps.
struct Exported {
  std::unique_ptr<DraftProposer> drafter;
  uint64_t capabilities = 0;
  std::map<int, std::vector<Tap>> taps;
  std::string describe_text;
};

void write_message(char* message, size_t size, const std::string& text) {
  if (message == nullptr || size == 0) return;
  const size_t n = std::min(size - 1, text.size());
  std::memcpy(message, text.data(), n);
  message[n] = '\0';
}

// Runs `body`, turning what it throws into a status and message.
template <class Body>
dflash_status guarded(char* message, size_t size, Body body) {
  try {
    body();
    return DFLASH_STATUS_OK;
  } catch (const HarnessError& e) {
    write_message(message, size, e.what());
    switch (e.kind()) {
      case ErrorKind::kBadInput:
      case ErrorKind::kPoolExhausted: return DFLASH_STATUS_BAD_INPUT;
      case ErrorKind::kUnsupported: return DFLASH_STATUS_UNSUPPORTED;
      default: return DFLASH_STATUS_INTERNAL;
    }
  } catch (const std::exception& e) {
    write_message(message, size, e.what());
    return DFLASH_STATUS_INTERNAL;
  } catch (...) {
    write_message(message, size, "unknown exception");
    return DFLASH_STATUS_INTERNAL;
  }
}

const dflash_tensor_view* find_view(const dflash_create_args& args, const std::string& name) {
  for (size_t i = 0; i < args.num_tensors; ++i) {
    if (args.tensors[i].name != nullptr && name == args.tensors[i].name) return &args.tensors[i];
  }
  return nullptr;
}

const dflash_tensor_view& need_view(const dflash_create_args& args, const std::string& name, int32_t dtype,
                                    const std::vector<int64_t>& shape) {
  const dflash_tensor_view* v = find_view(args, name);
  if (v == nullptr) throw bad_input("create: no tensor view '" + name + "'");
  const std::vector<int64_t> got(v->shape, v->shape + std::clamp(v->ndim, 0, 4));
  if (v->dtype != dtype || got != shape || v->data == nullptr) {
    throw bad_input("create: tensor view '" + name + "' is dtype " + std::to_string(v->dtype) + " " + shape_string(got) +
                    ", expected dtype " + std::to_string(dtype) + " " + shape_string(shape));
  }
  return *v;
}

Tensor float_tensor(const dflash_create_args& args, const std::string& name, const std::vector<int64_t>& shape) {
  const dflash_tensor_view& v = need_view(args, name, DFLASH_DTYPE_F32, shape);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const float* p = static_cast<const float*>(v.data);
  return Tensor(shape, std::vector<float>(p, p + n));
}

Exported* as_exported(dflash_drafter* d) { return reinterpret_cast<Exported*>(d); }

dflash_status create(const dflash_create_args* args, dflash_drafter** out, char* message, size_t size) {
  return guarded(message, size, [&] {
    if (args == nullptr || out == nullptr || args->struct_size < sizeof(dflash_create_args)) {
      throw bad_input("create: arguments of another ABI version (struct_size " +
                      std::to_string(args ? args->struct_size : 0) + ")");
    }
    const DrafterConfig config = config_from_plugin_args(*args);
    auto weights = weights_from_plugin_args(*args, config);
    const HeadSettings head = head_from_plugin_args(*args);
    PluginOptions options;
    for (size_t i = 0; i < args->num_options; ++i) {
      options.emplace_back(args->options[i].key ? args->options[i].key : "", args->options[i].value ? args->options[i].value : "");
    }
    auto exported = std::make_unique<Exported>();
    exported->drafter = factory_slot()(config, std::move(weights), head, options);
    *out = reinterpret_cast<dflash_drafter*>(exported.release());
  });
}

dflash_status propose(dflash_drafter* d, const dflash_propose_request* requests, dflash_propose_result* results,
                      size_t count, char* message, size_t size) {
  return guarded(message, size, [&] {
    Exported& e = *as_exported(d);
    if (count == 0) return;
    std::vector<Tensor> ctx(count);
    std::vector<ProposeInput> batch(count);
    const std::vector<int> active = e.drafter->sequences();
    for (size_t i = 0; i < count; ++i) {
      const dflash_propose_request& r = requests[i];
      if (r.ctx_rows < 0 || r.ctx_features != e.drafter->config().ctx_feature_dim() || (r.ctx_rows > 0 && r.ctx == nullptr)) {
        throw bad_input("propose: sequence " + std::to_string(r.seq) + ": context of " + std::to_string(r.ctx_rows) +
                        " x " + std::to_string(r.ctx_features) + " floats");
      }
      ctx[i] = Tensor({r.ctx_rows, r.ctx_features}, std::vector<float>(r.ctx, r.ctx + r.ctx_rows * r.ctx_features));
      batch[i] = {r.seq, &ctx[i], r.start, r.anchor};
    }
    for (const ProposeInput& in : batch) {
      if (std::find(active.begin(), active.end(), in.seq) == active.end()) e.drafter->add_sequence(in.seq);
    }
    e.drafter->set_block_g(requests[0].block_width);
    std::vector<ProposeOutput> outputs = e.drafter->propose(batch, requests[0].want_taps != 0);
    for (size_t i = 0; i < count; ++i) {
      auto it = std::find_if(outputs.begin(), outputs.end(), [&](const ProposeOutput& o) { return o.seq == requests[i].seq; });
      if (it == outputs.end()) throw internal_error("propose: no output for sequence " + std::to_string(requests[i].seq));
      dflash_propose_result& r = results[i];
      const int64_t rows = it->logits.rows(), V = e.drafter->config().vocab_size;
      if (rows > r.logits_rows || it->logits.cols() != V || static_cast<int64_t>(it->draft_tokens.size()) != rows) {
        throw internal_error("propose: outputs of " + std::to_string(rows) + " rows do not fit the harness's " +
                             std::to_string(r.logits_rows));
      }
      r.block_width = it->block_width;
      std::copy(it->logits.values.begin(), it->logits.values.end(), r.logits);
      std::copy(it->draft_tokens.begin(), it->draft_tokens.end(), r.draft_tokens);
      r.path = path_code(it->path.mode);
      e.taps[it->seq] = std::move(it->taps);
    }
  });
}

dflash_status release(dflash_drafter* d, int32_t seq, char* message, size_t size) {
  return guarded(message, size, [&] {
    Exported& e = *as_exported(d);
    const std::vector<int> active = e.drafter->sequences();
    // A sequence the harness announced but never proposed for was never begun here.
    if (std::find(active.begin(), active.end(), seq) != active.end()) e.drafter->release_sequence(seq);
    e.taps.erase(seq);
  });
}

void destroy(dflash_drafter* d) { delete as_exported(d); }

dflash_status read_tap(dflash_drafter* d, int32_t seq, const char* stage, float* values, size_t capacity, int32_t* ndim,
                       int64_t shape[4], char* message, size_t size) {
  Exported& e = *as_exported(d);
  auto it = e.taps.find(seq);
  if (it == e.taps.end() || stage == nullptr) return DFLASH_STATUS_NOT_AVAILABLE;
  for (const Tap& tap : it->second) {
    if (tap.name != stage) continue;
    if (tap.value.shape.size() > 4) {
      write_message(message, size, "tap '" + tap.name + "' has more than 4 dimensions");
      return DFLASH_STATUS_INTERNAL;
    }
    *ndim = static_cast<int32_t>(tap.value.shape.size());
    for (size_t i = 0; i < tap.value.shape.size(); ++i) shape[i] = tap.value.shape[i];
    if (values != nullptr && capacity >= tap.value.values.size()) std::copy(tap.value.values.begin(), tap.value.values.end(), values);
    return DFLASH_STATUS_OK;
  }
  return DFLASH_STATUS_NOT_AVAILABLE;
}

dflash_status read_kv(dflash_drafter* d, int32_t layer, int32_t seq, const int64_t* positions, size_t count, float* k,
                      float* v, char* message, size_t size) {
  return guarded(message, size, [&] {
    Exported& e = *as_exported(d);
    const std::optional<KvRows> rows = e.drafter->read_kv_at(layer, seq, std::vector<int64_t>(positions, positions + count));
    if (!rows) throw unsupported("read_kv: this drafter has no K/V read-back");
    std::copy(rows->k.values.begin(), rows->k.values.end(), k);
    std::copy(rows->v.values.begin(), rows->v.values.end(), v);
  });
}

const char* describe(dflash_drafter* d) {
  Exported& e = *as_exported(d);
  nlohmann::json j = nlohmann::json::object();
  j["drafter"] = e.drafter->name();
  for (const auto& [key, value] : e.drafter->describe()) j[key] = value;
  e.describe_text = j.dump();
  return e.describe_text.c_str();
}

}  // namespace

DrafterConfig config_from_plugin_args(const dflash_create_args& args) {
  if (args.config == nullptr || args.config->struct_size < sizeof(dflash_drafter_config) || args.config->config_json == nullptr) {
    throw bad_input("create: no config, or a config struct of another ABI version");
  }
  const nlohmann::json j = nlohmann::json::parse(args.config->config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw bad_input("create: config_json is not a JSON object");
  DrafterConfig config = parse_drafter_config(j, "config_json");
  const dflash_drafter_config& c = *args.config;
  if (c.hidden_size != config.hidden_size || c.num_layers != config.num_layers || c.vocab_size != config.vocab_size ||
      c.num_heads != config.num_heads || c.num_kv_heads != config.num_kv_heads || c.head_dim != config.head_dim) {
    throw bad_input("create: the config struct and config_json disagree on the geometry");
  }
  return config;
}

std::shared_ptr<const DrafterWeights> weights_from_plugin_args(const dflash_create_args& args, const DrafterConfig& config) {
  DrafterWeights w = assemble_drafter_tensors(config, [&](const std::string& name, const std::vector<int64_t>& shape) {
    return float_tensor(args, name, shape);
  });
  const int64_t V = config.vocab_size, H = config.hidden_size;
  w.embed_tokens = float_tensor(args, "embed_tokens.weight", {V, H});
  const dflash_tensor_view* head = find_view(args, "lm_head.weight");
  if (head != nullptr && head->dtype == DFLASH_DTYPE_U8) {
    NvFp4Weight& q = w.lm_head_nvfp4;
    q.rows = V;
    q.cols = H;
    const auto bytes = [](const dflash_tensor_view& v, int64_t n) {
      const uint8_t* p = static_cast<const uint8_t*>(v.data);
      return std::vector<uint8_t>(p, p + n);
    };
    q.codes = bytes(need_view(args, "lm_head.weight", DFLASH_DTYPE_U8, {V, H / 2}), V * (H / 2));
    q.block_scales = bytes(need_view(args, "lm_head.weight_scale", DFLASH_DTYPE_F8_E4M3, {V, H / kNvFp4GroupSize}),
                           V * (H / kNvFp4GroupSize));
    q.global_scale = *static_cast<const float*>(need_view(args, "lm_head.weight_scale_2", DFLASH_DTYPE_F32, {}).data);
    if (find_view(args, "lm_head.input_scale") != nullptr) {
      q.input_scale = *static_cast<const float*>(need_view(args, "lm_head.input_scale", DFLASH_DTYPE_F32, {}).data);
    }
  } else {
    w.lm_head = float_tensor(args, "lm_head.weight", {V, H});
  }
  validate_drafter_weights(config, w);
  return std::make_shared<const DrafterWeights>(std::move(w));
}

HeadSettings head_from_plugin_args(const dflash_create_args& args) {
  // A harness of ABI version 1 passes version 1's head settings: one rank.
  if (args.head == nullptr || args.head->struct_size < DFLASH_HEAD_SETTINGS_V1_SIZE) {
    throw bad_input("create: no head settings, or a struct of another ABI version");
  }
  const dflash_head_settings& h = *args.head;
  HeadSettings s;
  s.gamma = h.gamma;
  s.ctx_cap = h.ctx_cap;
  s.uncapped = h.uncapped != 0;
  s.max_batch = h.max_batch;
  s.kv_page_size = h.kv_page_size;
  s.pool_pages = h.pool_pages;
  if (!from_plugin_precision(h.precision, &s.precision)) {
    throw bad_input("create: precision " + std::to_string(h.precision) + " is not one ABI version 1 defines");
  }
  if (h.struct_size >= sizeof(dflash_head_settings)) {
    s.tp_size = h.tp_size;
    if (h.tp_reduce_dtype != DFLASH_TP_REDUCE_FP32 && h.tp_reduce_dtype != DFLASH_TP_REDUCE_BF16) {
      throw bad_input("create: tp_reduce_dtype " + std::to_string(h.tp_reduce_dtype) + " is not one ABI version 2 defines");
    }
    s.tp_reduce_dtype = h.tp_reduce_dtype == DFLASH_TP_REDUCE_BF16 ? TpReduceDtype::kBf16 : TpReduceDtype::kFp32;
  }
  return s;
}

const dflash_drafter_api* export_proposer(const char* name, uint64_t capabilities, ProposerFactory factory) {
  static dflash_drafter_api api{};
  factory_slot() = std::move(factory);
  api.abi_version = DFLASH_DRAFTER_ABI_VERSION;
  api.struct_size = sizeof(dflash_drafter_api);
  api.capabilities = capabilities;
  api.name = name;
  api.create = create;
  api.propose = propose;
  api.release = release;
  api.destroy = destroy;
  api.read_tap = read_tap;
  api.read_kv = read_kv;
  api.describe = describe;
  return &api;
}

}  // namespace dflash
