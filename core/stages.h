// The named stages of one propose (docs/spec/drafter.md §7), defined once: their names, their
// forward order (the order first-divergence bisection walks and reports list them), the one
// parser, and the shape of each stage's tap. Both drafters name their taps with stage_name,
// fixtures check tap names and shapes with parse_stage_name and stage_shape, compare orders them
// with forward_stage_order.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace dflash {

enum class StageKind {
  kCtxProj, kEmbed, kAttnNorm, kQ, kK, kV, kAttn, kOProj, kMlpNorm, kMlp, kOut, kFinalNorm, kLogits,
  // DFlash2 only (docs/spec/dflash2.md §6): the conv stages of each layer, the selector's stages.
  kAttnConvCoef, kAttnConvIn, kAttnConvOut, kMlpConvCoef, kMlpConvIn, kMlpConvOut,
  kSelTopkIds, kSelTopkValues, kSelUnary, kSelHiddenProj, kSelEdgeScores, kSelWalkScores,
};

// The per-layer stages in the order a layer computes them (q, k, v as docs/spec/drafter.md §7
// lists them).
constexpr StageKind kLayerStages[] = {StageKind::kAttnNorm, StageKind::kQ,       StageKind::kK,
                                      StageKind::kV,        StageKind::kAttn,    StageKind::kOProj,
                                      StageKind::kMlpNorm,  StageKind::kMlp,     StageKind::kOut};
constexpr int kStagesPerLayer = static_cast<int>(sizeof(kLayerStages) / sizeof(kLayerStages[0]));
// A DFlash2 layer: the conv stages where docs/spec/dflash2.md §3.2 computes them.
constexpr StageKind kDflash2LayerStages[] = {
    StageKind::kAttnNorm, StageKind::kAttnConvCoef, StageKind::kAttnConvIn,  StageKind::kQ,
    StageKind::kK,        StageKind::kV,            StageKind::kAttn,        StageKind::kOProj,
    StageKind::kAttnConvOut, StageKind::kMlpNorm,   StageKind::kMlpConvCoef, StageKind::kMlpConvIn,
    StageKind::kMlp,      StageKind::kMlpConvOut,   StageKind::kOut};
// The selector's stages, after the logits.
constexpr StageKind kSelectorStages[] = {StageKind::kSelTopkIds,     StageKind::kSelTopkValues,
                                         StageKind::kSelUnary,       StageKind::kSelHiddenProj,
                                         StageKind::kSelEdgeScores,  StageKind::kSelWalkScores};

struct StageId {
  StageKind kind = StageKind::kLogits;
  int layer = -1;  // per-layer stages only; -1 otherwise
  // A tensor-parallel drafter's per-rank partial of a row-parallel stage (o_proj, mlp), as it enters
  // the reduction (docs/spec/tensor-parallel.md §7: "L{l}.o_proj.partial@r{rank}"); -1 otherwise.
  int rank = -1;
};

// Whether `kind` is row-parallel at TP > 1 (o_proj and mlp): it has per-rank partials.
bool has_partials(StageKind kind);

// Whether the stage exists once per layer (attn_norm ... out).
bool is_layer_stage(StageKind kind);
// The stage's own name: "ctx_proj", "embed", "final_norm", "logits", or a layer stage's suffix
// ("attn_norm", "q", "k", "v", "attn", "o_proj", "mlp_norm", "mlp", "out").
const char* stage_kind_name(StageKind kind);
// The tap name: "ctx_proj", ..., or "L{layer}.{suffix}" for a layer stage, with ".partial@r{rank}"
// for a rank's partial.
std::string stage_name(StageKind kind, int layer = -1, int rank = -1);
inline std::string stage_name(const StageId& id) { return stage_name(id.kind, id.layer, id.rank); }
// The name a row-parallel stage's partials share with their rank left out, "L{l}.o_proj.partial"
// (the tolerance model gives every rank's partial one path); stage_name(kind, layer, rank) is it
// followed by "@r{rank}".
std::string partial_family(StageKind kind, int layer);
// The partial_family of a name written as a rank's partial ("L3.mlp.partial@r1" gives
// "L3.mlp.partial"); "" for any other name. Layers and ranks are not checked against a drafter:
// parse_stage_name does that.
std::string partial_family_of(const std::string& name);

// "ctx_proj", "embed", "L0.attn_norm", "L0.q", "L0.k", "L0.v", "L0.attn", "L0.o_proj",
// "L0.mlp_norm", "L0.mlp", "L0.out", "L1.attn_norm", ..., "final_norm", "logits".
// A DFlash2 drafter (dflash2 = true) adds the conv stages inside each layer and the selector's
// "selector.*" stages after the logits. At tp_size N > 1 the ranks' partials "L{l}.o_proj.partial@r0"
// .. "@r{N-1}" come just before L{l}.o_proj, and those of L{l}.mlp just before it.
std::vector<std::string> forward_stage_order(int num_layers, bool dflash2 = false, int tp_size = 1);

// Parses a stage name; false for anything that is not a stage of a drafter with num_layers layers
// (including "L01.q", layers past the last, and partials of ranks at or past tp_size).
bool parse_stage_name(const std::string& name, int num_layers, StageId* out, bool dflash2 = false, int tp_size = 1);

// Position of the stage in forward_stage_order(num_layers, dflash2, tp_size), or -1 when it is not a stage.
int stage_order_index(const std::string& name, int num_layers, bool dflash2 = false, int tp_size = 1);

// Every stage name of a drafter with num_layers layers, in words for an error message:
// "ctx_proj, embed, L{l}.attn_norm|q|k|v|attn|o_proj|mlp_norm|mlp|out for l < N, final_norm, logits".
std::string stage_names_summary(int num_layers, bool dflash2 = false);

// The shape of the stage's tap for one sequence (docs/spec/drafter.md §7): [context_rows, H] for
// ctx_proj (the rows admitted this step), [B - 1, V] for logits, [B, q_dim] for q and attn,
// [B, kv_dim] for k and v, [B, 2·k·ng] for the conv coefficients, [B - 1, K] (or r, or K×K) for
// the selector's stages, [B, H] otherwise (a rank's partial included).
std::vector<int64_t> stage_shape(const StageId& id, const DrafterConfig& config, int64_t block_width,
                                 int64_t context_rows);

}  // namespace dflash
