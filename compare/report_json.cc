#include "compare/report_json.h"

#include <cmath>
#include <fstream>
#include <map>

#include "compare/acceptance_json.h"
#include "core/stages.h"
#include "core/error.h"
#include "core/json_file.h"

namespace dflash {
namespace {

using nlohmann::json;

json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json value_pair(const ValuePair& p) {
  return {{"row", p.row}, {"col", p.col}, {"expected", number(p.expected)}, {"actual", number(p.actual)}};
}

json stage_to_json(const StageCheck& s) {
  json j = {{"stage", s.stage},
            {"order", s.order},
            {"passed", s.passed},
            {"ratio", number(s.ratio)},
            {"bound", {{"rel_rms", s.bound.rel_rms}, {"max_rel", s.bound.max_rel}, {"estimate", s.bound.estimate}}}};
  if (!s.shape_ok) {
    j["shape_fault"] = s.shape_detail;
  } else {
    const TensorMetrics& m = s.metrics;
    j["rows"] = m.rows;
    j["cols"] = m.cols;
    j["non_finite"] = m.non_finite;
    if (m.non_finite > 0) j["first_non_finite"] = value_pair(m.first_non_finite);
    j["max_abs"] = number(m.max_abs);
    j["worst_abs"] = value_pair(m.worst_abs);
    j["max_rel"] = number(m.max_rel);
    j["worst_rel"] = value_pair(m.worst_rel);
    j["rel_rms"] = number(m.max_row_rel_rms);
    j["worst_rms_row"] = m.worst_rms_row;
    j["nmse"] = number(m.nmse);
    j["cosine"] = number(m.cosine);
    j["max_bf16_ulp"] = m.max_bf16_ulp;
    // The smallest bounds this stage would have passed with (its own measures).
    j["passing_tolerance"] = {{"rel_rms", number(m.max_row_rel_rms)}, {"max_rel", number(m.max_rel)}};
  }
  if (s.bias) {  // same rounding points only (compare/rounding_bias.h)
    j["rounding_bias"] = {{"elements", s.bias->elements}, {"mean_ulp", number(s.bias->mean_ulp)},
                          {"second_moment", number(s.bias->second_moment)}, {"bound", number(s.bias->bound)},
                          {"passed", s.bias->passed()}, {"rows", s.bias->rows},
                          {"row_mean_sd", number(s.bias->row_mean_sd)},
                          {"beyond_one_ulp", number(s.bias->beyond_one_ulp)}};
  }
  if (!s.passed) {
    j["fail"] = {{"row", s.fail_row},       {"col", s.fail_col},
                 {"criterion", s.fail_criterion}, {"value", number(s.fail_value)},
                 {"bound", number(s.fail_bound)}, {"expected", number(s.fail_expected)},
                 {"actual", number(s.fail_actual)}};
  }
  return j;
}

json divergence_to_json(const Divergence& d) {
  return {{"pair", d.pair},         {"step", d.step},          {"seq", d.seq},
          {"stage", d.stage},       {"layer", d.layer},        {"row", d.row},
          {"col", d.col},           {"expected", number(d.expected)}, {"actual", number(d.actual)},
          {"criterion", d.criterion}, {"value", number(d.value)},  {"bound", number(d.bound)},
          {"detail", d.detail},     {"ranks", d.ranks},        {"text", describe_divergence(d)}};
}

// The worst check of each stage over all steps and sequences of one pair, in forward order: what
// the HTML plot draws.
json stage_summary(const ReplayResult& result, int pair) {
  struct Worst {
    const StageCheck* check = nullptr;
    int step = -1, seq = -1;
  };
  std::map<int, Worst> by_order;
  for (const SequenceResult& seq : result.sequences) {
    if (seq.pair != pair) continue;
    for (const StageCheck& check : seq.stages) {
      Worst& w = by_order[check.order];
      const bool worse = w.check == nullptr || (!check.passed && w.check->passed) ||
                         (check.passed == w.check->passed && check.ratio > w.check->ratio);
      if (worse) w = {&check, seq.step, seq.seq};
    }
  }
  json out = json::array();
  for (const auto& [order, w] : by_order) {
    out.push_back({{"stage", w.check->stage},
                   {"order", order},
                   {"passed", w.check->passed},
                   {"ratio", number(w.check->ratio)},
                   {"step", w.step},
                   {"seq", w.seq},
                   {"rel_rms", number(w.check->metrics.max_row_rel_rms)},
                   {"max_rel", number(w.check->metrics.max_rel)},
                   {"bound_rel_rms", w.check->bound.rel_rms},
                   {"bound_max_rel", w.check->bound.max_rel}});
  }
  return out;
}

json model_to_json(const ErrorModel& m) {
  return {{"name", m.name}, {"storage", m.storage}, {"accumulation", m.accumulation},
          {"rounds_at_boundaries", m.rounds_at_boundaries}, {"quantized_weights", m.quantized_weights},
          {"quantized_activations", m.quantized_activations}, {"bf16_wire", m.bf16_wire},
          {"bf16_attention_partials", m.bf16_attention_partials}, {"floor", m.floor}};
}

void require(const json& j, const char* key, json::value_t type, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw bad_input(where + ": missing field '" + key + "'");
  const json& v = j.at(key);
  if (v.type() != type) throw bad_input(where + ": field '" + key + "' has the wrong type (" + v.type_name() + ")");
}

}  // namespace

json replay_result_to_json(const ReplayResult& result) {
  json j;
  j["fixture"] = result.fixture_name;
  j["dir"] = result.fixture_dir;
  j["expect_precision"] = result.expect_precision;
  if (!result.provenance.is_null()) j["provenance"] = result.provenance;  // how the fixture was made, as it says
  j["num_layers"] = result.num_layers;
  j["total_steps"] = result.total_steps;
  j["steps_run"] = result.steps_run;
  j["verdict"] = result.passed() ? "pass" : "fail";
  j["safety_factor"] = kSafetyFactor;
  j["stage_order"] = forward_stage_order(result.num_layers);

  json proposers = json::array();
  for (const ProposerSummary& p : result.proposers) {
    json levers = json::array();
    for (const auto& [key, value] : p.levers) levers.push_back({key, value});
    json path_counts = json::object();
    for (const auto& [mode, count] : p.path_counts) path_counts[mode] = count;
    proposers.push_back({{"name", p.name},
                         {"precision", p.precision},
                         {"levers", levers},
                         {"path_counts", path_counts},
                         {"checks_not_run", p.checks_not_run}});
  }
  j["proposers"] = proposers;
  json paths = json::array();
  for (const StepPath& path : result.paths) {
    json entry = {{"step", path.step},
                  {"proposer", result.proposers[static_cast<size_t>(path.lane)].name},
                  {"block_width", path.block_width},
                  {"batch", path.batch},
                  {"mode", path.mode},
                  {"pdl", path.pdl},
                  {"taps_from_second_pass", path.taps_from_second_pass}};
    if (!path.plan.empty()) {  // optional: drafters that report a launch plan (the CUDA drafter)
      json plan = json::array();
      for (const auto& [kernel_class, runs] : path.plan) plan.push_back({kernel_class, runs});
      entry["plan"] = plan;
    }
    paths.push_back(entry);
  }
  j["paths"] = paths;

  json pairs = json::array();
  for (size_t i = 0; i < result.pairs.size(); ++i) {
    const PairSummary& pair = result.pairs[i];
    const PairTotals totals = pair_totals(result, static_cast<int>(i));
    pairs.push_back({{"label", pair.label},
                     {"expected", pair.expected_lane < 0 ? json("fixture") : json(result.proposers[pair.expected_lane].name)},
                     {"actual", result.proposers[pair.actual_lane].name},
                     {"expected_model", model_to_json(pair.tolerance.expected)},
                     {"actual_model", model_to_json(pair.tolerance.actual)},
                     {"shared_quantized_weights", pair.tolerance.shared_quantized_weights},
                     {"same_rounding_points", pair.tolerance.same_rounding_points},
                     {"sequences", totals.sequences},
                     {"failed_sequences", totals.failed_sequences},
                     {"tokens", {{"agree", totals.agree}, {"tie_excused", totals.excused}, {"mismatch", totals.mismatch}}},
                     {"worst_ratio", number(totals.worst_ratio)},
                     {"worst_stage", totals.worst_stage},
                     {"first_divergence", totals.first_divergence ? divergence_to_json(*totals.first_divergence) : json(nullptr)},
                     {"stages", stage_summary(result, static_cast<int>(i))}});
    if (totals.bias_checks > 0) {  // same rounding points only (compare/rounding_bias.h)
      pairs.back()["rounding_bias"] = {{"checks", totals.bias_checks},
                                       {"worst_ratio", number(totals.worst_bias_ratio)},
                                       {"worst_mean_ulp", number(totals.worst_bias_mean_ulp)},
                                       {"worst_stage", totals.worst_bias_stage}};
    }
  }
  j["pairs"] = pairs;

  json sequences = json::array();
  for (const SequenceResult& seq : result.sequences) {
    json s = {{"step", seq.step},
              {"seq", seq.seq},
              {"pair", seq.pair},
              {"requested_width", seq.requested_width},
              {"block_width", seq.block_width},
              {"start", seq.start},
              {"window", seq.window},
              {"passed", seq.passed()},
              {"problems", seq.problems}};
    json stages = json::array();
    for (const StageCheck& check : seq.stages) stages.push_back(stage_to_json(check));
    s["stages"] = stages;
    if (seq.tokens) {
      json rows = json::array();
      for (const TokenRow& row : seq.tokens->rows) {
        if (row.verdict == TokenVerdict::kAgree) continue;  // only the disagreements, to keep it short
        rows.push_back({{"row", row.row}, {"expected", row.expected}, {"actual", row.actual},
                        {"verdict", token_verdict_name(row.verdict)}, {"gap", number(row.gap)},
                        {"threshold", number(row.threshold)}});
      }
      s["tokens"] = {{"agree", seq.tokens->agree}, {"tie_excused", seq.tokens->excused},
                     {"mismatch", seq.tokens->mismatch}, {"disagreements", rows}};
    }
    if (seq.divergence) s["divergence"] = divergence_to_json(*seq.divergence);
    sequences.push_back(s);
  }
  j["sequences"] = sequences;

  json invariants = json::array();
  for (const InvariantFailure& f : result.invariant_failures) {
    invariants.push_back({{"step", f.step}, {"proposer", f.proposer}, {"invariant", f.invariant}, {"detail", f.detail}});
  }
  j["invariant_failures"] = invariants;
  if (result.drafter_fault) {
    const DrafterFaultRecord& f = *result.drafter_fault;
    j["drafter_fault"] = {{"step", f.step}, {"proposer", f.proposer}, {"event", f.event}, {"during", f.during},
                          {"text", f.text()}};
  }
  j["first_divergence"] = result.first_divergence ? divergence_to_json(*result.first_divergence) : json(nullptr);
  j["temperatures"] = result.temperatures;
  j["acceptance"] = acceptance_json(result);
  for (size_t i = 0; i < result.pairs.size(); ++i) {
    j["pairs"][i]["distribution"] = pair_distribution_json(result, static_cast<int>(i));
  }
  return j;
}

json make_report_document(const ReportRun& run, const std::vector<FixtureOutcome>& outcomes,
                          const std::vector<size_t>& indices) {
  if (indices.size() != outcomes.size()) throw internal_error("make_report_document: one index per outcome");
  json results = json::array(), errors = json::array();
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const FixtureOutcome& outcome = outcomes[i];
    if (outcome.result) {
      json r = replay_result_to_json(*outcome.result);
      r["index"] = indices[i];
      r["path"] = outcome.path;
      results.push_back(std::move(r));
    } else {
      errors.push_back({{"fixture", outcome.path}, {"index", indices[i]}, {"error", outcome.error},
                        {"exit_code", outcome.exit_code}});
    }
  }
  const json shard = run.shards > 0 ? json{{"index", run.shard}, {"count", run.shards}} : json(nullptr);
  return {{"format", kReportFormat},
          {"version", kReportVersion},
          {"run", {{"backend", run.backend}, {"precision", run.precision}, {"fixtures", run.fixtures}, {"shard", shard}}},
          {"results", results},
          {"errors", errors}};
}

