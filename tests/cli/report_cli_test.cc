// `dflash-harness report`: the HTML page opened in a real headless browser shows the failing stage.
#include <cstdlib>
#include <filesystem>
#include <fstream>

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
  ASSERT_EQ(report.exit_code, 1) << report.output;  // the run's exit code: a fixture failed
  EXPECT_NE(report.out.find("1 pass, 1 fail, 0 could not run\n"), std::string::npos) << report.out;

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

// The page of `html_path` as laid out by headless chromium, with a script added (to a copy: the
// report itself has none) that lists every SVG text drawn outside its SVG (cut off) and every
// caption wider than its box: "no clipping" when there is none.
std::string clipping_in_browser(const std::string& html_path, const std::string& work) {
  std::string html = read_file(html_path);
  const std::string script = R"(<script>
(function () {
  const problems = [];
  for (const cap of document.querySelectorAll('figcaption')) {
    if (cap.scrollWidth > cap.clientWidth + 1) problems.push('caption wider than its box: ' + cap.textContent);
  }
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.width === 0) problems.push('text not laid out: ' + t.textContent);
      if (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5) {
        problems.push('cut off: ' + t.textContent);
      }
    }
  }
  const out = document.createElement('pre');
  out.id = 'layout-check';
  out.textContent = problems.length ? problems.join(' | ') : 'no clipping';
  document.body.appendChild(out);
})();
</script>)";
  html.insert(html.rfind("</body>"), script);
  const std::string checked = work + "/checked.html", dom_path = work + "/checked-dom.html";
  std::ofstream(checked) << html;
  const std::string command = "timeout 120 chromium --headless --no-sandbox --disable-gpu --dump-dom 'file://" +
                              checked + "' > '" + dom_path + "' 2> /dev/null";
  if (std::system(command.c_str()) != 0) return "chromium could not render " + checked;
  const std::string dom = read_file(dom_path);
  const size_t begin = dom.find("<pre id=\"layout-check\">");
  if (begin == std::string::npos) return "the layout check did not run:\n" + dom;
  const size_t text = dom.find('>', begin) + 1;
  return dom.substr(text, dom.find("</pre>", text) - text);
}

TEST(ReportCli, HtmlCaptionsAndStageNamesAreNotCutOff) {
  if (std::system("command -v chromium > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "chromium is not installed (Debian package 'chromium'); the HTML report cannot be laid out here";
  }
  // DFlash2 fixtures have the longest stage names (selector.walk_scores, L1.attn_conv_coef), last in
  // forward order; a failing fixture adds the first-divergence caption.
  const std::string work = scratch_dir("work");
  const std::string bad = work + "/tiny-gqa";
  copy_fixture(kOracleDir + "/tiny-gqa", bad);
  edit_trace_tensor(bad, "s1.q0.tap.L0.mlp", [](std::vector<float>& v) { v[7] += 3.0f; });
  std::vector<std::string> args = {"replay", "--html", work + "/report.html", bad};
  for (const auto& entry : std::filesystem::directory_iterator(std::string(DFLASH_SOURCE_DIR) + "/fixtures/dflash2")) {
    if (std::filesystem::exists(entry.path() / "fixture.json")) args.push_back(entry.path().string());
  }
  ASSERT_GE(args.size(), 6u);
  const RunResult r = run_harness(args);
  ASSERT_EQ(r.exit_code, 1) << r.output;
  const std::string html = read_file(work + "/report.html");
  ASSERT_NE(html.find("selector.walk_scores"), std::string::npos) << "no DFlash2 selector stage in the page";
  EXPECT_EQ(clipping_in_browser(work + "/report.html", work), "no clipping");
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
