// Plain byte and JSON edits of a copied fixture, for the malformed-input tables: written apart from the
// readers under test so that a defect is planted the same way whatever those readers do.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash::testing {

using ojson = nlohmann::ordered_json;

std::vector<uint8_t> read_bytes(const std::string& path);
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes);
void write_text(const std::string& path, const std::string& text);

// A writable copy of the fixture directory `base` as <work_dir>/<name>; returns its path.
std::string copy_fixture(const std::string& work_dir, const std::string& name, const std::string& base);

// Parses the JSON file at `path` (key order kept), edits it and writes it back.
void edit_json(const std::string& path, const std::function<void(ojson&)>& edit);

// A safetensors file as header JSON + data area, edited and written back (header unpadded).
struct RawSafetensors {
  ojson header;
  std::vector<uint8_t> data;
};
RawSafetensors read_raw(const std::string& path);
void write_raw(const std::string& path, const std::string& header_text, const std::vector<uint8_t>& data);
void edit_safetensors(const std::string& path, const std::function<void(ojson&, std::vector<uint8_t>&)>& edit);

// Overwrites the bytes of element `index` of tensor `name` (element size = bytes.size()).
void poke(ojson& header, std::vector<uint8_t>& data, const std::string& name, size_t index,
          const std::vector<uint8_t>& bytes);
// Appends tensor `name` of `dtype` and `shape` holding `bytes` at the end of the data area.
void append_tensor(ojson& header, std::vector<uint8_t>& data, const std::string& name, const std::string& dtype,
                   const std::vector<int64_t>& shape, const std::vector<uint8_t>& bytes);

}  // namespace dflash::testing
