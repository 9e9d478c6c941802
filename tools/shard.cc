#include "tools/shard.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "core/parse_number.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

}  // namespace

ShardSpec parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  const auto refuse = [&](const std::string& why) {
    return bad_input("--shard " + text + ": " + why + " (I/N: shard I of N, 1 <= I <= N, e.g. 1/3, 2/3, 3/3)");
  };
  if (slash == std::string::npos) throw refuse("expected I/N");
  int index = 0, count = 0;
  if (!parse_whole_int(text.substr(0, slash), &index) || !parse_whole_int(text.substr(slash + 1), &count)) {
    throw refuse("I and N must be integers");
  }
  if (count < 1 || count > 100000) throw refuse("N must be between 1 and 100000");
  if (index < 1 || index > count) throw refuse("I must be between 1 and N (shards are numbered from 1)");
  return {index, count};
}

uint64_t fixture_bytes(const std::string& path) {
  std::error_code ec;
  fs::path dir(without_trailing_slash(path));
  if (!fs::exists(dir, ec)) return 0;
  if (!fs::is_directory(dir, ec)) dir = dir.parent_path();  // its fixture.json
  uint64_t bytes = 0;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (!it->is_regular_file(size_ec)) continue;
    const uintmax_t size = it->file_size(size_ec);
    if (!size_ec) bytes += size;
  }
  return bytes;
}

std::vector<int> assign_shards(const std::vector<std::string>& paths, const std::vector<uint64_t>& bytes, int count) {
  if (paths.size() != bytes.size() || count < 1) throw internal_error("assign_shards: one size per path, count >= 1");
  std::vector<size_t> order(paths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (bytes[a] != bytes[b]) return bytes[a] > bytes[b];
    return without_trailing_slash(paths[a]) < without_trailing_slash(paths[b]);
  });
  std::vector<uint64_t> load(static_cast<size_t>(count), 0);
  std::vector<int> shard(paths.size(), 0);
  for (size_t i : order) {
    const size_t lightest = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[lightest] += bytes[i];
    shard[i] = static_cast<int>(lightest) + 1;
  }
  return shard;
}

}  // namespace dflash
