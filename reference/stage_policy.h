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
#ifdef DFLASH_FAULT_POINTS
  Fp8Fault fp8_fault = Fp8Fault::kNone;  // only with fp8_weights (kUnscaledActivation: fp8_activations)
  Dflash2Fault dflash2_fault = Dflash2Fault::kNone;
  RoundingFault rounding_fault = RoundingFault::kNone;  // only with round_bf16
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
