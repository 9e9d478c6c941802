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

std::string element_location(const std::vector<int64_t>& shape, int64_t flat) {
  if (shape.size() < 2) return "index " + std::to_string(flat);
  const int64_t cols = shape.back();
  if (cols <= 0) return "index " + std::to_string(flat);
  std::string text = "row " + std::to_string(flat / cols) + ", column " + std::to_string(flat % cols);
  if (shape.size() == 2) return text;
  std::vector<int64_t> index(shape.size());
  int64_t rest = flat;
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = shape[d] > 0 ? rest % shape[d] : 0;
    rest = shape[d] > 0 ? rest / shape[d] : 0;
  }
  return text + " (index " + shape_string(index) + ")";
}

int64_t first_non_finite(const float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return -1;
}

}  // namespace dflash
