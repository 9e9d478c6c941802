#include "tests/cli/fixture_surgery.h"

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/safetensors.h"

namespace dflash::cli_test {

namespace fs = std::filesystem;

void copy_fixture(const std::string& source, const std::string& destination) {
  fs::remove_all(destination);
  fs::copy(source, destination, fs::copy_options::recursive);
  for (const auto& entry : fs::recursive_directory_iterator(destination)) {
    fs::permissions(entry.path(), fs::perms::owner_write, fs::perm_options::add);
  }
}

void edit_trace_tensor(const std::string& dir, const std::string& name,
                       const std::function<void(std::vector<float>&)>& edit_f32,
                       const std::function<void(std::vector<int32_t>&)>& edit_i32) {
  const std::string path = dir + "/trace.safetensors";
  std::vector<TensorToWrite> tensors;
  bool found = false;
  {
    auto file = SafetensorsFile::open(path);
    for (const std::string& tensor : file->names()) {
      const TensorInfo& info = file->info(tensor);
      TensorToWrite t{tensor, info.dtype, info.shape,
                      std::vector<uint8_t>(file->data(tensor), file->data(tensor) + (info.end - info.begin))};
      if (tensor == name) {
        found = true;
        if (info.dtype == DType::kF32 && edit_f32) {
          std::vector<float> values(t.bytes.size() / 4);
          std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
          edit_f32(values);
          std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
        } else if (info.dtype == DType::kI32 && edit_i32) {
          std::vector<int32_t> values(t.bytes.size() / 4);
          std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
          edit_i32(values);
          std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
        } else {
          throw internal_error("edit_trace_tensor: no edit for the dtype of '" + name + "'");
        }
      }
      tensors.push_back(std::move(t));
    }
  }
  if (!found) throw internal_error("edit_trace_tensor: " + path + " has no tensor '" + name + "'");
  write_safetensors(path, tensors);
}

}  // namespace dflash::cli_test
