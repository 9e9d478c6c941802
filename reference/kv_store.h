// The reference's K/V storage: one pool per layer for K and one for V, each [slots, nkv·d], all
// addressed by the slots KvPageTable hands out (docs/spec/drafter.md §5). Only context rows live here.
#pragma once
#include <cstdint>
#include <vector>

#include "reference/aligned_matrix.h"

namespace dflash {

template <typename T>
struct KvStore {
  std::vector<AlignedMatrix<T>> k, v;  // [layer] -> [slots, kv_dim]

  KvStore(int layers, int64_t slots, int64_t kv_dim) : k(static_cast<size_t>(layers)), v(static_cast<size_t>(layers)) {
    for (int l = 0; l < layers; ++l) {
      k[static_cast<size_t>(l)].resize(slots, kv_dim);
      v[static_cast<size_t>(l)].resize(slots, kv_dim);
    }
  }
};

}  // namespace dflash
