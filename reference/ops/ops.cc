// Instantiates every op of ops.h once per Highway target (foreach_target.h re-includes this file
// for each) and dispatches to the best supported one at run time.
#include "reference/ops/ops.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "reference/ops/ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"
#include "reference/ops/argmax-inl.h"
#include "reference/ops/residual-inl.h"
#include "reference/ops/rmsnorm-inl.h"
#include "reference/ops/rope-inl.h"
#include "reference/ops/silu_mul-inl.h"
#include "reference/ops/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace dflash {
namespace HWY_NAMESPACE {

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
