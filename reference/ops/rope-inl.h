// Rotate-half RoPE kernel, compiled once per Highway target. Separate multiply and subtract/add
// (no fused multiply-add, and ops.cc is built with -ffp-contract=off) so every target produces the
// same bits as scalar::rope_rotate_half.
#if defined(DFLASH_REFERENCE_OPS_ROPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DFLASH_REFERENCE_OPS_ROPE_INL_H_
#undef DFLASH_REFERENCE_OPS_ROPE_INL_H_
#else
#define DFLASH_REFERENCE_OPS_ROPE_INL_H_
#endif

#include <cstddef>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T>
HWY_INLINE void RopeRotateHalf(T* HWY_RESTRICT x, const T* HWY_RESTRICT cos, const T* HWY_RESTRICT sin,
                               size_t half) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  T* HWY_RESTRICT x2 = x + half;
  size_t j = 0;
  for (; j + lanes <= half; j += lanes) {
    const auto a = hn::LoadU(d, x + j);
    const auto b = hn::LoadU(d, x2 + j);
    const auto c = hn::LoadU(d, cos + j);
    const auto s = hn::LoadU(d, sin + j);
    hn::StoreU(hn::Sub(hn::Mul(a, c), hn::Mul(b, s)), d, x + j);
    hn::StoreU(hn::Add(hn::Mul(b, c), hn::Mul(a, s)), d, x2 + j);
  }
  for (; j < half; ++j) {
    const T a = x[j], b = x2[j];
    x[j] = a * cos[j] - b * sin[j];
    x2[j] = b * cos[j] + a * sin[j];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dflash
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
