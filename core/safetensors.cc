#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/json_file.h"
#include "core/limits.h"

namespace dflash {

// Safetensors data is little-endian; every conversion below copies bytes as they are.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace {

namespace fs = std::filesystem;

std::string in_quotes(const std::string& name) { return "'" + name + "'"; }

// A JSON integer >= 0; false for anything else (negative, fractional, not a number).
bool json_to_non_negative(const nlohmann::json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

// Parses and checks one header entry; `data_size` bounds its offsets.
TensorInfo parse_entry(const std::string& where, const std::string& name, const nlohmann::json& entry,
                       uint64_t data_size) {
  const std::string tensor = where + ": tensor " + in_quotes(name);
  if (!entry.is_object()) throw bad_input(tensor + ": header entry is not a JSON object");
  for (const auto& item : entry.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets") {
      throw bad_input(tensor + ": unknown header field " + in_quotes(item.key()));
    }
  }
  TensorInfo info;
  info.name = name;

  if (!entry.contains("dtype")) throw bad_input(tensor + ": header entry has no 'dtype'");
  const auto& dtype = entry["dtype"];
  if (!dtype.is_string()) throw bad_input(tensor + ": 'dtype' is not a string");
  if (!parse_dtype(dtype.get<std::string>(), &info.dtype)) {
    throw bad_input(tensor + ": unsupported dtype " + in_quotes(dtype.get<std::string>()) +
                    " (supported: BF16, F16, F32, F64, I32, I64, F8_E4M3, U8)");
  }

  if (!entry.contains("shape")) throw bad_input(tensor + ": header entry has no 'shape'");
  const auto& shape = entry["shape"];
  if (!shape.is_array()) throw bad_input(tensor + ": 'shape' is not an array");
  limits::check_at_most(tensor + ": rank of 'shape'", static_cast<int64_t>(shape.size()), limits::kTensorRank);
  uint64_t numel = 1;
  bool numel_overflows = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const auto& dim = shape[i];
    if (dim.is_number_integer() && !dim.is_number_unsigned() && dim.get<int64_t>() < 0) {
      throw bad_input(tensor + ": negative dimension " + std::to_string(dim.get<int64_t>()) + " at index " +
                      std::to_string(i) + " of 'shape'");
    }
    uint64_t d = 0;
    if (!json_to_non_negative(dim, &d)) {
      throw bad_input(tensor + ": dimension " + std::to_string(i) + " of 'shape' is not an integer (" + dim.dump() +
                      ")");
    }
    if (d > static_cast<uint64_t>(limits::kTensorDim)) {
      throw bad_input(tensor + ": dimension " + std::to_string(i) + " of 'shape' = " + dim.dump() +
                      " exceeds the limit " + std::to_string(limits::kTensorDim) + " (docs/limits.md)");
    }
    info.shape.push_back(static_cast<int64_t>(d));
    // Every partial product must fit in int64: TensorInfo::numel() forms the same ones.
    if (__builtin_mul_overflow(numel, d, &numel) || numel > static_cast<uint64_t>(INT64_MAX)) numel_overflows = true;
  }

  if (!entry.contains("data_offsets")) throw bad_input(tensor + ": header entry has no 'data_offsets'");
  const auto& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !json_to_non_negative(offsets[0], &info.begin) ||
      !json_to_non_negative(offsets[1], &info.end)) {
    throw bad_input(tensor + ": 'data_offsets' must be two non-negative integers [begin, end], got " + offsets.dump());
  }
  if (info.begin > info.end) {
    throw bad_input(tensor + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                    "] end before they begin");
  }
  if (info.end > data_size) {
    throw bad_input(tensor + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                    "] out of range: the data area holds " + std::to_string(data_size) + " bytes");
  }
  uint64_t bytes = 0;
  if (numel_overflows || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(info.dtype)), &bytes) ||
      bytes != info.end - info.begin) {
    throw bad_input(
        tensor + ": byte span " + std::to_string(info.end - info.begin) + " of data_offsets does not match shape " +
        shape_string(info.shape) + " x " + std::to_string(dtype_size(info.dtype)) + " bytes (" +
        dtype_name(info.dtype) + ")" +
        (numel_overflows ? std::string(": the element count overflows") : ", which needs " + std::to_string(bytes)));
  }
  return info;
}

