// Which emulation a precision mode switches on (docs/reference-precision.md has the full list):
//   fp64: double everywhere.   fp32: float activations.
//   bf16: float compute, values rounded to bf16 where the CUDA drafter stores bf16.
//   fp8:  bf16 plus per-row E4M3 weights for q/k/v/o/gate/up/down and lm_head.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/proposer.h"
#include "reference/aligned_matrix.h"

namespace dflash {

// A kernel bug of realistic size planted in the fp8 GEMMs, for the negative controls of the fp8
// envelope (docs/tolerances.md): the reference computes what a CUDA drafter with that bug would.
enum class Fp8Fault {
  kNone,
  kNeighbourRowScale,  // output row n is scaled by row n+1's scale (the last row by row 0's)
  kSkippedKTile,       // the last 64-wide K tile of every weight row is left out of the dot product
};

// "neighbour-row-scale", "skipped-k-tile"; "" for kNone.
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

struct StagePolicy {
  bool use_double = false;   // compute type: double (fp64 mode) or float
  bool round_bf16 = false;   // round at the bf16 storage boundaries
  bool fp8_weights = false;  // q/k/v/o/gate/up/down and lm_head as per-row E4M3
  Fp8Fault fp8_fault = Fp8Fault::kNone;  // only with fp8_weights
  Dflash2Fault dflash2_fault = Dflash2Fault::kNone;

  static StagePolicy for_precision(Precision precision) {
    StagePolicy p;
    p.use_double = precision == Precision::kFp64;
    p.round_bf16 = precision == Precision::kBf16 || precision == Precision::kFp8;
    p.fp8_weights = precision == Precision::kFp8;
    return p;
  }
};

inline const char* fp8_fault_name(Fp8Fault fault) {
  switch (fault) {
    case Fp8Fault::kNone: return "";
    case Fp8Fault::kNeighbourRowScale: return "neighbour-row-scale";
    case Fp8Fault::kSkippedKTile: return "skipped-k-tile";
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

// The bf16 storage boundaries, in forward order, as listed in docs/reference-precision.md.
constexpr const char* kBf16StorageStages =
    "ctx_proj (Xc after hidden_norm), cached context K/V, block K/V, q after RoPE, attn_norm output, "
    "attention output, mlp_norm output, silu(gate)*up, final_norm output";

// Rounds columns [0, cols) of rows [begin, end) to the nearest bf16 (ties to even) when the policy
// asks for it; otherwise leaves them alone.
template <typename T>
void round_stage_to_bf16(const StagePolicy& policy, AlignedMatrix<T>* m, int64_t begin, int64_t end) {
  if (!policy.round_bf16) return;
  for (int64_t r = begin; r < end; ++r) {
    T* row = m->row(r);
    for (int64_t c = 0; c < m->cols(); ++c) row[c] = static_cast<T>(round_to_bf16(static_cast<float>(row[c])));
  }
}

}  // namespace dflash
