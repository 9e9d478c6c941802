#include "compare/acceptance_text.h"

#include <algorithm>
#include <cmath>

#include "compare/acceptance_json.h"
#include "compare/text_format.h"

namespace dflash {

std::string max_tv_cell(const ReplayResult& result, const std::vector<int>& pairs) {
  std::optional<double> worst;
  for (int p : pairs) {
    if (const std::optional<double> tv = pair_max_tv(result, p)) worst = worst ? std::max(*worst, *tv) : *tv;
  }
  return worst ? format_number(*worst) : "-";
}

void print_acceptance_lines(std::ostream& out, const std::vector<FixtureOutcome>& outcomes) {
  for (const FixtureOutcome& outcome : outcomes) {
    if (!outcome.result) continue;
    const ReplayResult& r = *outcome.result;
    const AcceptanceReport& a = r.acceptance;
    if (!a.measured()) continue;
    const SideAcceptance* fixture = a.side_of_lane(-1);
    out << "acceptance " << fixture_label(r.fixture_name, r.fixture_dir) << ":";
    for (size_t i = 0; i < a.sides.size(); ++i) {
      const SideAcceptance& s = a.sides[i];
      out << (i ? ";" : "") << " " << s.name << " " << format_number(s.mean_length, "%.2f");
      if (s.lane >= 0 && fixture != nullptr)
        out << " (" << format_number(s.mean_length - fixture->mean_length, "%+.2f") << ")";
      out << ", per position";
      for (const PositionAcceptance& p : s.positions) {
        out << " " << format_number(static_cast<double>(p.reached) / p.blocks, "%.2f");
      }
      if (s.sampling_length) out << ", under sampling " << format_number(*s.sampling_length, "%.2f");
    }
    if (a.pin) {
      out << "; pinned";
      for (double v : a.pin->per_position) out << " " << format_number(v, "%.2f");
      bool failed = false;
      for (const AcceptanceFailure& f : a.failures) failed = failed || f.check == "pinned-acceptance";
      out << ": " << (failed ? "FAIL" : "pass");
    }
    out << "\n";
  }
}

void print_acceptance_failures(std::ostream& out, const ReplayResult& result) {
  for (const AcceptanceFailure& f : result.acceptance.failures) {
    out << "  " << (f.check == "canary" ? "acceptance canary" : "pinned acceptance") << ": " << f.detail << "\n";
  }
}

}  // namespace dflash
