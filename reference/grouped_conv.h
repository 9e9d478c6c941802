// DFlash2's grouped dynamic convolution (docs/spec/dflash2.md §3.1) over the block rows of one
// sequence: out[t, ch] = Σ_{τ ≤ min(k-1, t)} (base[side, τ, ch] + coef[t, side·k·ng + τ·ng + ch/G])
// · z[t-τ, ch]. Tap τ reads row t-τ of the same block only (zero for t < τ): never a row of another
// sequence nor a context row.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/aligned_matrix.h"

namespace dflash {

struct ConvGeometry {
  int taps = 0;        // k
  int group_size = 0;  // G
  int channels = 0;    // H
  int groups() const { return channels / group_size; }
};

// Rows [row0, row0 + block_width) of `out` from the same rows of `z` and `coef` ([rows, 2·k·ng]),
// with base kernel `base` ([2, k, H] flat) on `side` (0 = prepare, 1 = finish). out must not alias z.
// wraps (a planted fault, Dflash2Fault::kConvWraps): tap τ of row t < τ reads flat row
// row0 + t - τ of z (modulo its rows) instead of nothing.
template <typename T>
void grouped_conv_block(const ConvGeometry& g, int side, const std::vector<T>& base, const AlignedMatrix<T>& coef,
                        const AlignedMatrix<T>& z, int64_t row0, int64_t block_width, AlignedMatrix<T>* out,
                        bool wraps = false);

}  // namespace dflash
