// safetensors files: a memory-mapped, validated reader and a writer. Layout: 8-byte little-endian
// header length N, N bytes of JSON header {name: {dtype, shape, data_offsets: [begin, end]}, ...,
// "__metadata__": {str: str}}, then the data area. Validation before use: header inside the file,
// offsets inside the data area, in order and non-overlapping, byte span = numel × dtype size,
// no duplicate names, known dtypes. Every error names the file and, where there is one, the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace dflash {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // offsets inside the data area
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates the file; throws HarnessError(kBadInput) naming the file on any defect.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // error naming file and tensor if absent
  std::vector<std::string> names() const;                  // in data-offset order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const uint8_t* data(const std::string& name) const;      // raw little-endian bytes

  // The tensor converted exactly to float (BF16, F16, F32; F64 rounds; I32/I64/F8 are refused).
  Tensor read_float(const std::string& name) const;
  // An integer tensor (I32 or I64) as int64 values.
  std::vector<int64_t> read_int(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* mapping_ = nullptr;
  size_t mapped_size_ = 0;
  const uint8_t* data_area_ = nullptr;
  std::map<std::string, size_t> index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors in the order given; data kept aligned to 8 bytes.
struct TensorToWrite {
  std::string name;
  DType dtype;                // BF16, F16, F32, I32, I64 or F8_E4M3
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes; // little-endian, numel × dtype size
};
TensorToWrite make_f32_tensor(const std::string& name, const Tensor& t);
TensorToWrite make_bf16_tensor(const std::string& name, const Tensor& t);  // values rounded to bf16
TensorToWrite make_i32_tensor(const std::string& name, const std::vector<int64_t>& shape,
                              const std::vector<int32_t>& values);
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A checkpoint that may be one file or sharded (model.safetensors.index.json + shards): resolves a
// tensor name to its file. `path` is a .safetensors file, an index .json, or a directory holding
// model.safetensors or model.safetensors.index.json.
class TensorStore {
 public:
  static TensorStore open(const std::string& path);
  bool has(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;  // error naming the store if absent
  std::vector<std::string> names() const;
  const std::string& description() const { return description_; }  // the path, for messages

 private:
  std::string description_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;
};

}  // namespace dflash
