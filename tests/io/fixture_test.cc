// Fixture format v1 through the public API: every bundled oracle fixture and every engine
// capture loads (config, weights, target, trace) with the values the files hold; write -> read
// round trips keep everything, unknown fields included; head defaults; synthetic fixtures.
#include "fixtures/fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/kv_pages.h"
#include "fixtures/checkpoint_writer.h"
#include "tests/io/io_test_util.h"

namespace dflash {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::oracle_dir;
using testing::TempDir;

// Facts about each bundled oracle fixture, read from its files with numpy (independently of the
// readers under test): counts, the first entry's ctx shape and float64 sum, float64 sums of
// fc.weight and embed_tokens.weight, lm_head[0, 0], the first expected logit, the first drafts.
struct OracleFacts {
  const char* name;
  size_t steps, entries, drafter_tensors, taps;
  std::vector<int64_t> ctx0_shape;
  double ctx0_sum, fc_sum, embed_sum;
  float lm_head0, logits0;
  std::vector<int32_t> drafts0;
};

const OracleFacts kOracleFacts[] = {
    {"tiny-mha",
     4,
     4,
     14,
     48,
     {12, 128},
     81.37855529785156,
     7.3926922082901,
     -92.15448188781738,
     0.15234375f,
     1.8472117f,
     {54, 54, 54}},
    {"tiny-gqa",
     6,
     6,
     25,
     126,
     {40, 288},
     814.4691016674042,
     -11.0473218485713,
     -135.60776567459106,
     -0.026977539f,
     4.994982f,
     {29, 29, 29, 29, 29, 29, 29}},
    {"bias-mqa-eps",
     5,
     5,
     33,
     105,
     {25, 240},
     181.93067169189453,
     0.3781573846936226,
     98.45901811122894,
     -0.015380859f,
     -2.6021805f,
     {557, 557, 557, 557, 247, 247, 641}},
    {"yarn",
     4,
     4,
     25,
     84,
     {150, 128},
     165.67362213134766,
     0.4296630322933197,
     195.20832228660583,
     0.53125f,
     -2.8431735f,
     {77, 77, 77, 77, 77, 77, 77}},
    {"batch-widths-release",
     6,
     9,
     25,
     189,
     {20, 128},
     -30.982059478759766,
     -1.6325219869613647,
     161.9536606669426,
     -0.32617188f,
     -4.215712f,
     {73, 73, 73, 73, 73, 73, 73}},
    {"ctx-window",
     6,
     6,
     25,
     126,
     {50, 128},
     -14.105018615722656,
     6.01018214225769,
     -93.82560801506042,
     0.083984375f,
     0.8919175f,
     {204, 96, 96, 96, 29, 29, 29}},
    {"derived-layer-ids",
     3,
     3,
     36,
     90,
     {9, 144},
     -70.07421875,
     9.842648059129715,
     51.7316780090332,
     -1.1953125f,
     2.8359456f,
     {84, 84, 84}},
    {"heads128-batch",
     3,
     6,
     25,
     126,
     {640, 768},
     1332.1424139738083,
     3.394085398875177,
     -570.7101736962795,
     0.0615234375f,
     -2.4007833f,
     {129, 129, 129, 129, 129, 129, 129, 129, 129, 129, 129, 129, 129, 129, 129}},
    {"far-yarn-bias",
     4,
     4,
     33,
     84,
     {2900, 384},
     -2087.642080321908,
     26.376881401985884,
     -368.66875171661377,
     0.1591796875f,
     -8.323859f,
     {90, 90, 24, 24, 90, 90, 90}},
};

// A float64 sum in another order (numpy sums pairwise, this sums left to right) differs from the
// true sum by at most n·u·Σ|x| each (u = 2^-53; the float values are exact in double), so the two
// differ by at most 2·n·u·Σ|x|.
void expect_sum(const Tensor& t, double expected, const char* what) {
  double sum = 0, sum_abs = 0;
  for (float v : t.values) {
    sum += v;
    sum_abs += std::fabs(v);
  }
  const double bound = 2.0 * static_cast<double>(t.values.size()) * std::ldexp(1.0, -53) * sum_abs;
  EXPECT_NEAR(sum, expected, bound) << what;
}

TEST(OracleFixtures, AllLoadWithTheValuesTheFilesHold) {
  for (const OracleFacts& facts : kOracleFacts) {
    SCOPED_TRACE(facts.name);
    Fixture f = read_fixture(oracle_dir(facts.name));
    EXPECT_EQ(f.name, facts.name);
    EXPECT_EQ(f.expect_precision, "fp64");
    EXPECT_EQ(f.dir, fs::path(oracle_dir(facts.name)).lexically_normal().string());
    EXPECT_EQ(f.drafter_dir, f.dir + "/drafter");
    EXPECT_EQ(f.target.path, f.dir + "/target.safetensors");
    EXPECT_EQ(f.trace_path, f.dir + "/trace.safetensors");
    ASSERT_EQ(f.steps.size(), facts.steps);
    size_t entries = 0, taps = 0;
    for (const FixtureStep& step : f.steps) {
      for (const ProposeEntry& e : step.propose) {
        ++entries;
        ASSERT_TRUE(e.expect.has_value());
        taps += e.expect->taps.size();
        // Every expectation is at the clamped width.
        const int B = clamp_block_width(e.block_width, f.head.gamma);
        EXPECT_EQ(e.expect->logits->shape, (std::vector<int64_t>{B - 1, f.config.vocab_size}));
        EXPECT_EQ(e.expect->draft_tokens->size(), static_cast<size_t>(B - 1));
        EXPECT_EQ(e.ctx.cols(), f.config.ctx_feature_dim());
      }
    }
    EXPECT_EQ(entries, facts.entries);
    EXPECT_EQ(taps, facts.taps);

    const ProposeEntry& first = f.steps[0].propose[0];
    EXPECT_EQ(first.ctx.shape, facts.ctx0_shape);
    expect_sum(first.ctx, facts.ctx0_sum, "ctx of the first entry");
    EXPECT_EQ(first.expect->logits->values[0], facts.logits0);
    EXPECT_EQ(*first.expect->draft_tokens, facts.drafts0);

    const DrafterWeights& w = f.load_weights();
    EXPECT_EQ(drafter_tensor_list(f.config, w).size(), facts.drafter_tensors);
    expect_sum(w.fc, facts.fc_sum, "fc.weight");
    expect_sum(w.embed_tokens, facts.embed_sum, "embed_tokens.weight");
    EXPECT_EQ(w.lm_head.values[0], facts.lm_head0);
    EXPECT_EQ(&f.load_weights(), &w) << "weights are loaded once and cached";
  }
}

TEST(OracleFixtures, WidthsWindowsAndTapOrder) {
  // batch-widths-release: widths 1 and 20 clamp to 2 and gamma 8; a release step; a batch of 3.
  const Fixture batch = read_fixture(oracle_dir("batch-widths-release"));
  EXPECT_EQ(batch.head.gamma, 8);
  EXPECT_EQ(batch.head.max_batch, 3);
  const ProposeEntry& narrow = batch.steps[1].propose[1];
  EXPECT_EQ(narrow.block_width, 1);
  EXPECT_EQ(narrow.expect->logits->shape, (std::vector<int64_t>{1, 400}));
  EXPECT_EQ(narrow.expect->taps[0].name, "embed");
  EXPECT_EQ(narrow.expect->taps[0].value.shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(batch.steps[2].propose.size(), 3u);
  ASSERT_EQ(batch.steps[3].kind, FixtureStep::Kind::kRelease);
  EXPECT_EQ(batch.steps[3].release, std::vector<int>{1});
  EXPECT_EQ(batch.steps[4].propose[0].block_width, 20);
  EXPECT_EQ(batch.steps[4].propose[0].expect->logits->shape, (std::vector<int64_t>{7, 400}));

  // ctx-window: a 50-row prompt with ctx_cap 32 projects only the 32 rows that enter the window.
  const Fixture window = read_fixture(oracle_dir("ctx-window") + "/fixture.json");
  EXPECT_EQ(window.head.ctx_cap, 32);
  EXPECT_EQ(window.head.kv_page_size, 8);
  const ExpectedOutputs& x = *window.steps[0].propose[0].expect;
  EXPECT_EQ(window.steps[0].propose[0].ctx.shape, (std::vector<int64_t>{50, 128}));
  EXPECT_EQ(x.taps[1].name, "ctx_proj");
  EXPECT_EQ(x.taps[1].value.shape, (std::vector<int64_t>{32, 64}));

  // Taps keep the manifest's order (not alphabetical), with their trace names.
  std::vector<std::string> names;
  for (const Tap& tap : x.taps) names.push_back(tap.name);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 5),
            (std::vector<std::string>{"embed", "ctx_proj", "L0.attn_norm", "L0.v", "L0.q"}));
  EXPECT_EQ(names.back(), "final_norm");
  EXPECT_EQ(x.tap_tensor_names.at("L0.q"), "s0.q0.tap.L0.q");
  EXPECT_EQ(x.logits_name, "s0.q0.logits");
  EXPECT_EQ(x.draft_tokens_name, "s0.q0.drafts");
}

