#include "compare/catch_table.h"

#include <sstream>

#include "compare/text_format.h"
#include "core/stages.h"

namespace dflash {

const char* catch_check_name(CatchCheck check) {
  switch (check) {
    case CatchCheck::kReplay: return "replay";
    case CatchCheck::kInvariant: return "invariant";
    case CatchCheck::kProperty: return "property";
    case CatchCheck::kGpuTest: return "gpu-test";
  }
  return "?";
}

bool CatchResult::as_declared() const {
  return caught && check == bug.declared_check && named == bug.declared_stage;
}

namespace {
// Table cells may not carry a '|'.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? '/' : (c == '\n' ? ' ' : c);
  return out;
}

// Position of a failure within its step, in the order first_failure() documents.
int order_in_step(const ReplayFailure& f) {
  if (f.check == CatchCheck::kReplay) return f.named == stage_name(StageKind::kCtxProj) ? 0 : 2;
  return f.named == "kv-stored" ? 1 : 3;
}
}  // namespace

std::optional<ReplayFailure> first_failure(const std::optional<ReplayFailure>& divergence,
                                           const std::vector<ReplayFailure>& invariants) {
  std::optional<ReplayFailure> first = divergence;
  for (const ReplayFailure& f : invariants) {
    if (!first || f.step < first->step || (f.step == first->step && order_in_step(f) < order_in_step(*first))) first = f;
  }
  return first;
}

std::string format_catch_table(const std::vector<CatchResult>& results) {
  std::ostringstream os;
  os << "| id | class | caught | by | first stage named | declared | as declared | acceptance change | where |\n";
  os << "|---|---|---|---|---|---|---|---|---|\n";
  for (const CatchResult& r : results) {
    os << "| " << cell(r.bug.id) << " | " << cell(r.bug.bug_class) << " | " << (r.caught ? "yes" : "no") << " | "
       << (r.caught ? catch_check_name(r.check) : "-") << " | " << (r.caught ? cell(r.named) : "-") << " | "
       << catch_check_name(r.bug.declared_check) << " @ " << cell(r.bug.declared_stage) << " | "
       << (r.as_declared() ? "yes" : "no") << " | " << cell(r.acceptance) << " | " << cell(r.bug.where) << " |\n";
  }
  return os.str();
}

std::string catch_summary(const std::vector<CatchResult>& results) {
  int declared = 0;
  for (const CatchResult& r : results) declared += r.as_declared() ? 1 : 0;
  return std::to_string(declared) + " of " + std::to_string(results.size()) + " caught as declared";
}

std::string format_acceptance_change(const std::optional<double>& working, const std::optional<double>& broken,
                                     const std::vector<std::string>& failed_checks) {
  if (!working || !broken) return "-";
  std::string checks;
  for (const std::string& c : failed_checks) checks += (checks.empty() ? "; " : ", ") + c;
  return format_number(*broken - *working, "%+.2f") + " (" + format_number(*working, "%.2f") + " -> " +
         format_number(*broken, "%.2f") + checks + ")";
}

}  // namespace dflash