void write_report_document(const std::string& path, const json& document) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw bad_input(path + ": cannot open for writing");
  out << document.dump(1) << '\n';
  if (!out) throw bad_input(path + ": write failed");
}

bool recomputed_pass(const json& result) {
  if (!result.value("invariant_failures", json::array()).empty()) return false;
  if (result.contains("drafter_fault") && !result["drafter_fault"].is_null()) return false;
  for (const json& seq : result.value("sequences", json::array())) {
    for (const json& stage : seq.value("stages", json::array())) {
      if (!stage.value("passed", false)) return false;
    }
    if (!seq.value("problems", json::array()).empty()) return false;
    if (seq.contains("tokens") && seq["tokens"].value("mismatch", 0) != 0) return false;
  }
  // Version 2: a pair's distances over their bounds, a failed acceptance test or canary.
  for (const json& pair : result.value("pairs", json::array())) {
    if (pair.contains("distribution") && pair["distribution"].is_object() &&
        !pair["distribution"].value("passed", true)) {
      return false;
    }
  }
  if (result.contains("acceptance") && result["acceptance"].is_object() &&
      !result["acceptance"].value("failures", json::array()).empty()) {
    return false;
  }
  return true;
}

namespace {

// run.fixtures[index] must be `path`: where an entry of a version-2 document sits in its run.
void check_index(const json& entry, const json& run, const std::string& path_key, const std::string& where) {
  if (!entry.contains("index") || !entry["index"].is_number_unsigned()) {
    throw bad_input(where + ": field 'index' is missing or not a non-negative integer");
  }
  const size_t index = entry["index"].get<size_t>();
  const json& fixtures = run["fixtures"];
  if (index >= fixtures.size()) {
    throw bad_input(where + ": field 'index' is " + std::to_string(index) + ", past the run's " +
                    std::to_string(fixtures.size()) + " fixtures");
  }
  require(entry, path_key.c_str(), json::value_t::string, where);
  if (entry[path_key] != fixtures[index]) {
    throw bad_input(where + ": field '" + path_key + "' is " + entry[path_key].dump() + ", but run.fixtures[" +
                    std::to_string(index) + "] is " + fixtures[index].dump());
  }
}

void check_run(const json& doc, const std::string& path) {
  if (!doc.contains("run") || !doc["run"].is_object()) throw bad_input(path + ": missing field 'run' (an object)");
  const json& run = doc["run"];
  const std::string where = path + ": run";
  require(run, "backend", json::value_t::string, where);
  require(run, "precision", json::value_t::string, where);
  require(run, "fixtures", json::value_t::array, where);
  for (size_t i = 0; i < run["fixtures"].size(); ++i) {
    if (!run["fixtures"][i].is_string()) {
      throw bad_input(where + ".fixtures[" + std::to_string(i) + "] is not a string");
    }
  }
  if (!run.contains("shard")) throw bad_input(where + ": missing field 'shard' (null or {index, count})");
  const json& shard = run["shard"];
  if (shard.is_null()) return;
  for (const char* key : {"index", "count"}) {
    if (!shard.is_object() || !shard.contains(key) || !shard[key].is_number_integer()) {
      throw bad_input(where + ".shard: field '" + key + "' is missing or not an integer");
    }
  }
  const int64_t index = shard["index"].get<int64_t>(), count = shard["count"].get<int64_t>();
  if (count < 1 || index < 1 || index > count) {
    throw bad_input(where + ".shard: shard " + std::to_string(index) + "/" + std::to_string(count) +
                    " is not one of 1/" + std::to_string(std::max<int64_t>(count, 1)) + ".." +
                    std::to_string(std::max<int64_t>(count, 1)) + "/" + std::to_string(std::max<int64_t>(count, 1)));
  }
}

}  // namespace

