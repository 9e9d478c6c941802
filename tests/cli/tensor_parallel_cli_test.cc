// `dflash-harness replay --tp N`: the reference emulating TP = N passes every bundled oracle fixture
// whose geometry docs/spec/tensor-parallel.md §1 admits and refuses the others naming their config
// and both numbers; the options' own refusals carry §1's texts.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/harness_runner.h"

namespace dflash::cli_test {
namespace {

namespace fs = std::filesystem;

const std::string kOracleDir = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle";

nlohmann::json json_of(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// §1 checks 3-6, restated from the contract on the fixture's config.json: the first key N fails.
std::string refused_key(const fs::path& fixture, int n) {
  const nlohmann::json f = json_of(fixture / "fixture.json");
  const nlohmann::json c = json_of(fixture / f.at("drafter_dir").get<std::string>() / "config.json");
  const int nh = c.at("num_attention_heads"), nkv = c.at("num_key_value_heads");
  if (nh % n != 0) return "num_attention_heads";
  if (nkv % n != 0 && n % nkv != 0) return "num_key_value_heads";
  if (c.at("intermediate_size").get<int>() % n != 0) return "intermediate_size";
  if (c.at("vocab_size").get<int>() % n != 0) return "vocab_size";
  return "";
}

// The table line of one fixture: it starts with the fixture's name, or (could not run) its path.
std::string line_of(const std::string& output, const std::string& name) {
  size_t begin = 0;
  while (begin < output.size()) {
    const size_t end = std::min(output.find('\n', begin), output.size());
    const std::string line = output.substr(begin, end - begin);
    if (line.rfind(name + " ", 0) == 0 || line.find("/" + name + " ") != std::string::npos) {
      if (line.rfind("error:", 0) != 0) return line;
    }
    begin = end + 1;
  }
  return "";
}

void replay_every_oracle_fixture(const std::vector<std::string>& extra) {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(kOracleDir)) {
    if (e.is_directory() && fs::exists(e.path() / "fixture.json")) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  ASSERT_GE(dirs.size(), 8u);
  for (int n : {2, 4}) {
    std::vector<std::string> args = {"replay"};
    for (const fs::path& d : dirs) args.push_back(d.string());
    args.push_back("--tp");
    args.push_back(std::to_string(n));
    args.insert(args.end(), extra.begin(), extra.end());
    const RunResult r = run_harness(args);
    int passed = 0, refused = 0;
    for (const fs::path& d : dirs) {
      SCOPED_TRACE(d.filename().string() + " at tp " + std::to_string(n));
      const std::string key = refused_key(d, n);
      const std::string line = line_of(r.out, d.filename().string());
      if (key.empty()) {
        EXPECT_NE(line.find("PASS"), std::string::npos) << r.output;
        ++passed;
      } else {
        EXPECT_NE(line.find("could not run: "), std::string::npos) << r.output;
        EXPECT_NE(line.find("config.json: key '" + key + "' = "), std::string::npos) << line;
        EXPECT_NE(line.find("tp_size " + std::to_string(n)), std::string::npos) << line;
        ++refused;
      }
    }
    EXPECT_GT(passed, 0);
    EXPECT_EQ(r.exit_code, refused == 0 ? 0 : 2) << r.output;  // a fixture that could not run: exit 2
    EXPECT_NE(r.out.find(std::to_string(passed) + " pass, 0 fail, " + std::to_string(refused) + " could not run"),
              std::string::npos) << r.output;
  }
}

TEST(TensorParallelCli, Fp64PassesEveryAdmittedOracleFixtureAndRefusesTheRest) { replay_every_oracle_fixture({}); }

TEST(TensorParallelCli, Bf16WithABf16ReductionPassesEveryAdmittedOracleFixture) {
  replay_every_oracle_fixture({"--precision", "bf16", "--tp-reduce", "bf16"});
}

// docs/spec/tensor-parallel.md §9.2: a bf16 wire widens the bound of every stage past the first
// reduction, by ρ measured on the reference's partials, and of no stage before it.
TEST(TensorParallelCli, Bf16WireWidensTheBoundsPastTheFirstReduction) {
  const std::string fixture = kOracleDir + "/tiny-mha";
  const std::string dir = ::testing::TempDir();
  std::map<std::string, nlohmann::json> docs;
  for (const std::string wire : {"fp32", "bf16"}) {
    const std::string path = dir + "/tp-wire-" + wire + ".json";
    const RunResult r = run_harness(
        {"replay", fixture, "--tp", "2", "--precision", "bf16", "--tp-reduce", wire, "--json", path});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    docs[wire] = json_of(path);
  }
  const nlohmann::json& fp32 = docs["fp32"]["results"][0];
  const nlohmann::json& bf16 = docs["bf16"]["results"][0];
  EXPECT_EQ(fp32["pairs"][0]["actual_model"]["bf16_wire"], false);
  EXPECT_EQ(bf16["pairs"][0]["actual_model"]["bf16_wire"], true);
  const auto bound_of = [](const nlohmann::json& result, const std::string& stage) {
    for (const nlohmann::json& s : result["sequences"][0]["stages"]) {
      if (s["stage"] == stage) return s["bound"]["rel_rms"].get<double>();
    }
    ADD_FAILURE() << "no stage " << stage;
    return 0.0;
  };
  for (const std::string stage : {"L0.q", "L0.attn"}) {
    EXPECT_EQ(bound_of(bf16, stage), bound_of(fp32, stage)) << stage;
  }
  for (const std::string stage : {"L0.o_proj", "L0.mlp", "L0.out", "logits"}) {
    EXPECT_GT(bound_of(bf16, stage), bound_of(fp32, stage)) << stage;
  }
}

TEST(TensorParallelCli, OptionsRefusedWithTheContractsTexts) {
  const std::string fixture = kOracleDir + "/tiny-mha";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tp", "3"}, "error: --tp: tp_size 3 is not supported: expected 1, 2, 4 or 8"},
      {{"--tp", "2", "--tp-reduce", "fp16"},
       "error: --tp-reduce: tp_reduce_dtype 'fp16' is not supported: expected 'fp32' or 'bf16'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"replay", fixture};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const RunResult r = run_harness(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.output;
  }
  // bf16 partials need a precision that rounds to bf16: the fixture's row says why it could not run.
  const RunResult r = run_harness({"replay", fixture, "--tp", "2", "--tp-reduce", "bf16"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("tp_reduce_dtype 'bf16' needs a precision with bf16 storage"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dflash::cli_test
