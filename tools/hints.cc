#include "tools/hints.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;

// The path without trailing separators ("fixtures/oracle/" -> "fixtures/oracle"), so that its
// parent is the directory it sits in.
fs::path trimmed(const std::string& path) {
  std::string s = path;
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return fs::path(s);
}

// The entries of `dir` (names only, sorted), or none when it cannot be listed.
std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir.empty() ? fs::path(".") : dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

std::optional<std::string> nearest_name(const std::string& typed, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  int best_distance = 0;
  for (const std::string& candidate : candidates) {
    const int distance = edit_distance(typed, candidate);
    const int allowed = std::max<int>(1, static_cast<int>(std::max(typed.size(), candidate.size())) / 3);
    if (distance == 0 || distance > allowed) continue;
    if (!best || distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

void check_fixture_path(const std::string& path) {
  std::error_code ec;
  const fs::path p = trimmed(path);
  if (!fs::exists(p, ec)) {
    std::string message = "no such file or directory: " + path;
    const fs::path parent = p.parent_path();
    if (const auto near = nearest_name(p.filename().string(), entries_of(parent))) {
      message += "; did you mean " + (parent.empty() ? fs::path(*near) : parent / *near).string() + "?";
    } else if (!parent.empty() && !fs::exists(parent, ec)) {
      message += " (its directory " + parent.string() + " does not exist either)";
    }
    throw bad_input(message);
  }
  if (!fs::is_directory(p, ec)) {
    if (p.filename() == "fixture.json") return;
    std::string message = "not a fixture directory (a fixture is a directory holding fixture.json): " + path;
    const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (fs::exists(parent / "fixture.json", ec)) message += "; did you mean " + parent.string() + "?";
    throw bad_input(message);
  }
  if (fs::exists(p / "fixture.json", ec)) return;
  std::string message = "not a fixture directory (no fixture.json): " + path;
  std::vector<std::string> fixtures;
  for (const std::string& name : entries_of(p)) {
    if (fs::exists(p / name / "fixture.json", ec)) fixtures.push_back(name);
  }
  if (!fixtures.empty()) {
    message += "; it holds " + std::to_string(fixtures.size()) + " fixture director" +
               (fixtures.size() == 1 ? "y" : "ies") + " (" + fixtures.front() + (fixtures.size() > 1 ? ", ..." : "") +
               "): name them, e.g. " + (p / "*/").string();
  }
  throw bad_input(message);
}

}  // namespace dflash