// An all-sliding drafter (W 8) retains 7 of 10 new rows: it is compared with the expectation's last
// 7 rows (rows 3..9), a mixed one with all 10.
TEST(OracleFixtures, EvictingDrafterIsComparedWithTheLastCtxProjRows) {
  DrafterConfig config;
  config.num_layers = 2;
  config.dflash2.enabled = true;
  config.dflash2.sliding = {true, true};
  config.dflash2.sliding_window = 8;
  HeadSettings head;
  Tensor tap = Tensor::zeros({10, 2});
  for (int64_t r = 0; r < 10; ++r) tap.row(r)[0] = static_cast<float>(r);
  const Tensor kept = expected_ctx_proj_rows(tap, config, head, 10);
  ASSERT_EQ(kept.shape, (std::vector<int64_t>{7, 2}));
  EXPECT_EQ(kept.row(0)[0], 3.0f);
  EXPECT_EQ(kept.row(6)[0], 9.0f);
  const Tensor five({5, 1}, {0, 1, 2, 3, 4});
  EXPECT_EQ(expected_ctx_proj_rows(five, config, head, 5).values, five.values);  // all 5 rows enter the window
  config.dflash2.sliding[1] = false;
  EXPECT_EQ(expected_ctx_proj_rows(tap, config, head, 10).shape, tap.shape);
}

