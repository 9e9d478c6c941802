// The CPU reference against the upstream float64 oracle: every fixture of fixtures/oracle/, every
// step, every expected logit, draft token and tap.
//
// Bounds, relative to the largest |expected| value of each row (logits row, tap row):
//  fp64 mode: 1e-6. The oracle and the reference both compute in float64 from the same bf16-valued
//    weights and inputs and the same fp32 RoPE angles (core/rope.h), so they differ by float64
//    reduction-order noise (~1e-15) plus the F32 storage of the expectations (2^-24 ≈ 6e-8); 1e-6
//    leaves room for neither to matter, and every real defect is orders of magnitude larger.
//    Every draft token must be equal.
//  fp32 mode: 1e-4. Each fp32 dot product of length K carries relative error <= γ_K = K·2^-24
//    against Σ|a·b|; the longest here is K = nT·Ht = 768 (heads128-batch's fc, γ ≈ 4.6e-5), the
//    others <= 512 (γ ≈ 3.1e-5). RMSNorm and softmax are well conditioned (they do not amplify relative error
//    beyond a few units), so through 2-3 layers of projections the logits' error stays a few
//    γ_K: below 1e-4 of the row's scale, which is still 100× below what a wiring or formula error
//    produces (>= 1e-2). Draft tokens must be equal wherever the oracle's top-1/top-2 margin exceeds
//    2 × 1e-4 × the row's max |logit| (two values each off by the bound cannot swap order there).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/kv_pages.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"
#include "reference/reference_options.h"

