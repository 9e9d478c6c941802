// The named stages of one propose (drafter.md §7) in forward order: the order first-divergence
// bisection walks, and the order reports list and plot them.
#pragma once
#include <string>
#include <vector>

namespace dflash {

enum class StageKind {
  kCtxProj, kEmbed, kAttnNorm, kQ, kK, kV, kAttn, kOProj, kMlpNorm, kMlp, kOut, kFinalNorm, kLogits,
};

struct StageId {
  StageKind kind = StageKind::kLogits;
  int layer = -1;  // per-layer stages only; -1 otherwise
};

// "ctx_proj", "embed", "L0.attn_norm", "L0.q", "L0.k", "L0.v", "L0.attn", "L0.o_proj",
// "L0.mlp_norm", "L0.mlp", "L0.out", "L1.attn_norm", ..., "final_norm", "logits".
std::vector<std::string> forward_stage_order(int num_layers);

// Parses a stage name; false for anything that is not a stage of a drafter with num_layers layers.
bool parse_stage_name(const std::string& name, int num_layers, StageId* out);

// Position of the stage in forward_stage_order(num_layers), or -1 when it is not a stage.
int stage_order_index(const std::string& name, int num_layers);

}  // namespace dflash
