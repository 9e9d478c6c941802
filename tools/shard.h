// `replay --shard I/N`: a stable partition of a run's fixtures into N shards balanced by size, so
// that N machines replay a run between them and `report` merges their reports (docs/cli.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

struct ShardSpec {
  int index = 1;  // 1-based
  int count = 1;
};

// "I/N" with 1 <= I <= N (1-based; "1/3", "2/3", "3/3"); bad input naming the option otherwise.
ShardSpec parse_shard(const std::string& text);

// Bytes of every regular file under the fixture at `path` (a directory, or its fixture.json's
// directory), the measure of how long it takes; 0 for a path that cannot be read (it still gets
// a shard, where it is reported as could not run).
uint64_t fixture_bytes(const std::string& path);

// The shard (1-based) of each fixture: fixtures sorted by bytes, largest first, ties by path
// (compared without trailing '/'), each given to the shard with the fewest bytes so far (the lowest
// index of equals). The same paths and sizes give the same shards in any argument order.
std::vector<int> assign_shards(const std::vector<std::string>& paths, const std::vector<uint64_t>& bytes, int count);

}  // namespace dflash
