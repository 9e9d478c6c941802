#include "core/stages.h"

#include <cstdlib>

namespace dflash {

bool is_layer_stage(StageKind kind) {
  return kind != StageKind::kCtxProj && kind != StageKind::kEmbed && kind != StageKind::kFinalNorm &&
         kind != StageKind::kLogits;
}

const char* stage_kind_name(StageKind kind) {
  switch (kind) {
    case StageKind::kCtxProj: return "ctx_proj";
    case StageKind::kEmbed: return "embed";
    case StageKind::kAttnNorm: return "attn_norm";
    case StageKind::kQ: return "q";
    case StageKind::kK: return "k";
    case StageKind::kV: return "v";
    case StageKind::kAttn: return "attn";
    case StageKind::kOProj: return "o_proj";
    case StageKind::kMlpNorm: return "mlp_norm";
    case StageKind::kMlp: return "mlp";
    case StageKind::kOut: return "out";
    case StageKind::kFinalNorm: return "final_norm";
    case StageKind::kLogits: return "logits";
  }
  return "?";
}

std::string stage_name(StageKind kind, int layer) {
  if (!is_layer_stage(kind)) return stage_kind_name(kind);
  return "L" + std::to_string(layer) + "." + stage_kind_name(kind);
}

std::vector<std::string> forward_stage_order(int num_layers) {
  std::vector<std::string> order = {stage_name(StageKind::kCtxProj), stage_name(StageKind::kEmbed)};
  for (int l = 0; l < num_layers; ++l) {
    for (StageKind kind : kLayerStages) order.push_back(stage_name(kind, l));
  }
  order.push_back(stage_name(StageKind::kFinalNorm));
  order.push_back(stage_name(StageKind::kLogits));
  return order;
}

bool parse_stage_name(const std::string& name, int num_layers, StageId* out) {
  for (StageKind kind : {StageKind::kCtxProj, StageKind::kEmbed, StageKind::kFinalNorm, StageKind::kLogits}) {
    if (name == stage_kind_name(kind)) {
      *out = {kind, -1};
      return true;
    }
  }
  if (name.size() < 4 || name[0] != 'L') return false;
  const size_t dot = name.find('.');
  if (dot == std::string::npos || dot == 1) return false;
  const std::string digits = name.substr(1, dot - 1);
  if (digits.size() > 6 || (digits.size() > 1 && digits[0] == '0')) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  const int layer = std::atoi(digits.c_str());
  if (layer >= num_layers) return false;
  const std::string suffix = name.substr(dot + 1);
  for (StageKind kind : kLayerStages) {
    if (suffix == stage_kind_name(kind)) {
      *out = {kind, layer};
      return true;
    }
  }
  return false;
}

int stage_order_index(const std::string& name, int num_layers) {
  StageId id;
  if (!parse_stage_name(name, num_layers, &id)) return -1;
  switch (id.kind) {
    case StageKind::kCtxProj: return 0;
    case StageKind::kEmbed: return 1;
    case StageKind::kFinalNorm: return 2 + num_layers * kStagesPerLayer;
    case StageKind::kLogits: return 3 + num_layers * kStagesPerLayer;
    default: break;
  }
  for (int i = 0; i < kStagesPerLayer; ++i) {
    if (kLayerStages[i] == id.kind) return 2 + id.layer * kStagesPerLayer + i;
  }
  return -1;
}

std::string stage_names_summary(int num_layers) {
  std::string layer_stages;
  for (StageKind kind : kLayerStages) layer_stages += (layer_stages.empty() ? "" : "|") + std::string(stage_kind_name(kind));
  return std::string(stage_kind_name(StageKind::kCtxProj)) + ", " + stage_kind_name(StageKind::kEmbed) + ", L{l}." +
         layer_stages + " for l < " + std::to_string(num_layers) + ", " + stage_kind_name(StageKind::kFinalNorm) + ", " +
         stage_kind_name(StageKind::kLogits);
}

std::vector<int64_t> stage_shape(const StageId& id, const DrafterConfig& config, int64_t block_width,
                                 int64_t context_rows) {
  switch (id.kind) {
    case StageKind::kCtxProj: return {context_rows, config.hidden_size};
    case StageKind::kLogits: return {block_width - 1, config.vocab_size};
    case StageKind::kQ:
    case StageKind::kAttn: return {block_width, config.q_dim()};
    case StageKind::kK:
    case StageKind::kV: return {block_width, config.kv_dim()};
    default: return {block_width, config.hidden_size};
  }
}

}  // namespace dflash
