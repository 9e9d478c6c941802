#include "compare/divergence.h"

#include "core/proposer.h"
#include "core/stages.h"
#include "compare/text_format.h"

namespace dflash {
std::optional<Divergence> first_divergence(const std::vector<StageCheck>& stages, int num_layers) {
  const StageCheck* first = nullptr;
  for (const StageCheck& check : stages) {
    if (check.passed) continue;
    if (first == nullptr || check.order < first->order) first = &check;
  }
  if (first == nullptr) return std::nullopt;
  Divergence d;
  d.stage = first->stage;
  StageId id;
  // A superset of the plain names (DFlash2's stages, any rank's partial).
  if (parse_stage_name(first->stage, num_layers, &id, /*dflash2=*/true, kMaxTpSize)) d.layer = id.layer;
  d.criterion = first->fail_criterion;
  d.row = first->fail_row;
  d.col = first->fail_col;
  d.value = first->fail_value;
  d.bound = first->fail_bound;
  if (!first->shape_ok) {
    d.detail = first->shape_detail;
    return d;
  }
  if (first->bias && d.criterion == "rounding-bias") d.detail = describe_rounding_bias(*first->bias);
  d.expected = first->fail_expected;
  d.actual = first->fail_actual;
  return d;
}

std::string describe_divergence(const Divergence& d) {
  std::string text = "step " + std::to_string(d.step) + ", sequence " + std::to_string(d.seq) +
                     ": first divergence at " + d.stage;
  if (d.layer >= 0) text += " (layer " + std::to_string(d.layer) + ")";
  if (d.criterion == "shape" || d.criterion == "missing" || d.criterion == "draft-token" ||
      d.criterion == "rounding-bias" || d.stage == "distribution") {
    text += ": " + d.criterion + ": " + d.detail;
  } else {
    const char* six = "%.6g";
    text += ", row " + std::to_string(d.row) + ", column " + std::to_string(d.col) + ": expected " +
            format_number(d.expected, six) + ", actual " + format_number(d.actual, six) + "; " + d.criterion + " " +
            format_number(d.value, six) + " > bound " + format_number(d.bound, six);
  }
  if (!d.ranks.empty()) text += "; " + d.ranks;
  if (!d.pair.empty()) text += " [" + d.pair + "]";
  return text;
}

}  // namespace dflash