template <class T>
T load_le(const uint8_t* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;

  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw bad_input(path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw bad_input(path + ": not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    throw bad_input(path + ": file is " + std::to_string(size) +
                    " bytes, too short for the 8-byte header length of a safetensors file (truncated?)");
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) throw bad_input(path + ": mmap failed (" + std::strerror(errno) + ")");
  file->mapping_ = mapping;
  file->mapped_size_ = size;
  const uint8_t* bytes = static_cast<const uint8_t*>(mapping);

  const uint64_t header_length = load_le<uint64_t>(bytes);
  if (header_length > size - 8) {
    throw bad_input(path + ": header length " + std::to_string(header_length) + " runs past the end of the file (" +
                    std::to_string(size) + " bytes; truncated or not a safetensors file)");
  }
  if (header_length > limits::kHeaderBytes) {
    throw bad_input(path + ": header length " + std::to_string(header_length) + " exceeds the limit " +
                    std::to_string(limits::kHeaderBytes) + " bytes (docs/limits.md)");
  }
  const std::string header_text(reinterpret_cast<const char*>(bytes + 8), header_length);
  const nlohmann::json header = parse_json_strict(header_text, path + ": header");
  if (!header.is_object()) throw bad_input(path + ": header is not a JSON object");

  file->data_area_ = bytes + 8 + header_length;
  const uint64_t data_size = size - 8 - header_length;
  for (const auto& item : header.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object()) throw bad_input(path + ": '__metadata__' is not a JSON object");
      for (const auto& meta : item.value().items()) {
        if (!meta.value().is_string()) {
          throw bad_input(path + ": '__metadata__' entry " + in_quotes(meta.key()) +
                          " is not a string (must be str -> str)");
        }
        file->metadata_[meta.key()] = meta.value().get<std::string>();
      }
      continue;
    }
    file->tensors_.push_back(parse_entry(path, item.key(), item.value(), data_size));
  }

  // Sorted by where the bytes lie; gaps are allowed by the format, overlaps are not. Empty
  // tensors occupy no bytes and cannot overlap anything.
  std::sort(file->tensors_.begin(), file->tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& info : file->tensors_) {
    if (info.begin == info.end) continue;
    if (previous && info.begin < previous->end) {
      throw bad_input(path + ": tensors " + in_quotes(previous->name) + " [" + std::to_string(previous->begin) + ", " +
                      std::to_string(previous->end) + ") and " + in_quotes(info.name) + " [" +
                      std::to_string(info.begin) + ", " + std::to_string(info.end) + ") have overlapping data_offsets");
    }
    previous = &info;
  }
  for (size_t i = 0; i < file->tensors_.size(); ++i) file->index_[file->tensors_[i].name] = i;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_) ::munmap(mapping_, mapped_size_);
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw bad_input(path_ + ": no tensor " + in_quotes(name));
  return tensors_[it->second];
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const TensorInfo& info : tensors_) out.push_back(info.name);
  return out;
}

const uint8_t* SafetensorsFile::data(const std::string& name) const { return data_area_ + info(name).begin; }

Tensor SafetensorsFile::read_float(const std::string& name) const {
  const TensorInfo& meta = info(name);
  const uint8_t* bytes = data(name);
  const int64_t n = meta.numel();
  Tensor out(meta.shape, std::vector<float>(static_cast<size_t>(n)));
  float* dst = out.values.data();
  switch (meta.dtype) {
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(load_le<uint16_t>(bytes + 2 * i));
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_bits_to_float(load_le<uint16_t>(bytes + 2 * i));
      break;
    case DType::kF32:
      if (n > 0) std::memcpy(dst, bytes, static_cast<size_t>(n) * 4);
      break;
    case DType::kF64:
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load_le<double>(bytes + 8 * i));
      break;
    default:
      throw bad_input(path_ + ": tensor " + in_quotes(name) + " has dtype " + dtype_name(meta.dtype) +
                      "; a floating-point tensor (BF16, F16, F32 or F64) was expected");
  }
  return out;
}

