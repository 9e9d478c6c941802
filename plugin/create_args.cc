#include "plugin/create_args.h"

#include <cstddef>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dflash {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad_input(path + ": cannot be read (the config.json a plugin is given)");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

dflash_tensor_view view_of(const char* name, int32_t dtype, const std::vector<int64_t>& shape, const void* data) {
  dflash_tensor_view v{};
  v.name = name;
  v.dtype = dtype;
  v.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size() && i < 4; ++i) v.shape[i] = shape[i];
  v.data = data;
  return v;
}

}  // namespace

dflash_precision to_plugin_precision(Precision precision) {
  switch (precision) {
    case Precision::kFp64: return DFLASH_PRECISION_FP64;
    case Precision::kFp32: return DFLASH_PRECISION_FP32;
    case Precision::kBf16: return DFLASH_PRECISION_BF16;
    case Precision::kFp8: return DFLASH_PRECISION_FP8;
    case Precision::kW8a8: return DFLASH_PRECISION_W8A8;
  }
  throw internal_error("to_plugin_precision: unknown precision");
}

bool from_plugin_precision(int32_t value, Precision* out) {
  switch (value) {
    case DFLASH_PRECISION_FP64: *out = Precision::kFp64; return true;
    case DFLASH_PRECISION_FP32: *out = Precision::kFp32; return true;
    case DFLASH_PRECISION_BF16: *out = Precision::kBf16; return true;
    case DFLASH_PRECISION_FP8: *out = Precision::kFp8; return true;
    case DFLASH_PRECISION_W8A8: *out = Precision::kW8a8; return true;
    default: return false;
  }
}

const char* path_mode_name(int32_t path) {
  switch (path) {
    case DFLASH_PATH_CPU: return "cpu";
    case DFLASH_PATH_EAGER: return "eager";
    case DFLASH_PATH_GRAPH_CAPTURE: return "graph-capture";
    case DFLASH_PATH_GRAPH_REPLAY: return "graph-replay";
    default: return "unreported";
  }
}

int32_t path_code(const std::string& mode) {
  for (int32_t p : {DFLASH_PATH_CPU, DFLASH_PATH_EAGER, DFLASH_PATH_GRAPH_CAPTURE, DFLASH_PATH_GRAPH_REPLAY}) {
    if (mode == path_mode_name(p)) return p;
  }
  return DFLASH_PATH_UNREPORTED;
}