namespace dflash {
namespace {

std::string oracle_dir() { return std::string(DFLASH_SOURCE_DIR) + "/fixtures/oracle"; }

std::vector<std::string> oracle_fixtures() {
  std::vector<std::string> dirs;
  for (const auto& entry : std::filesystem::directory_iterator(oracle_dir())) {
    if (entry.is_directory() && std::filesystem::exists(entry.path() / "fixture.json")) dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

struct Bounds {
  Precision precision;
  double relative;  // per row, relative to the row's largest |expected|
  bool all_tokens;  // fp64: every token; fp32: only where the margin allows
};

struct Tally {
  double worst_logit = 0, worst_tap = 0;
  std::string worst_logit_where, worst_tap_where;
  int64_t rows = 0, taps = 0, tokens = 0, tokens_skipped = 0;
};

// Largest per-row error relative to the row's largest |expected|, checked against the bound.
double compare_rows(const Tensor& got, const Tensor& expected, double bound, const std::string& where) {
  EXPECT_EQ(got.shape, expected.shape) << where;
  if (got.shape != expected.shape) return INFINITY;
  double worst = 0;
  for (int64_t r = 0; r < expected.rows(); ++r) {
    double scale = 0, error = 0;
    for (int64_t c = 0; c < expected.cols(); ++c) {
      scale = std::max(scale, std::fabs(static_cast<double>(expected.row(r)[c])));
      const double diff = std::fabs(static_cast<double>(got.row(r)[c]) - expected.row(r)[c]);
      error = std::isnan(diff) ? INFINITY : std::max(error, diff);  // NaN always fails
    }
    const double relative = scale > 0 ? error / scale : (error == 0 ? 0 : INFINITY);
    EXPECT_LE(relative, bound) << where << " row " << r << ": max |error| " << error << " vs row scale " << scale;
    worst = std::max(worst, relative);
  }
  return worst;
}

void check_tokens(const ProposeOutput& out, const ExpectedOutputs& expect, const Bounds& bounds, Tally* tally,
                  const std::string& where) {
  const std::vector<int32_t>& want = *expect.draft_tokens;
  ASSERT_EQ(out.draft_tokens.size(), want.size()) << where;
  for (size_t i = 0; i < want.size(); ++i) {
    bool decidable = bounds.all_tokens;
    if (!decidable) {
      ASSERT_TRUE(expect.logits.has_value()) << where << ": fp32 token check needs the expected logits";
      const float* row = expect.logits->row(static_cast<int64_t>(i));
      double top1 = -INFINITY, top2 = -INFINITY, scale = 0;
      for (int64_t c = 0; c < expect.logits->cols(); ++c) {
        const double v = row[c];
        scale = std::max(scale, std::fabs(v));
        if (v > top1) {
          top2 = top1;
          top1 = v;
        } else if (v > top2) {
          top2 = v;
        }
      }
      decidable = top1 - top2 > 2 * bounds.relative * scale;
    }
    if (!decidable) {
      ++tally->tokens_skipped;
      continue;
    }
    ++tally->tokens;
    EXPECT_EQ(out.draft_tokens[i], want[i]) << where << " draft " << i;
  }
}

Tally replay(const std::string& dir, const Bounds& bounds) {
  Tally tally;
  Fixture fixture = read_fixture(dir);
  fixture.load_weights();
  HeadSettings head = fixture.head;
  head.precision = bounds.precision;
  auto drafter = make_reference_drafter(fixture.config, fixture.weights, head, ReferenceOptions{1});
  std::set<int> seen;
  for (size_t step_index = 0; step_index < fixture.steps.size(); ++step_index) {
    const FixtureStep& step = fixture.steps[step_index];
    if (step.kind == FixtureStep::Kind::kRelease) {
      for (int seq : step.release) drafter->release_sequence(seq);
      continue;
    }
    std::vector<ProposeInput> batch;
    bool want_taps = false;
    std::set<int> widths;
    for (const ProposeEntry& e : step.propose) {
      if (seen.insert(e.seq).second) drafter->add_sequence(e.seq);
      batch.push_back({e.seq, &e.ctx, e.start, e.anchor});
      widths.insert(clamp_block_width(e.block_width, drafter->settings().gamma));
      want_taps = want_taps || (e.expect && !e.expect->taps.empty());
    }
    EXPECT_EQ(widths.size(), 1u) << dir << " step " << step_index << ": one propose runs at one width";
    drafter->set_block_g(step.propose.front().block_width);
    const std::vector<ProposeOutput> outputs = drafter->propose(batch, want_taps);
    EXPECT_EQ(outputs.size(), batch.size());
    for (size_t b = 0; b < step.propose.size() && b < outputs.size(); ++b) {
      const ProposeEntry& e = step.propose[b];
      const ProposeOutput& out = outputs[b];
      EXPECT_EQ(out.seq, e.seq);
      if (!e.expect) continue;
      const std::string where = fixture.name + " [" + precision_name(bounds.precision) + "] step " +
                                std::to_string(step_index) + " seq " + std::to_string(e.seq);
      if (e.expect->logits) {
        const double worst = compare_rows(out.logits, *e.expect->logits, bounds.relative, where + " logits");
        tally.rows += e.expect->logits->rows();
        if (worst > tally.worst_logit) {
          tally.worst_logit = worst;
          tally.worst_logit_where = where;
        }
      }
      if (e.expect->draft_tokens) check_tokens(out, *e.expect, bounds, &tally, where);
      for (const Tap& want : e.expect->taps) {
        const auto got = std::find_if(out.taps.begin(), out.taps.end(), [&](const Tap& t) { return t.name == want.name; });
        if (got == out.taps.end()) {
          ADD_FAILURE() << where << ": tap " << want.name << " not produced";
          continue;
        }
        const Tensor expected = want.name == "ctx_proj" ? expected_ctx_proj_rows(want.value, fixture.config,
                                                                                  drafter->settings(), e.ctx.rows())
                                                        : want.value;
        const double worst = compare_rows(got->value, expected, bounds.relative, where + " tap " + want.name);
        ++tally.taps;
        if (worst > tally.worst_tap) {
          tally.worst_tap = worst;
          tally.worst_tap_where = where + " " + want.name;
        }
      }
    }
  }
  return tally;
}

TEST(OracleReplay, EveryFixtureInFp64AndFp32) {
  const std::vector<std::string> fixtures = oracle_fixtures();
  ASSERT_GE(fixtures.size(), 10u) << "expected the bundled oracle fixtures under " << oracle_dir();
  const auto begin = std::chrono::steady_clock::now();
  const Bounds modes[] = {{Precision::kFp64, 1e-6, true}, {Precision::kFp32, 1e-4, false}};
  for (const Bounds& bounds : modes) {
    int64_t rows = 0, taps = 0, tokens = 0, skipped = 0;
    for (const std::string& dir : fixtures) {
      SCOPED_TRACE(dir);
      const Tally t = replay(dir, bounds);
      std::printf("%-8s %-22s logits rows %3lld worst %.2e | taps %4lld worst %.2e (%s) | tokens %lld checked, %lld within noise\n",
                  precision_name(bounds.precision), std::filesystem::path(dir).filename().c_str(),
                  static_cast<long long>(t.rows), t.worst_logit, static_cast<long long>(t.taps), t.worst_tap,
                  t.worst_tap_where.c_str(), static_cast<long long>(t.tokens), static_cast<long long>(t.tokens_skipped));
      EXPECT_GT(t.rows, 0) << dir << ": no logits compared";
      EXPECT_GT(t.tokens, 0) << dir << ": no draft tokens compared";
      rows += t.rows;
      taps += t.taps;
      tokens += t.tokens;
      skipped += t.tokens_skipped;
    }
    std::printf("%s: %lld logit rows, %lld taps, %lld tokens compared (%lld too close to call)\n",
                precision_name(bounds.precision), static_cast<long long>(rows), static_cast<long long>(taps),
                static_cast<long long>(tokens), static_cast<long long>(skipped));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::printf("replayed %zu oracle fixtures in fp64 and fp32 in %.2f s\n", fixtures.size(), seconds);
#ifdef NDEBUG
  EXPECT_LT(seconds, 10.0) << "the oracle replay must stay fast enough for every CI run";
#endif
}

}  // namespace
}  // namespace dflash
