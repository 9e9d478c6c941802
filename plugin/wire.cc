#include "plugin/wire.h"

#include "core/error.h"

namespace dflash {

void WireWriter::put_string(const std::string& s) {
  put<uint64_t>(s.size());
  bytes_ += s;
}

void WireWriter::put_tensor(const Tensor& t) {
  put_vector(t.shape);
  put_vector(t.values);
}

std::string WireReader::get_string() {
  const uint64_t n = get<uint64_t>();
  if (n > size_ - at_) fail();
  return std::string(take(n), n);
}

Tensor WireReader::get_tensor() {
  std::vector<int64_t> shape = get_vector<int64_t>();
  std::vector<float> values = get_vector<float>();
  return Tensor(std::move(shape), std::move(values));
}

const char* WireReader::take(size_t n) {
  if (n > size_ - at_) fail();
  const char* p = data_ + at_;
  at_ += n;
  return p;
}

void WireReader::fail() const {
  throw internal_error("plugin isolation: a message of " + std::to_string(size_) + " bytes ends early at byte " +
                       std::to_string(at_));
}

}  // namespace dflash
