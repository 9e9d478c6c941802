// The byte layout of the messages between the harness and an isolated plugin's child process
// (plugin/isolated_drafter.h): little-endian host values appended in order, read back with every
// length checked. Both ends are this harness binary, so there is no versioning inside a run.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dflash {

class WireWriter {
 public:
  template <class T>
  void put(T value) {
    static_assert(std::is_trivially_copyable<T>::value, "put: plain values only");
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  void put_string(const std::string& s);
  void put_tensor(const Tensor& t);
  template <class T>
  void put_vector(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class WireReader {
 public:
  WireReader(const char* data, size_t size) : data_(data), size_(size) {}
  template <class T>
  T get() {
    T value;
    std::memcpy(&value, take(sizeof value), sizeof value);
    return value;
  }
  std::string get_string();
  Tensor get_tensor();
  template <class T>
  std::vector<T> get_vector() {
    const uint64_t n = get<uint64_t>();
    if (n > (size_ - at_) / sizeof(T)) fail();
    std::vector<T> v(n);
    std::memcpy(v.data(), take(n * sizeof(T)), n * sizeof(T));
    return v;
  }

 private:
  const char* take(size_t n);
  [[noreturn]] void fail() const;
  const char* data_;
  size_t size_, at_ = 0;
};

}  // namespace dflash
