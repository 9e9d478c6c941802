#include "core/stages.h"

#include <algorithm>
#include <cstdlib>

namespace dflash {

namespace {

bool is_selector_stage(StageKind kind) {
  for (StageKind k : kSelectorStages) {
    if (k == kind) return true;
  }
  return false;
}

template <size_t N>
std::vector<StageKind> kinds(const StageKind (&list)[N]) { return std::vector<StageKind>(list, list + N); }

std::vector<StageKind> layer_stages(bool dflash2) { return dflash2 ? kinds(kDflash2LayerStages) : kinds(kLayerStages); }

}  // namespace

bool is_layer_stage(StageKind kind) {
  return kind != StageKind::kCtxProj && kind != StageKind::kEmbed && kind != StageKind::kFinalNorm &&
         kind != StageKind::kLogits && !is_selector_stage(kind);
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
    case StageKind::kAttnConvCoef: return "attn_conv_coef";
    case StageKind::kAttnConvIn: return "attn_conv_in";
    case StageKind::kAttnConvOut: return "attn_conv_out";
    case StageKind::kMlpConvCoef: return "mlp_conv_coef";
    case StageKind::kMlpConvIn: return "mlp_conv_in";
    case StageKind::kMlpConvOut: return "mlp_conv_out";
    case StageKind::kSelTopkIds: return "selector.topk_ids";
    case StageKind::kSelTopkValues: return "selector.topk_values";
    case StageKind::kSelUnary: return "selector.unary";
    case StageKind::kSelHiddenProj: return "selector.hidden_proj";
    case StageKind::kSelEdgeScores: return "selector.edge_scores";
    case StageKind::kSelWalkScores: return "selector.walk_scores";
  }
  return "?";
}

bool has_partials(StageKind kind) { return kind == StageKind::kOProj || kind == StageKind::kMlp; }

// A rank's partial: "{stage}{kPartial}{kRank}{rank}".
constexpr char kPartial[] = ".partial";
constexpr char kRank[] = "@r";

std::string stage_name(StageKind kind, int layer, int rank) {
  if (!is_layer_stage(kind)) return stage_kind_name(kind);
  if (rank >= 0) return partial_family(kind, layer) + kRank + std::to_string(rank);
  return "L" + std::to_string(layer) + "." + stage_kind_name(kind);
}

std::string partial_family(StageKind kind, int layer) { return stage_name(kind, layer) + kPartial; }

std::string partial_family_of(const std::string& name) {
  const size_t at = name.rfind(std::string(kPartial) + kRank);
  return at == std::string::npos ? "" : name.substr(0, at + sizeof(kPartial) - 1);
}

std::vector<std::string> forward_stage_order(int num_layers, bool dflash2, int tp_size) {
  std::vector<std::string> order = {stage_name(StageKind::kCtxProj), stage_name(StageKind::kEmbed)};
  for (int l = 0; l < num_layers; ++l) {
    for (StageKind kind : layer_stages(dflash2)) {
      if (tp_size > 1 && has_partials(kind)) {
        for (int r = 0; r < tp_size; ++r) order.push_back(stage_name(kind, l, r));
      }
      order.push_back(stage_name(kind, l));
    }
  }
  order.push_back(stage_name(StageKind::kFinalNorm));
  order.push_back(stage_name(StageKind::kLogits));
  if (dflash2) {
    for (StageKind kind : kSelectorStages) order.push_back(stage_name(kind));
  }
  return order;
}

bool parse_stage_name(const std::string& name, int num_layers, StageId* out, bool dflash2, int tp_size) {
  // A rank's partial: "{row-parallel stage}.partial@r{rank}", rank < tp_size.
  const std::string family = partial_family_of(name);
  if (!family.empty()) {
    const size_t at = family.size() - (sizeof(kPartial) - 1);  // where the stage's name ends
    const std::string digits = name.substr(family.size() + sizeof(kRank) - 1);
    if (digits.empty() || digits.size() > 3 || (digits.size() > 1 && digits[0] == '0')) return false;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
    }
    const int rank = std::atoi(digits.c_str());
    StageId base;
    if (tp_size < 2 || rank >= tp_size || !parse_stage_name(name.substr(0, at), num_layers, &base, dflash2) || !has_partials(base.kind)) {
      return false;
    }
    *out = {base.kind, base.layer, rank};
    return true;
  }
  for (StageKind kind : {StageKind::kCtxProj, StageKind::kEmbed, StageKind::kFinalNorm, StageKind::kLogits}) {
    if (name == stage_kind_name(kind)) {
      *out = {kind, -1};
      return true;
    }
  }
  for (StageKind kind : kSelectorStages) {
    if (dflash2 && name == stage_kind_name(kind)) {
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
  for (StageKind kind : layer_stages(dflash2)) {
    if (suffix == stage_kind_name(kind)) {
      *out = {kind, layer};
      return true;
    }
  }
  return false;
}

int stage_order_index(const std::string& name, int num_layers, bool dflash2, int tp_size) {
  StageId id;
  if (!parse_stage_name(name, num_layers, &id, dflash2, tp_size)) return -1;
  const std::vector<std::string> order = forward_stage_order(num_layers, dflash2, tp_size);
  return static_cast<int>(std::find(order.begin(), order.end(), name) - order.begin());
}

std::string stage_names_summary(int num_layers, bool dflash2) {
  std::string per_layer;
  for (StageKind kind : layer_stages(dflash2)) per_layer += (per_layer.empty() ? "" : "|") + std::string(stage_kind_name(kind));
  std::string summary = std::string(stage_kind_name(StageKind::kCtxProj)) + ", " + stage_kind_name(StageKind::kEmbed) +
                        ", L{l}." + per_layer + " for l < " + std::to_string(num_layers) + ", " +
                        stage_kind_name(StageKind::kFinalNorm) + ", " + stage_kind_name(StageKind::kLogits);
  if (dflash2) {
    for (StageKind kind : kSelectorStages) summary += std::string(", ") + stage_kind_name(kind);
  }
  return summary;
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
    case StageKind::kAttnConvCoef:
    case StageKind::kMlpConvCoef: return {block_width, config.conv_coef_dim()};
    case StageKind::kSelTopkIds:
    case StageKind::kSelTopkValues:
    case StageKind::kSelUnary:
    case StageKind::kSelWalkScores: return {block_width - 1, config.dflash2.selector_top_k};
    case StageKind::kSelHiddenProj: return {block_width - 1, config.dflash2.selector_rank};
    case StageKind::kSelEdgeScores:
      return {block_width - 1, config.dflash2.selector_top_k, config.dflash2.selector_top_k};
    default: return {block_width, config.hidden_size};
  }
}

}  // namespace dflash
