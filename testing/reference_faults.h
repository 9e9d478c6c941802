// The reference drafter's planted faults: negative controls for the checks that must see what a
// drafter with such a bug computes (tests only). Part of the fault-point mechanism
// (testing/fault_points.h): the reference compiles them only with -DDFLASH_FAULT_POINTS=ON, and a
// test chooses them per drafter through ReferenceOptions.
#pragma once
#include <cstdint>

#ifndef DFLASH_FAULT_POINTS
#error "testing/reference_faults.h needs a build with -DDFLASH_FAULT_POINTS=ON"
#endif

namespace dflash {

// Faults planted in the reference for negative controls only (tests): each leaves the page-table
// bookkeeping right and breaks what is stored or read, so only the stored-state checks can see it.
enum class PlantedFault {
  kNone,
  kWrongSlot,        // the newest context row of each propose is written one slot further on
  kKeepsBlockRow,    // a propose also writes into the slot after its window (a block row kept)
  kStaleRead,        // attention reads the slot before the window's oldest in place of the oldest
  kReadsPastWindow,  // attention is also handed the slot after the window's newest (one row too many)
  kStaleKey,         // once, in a window of at least kStaleKeyWindow positions, one slot keeps the K/V
                     // of the position before it (a single stale key among hundreds)
  // Stale-graph classes, emulated as a CUDA drafter with graphs after one eager pass per shape
  // (width, batch) would compute them: its second propose captures, later ones replay.
  kBakedPageTable,      // replays read the block tables last uploaded, by batch slot (page 0 past
                        // their end): the page table baked at capture
  kStaleAttentionPlan,  // replays attend to at most as many positions as the longest window at the
                        // capture (the oldest ones): the attention plan of another window geometry
};
// The shortest window kStaleKey is planted in: long enough that one key weighs little in attention.
constexpr int64_t kStaleKeyWindow = 512;

// A kernel bug of realistic size planted in the fp8 GEMMs, for the negative controls of the fp8
// envelope (docs/tolerances.md): the reference computes what a CUDA drafter with that bug would.
enum class Fp8Fault {
  kNone,
  kNeighbourRowScale,  // output row n is scaled by row n+1's scale (the last row by row 0's)
  kSkippedKTile,       // the last 64-wide K tile of every weight row is left out of the dot product
  // A quantized drafter whose lm_head went through a second, per-tensor E4M3 quantization with a
  // calibration scale 2^20 times too large (a stale scale from another tensor): every head weight
  // rounds to zero, every logit is 0, and every draft token is token 0 (the lowest index of the tie).
  // The other GEMMs are untouched: the drafter runs, with no error, and its acceptance collapses.
  kQuantizedDrafter,
  // W8A8 only: every GEMM's input row is cast to E4M3 without dividing by its activation scale
  // (codes of x, not of x / scale), while the epilogue still multiplies by that scale: a fused
  // quantization step that skipped its scaling. Each output row shrinks by its token's scale.
  kUnscaledActivation,
};

// A rounding bug planted in the reference's bf16 storage (bf16, fp8 and w8a8 modes), for the negative
// controls of the rounding-bias check (compare/rounding_bias.h): values cut to bf16 toward zero
// instead of to the nearest, each error under one ulp and so under every per-row bound.
enum class RoundingFault {
  kNone,
  kTruncatedKvStore,     // the context K and V written to the pools
  kTruncatedActivation,  // the MLP activation silu(gate)·up (the CUDA drafter's SwiGLU epilogue)
};

// "truncated-kv-store", "truncated-swiglu"; "" for kNone.
const char* rounding_fault_name(RoundingFault fault);

// "neighbour-row-scale", "skipped-k-tile", "quantized-drafter", "unscaled-activation"; "" for kNone.
const char* fp8_fault_name(Fp8Fault fault);

// A DFlash2 bug planted in the reference, for the negative controls of the DFlash2 oracle replay
// (tests/oracle/dflash2_controls_test): what a drafter with that bug would compute.
enum class Dflash2Fault {
  kNone,
  kCausalBlock,  // attention masks the block causally: block row i sees block rows j <= i only
  kConvWraps,    // the convolution drops its block-boundary rule: row t < τ reads flat row t - τ of
                 // the batch's rows (the previous sequence's, or wrapping past the first row)
};

// "causal-block", "conv-wraps"; "" for kNone.
const char* dflash2_fault_name(Dflash2Fault fault);

// A tensor-parallel bug planted in the reference's TP = N emulation (docs/spec/tensor-parallel.md
// §4), for the catch suite of issue 47: what a TP drafter with that bug would compute.
enum class TpFault {
  kNone,
  kMissingAllReduce,  // layer 0's o_proj keeps rank 0's partial: its all-reduce is missing
  kVocabOffset,       // the vocabulary-parallel argmax (§5.2) turns rank r > 0's local index into a global
                      // one with rank r - 1's offset: a shard's vocabulary offset off by one block
  kShardTopKUnmerged,  // the DFlash2 top-K (§5.3) is rank 0's own top-K of its V/N columns: the
                       // per-shard candidates never merged across ranks
  kWrongShardKvHeads,  // rank r's query heads attend with rank r + 1's KV heads (mod N; §2, §6): KV heads
                       // assigned to the wrong shard (needs N dividing num_key_value_heads)
};

// "missing-all-reduce", "vocab-offset", "shard-topk-unmerged", "wrong-shard-kv-heads"; "" for kNone.
inline const char* tp_fault_name(TpFault fault) {
  switch (fault) {
    case TpFault::kNone: return "";
    case TpFault::kMissingAllReduce: return "missing-all-reduce";
    case TpFault::kVocabOffset: return "vocab-offset";
    case TpFault::kShardTopKUnmerged: return "shard-topk-unmerged";
    case TpFault::kWrongShardKvHeads: return "wrong-shard-kv-heads";
  }
  return "";
}

inline const char* fp8_fault_name(Fp8Fault fault) {
  switch (fault) {
    case Fp8Fault::kNone: return "";
    case Fp8Fault::kNeighbourRowScale: return "neighbour-row-scale";
    case Fp8Fault::kSkippedKTile: return "skipped-k-tile";
    case Fp8Fault::kQuantizedDrafter: return "quantized-drafter";
    case Fp8Fault::kUnscaledActivation: return "unscaled-activation";
  }
  return "";
}

inline const char* rounding_fault_name(RoundingFault fault) {
  switch (fault) {
    case RoundingFault::kNone: return "";
    case RoundingFault::kTruncatedKvStore: return "truncated-kv-store";
    case RoundingFault::kTruncatedActivation: return "truncated-swiglu";
  }
  return "";
}

inline const char* dflash2_fault_name(Dflash2Fault fault) {
  switch (fault) {
    case Dflash2Fault::kNone: return "";
    case Dflash2Fault::kCausalBlock: return "causal-block";
    case Dflash2Fault::kConvWraps: return "conv-wraps";
  }
  return "";
}

}  // namespace dflash
