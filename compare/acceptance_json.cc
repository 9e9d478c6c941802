#include "compare/acceptance_json.h"

#include <algorithm>
#include <cmath>

#include "compare/report_json.h"
#include "core/error.h"

namespace dflash {
namespace {

using nlohmann::json;

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json distances_json(const DistributionDistances& d) {
  return {{"tv", number(d.tv)},
          {"kl_expected_actual", number(d.kl_expected_actual)},
          {"kl_actual_expected", number(d.kl_actual_expected)},
          {"top1_gap", number(d.top1_gap)}};
}

json bound_json(const DistributionBound& b) {
  return {{"sigma", number(b.sigma)}, {"tv", number(b.tv)}, {"kl", number(b.kl)}, {"top1_gap", number(b.top1_gap)}};
}

json side_json(const SideAcceptance& side, const std::vector<PinTest>* tests) {
  json positions = json::array();
  for (const PositionAcceptance& p : side.positions) {
    positions.push_back({{"position", p.position},
                         {"blocks", p.blocks},
                         {"reached", p.reached},
                         {"acceptance_rate", number(static_cast<double>(p.reached) / p.blocks)},
                         {"matched", p.matched},
                         {"match_rate", number(static_cast<double>(p.matched) / p.blocks)},
                         {"sampling", p.sampling_blocks > 0 ? number(p.sampling_mean) : json(nullptr)}});
  }
  json j = {{"name", side.name},
            {"lane", side.lane},
            {"blocks", side.blocks},
            {"drafted", side.drafted},
            {"accepted", side.accepted},
            {"mean_length", number(side.mean_length)},
            {"sampling_length", side.sampling_length ? number(*side.sampling_length) : json(nullptr)},
            {"positions", positions}};
  if (tests != nullptr) {
    json pin_tests = json::array();
    for (const PinTest& t : *tests) {
      pin_tests.push_back({{"position", t.position},
                           {"blocks", t.blocks},
                           {"reached", t.reached},
                           {"pinned", t.pinned},
                           {"p_value", number(t.p_value)},
                           {"level", t.level},
                           {"least_passing", t.least_passing},
                           {"passed", t.passed}});
    }
    j["pin_tests"] = pin_tests;
  }
  return j;
}

void require(const json& j, const char* key, bool (json::*is)() const noexcept, const std::string& where,
             const char* what) {
  if (!j.is_object() || !j.contains(key) || !(j[key].*is)()) {
    throw bad_input(where + ": field '" + key + "' is missing or not " + what);
  }
}

}  // namespace

std::vector<PositionDistances> pair_positions(const ReplayResult& result, int pair) {
  std::vector<const DistanceCheck*> checks;
  for (const SequenceResult& seq : result.sequences) {
    if (seq.pair == pair && seq.distances) checks.push_back(&*seq.distances);
  }
  return summarize_positions(checks, result.temperatures);
}

std::optional<double> pair_max_tv(const ReplayResult& result, int pair) {
  std::optional<double> worst;
  for (const SequenceResult& seq : result.sequences) {
    if (seq.pair != pair || !seq.distances) continue;
    for (const RowDistance& row : seq.distances->rows) {
      if (row.temperature != 1.0) continue;
      const double tv = std::isnan(row.distances.tv) ? INFINITY : row.distances.tv;
      worst = worst ? std::max(*worst, tv) : tv;
    }
  }
  return worst;
}

json pair_distribution_json(const ReplayResult& result, int pair) {
  int checks = 0;
  bool passed = true;
  double worst = 0;
  for (const SequenceResult& seq : result.sequences) {
    if (seq.pair != pair || !seq.distances) continue;
    ++checks;
    passed = passed && seq.distances->passed;
    worst = std::max(worst, seq.distances->worst_ratio);
  }
  if (checks == 0) return nullptr;
  json positions = json::array();
  for (const PositionDistances& p : pair_positions(result, pair)) {
    positions.push_back({{"temperature", p.temperature},
                         {"block_row", p.row + 1},
                         {"count", p.count},
                         {"max", distances_json(p.max)},
                         {"mean", distances_json(p.mean)},
                         {"worst_ratio", number(p.worst_ratio)},
                         {"bound_at_worst", bound_json(p.bound_at_worst)},
                         {"passed", p.passed}});
  }
  return {{"passed", passed}, {"worst_ratio", number(worst)}, {"checks", checks}, {"positions", positions}};
}

json acceptance_json(const ReplayResult& result) {
  const AcceptanceReport& a = result.acceptance;
  if (!a.measured()) return nullptr;
  json sides = json::array();
  for (size_t i = 0; i < a.sides.size(); ++i) {
    const std::vector<PinTest>* tests = nullptr;
    for (const auto& [index, list] : a.pin_tests) {
      if (index == static_cast<int>(i)) tests = &list;
    }
    sides.push_back(side_json(a.sides[i], tests));
  }
  json comparisons = json::array();
  for (const PairSummary& pair : result.pairs) {
    const SideAcceptance* expected = a.side_of_lane(pair.expected_lane);
    const SideAcceptance* actual = a.side_of_lane(pair.actual_lane);
    if (expected == nullptr || actual == nullptr) continue;
    json c = {{"pair", pair.label},
              {"expected", expected->name},
              {"actual", actual->name},
              {"mean_length_change", number(actual->mean_length - expected->mean_length)}};
    c["sampling_length_change"] = expected->sampling_length && actual->sampling_length
                                      ? number(*actual->sampling_length - *expected->sampling_length)
                                      : json(nullptr);
    comparisons.push_back(c);
  }
  json failures = json::array();
  for (const AcceptanceFailure& f : a.failures) {
    failures.push_back({{"side", f.side}, {"check", f.check}, {"detail", f.detail}});
  }
  json pin = nullptr;
  if (a.pin) pin = {{"per_position", a.pin->per_position}, {"basis", a.pin->basis}};
  return {{"pin", pin},
          {"false_alarm", kAcceptanceFalseAlarm},
          {"sides", sides},
          {"comparisons", comparisons},
          {"failures", failures}};
}

void check_acceptance_fields(const json& r, int version, const std::string& where) {
  if (version < kReportVersionWithRunAndAcceptance) return;
  require(r, "temperatures", &json::is_array, where, "an array");
  if (!r.contains("acceptance")) throw bad_input(where + ": missing field 'acceptance'");
  const json& a = r["acceptance"];
  if (!a.is_null()) {
    const std::string aw = where + ".acceptance";
    for (const char* key : {"sides", "comparisons", "failures"}) require(a, key, &json::is_array, aw, "an array");
    for (size_t i = 0; i < a["sides"].size(); ++i) {
      const std::string sw = aw + ".sides[" + std::to_string(i) + "]";
      require(a["sides"][i], "name", &json::is_string, sw, "a string");
      require(a["sides"][i], "positions", &json::is_array, sw, "an array");
    }
    for (size_t i = 0; i < a["failures"].size(); ++i) {
      require(a["failures"][i], "detail", &json::is_string, aw + ".failures[" + std::to_string(i) + "]", "a string");
    }
  }
  for (size_t p = 0; p < r["pairs"].size(); ++p) {
    const std::string pw = where + ".pairs[" + std::to_string(p) + "]";
    if (!r["pairs"][p].contains("distribution")) throw bad_input(pw + ": missing field 'distribution'");
    const json& d = r["pairs"][p]["distribution"];
    if (d.is_null()) continue;
    require(d, "passed", &json::is_boolean, pw + ".distribution", "true or false");
    require(d, "positions", &json::is_array, pw + ".distribution", "an array");
    for (size_t k = 0; k < d["positions"].size(); ++k) {
      const json& pos = d["positions"][k];
      const std::string kw = pw + ".distribution.positions[" + std::to_string(k) + "]";
      require(pos, "block_row", &json::is_number_integer, kw, "an integer");
      require(pos, "temperature", &json::is_number, kw, "a number");
      require(pos, "max", &json::is_object, kw, "an object");
      require(pos, "passed", &json::is_boolean, kw, "true or false");
    }
  }
}

}  // namespace dflash
