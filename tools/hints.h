// Hints for a newcomer's mistakes: the nearest name to a mistyped one, and why a path given as a
// fixture is not one (with what it probably meant).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace dflash {

// Edit distance with adjacent transpositions (optimal string alignment): "replya" is 1 from
// "replay".
int edit_distance(const std::string& a, const std::string& b);

// The candidate nearest to `typed`, when it is near enough to be a typo (at most a third of the
// longer name's length away, and at least 1 edit allowed); ties go to the earlier candidate.
std::optional<std::string> nearest_name(const std::string& typed, const std::vector<std::string>& candidates);

// Refuses, as bad input with a reason and a hint, a path that cannot be a fixture:
//   "no such file or directory: PATH" (+ "; did you mean SIBLING?" for a near name beside it),
//   "not a fixture directory (no fixture.json): PATH" (+ the fixture directories it holds, if any).
// A path that names fixture.json, or a directory holding one, passes.
void check_fixture_path(const std::string& path);

}  // namespace dflash
