#include "compare/acceptance_html.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "compare/report_html.h"
#include "compare/text_format.h"

namespace dflash {
namespace {

using nlohmann::json;

std::string text(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

// A number from the JSON, or "-" for null (not measured, or not finite).
std::string cell(const json& j, const char* key, const char* format = "%.3g") {
  return j.is_object() && j.contains(key) && j[key].is_number() ? format_number(j[key].get<double>(), format) : "-";
}

}  // namespace

std::string distribution_plot_html(const json& pair) {
  if (!pair.contains("distribution") || !pair["distribution"].is_object()) return "";
  std::vector<const json*> rows;
  for (const json& p : pair["distribution"]["positions"]) {
    if (p.value("temperature", 0.0) == 1.0) rows.push_back(&p);
  }
  if (rows.empty()) return "";
  const int left = 56, top = 12, step = 30, height = 120, bottom = 34;
  const int width = left + static_cast<int>(rows.size()) * step + 20;
  const double log_min = -12, log_max = 0;
  const auto y_of = [&](double v) {
    const double l = v > 0 ? std::min(log_max, std::max(log_min, std::log10(v))) : log_min;
    return top + height * (log_max - l) / (log_max - log_min);
  };
  std::ostringstream svg;
  // The caption is HTML text, which wraps: the plot is only as wide as its bars.
  svg << "<figure class=\"distribution-plot\"><figcaption>TV per block position at T = 1: bar the largest, tick the "
         "mean, dash the bound (log scale)</figcaption>\n";
  svg << "<svg class=\"distribution\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\""
      << top + height + bottom << "\" role=\"img\" aria-label=\"total variation per block position\">\n";
  for (int e = static_cast<int>(log_min); e <= static_cast<int>(log_max); e += 3) {
    const double y = y_of(std::pow(10.0, e));
    svg << "<line class=\"axis\" x1=\"" << left - 4 << "\" x2=\"" << left << "\" y1=\"" << y << "\" y2=\"" << y
        << "\"/><text x=\"4\" y=\"" << y + 4 << "\">1e" << e << "</text>\n";
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& p = *rows[i];
    const bool passed = p.value("passed", false);
    const json& max = p["max"];
    const double tv = max.contains("tv") && max["tv"].is_number() ? max["tv"].get<double>() : 1.0;  // null: NaN
    const double mean = p.contains("mean") && p["mean"].contains("tv") && p["mean"]["tv"].is_number()
                            ? p["mean"]["tv"].get<double>()
                            : 0.0;
    const double bound = p.contains("bound_at_worst") && p["bound_at_worst"]["tv"].is_number()
                             ? p["bound_at_worst"]["tv"].get<double>()
                             : 0.0;
    const int x = left + static_cast<int>(i) * step + 4;
    const double y = y_of(tv);
    svg << "<rect class=\"bar " << (passed ? "pass" : "fail") << "\" data-block-row=\"" << p.value("block_row", 0)
        << "\" x=\"" << x << "\" y=\"" << y << "\" width=\"" << step - 8 << "\" height=\""
        << std::max(1.0, top + height - y) << "\"><title>block row " << p.value("block_row", 0) << ": max TV "
        << cell(max, "tv") << ", mean " << format_number(mean) << ", bound " << format_number(bound) << ", worst ratio "
        << cell(p, "worst_ratio") << " over " << p.value("count", 0) << "</title></rect>\n";
    svg << "<line class=\"mean\" stroke=\"#000\" x1=\"" << x << "\" x2=\"" << x + step - 8 << "\" y1=\"" << y_of(mean)
        << "\" y2=\"" << y_of(mean) << "\"/>\n";
    svg << "<line class=\"bound\" x1=\"" << x - 2 << "\" x2=\"" << x + step - 6 << "\" y1=\"" << y_of(bound)
        << "\" y2=\"" << y_of(bound) << "\"/>\n";
    svg << "<text x=\"" << x + 4 << "\" y=\"" << top + height + 14 << "\">" << p.value("block_row", 0) << "</text>\n";
  }
  svg << "</svg></figure>\n";
  // Every distance, at every temperature: the largest (and the mean TV) over the sequences and steps.
  svg << "<table class=\"distances\"><tr><th>T</th><th>block row</th><th>max TV</th><th>mean TV</th>"
         "<th>max KL(expected&#8214;actual)</th><th>max KL(actual&#8214;expected)</th><th>max top-1 gap</th>"
         "<th>distance/bound</th><th>of</th></tr>\n";
  for (const json& p : pair["distribution"]["positions"]) {
    const bool passed = p.value("passed", false);
    const json& max = p["max"];
    svg << "<tr class=\"" << (passed ? "pass" : "fail") << "\"><td>" << cell(p, "temperature") << "</td><td>"
        << p.value("block_row", 0) << "</td><td>" << cell(max, "tv") << "</td><td>"
        << (p.contains("mean") ? cell(p["mean"], "tv") : "-") << "</td><td>" << cell(max, "kl_expected_actual")
        << "</td><td>" << cell(max, "kl_actual_expected") << "</td><td>" << cell(max, "top1_gap") << "</td><td>"
        << cell(p, "worst_ratio") << "</td><td>" << p.value("count", 0) << "</td></tr>\n";
  }
  svg << "</table>\n";
  return svg.str();
}

std::string acceptance_section_html(const json& r) {
  if (!r.contains("acceptance") || !r["acceptance"].is_object()) return "";
  const json& a = r["acceptance"];
  std::ostringstream html;
  html << "<h3>Acceptance</h3>\n";
  if (a.contains("pin") && a["pin"].is_object()) {
    html << "<p>pinned per position:";
    for (const json& v : a["pin"]["per_position"])
      html << " " << (v.is_number() ? format_number(v.get<double>()) : "-");
    html << " (" << html_escape(text(a["pin"], "basis")) << "); false-alarm rate " << cell(a, "false_alarm")
         << "</p>\n";
  }
  html << "<table class=\"acceptance\"><tr><th>side</th><th>blocks</th><th>mean acceptance length</th>"
          "<th>expected under sampling</th><th>per position: accepted (rate) / expected under sampling</th>"
          "<th>pinned</th></tr>\n";
  for (const json& s : a["sides"]) {
    bool pin_ok = true;
    if (s.contains("pin_tests")) {
      for (const json& t : s["pin_tests"]) pin_ok = pin_ok && t.value("passed", false);
    }
    html << "<tr class=\"" << (pin_ok ? "pass" : "fail") << "\"><td>" << html_escape(text(s, "name")) << "</td><td>"
         << s.value("blocks", 0) << "</td><td>" << cell(s, "mean_length", "%.3f") << "</td><td>"
         << cell(s, "sampling_length", "%.3f") << "</td><td>";
    for (const json& p : s["positions"]) {
      html << p.value("position", 0) << ": " << p.value("reached", 0) << "/" << p.value("blocks", 0) << " ("
           << cell(p, "acceptance_rate") << ") / " << cell(p, "sampling") << "<br>";
    }
    html << "</td><td>" << (s.contains("pin_tests") ? (pin_ok ? "pass" : "FAIL") : "-") << "</td></tr>\n";
  }
  html << "</table>\n";
  if (!a["comparisons"].empty()) {
    html << "<ul class=\"acceptance-change\">\n";
    for (const json& c : a["comparisons"]) {
      html << "<li>" << html_escape(text(c, "actual")) << " against " << html_escape(text(c, "expected"))
           << ": mean acceptance length " << cell(c, "mean_length_change", "%+.3f") << ", expected under sampling "
           << cell(c, "sampling_length_change", "%+.3f") << "</li>\n";
    }
    html << "</ul>\n";
  }
  for (const json& f : a["failures"]) {
    html << "<p class=\"divergence\">" << html_escape(text(f, "check")) << ": " << html_escape(text(f, "detail"))
         << "</p>\n";
  }
  return html.str();
}

}  // namespace dflash