TEST(Captures, EngineCapturesLoad) {
  const fs::path captures = testing::captures_dir();
  ASSERT_TRUE(fs::is_directory(captures)) << "the bundled engine captures are missing: " << captures.string();
  size_t loaded = 0;
  for (const char* group : {"bf16", "planted"}) {
    for (const auto& item : fs::directory_iterator(captures / group)) {
      if (!item.is_directory()) continue;
      SCOPED_TRACE(item.path().string());
      Fixture f = read_fixture(item.path().string());
      EXPECT_EQ(f.expect_precision, "bf16");
      const DrafterWeights& w = f.load_weights();
      EXPECT_EQ(w.layers.size(), static_cast<size_t>(f.config.num_layers));
      // Same traces as the oracle fixture of the same name: same steps, same inputs.
      const Fixture oracle = read_fixture(oracle_dir(f.name));
      ASSERT_EQ(f.steps.size(), oracle.steps.size());
      for (size_t i = 0; i < f.steps.size(); ++i) {
        ASSERT_EQ(f.steps[i].propose.size(), oracle.steps[i].propose.size());
        for (size_t j = 0; j < f.steps[i].propose.size(); ++j) {
          EXPECT_EQ(f.steps[i].propose[j].start, oracle.steps[i].propose[j].start);
          EXPECT_EQ(f.steps[i].propose[j].ctx.values, oracle.steps[i].propose[j].ctx.values);
        }
      }
      ++loaded;
    }
  }
  EXPECT_EQ(loaded, 5u);  // bf16: 3 fixtures, planted: 2
}

// ---- round trips ----

