// Host tensors of float values, row-major. Everything the harness compares (inputs, logits, taps)
// passes through this type; bf16 and f32 inputs convert into it exactly.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dflash {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> values;

  Tensor() = default;
  Tensor(std::vector<int64_t> shape_in, std::vector<float> values_in)
      : shape(std::move(shape_in)), values(std::move(values_in)) {}
  static Tensor zeros(std::vector<int64_t> shape);

  int64_t numel() const;
  // A 2-D view: rows = product of all leading dims, cols = last dim (1-D tensors are one row).
  int64_t rows() const;
  int64_t cols() const;
  const float* row(int64_t r) const { return values.data() + r * cols(); }
  float* row(int64_t r) { return values.data() + r * cols(); }
};

// "[8, 400]"
std::string shape_string(const std::vector<int64_t>& shape);

// Index of the first NaN or Inf in values, or -1.
int64_t first_non_finite(const float* values, int64_t count);

// Where element `flat` (row-major) of a tensor of `shape` sits, in the 2-D view every report uses:
// "index 17" (1-D), "row 3, column 17" (2-D), "row 7, column 17 (index [1, 3, 17])" (more dims).
std::string element_location(const std::vector<int64_t>& shape, int64_t flat);

}  // namespace dflash
