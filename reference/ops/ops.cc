// The Highway kernels of ops.h, compiled once per Highway target (foreach_target.h re-includes
// this file for each), and the dispatch to the best supported one at run time. Each kernel follows
// its scalar twin in scalar_ops.h; where the two may differ, the comment says so and ops_test.cc
// bounds it. Built with -ffp-contract=off: no fused multiply-add on any target.
#include "reference/ops/ops.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reference/ops/ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Argmax: lowest index of the largest value, NaN never wins, all NaN gives 0 (scalar::argmax).
// Two passes (the max, then the first lane equal to it), so the answer never depends on lane
// order: a value-only reduction cannot pick a later index.
template <typename T>
HWY_INLINE size_t Argmax(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const T lowest = -std::numeric_limits<T>::infinity();
  // Pass 1: the largest non-NaN value (NaN lanes become -inf; x == x is false only for NaN).
  auto vmax = hn::Set(d, lowest);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    vmax = hn::Max(vmax, hn::IfThenElse(hn::Eq(v, v), v, hn::Set(d, lowest)));
  }
  T max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  // Pass 2: the first element equal to it.
  const auto target = hn::Set(d, max);
  for (i = 0; i + lanes <= n; i += lanes) {
    const intptr_t lane = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, x + i), target));
    if (lane >= 0) return i + static_cast<size_t>(lane);
  }
  for (; i < n; ++i) {
    if (x[i] == max) return i;
  }
  return 0;
}

// Residual-stream add; bit-identical to scalar::add_inplace.
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

// RMSNorm: same formula and operation order as scalar::rms_norm; only the order of the sum of
// squares differs (lanes, then the tail).
template <typename T>
HWY_INLINE T SumOfSquares(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    acc = hn::Add(acc, hn::Mul(v, v));
  }
  T sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

// out may alias x: each element is read before its own store, and no other element is read later.
template <typename T>
HWY_INLINE void RmsNorm(const T* x, const T* HWY_RESTRICT weight, size_t n, T eps, T* out) {
  const T inv = T(1) / std::sqrt(SumOfSquares(x, n) / static_cast<T>(n) + eps);
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const auto vinv = hn::Set(d, inv);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(hn::LoadU(d, weight + i), hn::Mul(hn::LoadU(d, x + i), vinv)), d, out + i);
  }
  for (; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

// Rotate-half RoPE: separate multiply and subtract/add, so every target produces the same bits as
// scalar::rope_rotate_half.
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

// SiLU(gate) · up with the overflow-free form of scalar::silu_mul (e = exp(-|g|) <= 1). Only Exp
// differs from the scalar version (contrib Exp vs std::exp).
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

// Largest value of x[0..n), n >= 1 (no NaN: the caller's inputs are finite).
template <typename T>
HWY_INLINE T MaxValue(const T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  T max = x[0];
  size_t i = 0;
  if (n >= lanes) {
    auto vmax = hn::LoadU(d, x);
    for (i = lanes; i + lanes <= n; i += lanes) vmax = hn::Max(vmax, hn::LoadU(d, x + i));
    max = hn::GetLane(hn::MaxOfLanes(d, vmax));
  }
  for (; i < n; ++i) max = x[i] > max ? x[i] : max;
  return max;
}

// Softmax. exp is Highway's contrib Exp (documented max error 1 ulp in float and double;
// arguments here are <= 0, inside its valid range). The max is exact; the sum's order differs
// from scalar::softmax.
template <typename T>
HWY_INLINE void Softmax(T* HWY_RESTRICT x, size_t n) {
  const hn::ScalableTag<T> d;
  const size_t lanes = hn::Lanes(d);
  const T max = MaxValue(x, n);
  const auto vmax = hn::Set(d, max);
  auto vsum = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + i), vmax));
    hn::StoreU(e, d, x + i);
    vsum = hn::Add(vsum, e);
  }
  T sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const auto vdenominator = hn::Set(d, sum);
  for (i = 0; i + lanes <= n; i += lanes) hn::StoreU(hn::Div(hn::LoadU(d, x + i), vdenominator), d, x + i);
  for (; i < n; ++i) x[i] = x[i] / sum;
}

