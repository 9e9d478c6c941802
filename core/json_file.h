// Strict JSON reading for every JSON the harness takes in (safetensors headers, config.json,
// fixture.json, sharded indexes). nlohmann keeps the last of two equal keys silently, which would
// let a file say two things at once; these helpers refuse duplicate keys at any depth instead.
#pragma once
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/limits.h"

namespace dflash {

// Parses `text`; `source` (a path, or "path: header") prefixes every error.
template <class Json = nlohmann::json>
Json parse_json_strict(const std::string& text, const std::string& source) {
  // One entry per open container: its key set (objects only) and its name for the message.
  struct Container {
    bool is_array;
    std::set<std::string> keys;
    std::string name;
  };
  std::vector<Container> open;
  std::string last_key, duplicate, duplicate_where;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, Json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      // Bounded before anything recursive (dump, copy, compare) walks the value.
      if (open.size() >= static_cast<size_t>(limits::kJsonDepth)) {
        throw bad_input(source + ": JSON nested deeper than " + std::to_string(limits::kJsonDepth) +
                        " levels (the limit, docs/limits.md)");
      }
      std::string name;
      if (!open.empty()) name = open.back().is_array ? "[]" : last_key;
      open.push_back({event == Event::array_start, {}, name});
    } else if (event == Event::object_end || event == Event::array_end) {
      open.pop_back();
    } else if (event == Event::key) {
      last_key = parsed.template get<std::string>();
      if (!open.back().keys.insert(last_key).second && duplicate.empty()) {
        duplicate = last_key;
        for (size_t i = 1; i < open.size(); ++i) {
          const std::string& name = open[i].name;
          duplicate_where += (name == "[]" || i == 1) ? name : "." + name;
        }
      }
    }
    return true;
  };
  Json result;
  try {
    result = Json::parse(text, callback);
  } catch (const nlohmann::json::exception& e) {
    throw bad_input(source + ": not valid JSON (" + e.what() + ")");
  }
  if (!duplicate.empty()) {
    throw bad_input(source + ": duplicate key '" + duplicate + "'" +
                    (duplicate_where.empty() ? std::string(" at the top level") : " inside '" + duplicate_where + "'") +
                    " (a JSON parser would silently keep only one of them)");
  }
  return result;
}

// The whole file as text; an unreadable file is an error naming it.
inline std::string read_text_file(const std::string& path) {
  // Only regular files: reading a FIFO or a device named by a hostile path could block forever.
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw bad_input("no such file or directory: " + path);
  if (!std::filesystem::is_regular_file(path, ec)) throw bad_input(path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad_input(path + ": cannot open the file (" + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw bad_input(path + ": read error");
  return text.str();
}

template <class Json = nlohmann::json>
Json read_json_file_strict(const std::string& path) {
  return parse_json_strict<Json>(read_text_file(path), path);
}

}  // namespace dflash
