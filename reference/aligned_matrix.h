// Row-major matrices whose every row starts on a 64-byte boundary (the row stride is padded), so
// a GEMV sees the same alignment for a row whatever its index or the matrix's row count: one of
// the conditions for results that do not depend on batch composition (docs/spec/drafter.md §5).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace dflash {

constexpr size_t kRowAlignmentBytes = 64;

template <typename T>
class AlignedMatrix {
 public:
  AlignedMatrix() = default;
  AlignedMatrix(int64_t rows, int64_t cols) { resize(rows, cols); }
  AlignedMatrix(const AlignedMatrix& other) { *this = other; }
  AlignedMatrix(AlignedMatrix&& other) noexcept { swap(other); }
  AlignedMatrix& operator=(const AlignedMatrix& other) {
    if (this != &other) {
      resize(other.rows_, other.cols_);
      if (capacity_) std::memcpy(data_, other.data_, static_cast<size_t>(rows_ * stride_) * sizeof(T));
    }
    return *this;
  }
  AlignedMatrix& operator=(AlignedMatrix&& other) noexcept {
    swap(other);
    return *this;
  }
  ~AlignedMatrix() { std::free(data_); }

  // Reshapes to rows × cols, zero-filled.
  void resize(int64_t rows, int64_t cols) {
    constexpr int64_t per_line = static_cast<int64_t>(kRowAlignmentBytes / sizeof(T));
    const int64_t stride = (cols + per_line - 1) / per_line * per_line;
    const size_t bytes = static_cast<size_t>(rows * stride) * sizeof(T);
    if (bytes > capacity_) {
      std::free(data_);
      data_ = nullptr;
      capacity_ = 0;
      const size_t rounded = (bytes + kRowAlignmentBytes - 1) / kRowAlignmentBytes * kRowAlignmentBytes;
      data_ = static_cast<T*>(std::aligned_alloc(kRowAlignmentBytes, rounded));
      if (!data_) throw std::bad_alloc();
      capacity_ = rounded;
    }
    rows_ = rows;
    cols_ = cols;
    stride_ = stride;
    if (bytes) std::memset(static_cast<void*>(data_), 0, bytes);
  }

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t stride() const { return stride_; }
  T* row(int64_t r) { return data_ + r * stride_; }
  const T* row(int64_t r) const { return data_ + r * stride_; }

 private:
  void swap(AlignedMatrix& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(capacity_, other.capacity_);
    std::swap(rows_, other.rows_);
    std::swap(cols_, other.cols_);
    std::swap(stride_, other.stride_);
  }

  T* data_ = nullptr;
  size_t capacity_ = 0;  // bytes allocated
  int64_t rows_ = 0, cols_ = 0, stride_ = 0;
};

}  // namespace dflash