void expect_same_fixture(const Fixture& a, const Fixture& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.expect_precision, b.expect_precision);
  EXPECT_EQ(a.drafter_dir, b.drafter_dir);
  EXPECT_EQ(a.target.path, b.target.path);
  EXPECT_EQ(a.target.embed_tokens_name, b.target.embed_tokens_name);
  EXPECT_EQ(a.target.lm_head_name, b.target.lm_head_name);
  EXPECT_EQ(a.target.tied, b.target.tied);
  EXPECT_EQ(a.head.gamma, b.head.gamma);
  EXPECT_EQ(a.head.ctx_cap, b.head.ctx_cap);
  EXPECT_EQ(a.head.max_batch, b.head.max_batch);
  EXPECT_EQ(a.head.kv_page_size, b.head.kv_page_size);
  EXPECT_EQ(a.config.target_layer_ids, b.config.target_layer_ids);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    SCOPED_TRACE("step " + std::to_string(i));
    const FixtureStep &sa = a.steps[i], &sb = b.steps[i];
    EXPECT_EQ(sa.kind, sb.kind);
    EXPECT_EQ(sa.release, sb.release);
    EXPECT_EQ(sa.extra, sb.extra);
    ASSERT_EQ(sa.propose.size(), sb.propose.size());
    for (size_t j = 0; j < sa.propose.size(); ++j) {
      const ProposeEntry &ea = sa.propose[j], &eb = sb.propose[j];
      EXPECT_EQ(ea.seq, eb.seq);
      EXPECT_EQ(ea.ctx_name, eb.ctx_name);
      EXPECT_EQ(ea.ctx.shape, eb.ctx.shape);
      EXPECT_EQ(ea.ctx.values, eb.ctx.values);
      EXPECT_EQ(ea.start, eb.start);
      EXPECT_EQ(ea.anchor, eb.anchor);
      EXPECT_EQ(ea.block_width, eb.block_width);
      EXPECT_EQ(ea.extra, eb.extra);
      ASSERT_EQ(ea.expect.has_value(), eb.expect.has_value());
      if (!ea.expect) continue;
      const ExpectedOutputs &xa = *ea.expect, &xb = *eb.expect;
      EXPECT_EQ(xa.logits_name, xb.logits_name);
      EXPECT_EQ(xa.draft_tokens_name, xb.draft_tokens_name);
      EXPECT_EQ(xa.tap_tensor_names, xb.tap_tensor_names);
      ASSERT_EQ(xa.logits.has_value(), xb.logits.has_value());
      if (xa.logits) {
        EXPECT_EQ(xa.logits->shape, xb.logits->shape);
        EXPECT_EQ(xa.logits->values, xb.logits->values);
      }
      EXPECT_EQ(xa.draft_tokens, xb.draft_tokens);
      ASSERT_EQ(xa.taps.size(), xb.taps.size());
      for (size_t k = 0; k < xa.taps.size(); ++k) {
        EXPECT_EQ(xa.taps[k].name, xb.taps[k].name);
        EXPECT_EQ(xa.taps[k].value.shape, xb.taps[k].value.shape);
        EXPECT_EQ(xa.taps[k].value.values, xb.taps[k].value.values);
      }
    }
  }
}

void copy_fixture(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  for (const auto& entry : fs::recursive_directory_iterator(to)) {
    fs::permissions(entry.path(), fs::perms::owner_write, fs::perm_options::add);
  }
}

void edit_manifest(const std::string& dir, const std::function<void(nlohmann::ordered_json&)>& edit) {
  nlohmann::ordered_json m = nlohmann::ordered_json::parse(std::ifstream(dir + "/fixture.json"));
  edit(m);
  std::ofstream(dir + "/fixture.json") << m.dump(1);
}

TEST(FixtureRoundTrip, WriteReadKeepsEverythingIncludingUnknownFields) {
  TempDir tmp;
  const std::string original = tmp / "original";
  copy_fixture(oracle_dir("batch-widths-release"), original);
  edit_manifest(original, [](nlohmann::ordered_json& m) {
    m["x_top"] = {{"a", 1}, {"b", {true, nullptr}}};
    m["provenance"]["x_provenance"] = "kept";
    m["head"]["x_head"] = 7;
    m["target"]["x_target"] = "t";
    m["steps"][0]["x_step"] = {1, 2};
    m["steps"][3]["note"] = "a release with a note";
    m["steps"][2]["propose"][1]["x_entry"] = 3.5;
    m["steps"][2]["propose"][1]["expect"]["x_expect"] = "kept too";
  });
  const Fixture a = read_fixture(original);
  EXPECT_EQ(a.manifest["x_top"]["a"], 1);
  EXPECT_EQ(a.steps[0].extra, json({{"x_step", {1, 2}}}));
  EXPECT_EQ(a.steps[3].extra, json({{"note", "a release with a note"}}));
  EXPECT_EQ(a.steps[2].propose[1].extra, json({{"x_entry", 3.5}, {"expect", {{"x_expect", "kept too"}}}}));

  // BF16 ctx (the originals are bf16 values, so exact) and F32 ctx both round trip.
  for (bool ctx_bf16 : {true, false}) {
    SCOPED_TRACE(ctx_bf16 ? "ctx bf16" : "ctx f32");
    const std::string out = tmp / (ctx_bf16 ? "bf16" : "f32");
    write_fixture(a, out, ctx_bf16);
    const Fixture b = read_fixture(out);
    expect_same_fixture(a, b);
    EXPECT_EQ(b.trace_path, out + "/trace.safetensors");
    const auto trace = SafetensorsFile::open(b.trace_path);
    EXPECT_EQ(trace->info("s0.q0.ctx").dtype, ctx_bf16 ? DType::kBF16 : DType::kF32);
    // Unknown fields are written back where they were. The paths point back at the original.
    json expected = a.manifest;
    expected["drafter_dir"] = original + "/drafter";
    expected["target"]["file"] = original + "/target.safetensors";
    EXPECT_EQ(b.manifest, expected);

    // Written again, the manifest is identical and the trace bytes are too (determinism).
    const std::string again = tmp / (ctx_bf16 ? "bf16-again" : "f32-again");
    write_fixture(b, again, ctx_bf16);
    const Fixture c = read_fixture(again);
    EXPECT_EQ(c.manifest, b.manifest);
    expect_same_fixture(b, c);
    std::ifstream t1(b.trace_path, std::ios::binary), t2(c.trace_path, std::ios::binary);
    EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(t1), std::istreambuf_iterator<char>(),
                           std::istreambuf_iterator<char>(t2)));
  }

  // Rewritten in place, relative paths stay relative.
  write_fixture(a, original, /*ctx_bf16=*/true);
  const Fixture in_place = read_fixture(original);
  EXPECT_EQ(in_place.manifest, a.manifest);
  expect_same_fixture(a, in_place);
}

