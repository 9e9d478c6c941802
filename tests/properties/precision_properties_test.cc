// Property 9: the fp32 reference agrees with its fp64 mode within the fp32 bound, element by
// element at every tap and the logits. The bound is derived, not tuned: ShadowDrafter
// (shadow_forward.h) evaluates docs/spec/drafter.md in float64 and carries a first-order forward error
// bound for an fp32 evaluation of the same formulas; docs/properties.md has the derivation.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "core/stages.h"
#include "tests/properties/backends.h"
#include "tests/properties/broken_proposers.h"
#include "tests/properties/property_check.h"
#include "tests/properties/scenario.h"
#include "tests/properties/shadow_forward.h"
#include "tests/properties/trace_runner.h"

namespace dflash::prop {
namespace {

constexpr double kU32 = 0x1p-24;            // fp32 unit roundoff
constexpr double kU64Ratio = 0x1p-29;       // fp64 / fp32 unit roundoff: fp64's own bound is E·2^-29
constexpr double kSecondOrder = 1.0 + 0x1p-9;  // fp64's own second-order terms (its rho is 2^-29 of fp32's)

const Tensor* find_tap(const ProposeOutput& out, const std::string& name) {
  if (name == "logits") return &out.logits;
  for (const Tap& tap : out.taps) {
    if (tap.name == name) return &tap.value;
  }
  return nullptr;
}

// fp32 output a, fp64 output z (rounded to float), the shadow's float64 value x with fp32 bound E
// and remainder factor f (ShadowDrafter::remainder_factor):
//   same function:  |z − x| ≤ (2·E·2^-29 + u32·|x|)·(1 + 2^-9)      (every stage)
//   fp32 bound:     |a − z| ≤ (E·f + E·2^-29 + u32·|x|)·(1 + 2^-9)  (where f > 0)
// Returns whether the fp32 bound applied to this stage.
bool check_stage(const std::string& where, const std::string& stage, const Bounded& shadow, const Tensor& a,
                 const Tensor& z) {
  if (a.rows() != shadow.rows || a.cols() != shadow.cols || z.rows() != shadow.rows || z.cols() != shadow.cols) {
    fail_case(where + stage + ": shapes fp32 " + shape_string(a.shape) + ", fp64 " + shape_string(z.shape) +
              ", expected [" + std::to_string(shadow.rows) + ", " + std::to_string(shadow.cols) + "]");
  }
  const double f = ShadowDrafter::remainder_factor(shadow);
  for (int64_t r = 0; r < shadow.rows; ++r) {
    for (int64_t c = 0; c < shadow.cols; ++c) {
      const double x = shadow.v(r, c), e = shadow.e(r, c);
      const double av = a.row(r)[c], zv = z.row(r)[c];
      const double same_function = (2.0 * kU64Ratio * e + kU32 * std::fabs(x)) * kSecondOrder;
      const double fp32_bound = (e * f + e * kU64Ratio + kU32 * std::fabs(x)) * kSecondOrder;
      std::ostringstream at;
      at.precision(10);
      at << where << stage << "[" << r << ", " << c << "]: ";
      if (!(std::fabs(zv - x) <= same_function)) {
        at << "the fp64 reference gives " << zv << " but an independent fp64 evaluation " << x
           << ", more than fp64's bound " << same_function << " apart";
        fail_case(at.str());
      }
      if (f > 0 && !(std::fabs(av - zv) <= fp32_bound)) {
        at << "fp32 " << av << " vs fp64 " << zv << ": |difference| " << std::fabs(av - zv)
           << " exceeds the derived fp32 bound " << fp32_bound;
        fail_case(at.str());
      }
    }
  }
  return f > 0;
}

void fp32_within_bound_of_fp64(const Backend& fp32, const Backend& fp64) {
  ScenarioOptions options;
  options.max_sequences = 2;
  options.max_steps = 4;
  const Scenario s = *gen_scenario(fp32, options);
  HeadSettings settings64 = s.settings;
  settings64.precision = Precision::kFp64;
  auto p32 = s.build(fp32);
  auto p64 = s.build(fp64, settings64);
  RunOptions taps;
  taps.want_taps = true;
  const TraceRun r32 = run_trace(*p32, s.trace, taps);
  const TraceRun r64 = run_trace(*p64, s.trace, taps);

  ShadowDrafter shadow(s.config, *s.weights, s.settings.uncapped ? 0 : s.settings.ctx_cap, kU32);
  const int64_t features = s.config.ctx_feature_dim();
  const std::vector<std::string> stages = forward_stage_order(s.config.num_layers);
  for (const TraceStep& step : s.trace.steps) {
    if (step.release) {
      for (int seq : step.released) shadow.release(seq);
      continue;
    }
    const StepResult* a = r32.step(step.id);
    const StepResult* z = r64.step(step.id);
    for (const TraceEntry& entry : step.entries) {
      const ProposeOutput& o32 = a->outputs.at(entry.seq);
      const ProposeOutput& o64 = z->outputs.at(entry.seq);
      const int64_t start = z->starts.at(entry.seq), count = z->counts.at(entry.seq);
      Tensor ctx = Tensor::zeros({count, features});
      for (int64_t r = 0; r < count; ++r) {
        context_row(default_stream(entry.seq, start - count + r), start - count + r, features, ctx.row(r));
      }
      const auto bounded = shadow.propose(entry.seq, ctx, start, entry.anchor, o64.block_width);
      const std::string where = "step #" + std::to_string(step.id) + " sequence " + std::to_string(entry.seq) + ": ";
      for (const std::string& stage : stages) {  // forward order: the first stage out of bound is named
        const Tensor* t32 = find_tap(o32, stage);
        const Tensor* t64 = find_tap(o64, stage);
        if (t32 == nullptr || t64 == nullptr) fail_case(where + "tap " + stage + " missing");
        check_stage(where, stage, bounded.at(stage), *t32, *t64);
      }
      // Draft tokens may differ only between logits within their bounds of each other.
      const Bounded& logits = bounded.at("logits");
      const double f = ShadowDrafter::remainder_factor(logits);
      if (f == 0) continue;
      for (int64_t r = 0; r < logits.rows; ++r) {
        const int32_t t32 = o32.draft_tokens[static_cast<size_t>(r)], t64 = o64.draft_tokens[static_cast<size_t>(r)];
        if (t32 == t64) continue;
        const double gap = std::fabs(logits.v(r, t64) - logits.v(r, t32));
        const double reach = (logits.e(r, t32) + logits.e(r, t64)) * (f + kU64Ratio) * kSecondOrder;
        if (gap > reach) {
          fail_case(where + "draft token of row " + std::to_string(r) + ": fp32 " + std::to_string(t32) + ", fp64 " +
                    std::to_string(t64) + ", logits " + std::to_string(gap) + " apart, more than their bounds' sum " +
                    std::to_string(reach));
        }
      }
    }
  }
}

TEST(ReferencePrecision, P9_Fp32WithinTheDerivedFp32BoundOfFp64) {
  check_property(100, [] { fp32_within_bound_of_fp64(reference_backend(Precision::kFp32), reference_backend(Precision::kFp64)); });
}

// The bound must be tight enough to tell fp32 from bf16 storage.
TEST(ReferencePrecision, P9_CatchesBf16StoragePosingAsFp32) {
  std::string failure;
  const Backend broken = bf16_posing_as_fp32(reference_backend(Precision::kFp32));
  ASSERT_TRUE(property_fails(100, 1, [&] { fp32_within_bound_of_fp64(broken, reference_backend(Precision::kFp64)); },
                             &failure))
      << "bf16 storage passed as fp32 for 100 cases: " << failure;
  EXPECT_NE(failure.find("exceeds the derived fp32 bound"), std::string::npos) << failure;
}

}  // namespace
}  // namespace dflash::prop
