// `replay --shard I/N` and `report` merging the shards: three shards merged give the verdicts, the
// count line and the exit code of the unsharded run, for a clean set and for a set with a failing
// and an unreadable fixture; shards that are not one run are refused by name.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/fixture_surgery.h"
#include "tests/cli/harness_runner.h"

namespace dflash::cli_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSourceDir = DFLASH_SOURCE_DIR;

std::vector<std::string> fixture_dirs(const std::string& parent) {
  std::vector<std::string> dirs;
  for (const auto& entry : fs::directory_iterator(parent)) {
    if (entry.is_directory() && fs::exists(entry.path() / "fixture.json")) dirs.push_back(entry.path().string() + "/");
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// The oracle and DFlash2 fixtures.
std::vector<std::string> clean_set() {
  std::vector<std::string> set = fixture_dirs(kSourceDir + "/fixtures/oracle");
  const std::vector<std::string> d2 = fixture_dirs(kSourceDir + "/fixtures/dflash2");
  set.insert(set.end(), d2.begin(), d2.end());
  return set;
}

// Per fixture path: "pass", "fail", or "exit N" for one that could not run.
std::map<std::string, std::string> verdicts(const json& doc) {
  std::map<std::string, std::string> out;
  for (const json& r : doc["results"]) out[r["path"].get<std::string>()] = r["verdict"].get<std::string>();
  for (const json& e : doc["errors"]) out[e["fixture"].get<std::string>()] = "exit " + std::to_string(e["exit_code"].get<int>());
  return out;
}

std::string last_line(const std::string& text) {
  const size_t end = text.find_last_not_of('\n');
  if (end == std::string::npos) return "";
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

std::vector<std::string> with(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// Replays `fixtures` whole and in three shards (shard 2 given them in reverse order), merges the
// shards with `report`, and checks the merge against the whole run; returns the whole run's document.
json expect_shards_merge_to_the_whole_run(const std::vector<std::string>& fixtures, int expected_exit,
                                          const std::string& expected_count) {
  const std::string out = scratch_dir("reports");
  const RunResult whole = run_harness(with({"replay", "--json", out + "/whole.json"}, fixtures));
  EXPECT_EQ(whole.exit_code, expected_exit) << whole.output;
  EXPECT_EQ(last_line(whole.out), expected_count) << whole.out;
  const json whole_doc = json::parse(read_file(out + "/whole.json"));

  std::vector<std::string> shard_files, seen;
  for (int shard = 1; shard <= 3; ++shard) {
    std::vector<std::string> order = fixtures;
    if (shard == 2) std::reverse(order.begin(), order.end());  // the partition does not depend on the order
    const std::string file = out + "/shard" + std::to_string(shard) + ".json";
    const RunResult r =
        run_harness(with({"replay", "--shard", std::to_string(shard) + "/3", "--json", file}, order));
    EXPECT_NE(r.out.find("shard " + std::to_string(shard) + "/3: "), std::string::npos) << r.out;
    const json doc = json::parse(read_file(file));
    EXPECT_EQ(doc["run"]["shard"], (json{{"index", shard}, {"count", 3}}));
    const size_t held = doc["results"].size() + doc["errors"].size();
    EXPECT_GE(held, 1u) << "shard " << shard << " holds no fixture";
    for (const auto& [path, verdict] : verdicts(doc)) seen.push_back(path);
    shard_files.push_back(file);
  }
  std::vector<std::string> all = fixtures;
  std::sort(all.begin(), all.end());
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, all) << "the shards are not a partition of the fixtures";

  const RunResult merged = run_harness(
      with({"report", "--json", out + "/merged.json", "-o", out + "/merged.html"}, shard_files));
  EXPECT_EQ(merged.exit_code, expected_exit) << merged.output;
  EXPECT_EQ(last_line(merged.out), expected_count) << merged.out;
  const json merged_doc = json::parse(read_file(out + "/merged.json"));
  EXPECT_EQ(verdicts(merged_doc), verdicts(whole_doc));
  EXPECT_EQ(merged_doc["results"], whole_doc["results"]);  // the same bits, in the same order
  EXPECT_EQ(merged_doc["errors"], whole_doc["errors"]);
  EXPECT_EQ(merged_doc["run"], whole_doc["run"]);
  EXPECT_NE(read_file(out + "/merged.html").find(expected_count), std::string::npos);

  // One shard missing: refused by name.
  const RunResult partial = run_harness({"report", shard_files[0], shard_files[1]});
  EXPECT_EQ(partial.exit_code, 2);
  EXPECT_EQ(partial.err, "error: shard 3/3 is missing; given: 1 (" + shard_files[0] + "), 2 (" + shard_files[1] + ")\n");
  return whole_doc;
}

TEST(ShardCli, ThreeShardsOfACleanSetMergeToTheWholeRun) {
  const std::vector<std::string> set = clean_set();
  ASSERT_GE(set.size(), 12u);
  expect_shards_merge_to_the_whole_run(set, 0, std::to_string(set.size()) + " pass, 0 fail, 0 could not run");
}

TEST(ShardCli, ThreeShardsWithAFailingAndAnUnreadableFixtureMergeToTheWholeRun) {
  const std::string work = scratch_dir("work");
  const std::string broken = work + "/tiny-gqa-broken";
  copy_fixture(kSourceDir + "/fixtures/oracle/tiny-gqa", broken);
  edit_trace_tensor(broken, "s1.q0.tap.L0.q", [](std::vector<float>& v) { v[3] += 0.5f; });
  const std::string unreadable = work + "/tiny-mha-unreadable";
  copy_fixture(kSourceDir + "/fixtures/oracle/tiny-mha", unreadable);
  std::ofstream(unreadable + "/fixture.json", std::ios::trunc) << "{\"format\": ";
  std::vector<std::string> set = clean_set();
  set.push_back(broken);
  set.push_back(unreadable);
  const json whole = expect_shards_merge_to_the_whole_run(
      set, 2, std::to_string(set.size() - 2) + " pass, 1 fail, 1 could not run");
  const std::map<std::string, std::string> v = verdicts(whole);
  EXPECT_EQ(v.at(broken), "fail");
  EXPECT_EQ(v.at(unreadable), "exit 2");
}

TEST(ShardCli, AShardOfAnotherRunIsRefusedByName) {
  const std::string out = scratch_dir("reports");
  const std::string a = kSourceDir + "/fixtures/oracle/tiny-mha", b = kSourceDir + "/fixtures/oracle/tiny-gqa";
  ASSERT_EQ(run_harness({"replay", "--shard", "1/2", "--json", out + "/s1.json", a, b}).exit_code, 0);
  ASSERT_EQ(run_harness({"replay", "--shard", "2/2", "--precision", "fp32", "--json", out + "/s2.json", a, b}).exit_code, 0);
  const RunResult r = run_harness({"report", out + "/s1.json", out + "/s2.json"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: " + out + "/s2.json ran --backend reference --precision fp32, " + out +
                       "/s1.json ran --backend reference --precision fp64: not one run\n");
}

}  // namespace
}  // namespace dflash::cli_test
