// Fuzz target: a sharded checkpoint (model.safetensors.index.json and two shards). The input is
// three parts, each but the last preceded by its length as 4 little-endian bytes: the index JSON,
// shard a.safetensors, then shard b.safetensors (the rest).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

// The next length-prefixed part of [*data, *data + *size), clamped to what is left.
std::pair<const uint8_t*, size_t> take_part(const uint8_t** data, size_t* size) {
  uint32_t length = 0;
  if (*size >= 4) {
    std::memcpy(&length, *data, 4);
    *data += 4;
    *size -= 4;
  }
  const size_t taken = std::min<size_t>(length, *size);
  const std::pair<const uint8_t*, size_t> part{*data, taken};
  *data += taken;
  *size -= taken;
  return part;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dflash;
  const auto dir = fuzz::scratch();
  const auto index = take_part(&data, &size);
  const auto shard_a = take_part(&data, &size);
  fuzz::write_file(dir / "model.safetensors.index.json", index.first, index.second);
  fuzz::write_file(dir / "a.safetensors", shard_a.first, shard_a.second);
  fuzz::write_file(dir / "b.safetensors", data, size);
  fuzz::refuse_or_accept([&] {
    const TensorStore store = TensorStore::open(dir.string());
    for (const std::string& name : store.names()) {
      const SafetensorsFile& file = store.file_of(name);
      fuzz::refuse_or_accept([&] { file.read_float(name); });
    }
  });
  return 0;
}