std::vector<int64_t> SafetensorsFile::read_int(const std::string& name) const {
  const TensorInfo& meta = info(name);
  const uint8_t* bytes = data(name);
  const int64_t n = meta.numel();
  std::vector<int64_t> out(static_cast<size_t>(n));
  if (meta.dtype == DType::kI32) {
    for (int64_t i = 0; i < n; ++i) out[i] = load_le<int32_t>(bytes + 4 * i);
  } else if (meta.dtype == DType::kI64) {
    for (int64_t i = 0; i < n; ++i) out[i] = load_le<int64_t>(bytes + 8 * i);
  } else {
    throw bad_input(path_ + ": tensor " + in_quotes(name) + " has dtype " + dtype_name(meta.dtype) +
                    "; an integer tensor (I32 or I64) was expected");
  }
  return out;
}

// ---- writer ----

TensorToWrite make_f32_tensor(const std::string& name, const Tensor& t) {
  if (static_cast<int64_t>(t.values.size()) != t.numel()) {
    throw internal_error("make_f32_tensor " + in_quotes(name) + ": " + std::to_string(t.values.size()) +
                         " values for shape " + shape_string(t.shape));
  }
  TensorToWrite out{name, DType::kF32, t.shape, std::vector<uint8_t>(t.values.size() * 4)};
  if (!t.values.empty()) std::memcpy(out.bytes.data(), t.values.data(), out.bytes.size());
  return out;
}

TensorToWrite make_bf16_tensor(const std::string& name, const Tensor& t) {
  if (static_cast<int64_t>(t.values.size()) != t.numel()) {
    throw internal_error("make_bf16_tensor " + in_quotes(name) + ": " + std::to_string(t.values.size()) +
                         " values for shape " + shape_string(t.shape));
  }
  TensorToWrite out{name, DType::kBF16, t.shape, std::vector<uint8_t>(t.values.size() * 2)};
  for (size_t i = 0; i < t.values.size(); ++i) {
    const uint16_t bits = float_to_bf16_bits(t.values[i]);
    std::memcpy(out.bytes.data() + 2 * i, &bits, 2);
  }
  return out;
}

TensorToWrite make_i32_tensor(const std::string& name, const std::vector<int64_t>& shape,
                              const std::vector<int32_t>& values) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel != static_cast<int64_t>(values.size())) {
    throw internal_error("make_i32_tensor " + in_quotes(name) + ": " + std::to_string(values.size()) +
                         " values for shape " + shape_string(shape));
  }
  TensorToWrite out{name, DType::kI32, shape, std::vector<uint8_t>(values.size() * 4)};
  if (!values.empty()) std::memcpy(out.bytes.data(), values.data(), out.bytes.size());
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the header in the given order, as the data area is.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw internal_error(path + ": invalid tensor name " + in_quotes(t.name));
    if (header.contains(t.name)) throw internal_error(path + ": tensor " + in_quotes(t.name) + " written twice");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw internal_error(path + ": tensor " + in_quotes(t.name) + " has a negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * dtype_size(t.dtype) != t.bytes.size()) {
      throw internal_error(path + ": tensor " + in_quotes(t.name) + " has " + std::to_string(t.bytes.size()) +
                           " bytes for shape " + shape_string(t.shape) + " of " + dtype_name(t.dtype));
    }
    header[t.name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string header_text = header.dump();
  // Spaces pad the header so the data area starts on an 8-byte boundary (as the format advises).
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  // Written beside the destination and renamed, so a failed write never leaves a half file.
  const std::string temporary = path + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw bad_input(path + ": cannot create the file");
    const uint64_t length = header_text.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
    for (const TensorToWrite& t : tensors) {
      out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    }
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      throw bad_input(path + ": write failed");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw bad_input(path + ": cannot move the written file into place (" + std::strerror(errno) + ")");
  }
}

