// Shards: parsed by name, a partition of the fixtures, balanced by bytes, the same in any order.
#include "tools/shard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "tests/support/harness_error.h"

namespace dflash {
namespace {

using testing::expect_mentions;
using testing::harness_error_message;

TEST(ParseShard, OneBasedIOfN) {
  const ShardSpec s = parse_shard("2/3");
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 3);
  EXPECT_EQ(parse_shard("1/1").index, 1);
  for (const char* bad : {"0/3", "4/3", "3", "a/3", "1/0", "-1/3", "1/3x", "/3"}) {
    expect_mentions(harness_error_message([&] { parse_shard(bad); }), std::string("--shard ") + bad + ": ");
  }
  expect_mentions(harness_error_message([&] { parse_shard("0/3"); }), "shards are numbered from 1");
}

TEST(AssignShards, LargestFirstToTheLightestShard) {
  // 100, 60, 50, 40, 10 over 2 shards: 100 -> 1; 60 -> 2; 50 -> 2 (110); 40 -> 1 (140); 10 -> 2 (120).
  const std::vector<std::string> paths = {"e", "b", "a", "d", "c"};
  const std::vector<uint64_t> bytes = {10, 60, 100, 40, 50};
  EXPECT_EQ(assign_shards(paths, bytes, 2), (std::vector<int>{2, 2, 1, 1, 2}));
  // One shard takes everything; more shards than fixtures leaves some empty.
  EXPECT_EQ(assign_shards(paths, bytes, 1), (std::vector<int>{1, 1, 1, 1, 1}));
  EXPECT_EQ(assign_shards({"x", "y"}, {5, 5}, 4), (std::vector<int>{1, 2}));
}

TEST(AssignShards, IndependentOfArgumentOrderAndTrailingSlashes) {
  std::vector<std::string> paths;
  std::vector<uint64_t> bytes;
  for (int i = 0; i < 23; ++i) {
    paths.push_back("fixtures/f" + std::to_string(i) + "/");
    bytes.push_back(static_cast<uint64_t>((i * 37) % 11) * 1000);  // many equal sizes: ties decided by path
  }
  std::map<std::string, int> first;
  const std::vector<int> shards = assign_shards(paths, bytes, 3);
  for (size_t i = 0; i < paths.size(); ++i) first[paths[i]] = shards[i];
  std::vector<size_t> order(paths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  std::swap(order[3], order[17]);
  std::vector<std::string> shuffled;
  std::vector<uint64_t> shuffled_bytes;
  for (size_t i : order) {
    std::string p = paths[i];
    if (i % 2) p.pop_back();  // the same fixture without its trailing '/'
    shuffled.push_back(p);
    shuffled_bytes.push_back(bytes[i]);
  }
  const std::vector<int> again = assign_shards(shuffled, shuffled_bytes, 3);
  for (size_t k = 0; k < order.size(); ++k) EXPECT_EQ(again[k], first[paths[order[k]]]) << shuffled[k];
  // Every shard gets some, and none is heavier than another by more than the largest fixture.
  std::vector<uint64_t> load(3, 0);
  for (size_t i = 0; i < paths.size(); ++i) load[shards[i] - 1] += bytes[i];
  const uint64_t largest = *std::max_element(bytes.begin(), bytes.end());
  EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), largest);
}

TEST(FixtureBytes, SumsTheFilesOfTheFixtureDirectory) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "shard-bytes" / "f";
  std::filesystem::remove_all(dir.parent_path());
  std::filesystem::create_directories(dir / "drafter");
  std::ofstream(dir / "fixture.json") << std::string(100, 'a');
  std::ofstream(dir / "drafter" / "model.safetensors") << std::string(250, 'b');
  EXPECT_EQ(fixture_bytes(dir.string()), 350u);
  EXPECT_EQ(fixture_bytes(dir.string() + "/"), 350u);
  EXPECT_EQ(fixture_bytes((dir / "fixture.json").string()), 350u);
  EXPECT_EQ(fixture_bytes((dir.parent_path() / "missing").string()), 0u);
}

}  // namespace
}  // namespace dflash
