#include "compare/report_html.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "compare/acceptance_html.h"
#include "compare/run_tally.h"
#include "compare/text_format.h"

namespace dflash {
namespace {

using nlohmann::json;

std::string str(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

std::string fixture_label(const json& r) { return dflash::fixture_label(str(r, "fixture"), str(r, "dir")); }

// A ratio (error/bound) as text; null in the JSON stands for a non-finite ratio (NaN or a shape fault).
std::string ratio_text(const json& ratio) { return ratio.is_number() ? format_number(ratio.get<double>()) : "&#8734;"; }

const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-top:1px solid #ccc;padding-top:12px}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.verdict-pass{color:#176b2c;font-weight:bold}.verdict-fail{color:#b00020;font-weight:bold}
.divergence{background:#fdecea;border-left:4px solid #b00020;padding:8px 12px;font-family:monospace}
.error{background:#fff4e5;border-left:4px solid #e65100;padding:8px 12px}
svg .bar.pass{fill:#4caf50}svg .bar.fail{fill:#e53935}svg .bar.first-divergence{stroke:#000;stroke-width:2}
svg .bound{stroke:#b00020;stroke-dasharray:6 4}svg.heat-map .cell.fail{stroke:#000}svg text{font:11px sans-serif}svg .axis{stroke:#888}
tr.fail td{background:#fdecea}tr.could-not-run td{background:#fff4e5}
figure{margin:12px 0;max-width:100%;overflow-x:auto}figcaption{font-size:12px;margin-bottom:4px;overflow-wrap:anywhere}
figcaption .first-divergence-label{color:#b00020;font-weight:bold}
)";

// Room for a stage name drawn at 60 degrees below an axis: a generous width per character of the
// 11px font, so that no name is cut off at the bottom or the right edge of its plot.
constexpr double kCharWidth = 7.0;
struct LabelRoom {
  int below = 0, right = 0;
};
LabelRoom label_room(const std::vector<std::string>& names) {
  size_t longest = 0;
  for (const std::string& name : names) longest = std::max(longest, name.size());
  const double length = kCharWidth * static_cast<double>(longest);
  return {static_cast<int>(std::ceil(0.87 * length + 0.5 * 11)) + 14, static_cast<int>(std::ceil(0.5 * length)) + 14};
}

// Error/bound per stage on a log scale from 1e-4 to 1e2; the bound is the line at 1. The caption is
// HTML (it wraps with the page); the SVG is sized to hold its rotated stage names.
std::string stage_plot(const json& pair, const std::string& first_stage) {
  const json& stages = pair["stages"];
  const int n = static_cast<int>(stages.size());
  std::vector<std::string> names;
  for (const json& s : stages) names.push_back(str(s, "stage"));
  const LabelRoom room = label_room(names);
  const int left = 40, top = 10, bar_step = 22, plot_height = 180;
  const int width = left + std::max(n, 1) * bar_step + room.right, height = top + plot_height + room.below;
  const double log_min = -4, log_max = 2;
  const auto y_of = [&](double log_ratio) {
    const double clamped = std::min(log_max, std::max(log_min, log_ratio));
    return top + plot_height * (log_max - clamped) / (log_max - log_min);
  };
  std::ostringstream svg;
  svg << "<figure class=\"stage-plot\"><figcaption>error / bound per stage (log scale; above the dashed line fails)";
  if (!first_stage.empty()) {
    svg << "<br><span class=\"first-divergence-label\">first divergence: " << html_escape(first_stage) << "</span>";
  }
  svg << "</figcaption>\n";
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" role=\"img\" aria-label=\"error over bound per stage\">\n";
  for (int e = static_cast<int>(log_min); e <= static_cast<int>(log_max); ++e) {
    const double y = y_of(e);
    svg << "<line class=\"axis\" x1=\"" << left - 4 << "\" x2=\"" << left << "\" y1=\"" << y << "\" y2=\"" << y
        << "\"/><text x=\"4\" y=\"" << y + 4 << "\">1e" << e << "</text>\n";
  }
  svg << "<line class=\"axis\" x1=\"" << left << "\" x2=\"" << left << "\" y1=\"" << top << "\" y2=\""
      << top + plot_height << "\"/>\n";
  const double bound_y = y_of(0);
  svg << "<line class=\"bound\" x1=\"" << left << "\" x2=\"" << width - 10 << "\" y1=\"" << bound_y << "\" y2=\""
      << bound_y << "\"/>\n";
  for (int i = 0; i < n; ++i) {
    const json& s = stages[i];
    const std::string& name = names[i];
    const bool passed = s["passed"].get<bool>();
    const bool finite = s["ratio"].is_number();
    const double ratio = finite ? s["ratio"].get<double>() : 0;
    const double log_ratio = !finite ? log_max : ratio > 0 ? std::log10(ratio) : log_min;
    const double y = y_of(log_ratio);
    const int x = left + i * bar_step + 3;
    std::string cls = std::string("bar ") + (passed ? "pass" : "fail");
    if (name == first_stage) cls += " first-divergence";
    svg << "<rect class=\"" << cls << "\" data-stage=\"" << html_escape(name) << "\" x=\"" << x << "\" y=\"" << y
        << "\" width=\"" << bar_step - 6 << "\" height=\"" << std::max(1.0, top + plot_height - y) << "\"><title>"
        << html_escape(name) << ": error/bound " << ratio_text(s["ratio"]) << "</title></rect>\n";
    const int label_x = x + (bar_step - 6) / 2;
    svg << "<text class=\"stage-label" << (passed ? "" : " fail") << "\" x=\"" << label_x << "\" y=\""
        << top + plot_height + 8 << "\" transform=\"rotate(60 " << label_x << " " << top + plot_height + 8
        << ")\">" << html_escape(name) << "</text>\n";
  }
  svg << "</svg></figure>\n";
  return svg.str();
}

// The fill of a heat-map cell: green at error/bound 1e-4 and below through yellow to orange at the
// bound; over it (or not finite) dark red.
std::string cell_color(bool passed, const json& ratio) {
  if (!passed || !ratio.is_number()) return "#b00020";
  const double r = ratio.get<double>();
  const double t = r > 0 ? std::min(1.0, std::max(0.0, (std::log10(r) + 4) / 4)) : 0.0;
  std::ostringstream c;
  c << "hsl(" << static_cast<int>(120 - 90 * t) << ",70%," << static_cast<int>(88 - 30 * t) << "%)";
  return c.str();
}

// Error/bound of every stage at every step of one comparison (the worst sequence of the step), as
// a grid: a row per step, a column per stage in forward order. A stage not compared at a step is
// grey.
std::string step_stage_heat_map(const json& r, int pair_index) {
  std::vector<std::string> stages;
  for (const json& name : r["stage_order"]) {
    if (name.is_string()) stages.push_back(name.get<std::string>());
  }
  struct Cell {
    bool seen = false, passed = true;
    json ratio;
  };
  std::map<int, std::map<std::string, Cell>> grid;  // step -> stage -> worst check
  for (const json& seq : r["sequences"]) {
    if (seq.value("pair", -1) != pair_index) continue;
    std::map<std::string, Cell>& row = grid[seq.value("step", -1)];
    for (const json& s : seq["stages"]) {
      Cell& cell = row[str(s, "stage")];
      const bool passed = s.value("passed", false);
      const json& ratio = s.contains("ratio") ? s["ratio"] : json();
      const bool worse = !cell.seen || (cell.passed && !passed) ||
                         (cell.passed == passed && cell.ratio.is_number() &&
                          (!ratio.is_number() || ratio.get<double>() > cell.ratio.get<double>()));
      if (worse) cell = {true, passed, ratio};
    }
  }
  if (grid.empty()) return "";
  const LabelRoom room = label_room(stages);
  const int cell = 14, left = 64, top = 4;
  const int width = left + static_cast<int>(stages.size()) * cell + room.right;
  const int height = top + static_cast<int>(grid.size()) * cell + room.below;
  std::ostringstream svg;
  svg << "<figure class=\"heat-map\"><figcaption>error / bound per step and stage: green 1e-4, orange 1, red over, "
         "grey not compared</figcaption>\n";
  svg << "<svg class=\"heat-map\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" role=\"img\" aria-label=\"error over bound per step and stage\">\n";
  int y = top;
  for (const auto& [step, row] : grid) {
    svg << "<text x=\"4\" y=\"" << y + cell - 3 << "\">step " << step << "</text>\n";
    for (size_t i = 0; i < stages.size(); ++i) {
      const int x = left + static_cast<int>(i) * cell;
      const auto it = row.find(stages[i]);
      svg << "<rect class=\"cell ";
      if (it == row.end()) {
        svg << "none\" data-step=\"" << step << "\" data-stage=\"" << html_escape(stages[i]) << "\" fill=\"#e0e0e0\"";
      } else {
        svg << (it->second.passed ? "pass" : "fail") << "\" data-step=\"" << step << "\" data-stage=\""
            << html_escape(stages[i]) << "\" fill=\"" << cell_color(it->second.passed, it->second.ratio) << "\"";
      }
      svg << " x=\"" << x << "\" y=\"" << y << "\" width=\"" << cell - 1 << "\" height=\"" << cell - 1 << "\"><title>step "
          << step << ", " << html_escape(stages[i]) << ": "
          << (it == row.end() ? std::string("not compared") : "error/bound " + ratio_text(it->second.ratio))
          << "</title></rect>\n";
    }
    y += cell;
  }
  for (size_t i = 0; i < stages.size(); ++i) {
    const int label_x = left + static_cast<int>(i) * cell + cell / 2;
    svg << "<text x=\"" << label_x << "\" y=\"" << y + 6 << "\" transform=\"rotate(60 " << label_x << " " << y + 6
        << ")\">" << html_escape(stages[i]) << "</text>\n";
  }
  svg << "</svg></figure>\n";
  return svg.str();
}

void render_result(std::ostringstream& html, const json& r, int index) {
  const bool pass = str(r, "verdict") == "pass";
  html << "<section class=\"fixture " << (pass ? "pass" : "fail") << "\" id=\"fixture-" << index << "\">\n";
  html << "<h2>" << html_escape(fixture_label(r)) << " &mdash; <span class=\"verdict-" << (pass ? "pass" : "fail")
       << "\">" << (pass ? "PASS" : "FAIL") << "</span></h2>\n";
  html << "<p>expectations: " << html_escape(str(r, "expect_precision")) << "; steps run "
       << r.value("steps_run", 0) << " of " << r.value("total_steps", 0) << "; directory "
       << html_escape(str(r, "dir")) << "</p>\n";
  const json& first = r["first_divergence"];
  std::string first_pair, first_stage;
  if (!first.is_null()) {
    first_pair = str(first, "pair");
    first_stage = str(first, "stage");
    html << "<p class=\"divergence\">" << html_escape(str(first, "text")) << "</p>\n";
  }

  html << "<h3>Drafters</h3>\n<table><tr><th>drafter</th><th>precision</th><th>levers</th><th>not run</th></tr>\n";
  for (const json& p : r["proposers"]) {
    html << "<tr><td>" << html_escape(str(p, "name")) << "</td><td>" << html_escape(str(p, "precision")) << "</td><td>";
    if (p.contains("levers") && p["levers"].is_array()) {
      for (const json& lever : p["levers"]) {
        if (lever.is_array() && lever.size() == 2 && lever[0].is_string() && lever[1].is_string()) {
          html << html_escape(lever[0].get<std::string>()) << "=" << html_escape(lever[1].get<std::string>()) << " ";
        }
      }
    }
    html << "</td><td>";
    if (p.contains("checks_not_run") && p["checks_not_run"].is_array()) {
      for (const json& line : p["checks_not_run"]) {
        if (line.is_string()) html << html_escape(line.get<std::string>()) << "<br>";
      }
    }
    html << "</td></tr>\n";
  }
  html << "</table>\n";

  int pair_index = 0;
  for (const json& pair : r["pairs"]) {
    const std::string label = str(pair, "label");
    html << "<h3>" << html_escape(label) << "</h3>\n";
    const json& tokens = pair["tokens"];
    html << "<p>draft tokens: " << tokens.value("agree", 0) << " agree, " << tokens.value("tie_excused", 0)
         << " tie-excused, " << tokens.value("mismatch", 0) << " mismatch</p>\n";
    html << stage_plot(pair, label == first_pair ? first_stage : std::string());
    html << step_stage_heat_map(r, pair_index++);
    html << distribution_plot_html(pair);
    html << "<table><tr><th>stage</th><th>error/bound</th><th>rel RMS</th><th>bound</th><th>max rel</th>"
            "<th>bound</th><th>worst at step/seq</th></tr>\n";
    for (const json& s : pair["stages"]) {
      const bool passed = s["passed"].get<bool>();
      html << "<tr class=\"" << (passed ? "pass" : "fail") << "\"><td>" << html_escape(str(s, "stage")) << "</td><td>"
           << ratio_text(s["ratio"]) << "</td><td>" << ratio_text(s.value("rel_rms", json())) << "</td><td>"
           << format_number(s.value("bound_rel_rms", 0.0)) << "</td><td>" << ratio_text(s.value("max_rel", json()))
           << "</td><td>" << format_number(s.value("bound_max_rel", 0.0)) << "</td><td>" << s.value("step", -1) << " / "
           << s.value("seq", -1) << "</td></tr>\n";
    }
    html << "</table>\n";
  }

  html << acceptance_section_html(r);
  if (r.contains("drafter_fault") && r["drafter_fault"].is_object()) {
    html << "<p class=\"divergence\">" << html_escape(str(r["drafter_fault"], "proposer")) << ": "
         << html_escape(str(r["drafter_fault"], "text")) << "</p>\n";
  }
  if (!r["invariant_failures"].empty()) {
    html << "<h3>Invariant failures</h3>\n<ul>\n";
    for (const json& f : r["invariant_failures"]) {
      html << "<li>step " << f.value("step", -1) << ", " << html_escape(str(f, "proposer")) << ": "
           << html_escape(str(f, "invariant")) << ": " << html_escape(str(f, "detail")) << "</li>\n";
    }
    html << "</ul>\n";
  }
  html << "</section>\n";
}

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string render_html_report(const std::vector<json>& documents) {
  // Every fixture in its run's order (version 2 entries carry their index in run.fixtures; a
  // version 1 document lists its results, then its errors).
  struct Entry {
    const json* value;
    bool error;
  };
  std::vector<Entry> entries;
  std::vector<const json*> results;
  for (const json& doc : documents) {
    std::vector<std::pair<size_t, Entry>> ordered;
    for (const json& r : doc["results"]) ordered.push_back({r.value("index", ordered.size()), {&r, false}});
    for (const json& e : doc["errors"]) ordered.push_back({e.value("index", ordered.size()), {&e, true}});
    std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [index, entry] : ordered) {
      entries.push_back(entry);
      if (!entry.error) results.push_back(entry.value);
    }
  }

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>dflash-harness report</title>\n"
       << "<style>" << kStyle << "</style></head>\n<body>\n<h1>dflash-harness report</h1>\n";
  html << "<p id=\"totals\">" << html_escape(count_line(tally_reports(documents))) << "</p>\n";
  html << "<table class=\"summary\"><tr><th>fixture</th><th>comparison</th><th>stage</th><th>worst error/bound</th>"
          "<th>tokens agree / excused / mismatch</th><th>verdict</th></tr>\n";
  size_t result_index = 0;
  for (const Entry& entry : entries) {
    const json& r = *entry.value;
    if (entry.error) {
      html << "<tr class=\"could-not-run\"><td>" << html_escape(str(r, "fixture"))
           << "</td><td colspan=\"4\">" << html_escape(str(r, "error")) << " (exit " << r.value("exit_code", 2)
           << ")</td><td>could not run</td></tr>\n";
      continue;
    }
    const size_t i = result_index++;
    for (const json& pair : r["pairs"]) {
      const json& tokens = pair["tokens"];
      const json first = pair.value("first_divergence", json());
      const std::string stage = first.is_object() ? "first divergence: " + str(first, "stage") + " (step " +
                                                        std::to_string(first.value("step", -1)) + ")"
                                                  : "worst: " + str(pair, "worst_stage");
      html << "<tr class=\"" << html_escape(str(r, "verdict")) << "\"><td><a href=\"#fixture-" << i << "\">"
           << html_escape(fixture_label(r)) << "</a></td><td>" << html_escape(str(pair, "label")) << "</td><td>"
           << html_escape(stage) << "</td><td>" << ratio_text(pair.value("worst_ratio", json()))
           << "</td><td>" << tokens.value("agree", 0) << " / " << tokens.value("tie_excused", 0) << " / "
           << tokens.value("mismatch", 0) << "</td><td>" << html_escape(str(r, "verdict")) << "</td></tr>\n";
    }
  }
  html << "</table>\n";
  for (size_t i = 0; i < results.size(); ++i) render_result(html, *results[i], static_cast<int>(i));
  html << "</body></html>\n";
  return html.str();
}

}  // namespace dflash