TEST(FixtureRoundTrip, CtxBf16RefusesValuesItWouldRound) {
  TempDir tmp;
  Fixture f = read_fixture(oracle_dir("tiny-mha"));
  f.steps[1].propose[0].ctx.values[128 + 4] = 0.1f;  // ctx is [4, 128]
  EXPECT_BAD_INPUT(write_fixture(f, tmp / "out", true),
                   "write_fixture: tensor 's1.q0.ctx' value 0.100000 at row 1, column 4 is not a bf16 value");
}

TEST(FixtureHead, MissingFieldsTakeTheirDefaults) {
  TempDir tmp;
  const std::string dir = tmp / "f";
  copy_fixture(oracle_dir("tiny-mha"), dir);
  edit_manifest(dir, [](nlohmann::ordered_json& m) { m.erase("head"); });
  Fixture f = read_fixture(dir);
  EXPECT_EQ(f.head.gamma, 4);  // the config's block_size
  EXPECT_EQ(f.head.ctx_cap, 4096);
  EXPECT_EQ(f.head.max_batch, 1);
  EXPECT_EQ(f.head.kv_page_size, 16);
  EXPECT_FALSE(f.head.uncapped);

  edit_manifest(dir, [](nlohmann::ordered_json& m) { m["head"] = {{"ctx_cap", 0}}; });
  EXPECT_BAD_INPUT(read_fixture(dir), "fixture.json: head: ctx_cap is 0");
  edit_manifest(dir, [](nlohmann::ordered_json& m) { m["head"] = {{"gamma", -1}}; });
  EXPECT_BAD_INPUT(read_fixture(dir), "field 'head.gamma' must be >= 0, got -1");
  edit_manifest(dir, [](nlohmann::ordered_json& m) { m["head"] = {{"max_batch", "4"}}; });
  EXPECT_BAD_INPUT(read_fixture(dir), "field 'head.max_batch' must be an integer");
}

TEST(FixturePaths, AbsolutePathsAndATiedTarget) {
  TempDir tmp;
  const std::string dir = tmp / "f";
  fs::create_directories(dir);
  fs::copy(oracle_dir("tiny-mha") + "/fixture.json", dir + "/fixture.json");
  fs::copy(oracle_dir("tiny-mha") + "/trace.safetensors", dir + "/trace.safetensors");
  fs::permissions(dir + "/fixture.json", fs::perms::owner_write, fs::perm_options::add);
  // The target keeps only embed_tokens; the fixture says it is tied.
  const auto target = SafetensorsFile::open(oracle_dir("tiny-mha") + "/target.safetensors");
  const Tensor embed = target->read_float("embed_tokens.weight");
  write_safetensors(dir + "/embed-only.safetensors", {make_bf16_tensor("model.embed_tokens.weight", embed)});
  edit_manifest(dir, [&](nlohmann::ordered_json& m) {
    m["drafter_dir"] = oracle_dir("tiny-mha") + "/drafter";
    m["target"] = {
        {"file", "embed-only.safetensors"}, {"embed_tokens", "embed_tokens.weight"}, {"tie_word_embeddings", true}};
  });
  Fixture f = read_fixture(dir);
  EXPECT_EQ(f.drafter_dir, oracle_dir("tiny-mha") + "/drafter");
  EXPECT_TRUE(f.target.tied);
  EXPECT_EQ(f.load_weights().lm_head.values, embed.values);

  edit_manifest(dir, [&](nlohmann::ordered_json& m) { m["target"]["tie_word_embeddings"] = false; });
  Fixture untied = read_fixture(dir);
  EXPECT_BAD_INPUT(untied.load_weights(), "lm_head 'lm_head.weight' not found");
}