// ---- sharded checkpoints ----

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

TensorStore TensorStore::open(const std::string& path) {
  TensorStore store;
  store.description_ = path;
  std::string file_path = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    const bool has_single = fs::exists(dir / kSingleName, ec);
    const bool has_index = fs::exists(dir / kIndexName, ec);
    if (has_single && has_index) {
      throw bad_input(path + ": holds both " + kSingleName + " and " + kIndexName +
                      "; which one is the checkpoint is ambiguous");
    }
    if (!has_single && !has_index)
      throw bad_input(path + ": holds neither " + std::string(kSingleName) + " nor " + kIndexName);
    file_path = (dir / (has_single ? kSingleName : kIndexName)).string();
  } else if (!fs::exists(path, ec)) {
    throw bad_input(path + ": no such file or directory");
  }

  if (!ends_with(file_path, ".json")) {
    auto file = SafetensorsFile::open(file_path);
    for (const std::string& name : file->names()) store.by_name_[name] = file;
    return store;
  }

  // A sharded checkpoint: weight_map maps each tensor to a shard beside the index.
  const nlohmann::json index = read_json_file_strict(file_path);
  if (!index.is_object()) throw bad_input(file_path + ": not a JSON object");
  if (!index.contains("weight_map")) throw bad_input(file_path + ": missing 'weight_map'");
  const auto& weight_map = index["weight_map"];
  if (!weight_map.is_object())
    throw bad_input(file_path + ": 'weight_map' is not an object (tensor name -> shard file)");
  const fs::path base = fs::path(file_path).parent_path();
  std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
  std::map<std::string, std::set<std::string>> names_per_shard;
  for (const auto& item : weight_map.items()) {
    if (!item.value().is_string()) {
      throw bad_input(file_path + ": weight_map entry " + in_quotes(item.key()) + " is not a string (shard file name)");
    }
    const std::string shard = item.value().get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      throw bad_input(file_path + ": weight_map maps tensor " + in_quotes(item.key()) + " to " + in_quotes(shard) +
                      ", which is not a file name beside the index");
    }
    auto it = shards.find(shard);
    if (it == shards.end()) {
      const fs::path shard_path = base / shard;
      if (!fs::is_regular_file(shard_path, ec)) {
        throw bad_input(file_path + ": shard " + in_quotes(shard) + " (mapped for tensor " + in_quotes(item.key()) +
                        ") does not exist");
      }
      it = shards.emplace(shard, SafetensorsFile::open(shard_path.string())).first;
    }
    if (!it->second->has(item.key())) {
      throw bad_input(file_path + ": weight_map maps tensor " + in_quotes(item.key()) + " to shard " +
                      in_quotes(shard) + ", which does not hold it");
    }
    names_per_shard[shard].insert(item.key());
    store.by_name_[item.key()] = it->second;
  }
  // A tensor the index does not map would be invisible to tensor accounting.
  for (const auto& [shard, file] : shards) {
    for (const std::string& name : file->names()) {
      if (!names_per_shard[shard].count(name)) {
        throw bad_input(file_path + ": shard " + in_quotes(shard) + " holds tensor " + in_quotes(name) +
                        ", which weight_map does not map to it");
      }
    }
  }
  return store;
}

bool TensorStore::has(const std::string& name) const { return by_name_.count(name) != 0; }

const SafetensorsFile& TensorStore::file_of(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw bad_input(description_ + ": no tensor " + in_quotes(name));
  return *it->second;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& entry : by_name_) out.push_back(entry.first);
  return out;
}

}  // namespace dflash