std::unique_ptr<PluginCreateArgs> make_create_args(const DrafterConfig& config,
                                                   std::shared_ptr<const DrafterWeights> weights,
                                                   const HeadSettings& settings, const std::string& drafter_dir,
                                                   const std::string& target_path, const PluginOptions& options,
                                                   uint32_t abi_version) {
  auto a = std::make_unique<PluginCreateArgs>();
  a->weights = std::move(weights);
  a->drafter_dir = drafter_dir;
  a->target_path = target_path;
  a->config_json = read_text(drafter_dir + "/config.json");
  a->target_layer_ids.assign(config.target_layer_ids.begin(), config.target_layer_ids.end());

  dflash_drafter_config& c = a->config;
  c.struct_size = sizeof(dflash_drafter_config);
  c.hidden_size = config.hidden_size;
  c.num_layers = config.num_layers;
  c.num_heads = config.num_heads;
  c.num_kv_heads = config.num_kv_heads;
  c.head_dim = config.head_dim;
  c.intermediate_size = config.intermediate_size;
  c.vocab_size = config.vocab_size;
  c.block_size = config.block_size;
  c.mask_token_id = config.mask_token_id;
  c.target_hidden_size = config.target_hidden_size;
  c.max_position_embeddings = config.max_position_embeddings;
  c.attention_bias = config.attention_bias ? 1 : 0;
  c.tie_word_embeddings = config.tie_word_embeddings ? 1 : 0;
  c.dflash2 = config.dflash2.enabled ? 1 : 0;
  c.num_target_layers = static_cast<int32_t>(a->target_layer_ids.size());
  c.target_layer_ids = a->target_layer_ids.data();
  c.rms_norm_eps = config.rms_norm_eps;
  c.rope_theta = config.rope.theta;
  c.config_json = a->config_json.c_str();

  // Version 1's head settings are a prefix of version 2's (the layout below is checked).
  // Version 1's size: its fields up to `precision`, padded to the struct's (int64_t's) alignment.
  constexpr size_t v1_end = offsetof(dflash_head_settings, precision) + sizeof(int32_t);
  static_assert(DFLASH_HEAD_SETTINGS_V1_SIZE ==
                        (v1_end + alignof(dflash_head_settings) - 1) / alignof(dflash_head_settings) * alignof(dflash_head_settings) &&
                    offsetof(dflash_head_settings, tp_size) >= v1_end &&
                    DFLASH_HEAD_SETTINGS_V1_SIZE < sizeof(dflash_head_settings),
                "ABI version 1's dflash_head_settings must be a prefix of version 2's");
  dflash_head_settings& h = a->head;
  h.struct_size = abi_version == 1 ? DFLASH_HEAD_SETTINGS_V1_SIZE : sizeof(dflash_head_settings);
  h.gamma = settings.gamma;
  h.ctx_cap = settings.ctx_cap;
  h.uncapped = settings.uncapped ? 1 : 0;
  h.max_batch = settings.max_batch;
  h.kv_page_size = settings.kv_page_size;
  h.pool_pages = settings.pool_pages;
  h.precision = to_plugin_precision(settings.precision);
  h.tp_size = settings.tp_size;
  h.tp_reduce_dtype = settings.tp_reduce_dtype == TpReduceDtype::kBf16 ? DFLASH_TP_REDUCE_BF16 : DFLASH_TP_REDUCE_FP32;

  // Names first (the views point at them: no reallocation after).
  const DrafterWeights& w = *a->weights;
  const std::vector<NamedWeight> drafter = drafter_tensor_list(config, w);
  for (const NamedWeight& n : drafter) a->view_names.push_back(n.name);
  a->view_names.push_back("embed_tokens.weight");
  if (w.nvfp4_head()) {
    for (const char* n : {"lm_head.weight", "lm_head.weight_scale", "lm_head.weight_scale_2", "lm_head.input_scale"}) {
      a->view_names.push_back(n);
    }
    a->scalars = {w.lm_head_nvfp4.global_scale, w.lm_head_nvfp4.input_scale.value_or(0.0f)};
  } else {
    a->view_names.push_back("lm_head.weight");
  }
  size_t i = 0;
  for (const NamedWeight& n : drafter) {
    a->views.push_back(view_of(a->view_names[i++].c_str(), DFLASH_DTYPE_F32, n.tensor->shape, n.tensor->values.data()));
  }
  a->views.push_back(view_of(a->view_names[i++].c_str(), DFLASH_DTYPE_F32, w.embed_tokens.shape, w.embed_tokens.values.data()));
  if (w.nvfp4_head()) {
    const NvFp4Weight& q = w.lm_head_nvfp4;
    a->views.push_back(view_of(a->view_names[i++].c_str(), DFLASH_DTYPE_U8, {q.rows, q.cols / 2}, q.codes.data()));
    a->views.push_back(view_of(a->view_names[i++].c_str(), DFLASH_DTYPE_F8_E4M3, {q.rows, q.cols / kNvFp4GroupSize},
                               q.block_scales.data()));
    a->views.push_back(view_of(a->view_names[i++].c_str(), DFLASH_DTYPE_F32, {}, &a->scalars[0]));
    if (q.input_scale) a->views.push_back(view_of(a->view_names[i++].c_str(), DFLASH_DTYPE_F32, {}, &a->scalars[1]));
  } else {
    a->views.push_back(view_of(a->view_names[i++].c_str(), DFLASH_DTYPE_F32, w.lm_head.shape, w.lm_head.values.data()));
  }

  a->option_strings = options;
  for (const auto& [key, value] : a->option_strings) a->options.push_back({key.c_str(), value.c_str()});

  dflash_create_args& args = a->args;
  args.struct_size = sizeof(dflash_create_args);
  args.config = &a->config;
  args.head = &a->head;
  args.drafter_dir = a->drafter_dir.empty() ? nullptr : a->drafter_dir.c_str();
  args.target_path = a->target_path.empty() ? nullptr : a->target_path.c_str();
  args.tensors = a->views.data();
  args.num_tensors = a->views.size();
  args.options = a->options.data();
  args.num_options = a->options.size();
  return a;
}

}  // namespace dflash
