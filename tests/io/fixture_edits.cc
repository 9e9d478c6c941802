#include "tests/io/fixture_edits.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace dflash::testing {

namespace fs = std::filesystem;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string copy_fixture(const std::string& work_dir, const std::string& name, const std::string& base) {
  const fs::path dir = fs::path(work_dir) / name;
  fs::remove_all(dir);
  fs::copy(base, dir, fs::copy_options::recursive);
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    fs::permissions(entry.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  return dir.string();
}

void edit_json(const std::string& path, const std::function<void(ojson&)>& edit) {
  std::ifstream in(path);
  ojson value = ojson::parse(in);
  edit(value);
  write_text(path, value.dump(1));
}

RawSafetensors read_raw(const std::string& path) {
  const std::vector<uint8_t> bytes = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  RawSafetensors raw;
  raw.header = ojson::parse(std::string(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n)));
  raw.data.assign(bytes.begin() + 8 + static_cast<long>(n), bytes.end());
  return raw;
}

void write_raw(const std::string& path, const std::string& header_text, const std::vector<uint8_t>& data) {
  const uint64_t n = header_text.size();
  std::vector<uint8_t> bytes(8 + header_text.size() + data.size());
  std::memcpy(bytes.data(), &n, 8);
  std::memcpy(bytes.data() + 8, header_text.data(), header_text.size());
  if (!data.empty()) std::memcpy(bytes.data() + 8 + header_text.size(), data.data(), data.size());
  write_bytes(path, bytes);
}

void edit_safetensors(const std::string& path, const std::function<void(ojson&, std::vector<uint8_t>&)>& edit) {
  RawSafetensors raw = read_raw(path);
  edit(raw.header, raw.data);
  write_raw(path, raw.header.dump(), raw.data);
}

void poke(ojson& header, std::vector<uint8_t>& data, const std::string& name, size_t index,
          const std::vector<uint8_t>& bytes) {
  const size_t begin = header[name]["data_offsets"][0].get<size_t>();
  std::memcpy(data.data() + begin + index * bytes.size(), bytes.data(), bytes.size());
}

void append_tensor(ojson& header, std::vector<uint8_t>& data, const std::string& name, const std::string& dtype,
                   const std::vector<int64_t>& shape, const std::vector<uint8_t>& bytes) {
  header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
  data.insert(data.end(), bytes.begin(), bytes.end());
}

}  // namespace dflash::testing