TEST(SyntheticFixture, WrittenFromMemoryWithDefaultNames) {
  TempDir tmp;
  const std::string out = tmp / "synthetic";
  const DrafterConfig config = parse_drafter_config(testing::small_config(false), "small");
  const DrafterWeights weights = testing::make_weights(config);
  write_drafter_checkpoint(out + "/drafter", testing::small_config(false), weights);
  write_target_file(out + "/target.safetensors", weights);

  Fixture f;
  f.name = "synthetic";
  f.expect_precision = "fp32";
  f.drafter_dir = out + "/drafter";
  f.target.path = out + "/target.safetensors";
  f.head.gamma = 4;
  f.head.ctx_cap = 8;
  f.head.max_batch = 2;
  f.head.kv_page_size = 4;
  auto propose = [&](int seq, int64_t rows, int64_t start, int width, uint32_t seed) {
    ProposeEntry e;
    e.seq = seq;
    e.ctx = testing::bf16_values({rows, 16}, seed);
    e.start = start;
    e.anchor = 5 + seq;
    e.block_width = width;
    const int B = clamp_block_width(width, f.head.gamma);
    ExpectedOutputs x;
    x.logits = testing::bf16_values({B - 1, 32}, seed + 1);
    x.draft_tokens = std::vector<int32_t>(static_cast<size_t>(B - 1), 7);
    x.taps.push_back({"embed", testing::bf16_values({B, 8}, seed + 2)});
    x.taps.push_back({"ctx_proj", testing::bf16_values({std::min<int64_t>(rows, 8), 8}, seed + 3)});
    e.expect = x;
    return e;
  };
  FixtureStep s0, s1, s2;
  s0.propose = {propose(0, 3, 3, 4, 10)};
  s1.propose = {propose(0, 2, 5, 9, 20), propose(1, 10, 10, 7, 30)};  // widths 9 and 7 both clamp to 4
  s2.kind = FixtureStep::Kind::kRelease;
  s2.release = {0};
  f.steps = {s0, s1, s2};
  write_fixture(f, out);

  Fixture back = read_fixture(out);
  EXPECT_EQ(back.manifest["drafter_dir"], "drafter");
  EXPECT_EQ(back.manifest["target"]["file"], "target.safetensors");
  EXPECT_EQ(back.steps[1].propose[1].ctx_name, "s1.q1.ctx");
  EXPECT_EQ(back.steps[1].propose[1].expect->logits_name, "s1.q1.logits");
  EXPECT_EQ(back.steps[1].propose[1].expect->draft_tokens_name, "s1.q1.drafts");
  EXPECT_EQ(back.steps[1].propose[1].expect->tap_tensor_names.at("ctx_proj"), "s1.q1.tap.ctx_proj");
  EXPECT_EQ(back.steps[1].propose[1].expect->taps[1].value.shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(back.steps[0].propose[0].ctx.values, f.steps[0].propose[0].ctx.values);
  EXPECT_EQ(back.steps[1].propose[1].expect->logits->values, f.steps[1].propose[1].expect->logits->values);
  EXPECT_EQ(back.steps[2].release, std::vector<int>{0});
  EXPECT_EQ(back.load_weights().lm_head.values, weights.lm_head.values);

  // A trace name used twice for different contents is refused.
  f.steps[1].propose[1].ctx_name = "s0.q0.ctx";
  EXPECT_BAD_INPUT(write_fixture(f, tmp / "clash"), "trace tensor 's0.q0.ctx' is named twice with different contents");
}

}  // namespace
}  // namespace dflash
