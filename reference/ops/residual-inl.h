// Residual-stream add, compiled once per Highway target; bit-identical to scalar::add_inplace.
#if defined(DFLASH_REFERENCE_OPS_RESIDUAL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DFLASH_REFERENCE_OPS_RESIDUAL_INL_H_
#undef DFLASH_REFERENCE_OPS_RESIDUAL_INL_H_
#else
#define DFLASH_REFERENCE_OPS_RESIDUAL_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
HWY_INLINE void AddInplace(T* HWY_RESTRICT acc, const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(d, acc + i), hn::LoadU(d, x + i)), d, acc + i);
  }
  for (; i < n; ++i) acc[i] = acc[i] + x[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace dflash
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
