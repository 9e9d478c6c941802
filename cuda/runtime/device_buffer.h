// Owning device and pinned-host allocations (RAII), zero-filled at allocation so that padding
// columns and never-written tails read as zeros.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cuda/runtime/cuda_check.h"

namespace dflash {

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) { allocate(count); }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }

  void allocate(size_t count) {
    reset();
    if (count == 0) return;
    DFLASH_CUDA_CHECK(DFLASH_INJECTED_FAILURE(kAlloc) ? cudaErrorMemoryAllocation
                                                             : cudaMalloc(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    count_ = count;
    DFLASH_CUDA_CHECK(cudaMemset(data_, 0, count * sizeof(T)));
    // The memset runs on the legacy default stream, which non-blocking streams do not wait for.
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  void reset() {
    if (data_ != nullptr) cudaFree(data_);  // never throws from a destructor
    data_ = nullptr;
    count_ = 0;
  }

  T* get() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t count) { allocate(count); }
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void allocate(size_t count) {
    reset();
    if (count == 0) return;
    DFLASH_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), count * sizeof(T)));
    count_ = count;
    std::memset(static_cast<void*>(data_), 0, count * sizeof(T));
  }
  void reset() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    count_ = 0;
  }

  T* get() const { return data_; }
  size_t size() const { return count_; }

 private:
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace dflash
