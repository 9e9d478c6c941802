// Taps (docs/spec/drafter.md §7): rows of an intermediate converted to a float Tensor and appended to one
// sequence's output, in forward order. Only called when taps were asked for.
#pragma once
#include <cstdint>
#include <string>

#include "core/proposer.h"
#include "reference/aligned_matrix.h"

namespace dflash {

// Appends rows [begin, begin + count), columns [0, m.cols()), of m as tap `name` of `out`.
template <typename T>
void append_tap(ProposeOutput* out, const std::string& name, const AlignedMatrix<T>& m, int64_t begin, int64_t count) {
  Tap tap;
  tap.name = name;
  tap.value = Tensor::zeros({count, m.cols()});
  for (int64_t r = 0; r < count; ++r) {
    const T* src = m.row(begin + r);
    float* dst = tap.value.row(r);
    for (int64_t c = 0; c < m.cols(); ++c) dst[c] = static_cast<float>(src[c]);
  }
  out->taps.push_back(std::move(tap));
}

}  // namespace dflash
