// One self-contained HTML page (no scripts, no external resources) from report documents: a summary
// table, and per fixture and comparison an inline SVG plot of error/bound per stage in forward
// order with the failing stages and the first divergence highlighted.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dflash {

// `documents` as read by read_report_document (compare/report_json.h).
std::string render_html_report(const std::vector<nlohmann::json>& documents);

// Text made safe for HTML element content and attribute values.
std::string html_escape(const std::string& text);

}  // namespace dflash
