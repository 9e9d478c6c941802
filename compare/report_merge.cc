#include "compare/report_merge.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "compare/report_json.h"
#include "core/error.h"

namespace dflash {
namespace {

using nlohmann::json;

bool is_shard(const json& doc) {
  return doc.contains("run") && doc["run"].is_object() && !doc["run"].value("shard", json()).is_null();
}

// "2/3"
std::string shard_name(const json& doc) {
  const json& shard = doc["run"]["shard"];
  return std::to_string(shard["index"].get<int>()) + "/" + std::to_string(shard["count"].get<int>());
}

std::string run_settings(const json& doc) {
  return "--backend " + doc["run"]["backend"].get<std::string>() + " --precision " +
         doc["run"]["precision"].get<std::string>();
}

std::vector<std::string> sorted_paths(const json& fixtures) {
  std::vector<std::string> paths;
  for (const json& f : fixtures) paths.push_back(f.get<std::string>());
  std::sort(paths.begin(), paths.end());
  return paths;
}

// A fixture that one run's list holds more often than the other's, in words.
std::string first_difference(const json& a, const std::string& a_name, const json& b, const std::string& b_name) {
  const std::vector<std::string> x = sorted_paths(a), y = sorted_paths(b);
  std::vector<std::string> only_x, only_y;
  std::set_difference(x.begin(), x.end(), y.begin(), y.end(), std::back_inserter(only_x));
  std::set_difference(y.begin(), y.end(), x.begin(), x.end(), std::back_inserter(only_y));
  if (!only_x.empty()) return only_x.front() + " is in " + a_name + " only";
  return only_y.front() + " is in " + b_name + " only";
}

// Where each position of `fixtures` sits in `canonical` (the same paths, maybe in another order):
// the k-th occurrence of a path goes to its k-th occurrence there.
std::vector<size_t> positions_in(const json& fixtures, const json& canonical) {
  std::map<std::string, std::vector<size_t>> where;
  for (size_t i = 0; i < canonical.size(); ++i) where[canonical[i].get<std::string>()].push_back(i);
  std::map<std::string, size_t> seen;
  std::vector<size_t> positions;
  for (const json& f : fixtures) {
    const std::string path = f.get<std::string>();
    positions.push_back(where[path][seen[path]++]);
  }
  return positions;
}

}  // namespace

std::vector<json> merge_reports(const std::vector<json>& documents, const std::vector<std::string>& names) {
  std::vector<size_t> shards, others;
  for (size_t i = 0; i < documents.size(); ++i) (is_shard(documents[i]) ? shards : others).push_back(i);
  if (shards.empty()) return documents;
  const size_t first = shards.front();
  if (!others.empty()) {
    throw bad_input(names[others.front()] + " is not a shard, but " + names[first] + " is shard " +
                    shard_name(documents[first]) + " of a run: merge the shards of one run, or render reports that are not shards");
  }
  const json& run = documents[first]["run"];
  const int count = run["shard"]["count"].get<int>();
  std::map<int, size_t> by_index;  // shard index -> document
  for (size_t k : shards) {
    const json& doc = documents[k];
    if (doc["run"]["shard"]["count"].get<int>() != count) {
      throw bad_input(names[k] + " is shard " + shard_name(doc) + ", " + names[first] + " is shard " +
                      shard_name(documents[first]) + ": different shard counts, not one run");
    }
    if (doc["run"]["backend"] != run["backend"] || doc["run"]["precision"] != run["precision"]) {
      throw bad_input(names[k] + " ran " + run_settings(doc) + ", " + names[first] + " ran " +
                      run_settings(documents[first]) + ": not one run");
    }
    if (sorted_paths(doc["run"]["fixtures"]) != sorted_paths(run["fixtures"])) {
      throw bad_input(names[k] + " was run over other fixtures than " + names[first] + " (" +
                      first_difference(doc["run"]["fixtures"], names[k], run["fixtures"], names[first]) +
                      "): not one run");
    }
    const int index = doc["run"]["shard"]["index"].get<int>();
    const auto [it, added] = by_index.emplace(index, k);
    if (!added) throw bad_input(names[it->second] + " and " + names[k] + " are both shard " + shard_name(doc));
  }
  for (int index = 1; index <= count; ++index) {
    if (by_index.count(index)) continue;
    std::string given;
    for (const auto& [i, k] : by_index) given += (given.empty() ? "" : ", ") + std::to_string(i) + " (" + names[k] + ")";
    throw bad_input("shard " + std::to_string(index) + "/" + std::to_string(count) + " is missing; given: " + given);
  }

  // Every fixture of the run in exactly one shard, then in the order of the first document given
  // (shards may list the same fixtures in another order: the shards do not depend on it).
  const json& fixtures = run["fixtures"];
  std::vector<json> slot(fixtures.size());
  std::vector<size_t> owner(fixtures.size(), 0);
  std::vector<bool> is_error(fixtures.size(), false);
  for (const auto& [index, k] : by_index) {
    const std::vector<size_t> position = positions_in(documents[k]["run"]["fixtures"], fixtures);
    for (const char* list : {"results", "errors"}) {
      for (const json& entry : documents[k][list]) {
        const size_t i = position[entry["index"].get<size_t>()];
        if (!slot[i].is_null()) {
          throw bad_input("fixture " + fixtures[i].get<std::string>() + " is in both " + names[owner[i]] + " and " +
                          names[k]);
        }
        slot[i] = entry;
        slot[i]["index"] = i;
        owner[i] = k;
        is_error[i] = std::string(list) == "errors";
      }
    }
  }
  json results = json::array(), errors = json::array();
  for (size_t i = 0; i < fixtures.size(); ++i) {
    if (slot[i].is_null()) {
      throw bad_input("fixture " + fixtures[i].get<std::string>() + " of the run is in none of the " +
                      std::to_string(count) + " shards");
    }
    (is_error[i] ? errors : results).push_back(std::move(slot[i]));
  }
  json merged = {{"format", kReportFormat}, {"version", kReportVersion}, {"run", run}, {"results", results},
                 {"errors", errors}};
  merged["run"]["shard"] = nullptr;
  return {merged};
}

}  // namespace dflash