json read_report_document(const std::string& path) {
  const json doc = read_json_file_strict(path);
  require(doc, "format", json::value_t::string, path);
  if (doc["format"] != kReportFormat) {
    throw bad_input(path + ": field 'format' is '" + doc["format"].get<std::string>() + "', not '" + kReportFormat + "'");
  }
  if (!doc.contains("version") || !doc["version"].is_number_integer()) {
    throw bad_input(path + ": field 'version' is missing or not an integer");
  }
  const int64_t version = doc["version"].get<int64_t>();
  if (version > kReportVersion) {
    throw bad_input(path + ": report version " + std::to_string(version) + " is newer than this harness reads (" +
                    std::to_string(kReportVersion) + ")");
  }
  if (version < 1) throw bad_input(path + ": report version " + std::to_string(version) + " does not exist (1 or 2)");
  if (version >= kReportVersionWithRunAndAcceptance) check_run(doc, path);
  require(doc, "results", json::value_t::array, path);
  require(doc, "errors", json::value_t::array, path);
  for (size_t i = 0; i < doc["results"].size(); ++i) {
    const json& r = doc["results"][i];
    const std::string where = path + ": results[" + std::to_string(i) + "]";
    require(r, "fixture", json::value_t::string, where);
    require(r, "verdict", json::value_t::string, where);
    require(r, "stage_order", json::value_t::array, where);
    require(r, "proposers", json::value_t::array, where);
    require(r, "pairs", json::value_t::array, where);
    require(r, "invariant_failures", json::value_t::array, where);
    require(r, "sequences", json::value_t::array, where);
    for (size_t k = 0; k < r["sequences"].size(); ++k) {  // what the heat map reads
      const json& seq = r["sequences"][k];
      const std::string qw = where + ".sequences[" + std::to_string(k) + "]";
      for (const char* key : {"step", "pair"}) {
        if (!seq.is_object() || !seq.contains(key) || !seq[key].is_number_integer()) {
          throw bad_input(qw + ": field '" + key + "' is missing or not an integer");
        }
      }
      require(seq, "stages", json::value_t::array, qw);
      for (size_t i = 0; i < seq["stages"].size(); ++i) {
        const json& stage = seq["stages"][i];
        const std::string sw = qw + ".stages[" + std::to_string(i) + "]";
        require(stage, "stage", json::value_t::string, sw);
        require(stage, "passed", json::value_t::boolean, sw);
      }
      // What the verdict is recomputed from (recomputed_pass).
      if (seq.contains("problems")) require(seq, "problems", json::value_t::array, qw);
      if (seq.contains("tokens")) {
        require(seq, "tokens", json::value_t::object, qw);
        if (!seq["tokens"].contains("mismatch") || !seq["tokens"]["mismatch"].is_number_integer()) {
          throw bad_input(qw + ".tokens: field 'mismatch' is missing or not an integer");
        }
      }
    }
    for (size_t p = 0; p < r["pairs"].size(); ++p) {
      const std::string pw = where + ".pairs[" + std::to_string(p) + "]";
      require(r["pairs"][p], "label", json::value_t::string, pw);
      require(r["pairs"][p], "stages", json::value_t::array, pw);
      require(r["pairs"][p], "tokens", json::value_t::object, pw);
      for (size_t k = 0; k < r["pairs"][p]["stages"].size(); ++k) {
        const json& stage = r["pairs"][p]["stages"][k];
        const std::string sw = pw + ".stages[" + std::to_string(k) + "]";
        require(stage, "stage", json::value_t::string, sw);
        require(stage, "passed", json::value_t::boolean, sw);
        if (!stage.contains("ratio") || !(stage["ratio"].is_number() || stage["ratio"].is_null())) {
          throw bad_input(sw + ": field 'ratio' is missing or not a number");
        }
      }
    }
    if (version >= kReportVersionWithRunAndAcceptance) check_index(r, doc["run"], "path", where);
    check_acceptance_fields(r, static_cast<int>(version), where);
    const std::string verdict = r["verdict"].get<std::string>();
    if (verdict != "pass" && verdict != "fail") throw bad_input(where + ": field 'verdict' is '" + verdict + "', not pass or fail");
    if ((verdict == "pass") != recomputed_pass(r)) {
      throw bad_input(where + " (" + r["fixture"].get<std::string>() + "): field 'verdict' is '" + verdict +
                      "', but its sequences, invariant failures, distances and acceptance say '" +
                      (recomputed_pass(r) ? "pass" : "fail") + "'");
    }
    if (!r.contains("first_divergence")) throw bad_input(where + ": missing field 'first_divergence'");
    if (!r["first_divergence"].is_null()) {
      require(r["first_divergence"], "text", json::value_t::string, where + ".first_divergence");
      require(r["first_divergence"], "stage", json::value_t::string, where + ".first_divergence");
      require(r["first_divergence"], "pair", json::value_t::string, where + ".first_divergence");
    }
  }
  for (size_t i = 0; i < doc["errors"].size(); ++i) {
    const std::string where = path + ": errors[" + std::to_string(i) + "]";
    const json& e = doc["errors"][i];
    require(e, "fixture", json::value_t::string, where);
    require(e, "error", json::value_t::string, where);
    if (!e.contains("exit_code") || !e["exit_code"].is_number_integer()) {
      throw bad_input(where + ": field 'exit_code' is missing or not an integer");
    }
    const int code = e["exit_code"].get<int>();
    if (code != kExitBadInput && code != kExitInternal && code != kExitCannotRun) {
      throw bad_input(where + ": field 'exit_code' is " + std::to_string(code) + ", not 2, 3 or 125");
    }
    if (version >= kReportVersionWithRunAndAcceptance) check_index(e, doc["run"], "fixture", where);
  }
  return doc;
}

}  // namespace dflash
