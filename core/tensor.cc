#include "core/tensor.h"

#include <cmath>

namespace dflash {

Tensor Tensor::zeros(std::vector<int64_t> shape) {
  Tensor t;
  t.shape = std::move(shape);
  t.values.assign(static_cast<size_t>(t.numel()), 0.0f);
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Tensor::cols() const { return shape.empty() ? 1 : shape.back(); }

int64_t Tensor::rows() const {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t first_non_finite(const float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return -1;
}

}  // namespace dflash
