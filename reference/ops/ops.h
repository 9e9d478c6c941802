// Elementwise ops of the reference drafter, in float and double, through Highway's dynamic
// dispatch (the best target this CPU supports; tests force every compiled target). Each op has a
// scalar twin in scalar_ops.h that defines its exact formula.
//
// Accuracy against the scalar twins (tested on every target, ops_test.cc):
//   add_inplace, rope_rotate_half, argmax: bit-identical.
//   rms_norm, softmax: differ only in the order of one sum (lanes, then tail).
//   silu_mul, softmax: exp is Highway's contrib Exp (max error 1 ulp in float and double) where the
//     scalar twin calls std::exp. In fp64 mode that is ~1e-16 relative, far inside the 1e-6 budget
//     against the float64 oracle, so no op needs a slower exact path.
#pragma once
#include <cstddef>

namespace dflash {
namespace ops {

void rms_norm(const float* x, const float* weight, size_t n, float eps, float* out);
void rms_norm(const double* x, const double* weight, size_t n, double eps, double* out);

void rope_rotate_half(float* x, const float* cos, const float* sin, size_t half);
void rope_rotate_half(double* x, const double* cos, const double* sin, size_t half);

void softmax(float* x, size_t n);
void softmax(double* x, size_t n);

void silu_mul(const float* gate, const float* up, size_t n, float* out);
void silu_mul(const double* gate, const double* up, size_t n, double* out);

void add_inplace(float* acc, const float* x, size_t n);
void add_inplace(double* acc, const double* x, size_t n);

size_t argmax(const float* x, size_t n);
size_t argmax(const double* x, size_t n);

// Name of the Highway target the dispatch picks now ("AVX3", "AVX2", "EMU128", ...).
const char* dispatch_target_name();

}  // namespace ops
}  // namespace dflash
