// Which emulation a precision mode switches on (docs/reference-precision.md has the full list):
//   fp64: double everywhere.   fp32: float activations.
//   bf16: float compute, values rounded to bf16 where the CUDA drafter stores bf16.
//   fp8:  bf16 plus per-row E4M3 weights for q/k/v/o/gate/up/down and lm_head.
//   w8a8: fp8 plus the input rows of those GEMMs quantized per token to E4M3.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "core/proposer.h"
#include "reference/aligned_matrix.h"
#ifdef DFLASH_FAULT_POINTS
#include "testing/reference_faults.h"
#endif

namespace dflash {

struct StagePolicy {
  bool use_double = false;   // compute type: double (fp64 mode) or float
  bool round_bf16 = false;   // round at the bf16 storage boundaries
  bool fp8_weights = false;  // q/k/v/o/gate/up/down and lm_head as per-row E4M3
  bool fp8_activations = false;  // and their input rows per token as E4M3 (only with fp8_weights)
  // Tensor parallelism emulated (docs/spec/tensor-parallel.md): o_proj and down_proj reduce tp_size
  // row-parallel partials (§4, Linear::set_row_parallel), in bf16 where tp_reduce_bf16. Nothing
  // else is emulated per rank, by the contract's own statements:
  //  - column-parallel stages (q/k/v, attention, gate/up, the logits) are TP = 1's bit for bit: a
  //    GEMM's per-element order depends on K only (§3 decision), and each rank's slice of rows or
  //    heads reads the same inputs as at TP = 1, so per-shard GEMMs would give the same bits;
  //  - the embedding's combination is exact (§5.1), and K/V heads (split or replicated, §2) hold
  //    TP = 1's values (§6);
  //  - the vocabulary-parallel argmax (§5.2) takes the greatest (value, global index) pair under a
  //    strict total order with lowest-index ties, so the greatest of the shards' greatest is the
  //    row's greatest: TP = 1's argmax, including ties across a shard boundary (the reference still
  //    draws its tokens through that merge at tp_size > 1, engine.cc, so a merge bug can be planted);
  //  - the DFlash2 top-K merge (§5.3) is exactly the one-device top-K of the gathered row, ids and
  //    order (a token in the global first K is preceded by fewer than K tokens of its own shard), so
  //    the reference's one-device top-K is the merge's result; the rest of the selector is
  //    replicated.
  int tp_size = 1;
  bool tp_reduce_bf16 = false;
#ifdef DFLASH_FAULT_POINTS
  Fp8Fault fp8_fault = Fp8Fault::kNone;  // only with fp8_weights (kUnscaledActivation: fp8_activations)
  Dflash2Fault dflash2_fault = Dflash2Fault::kNone;
  RoundingFault rounding_fault = RoundingFault::kNone;  // only with round_bf16
  TpFault tp_fault = TpFault::kNone;                    // only with tp_size > 1
#endif

  static StagePolicy for_precision(Precision precision) {
    StagePolicy p;
    p.use_double = precision == Precision::kFp64;
    p.fp8_activations = precision == Precision::kW8a8;
    p.fp8_weights = precision == Precision::kFp8 || p.fp8_activations;
    p.round_bf16 = precision == Precision::kBf16 || p.fp8_weights;
    return p;
  }
};

// The bf16 storage boundaries, in forward order, as listed in docs/reference-precision.md.
constexpr const char* kBf16StorageStages =
    "ctx_proj (Xc after hidden_norm), cached context K/V, block K/V, q after RoPE, attn_norm output, "
    "attention output, mlp_norm output, silu(gate)*up, final_norm output";

// f cut to bf16 toward zero (its low 16 bits dropped): a planted rounding fault's conversion.
inline float truncate_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return bf16_bits_to_float(static_cast<uint16_t>(u >> 16));
}

// Rounds columns [0, cols) of rows [begin, end) to the nearest bf16 (ties to even) when the policy
// asks for it, toward zero instead where `toward_zero` (a planted RoundingFault); otherwise leaves
// them alone.
template <typename T>
void round_stage_to_bf16(const StagePolicy& policy, AlignedMatrix<T>* m, int64_t begin, int64_t end,
                         bool toward_zero = false) {
  if (!policy.round_bf16) return;
  for (int64_t r = begin; r < end; ++r) {
    T* row = m->row(r);
    for (int64_t c = 0; c < m->cols(); ++c) {
      const float x = static_cast<float>(row[c]);
      row[c] = static_cast<T>(toward_zero ? truncate_to_bf16(x) : round_to_bf16(x));
    }
  }
}

}  // namespace dflash
