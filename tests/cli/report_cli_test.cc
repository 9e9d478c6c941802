// `dflash-harness report`: the HTML page opened in a real headless browser shows the failing stage.
#include <cstdlib>

#include <gtest/gtest.h>

#include "tests/cli/fixture_surgery.h"
#include "tests/cli/harness_runner.h"

namespace dflash::cli_test {
namespace {

const std::string kOracleDir = std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle";

TEST(ReportCli, HtmlInAHeadlessBrowserShowsTheFailingStage) {
  if (std::system("command -v chromium > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "chromium is not installed (Debian package 'chromium'); the HTML report cannot be opened in a browser here";
  }
  const std::string work = scratch_dir("work");
  const std::string bad = work + "/tiny-gqa";
  copy_fixture(kOracleDir + "/tiny-gqa", bad);
  edit_trace_tensor(bad, "s1.q0.tap.L0.mlp", [](std::vector<float>& v) { v[7] += 3.0f; });
  const std::string json_path = work + "/report.json", html_path = work + "/report.html";
  ASSERT_EQ(run_harness({"replay", "--json", json_path, bad, kOracleDir + "/tiny-mha"}).exit_code, 1);
  const RunResult report = run_harness({"report", json_path, "-o", html_path});
  ASSERT_EQ(report.exit_code, 0) << report.output;

  const std::string dom_path = work + "/dom.html";
  const std::string command = "timeout 120 chromium --headless --no-sandbox --disable-gpu --dump-dom 'file://" +
                              html_path + "' > '" + dom_path + "' 2> /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << "chromium could not render " << html_path;
  const std::string dom = read_file(dom_path);
  // The browser parsed the page (the DOM comes back serialized) and the plot marks the stage.
  EXPECT_NE(dom.find("<svg"), std::string::npos);
  EXPECT_NE(dom.find("class=\"bar fail first-divergence\" data-stage=\"L0.mlp\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("first divergence: L0.mlp"), std::string::npos);
  EXPECT_NE(dom.find("step 1, sequence 0: first divergence at L0.mlp (layer 0)"), std::string::npos);
  EXPECT_NE(dom.find("class=\"bar pass\" data-stage=\"L0.mlp_norm\""), std::string::npos);
  // The heat map (step x stage): the planted stage fails at step 1 and passes at the others.
  EXPECT_NE(dom.find("<svg class=\"heat-map\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("class=\"cell fail\" data-step=\"1\" data-stage=\"L0.mlp\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("class=\"cell pass\" data-step=\"0\" data-stage=\"L0.mlp\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("class=\"cell pass\" data-step=\"2\" data-stage=\"L0.mlp\""), std::string::npos) << dom;
  EXPECT_NE(dom.find("FAIL"), std::string::npos);
  EXPECT_NE(dom.find("PASS"), std::string::npos);  // tiny-mha
}

TEST(ReportCli, MissingOrForeignReportExitsTwo) {
  const std::string work = scratch_dir("work");
  EXPECT_EQ(run_harness({"report", work + "/none.json", "-o", work + "/r.html"}).exit_code, 2);
  const RunResult foreign = run_harness({"report", kOracleDir + "/tiny-mha/fixture.json", "-o", work + "/r.html"});
  EXPECT_EQ(foreign.exit_code, 2) << foreign.output;
  EXPECT_NE(foreign.output.find("format"), std::string::npos) << foreign.output;
  EXPECT_EQ(run_harness({"report", kOracleDir + "/tiny-mha/fixture.json"}).exit_code, 2);  // no -o
}

}  // namespace
}  // namespace dflash::cli_test