// HWY_EXPORT needs plain (non-template) functions: one per op and element type.
void RmsNormF32(const float* x, const float* w, size_t n, float eps, float* out) { RmsNorm(x, w, n, eps, out); }
void RmsNormF64(const double* x, const double* w, size_t n, double eps, double* out) { RmsNorm(x, w, n, eps, out); }
void RopeF32(float* x, const float* c, const float* s, size_t half) { RopeRotateHalf(x, c, s, half); }
void RopeF64(double* x, const double* c, const double* s, size_t half) { RopeRotateHalf(x, c, s, half); }
void SoftmaxF32(float* x, size_t n) { Softmax(x, n); }
void SoftmaxF64(double* x, size_t n) { Softmax(x, n); }
void SiluMulF32(const float* g, const float* u, size_t n, float* out) { SiluMul(g, u, n, out); }
void SiluMulF64(const double* g, const double* u, size_t n, double* out) { SiluMul(g, u, n, out); }
void AddF32(float* acc, const float* x, size_t n) { AddInplace(acc, x, n); }
void AddF64(double* acc, const double* x, size_t n) { AddInplace(acc, x, n); }
size_t ArgmaxF32(const float* x, size_t n) { return Argmax(x, n); }
size_t ArgmaxF64(const double* x, size_t n) { return Argmax(x, n); }
int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace dflash
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dflash {
namespace ops {

HWY_EXPORT(RmsNormF32);
HWY_EXPORT(RmsNormF64);
HWY_EXPORT(RopeF32);
HWY_EXPORT(RopeF64);
HWY_EXPORT(SoftmaxF32);
HWY_EXPORT(SoftmaxF64);
HWY_EXPORT(SiluMulF32);
HWY_EXPORT(SiluMulF64);
HWY_EXPORT(AddF32);
HWY_EXPORT(AddF64);
HWY_EXPORT(ArgmaxF32);
HWY_EXPORT(ArgmaxF64);
HWY_EXPORT(CompiledTarget);

void rms_norm(const float* x, const float* w, size_t n, float eps, float* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormF32)(x, w, n, eps, out);
}
void rms_norm(const double* x, const double* w, size_t n, double eps, double* out) {
  HWY_DYNAMIC_DISPATCH(RmsNormF64)(x, w, n, eps, out);
}
void rope_rotate_half(float* x, const float* c, const float* s, size_t half) { HWY_DYNAMIC_DISPATCH(RopeF32)(x, c, s, half); }
void rope_rotate_half(double* x, const double* c, const double* s, size_t half) {
  HWY_DYNAMIC_DISPATCH(RopeF64)(x, c, s, half);
}
void softmax(float* x, size_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxF32)(x, n); }
void softmax(double* x, size_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxF64)(x, n); }
void silu_mul(const float* g, const float* u, size_t n, float* out) { HWY_DYNAMIC_DISPATCH(SiluMulF32)(g, u, n, out); }
void silu_mul(const double* g, const double* u, size_t n, double* out) { HWY_DYNAMIC_DISPATCH(SiluMulF64)(g, u, n, out); }
void add_inplace(float* acc, const float* x, size_t n) { HWY_DYNAMIC_DISPATCH(AddF32)(acc, x, n); }
void add_inplace(double* acc, const double* x, size_t n) { HWY_DYNAMIC_DISPATCH(AddF64)(acc, x, n); }
size_t argmax(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(ArgmaxF32)(x, n); }
size_t argmax(const double* x, size_t n) { return HWY_DYNAMIC_DISPATCH(ArgmaxF64)(x, n); }

const char* dispatch_target_name() { return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CompiledTarget)()); }

}  // namespace ops
}  // namespace dflash
#endif  // HWY_ONCE
