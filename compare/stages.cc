#include "compare/stages.h"

#include <cstdlib>

namespace dflash {
namespace {

struct LayerStage {
  StageKind kind;
  const char* suffix;
};
// Per-layer stages in the order a layer computes them (q, k, v as drafter.md §7 lists them).
constexpr LayerStage kLayerStages[] = {
    {StageKind::kAttnNorm, "attn_norm"}, {StageKind::kQ, "q"},       {StageKind::kK, "k"},
    {StageKind::kV, "v"},                {StageKind::kAttn, "attn"}, {StageKind::kOProj, "o_proj"},
    {StageKind::kMlpNorm, "mlp_norm"},   {StageKind::kMlp, "mlp"},   {StageKind::kOut, "out"},
};

}  // namespace

std::vector<std::string> forward_stage_order(int num_layers) {
  std::vector<std::string> order = {"ctx_proj", "embed"};
  for (int l = 0; l < num_layers; ++l) {
    for (const LayerStage& stage : kLayerStages) order.push_back("L" + std::to_string(l) + "." + stage.suffix);
  }
  order.push_back("final_norm");
  order.push_back("logits");
  return order;
}

bool parse_stage_name(const std::string& name, int num_layers, StageId* out) {
  if (name == "ctx_proj") { *out = {StageKind::kCtxProj, -1}; return true; }
  if (name == "embed") { *out = {StageKind::kEmbed, -1}; return true; }
  if (name == "final_norm") { *out = {StageKind::kFinalNorm, -1}; return true; }
  if (name == "logits") { *out = {StageKind::kLogits, -1}; return true; }
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
  for (const LayerStage& stage : kLayerStages) {
    if (suffix == stage.suffix) { *out = {stage.kind, layer}; return true; }
  }
  return false;
}

int stage_order_index(const std::string& name, int num_layers) {
  StageId id;
  if (!parse_stage_name(name, num_layers, &id)) return -1;
  constexpr int kPerLayer = static_cast<int>(sizeof(kLayerStages) / sizeof(kLayerStages[0]));
  switch (id.kind) {
    case StageKind::kCtxProj: return 0;
    case StageKind::kEmbed: return 1;
    case StageKind::kFinalNorm: return 2 + num_layers * kPerLayer;
    case StageKind::kLogits: return 3 + num_layers * kPerLayer;
    default: break;
  }
  for (int i = 0; i < kPerLayer; ++i) {
    if (kLayerStages[i].kind == id.kind) return 2 + id.layer * kPerLayer + i;
  }
  return -1;
}

}  // namespace dflash
