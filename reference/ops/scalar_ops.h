// Plain scalar versions of the elementwise ops (the same formulas as the Highway kernels in
// ops.cc, one element at a time). They are what the Highway kernels are tested against on every
// target, and they document the exact operation order each kernel follows.
#pragma once
#include <cmath>
#include <cstddef>
#include <limits>

namespace dflash {
namespace scalar {

// out[i] = w[i] · (x[i] · (1 / sqrt(mean(x²) + eps))), Hugging Face's RMSNorm order (weight w, not
// 1 + w). out may alias x.
template <typename T>
void rms_norm(const T* x, const T* weight, size_t n, T eps, T* out) {
  T sum = 0;
  for (size_t i = 0; i < n; ++i) sum += x[i] * x[i];
  const T inv = T(1) / std::sqrt(sum / static_cast<T>(n) + eps);
  for (size_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

// Rotate-half (NeoX) RoPE of one head of width 2·half, in place:
//   x[j]      ← x[j]·cos[j] − x[j+half]·sin[j]
//   x[j+half] ← x[j+half]·cos[j] + x[j]·sin[j]
// (upstream q·cos + rotate_half(q)·sin with cos/sin repeated over both halves).
template <typename T>
void rope_rotate_half(T* x, const T* cos, const T* sin, size_t half) {
  for (size_t j = 0; j < half; ++j) {
    const T a = x[j], b = x[j + half];
    x[j] = a * cos[j] - b * sin[j];
    x[j + half] = b * cos[j] + a * sin[j];
  }
}

// In-place softmax: x ← exp(x − max) / Σ exp(x − max). n ≥ 1, no NaN.
template <typename T>
void softmax(T* x, size_t n) {
  T max = x[0];
  for (size_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  T sum = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  for (size_t i = 0; i < n; ++i) x[i] = x[i] / sum;
}

// out[i] = silu(gate[i]) · up[i] (out may alias gate or up). silu(g) = g·sigmoid(g) evaluated with e = exp(−|g|) ∈ (0, 1],
// so exp never overflows: g ≥ 0: g / (1 + e); g < 0: (g·e) / (1 + e).
template <typename T>
void silu_mul(const T* gate, const T* up, size_t n, T* out) {
  for (size_t i = 0; i < n; ++i) {
    const T g = gate[i];
    const T e = std::exp(-std::fabs(g));
    const T numerator = g < T(0) ? g * e : g;
    out[i] = (numerator / (T(1) + e)) * up[i];
  }
}

// acc[i] += x[i] (the residual stream update).
template <typename T>
void add_inplace(T* acc, const T* x, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = acc[i] + x[i];
}

// Lowest index of the largest value; NaN entries never win; all NaN (or n = 0) gives 0.
template <typename T>
size_t argmax(const T* x, size_t n) {
  T max = -std::numeric_limits<T>::infinity();
  for (size_t i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
  for (size_t i = 0; i < n; ++i) {
    if (x[i] == max) return i;
  }
  return 0;
}

}  // namespace scalar
}  // namespace dflash
