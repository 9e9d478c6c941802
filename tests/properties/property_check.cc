#include "tests/properties/property_check.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <unordered_map>

#include "core/error.h"

namespace rc::detail {
// Exported by librapidcheck (the string its own listener prints); not in a public header.
std::string reproduceMapToString(const std::unordered_map<std::string, Reproduce>& reproduce_map);
}  // namespace rc::detail

namespace dflash::prop {
namespace {

// Whether RC_PARAMS names `key` explicitly ("key=value" tokens separated by spaces).
bool rc_params_has(const std::string& key) {
  const char* env = std::getenv("RC_PARAMS");
  if (env == nullptr) return false;
  std::istringstream tokens(env);
  std::string token;
  while (tokens >> token) {
    if (token.rfind(key + "=", 0) == 0) return true;
  }
  return false;
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string current_test_id() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info == nullptr) return "no-test";
  return std::string(info->test_suite_name()) + "/" + info->name();
}

class SilentListener : public rc::detail::TestListener {
 public:
  void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
  void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

}  // namespace

void fail_case(const std::string& message) {
  throw rc::detail::CaseResult(rc::detail::CaseResult::Type::Failure, message);
}

PropertyRun property_run(const std::string& id, int default_cases) {
  const rc::detail::TestParams& params = rc::detail::configuration().testParams;
  PropertyRun run;
  run.cases = default_cases;
  if (rc_params_has("max_success")) run.cases = params.maxSuccess;
  if (const char* env = std::getenv("DFLASH_PROP_CASES")) {
    char* end = nullptr;
    const long cases = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || cases < 1 || cases > 10000000) {
      throw bad_input(std::string("DFLASH_PROP_CASES must be a positive integer, got '") + env + "'");
    }
    run.cases = static_cast<int>(cases);
  }
  run.seed = rc_params_has("seed") ? params.seed : fnv1a(id);
  run.shrink = !params.disableShrinking;
  return run;
}

void check_property_in_test(const rc::detail::Property& property, int default_cases) {
  const std::string id = current_test_id();
  const PropertyRun run = property_run(id, default_cases);
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = run.cases;
  params.seed = run.seed;
  rc::detail::TestMetadata metadata;
  metadata.id = id;
  metadata.description = id;
  // The global listener also records the failure for RapidCheck's own reproduce line at exit.
  const rc::detail::TestResult result = rc::detail::checkProperty(property, metadata, params);

  rc::detail::SuccessResult success;
  if (result.match(success)) {
    if (success.numSuccess == 0 && !rc::detail::configuration().reproduce.empty()) {
      std::cout << "[property] " << id << ": not in the RC_PARAMS reproduce set, not run\n";
    } else {
      // Always say how many cases ran (and how often each classified situation came up), so a log
      // shows the count behind every pass.
      std::cout << "[property] " << id << " (seed " << run.seed << "): ";
      rc::detail::printResultMessage(success, std::cout);
      std::cout << "\n";
    }
    return;
  }
  std::ostringstream message;
  message << "property " << id << " failed (seed " << run.seed << ", up to " << run.cases << " cases)\n";
  rc::detail::printResultMessage(result, message);
  rc::detail::FailureResult failure;
  if (result.match(failure)) {
    std::unordered_map<std::string, rc::detail::Reproduce> reproduce{{id, failure.reproduce}};
    message << "\nReproduce this counterexample with:\n  RC_PARAMS=\"reproduce="
            << rc::detail::reproduceMapToString(reproduce) << "\" <test binary> --gtest_filter='"
            << ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() << "."
            << ::testing::UnitTest::GetInstance()->current_test_info()->name() << "'\n"
            << "or rerun the whole search with RC_PARAMS=\"seed=" << run.seed << "\" (and DFLASH_PROP_CASES="
            << run.cases << ").";
  }
  ADD_FAILURE() << message.str();
}

bool find_counterexample(const rc::detail::Property& property, int cases, uint64_t seed, std::string* failure,
                         bool shrink) {
  rc::detail::TestParams params;
  params.maxSuccess = cases;
  params.seed = seed;
  params.disableShrinking = !shrink;  // mostly the counterexample's existence is the point, not its size
  SilentListener listener;
  const rc::detail::TestResult result =
      rc::detail::checkProperty(property, rc::detail::TestMetadata{}, params, listener, {});
  rc::detail::FailureResult found;
  if (!result.match(found)) {
    rc::detail::GaveUpResult gave_up;
    if (result.match(gave_up) && failure != nullptr) *failure = "gave up: " + gave_up.description;
    return false;
  }
  if (failure != nullptr) {
    std::ostringstream text;
    rc::detail::printResultMessage(found, text);
    *failure = text.str();
  }
  return true;
}

}  // namespace dflash::prop
