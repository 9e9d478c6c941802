// SiLU(gate) · up kernel, compiled once per Highway target, with the overflow-free form of
// scalar::silu_mul (e = exp(-|g|) <= 1). Only Exp differs from the scalar version (contrib Exp vs
// std::exp), which the tests bound.
#if defined(DFLASH_REFERENCE_OPS_SILU_MUL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DFLASH_REFERENCE_OPS_SILU_MUL_INL_H_
#undef DFLASH_REFERENCE_OPS_SILU_MUL_INL_H_
#else
#define DFLASH_REFERENCE_OPS_SILU_MUL_INL_H_
#endif

#include <cmath>
#include <cstddef>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out may alias gate or up: each element is loaded before its own store.
template <typename T>
HWY_INLINE void SiluMul(const T* gate, const T* up, size_t n, T* out) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const auto one = hn::Set(d, T(1));
  const auto zero = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(d, gate + i);
    const auto e = hn::Exp(d, hn::Sub(zero, hn::Abs(g)));
    const auto numerator = hn::IfThenElse(hn::Lt(g, zero), hn::Mul(g, e), g);
    hn::StoreU(hn::Mul(hn::Div(numerator, hn::Add(one, e)), hn::LoadU(d, up + i)), d, out + i);
  }
  for (; i < n; ++i) {
    const T g = gate[i];
    const T e = std::exp(-std::fabs(g));
    const T numerator = g < T(0) ? g * e : g;
    out[i] = (numerator / (T(1) + e)) * up[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace dflash
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
