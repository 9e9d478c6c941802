// The reference drafter's contract beyond the numbers the oracle checks: batch, thread and page
// order invariance (bit for bit), determinism, atomic errors, block width clamping, the context
// window, taps, precision modes. Weights come from make_random_drafter_weights.
#include "tests/support/harness_error.h"
#include "reference/reference_drafter.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/stages.h"
#include "fixtures/random_drafter.h"
#include "core/error.h"
#include "core/kv_pages.h"
#include "core/rope.h"
#include "reference/reference_options.h"

namespace dflash {
namespace {

DrafterConfig tiny_config() {
  DrafterConfig c;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.vocab_size = 97;
  c.rms_norm_eps = 1e-6;
  c.rope.theta = 10000.0;
  c.block_size = 4;
  c.target_layer_ids = {1, 3};
  c.mask_token_id = 5;
  c.target_hidden_size = 32;
  return c;
}

HeadSettings tiny_head(Precision precision = Precision::kFp32) {
  HeadSettings h;
  h.gamma = 4;
  h.ctx_cap = 64;
  h.max_batch = 3;
  h.kv_page_size = 4;
  h.precision = precision;
  return h;
}

std::shared_ptr<const DrafterWeights> tiny_weights(const DrafterConfig& c = tiny_config(), uint64_t seed = 42) {
  return std::make_shared<const DrafterWeights>(make_random_drafter_weights(c, seed, unit_gain_weight_ranges(), 1));
}

std::unique_ptr<DraftProposer> make(const HeadSettings& head, int threads = 1, const DrafterConfig& c = tiny_config()) {
  return make_reference_drafter(c, tiny_weights(c), head, ReferenceOptions{threads});
}

// Context rows of a "stream": the value at (position, column) depends only on them, so several
// drafters can be fed the same rows in different batches and chunks.
Tensor ctx_rows(int stream, int64_t first, int64_t count, int64_t features = 64) {
  Tensor t = Tensor::zeros({count, features});
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t c = 0; c < features; ++c) {
      const double phase = 0.731 * stream + 0.113 * static_cast<double>(first + r) + 0.071 * static_cast<double>(c);
      t.row(r)[c] = round_to_bf16(static_cast<float>(2.0 * std::sin(phase * (1.0 + 0.01 * stream))));
    }
  }
  return t;
}

// One sequence's request in a test trace; the rows are made from (stream, start - count, count).
struct Request {
  int seq;
  int stream;
  int64_t start;
  int64_t count;
  int anchor;
};

std::vector<ProposeOutput> propose(DraftProposer& d, const std::vector<Request>& requests, bool taps = true) {
  std::vector<Tensor> rows;
  rows.reserve(requests.size());
  for (const Request& r : requests) rows.push_back(ctx_rows(r.stream, r.start - r.count, r.count));
  std::vector<ProposeInput> batch;
  for (size_t i = 0; i < requests.size(); ++i) {
    batch.push_back({requests[i].seq, &rows[i], requests[i].start, requests[i].anchor});
  }
  return d.propose(batch, taps);
}

::testing::AssertionResult same_bits(const ProposeOutput& a, const ProposeOutput& b) {
  if (a.block_width != b.block_width) return ::testing::AssertionFailure() << "block widths differ";
  if (a.logits.shape != b.logits.shape || a.logits.values.size() != b.logits.values.size() ||
      std::memcmp(a.logits.values.data(), b.logits.values.data(), a.logits.values.size() * sizeof(float)) != 0) {
    return ::testing::AssertionFailure() << "logits differ";
  }
  if (a.draft_tokens != b.draft_tokens) return ::testing::AssertionFailure() << "draft tokens differ";
  if (a.taps.size() != b.taps.size()) return ::testing::AssertionFailure() << "tap counts differ";
  for (size_t i = 0; i < a.taps.size(); ++i) {
    const Tensor& x = a.taps[i].value;
    const Tensor& y = b.taps[i].value;
    if (a.taps[i].name != b.taps[i].name || x.shape != y.shape ||
        std::memcmp(x.values.data(), y.values.data(), x.values.size() * sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "tap " << a.taps[i].name << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

const Precision kAllPrecisions[] = {Precision::kFp64, Precision::kFp32, Precision::kBf16, Precision::kFp8,
                                    Precision::kW8a8};

TEST(ReferenceDrafter, OneSequenceGivesTheSameBitsAloneOrInAnyBatch) {
  for (Precision p : kAllPrecisions) {
    SCOPED_TRACE(precision_name(p));
    auto alone = make(tiny_head(p));
    alone->add_sequence(0);
    const ProposeOutput a1 = propose(*alone, {{0, 0, 10, 10, 7}})[0];
    const ProposeOutput a2 = propose(*alone, {{0, 0, 13, 3, 9}})[0];

    auto batched = make(tiny_head(p));
    for (int s : {0, 1, 2}) batched->add_sequence(s);
    // Other sequences with other lengths and positions, the sequence of interest in the middle.
    const auto b1 = propose(*batched, {{1, 1, 20, 20, 3}, {0, 0, 10, 10, 7}, {2, 2, 5, 5, 11}});
    EXPECT_TRUE(same_bits(b1[1], a1));
    // Then last, with one neighbour gone from the batch.
    const auto b2 = propose(*batched, {{2, 2, 6, 1, 12}, {0, 0, 13, 3, 9}});
    EXPECT_TRUE(same_bits(b2[1], a2));
    // Sanity: the neighbours' outputs really differ from it (the comparison can fail).
    EXPECT_FALSE(same_bits(b1[0], a1));
  }
}

// The same trace on differently configured drafters; returns every output.
std::vector<ProposeOutput> run_trace(DraftProposer& d) {
  std::vector<ProposeOutput> all;
  for (int s : {0, 1, 2}) d.add_sequence(s);
  for (auto& o : propose(d, {{0, 0, 9, 9, 1}, {1, 1, 30, 30, 2}, {2, 2, 4, 4, 3}})) all.push_back(o);
  for (auto& o : propose(d, {{1, 1, 33, 3, 4}, {0, 0, 17, 8, 5}})) all.push_back(o);
  d.release_sequence(1);
  d.add_sequence(3);
  for (auto& o : propose(d, {{3, 3, 12, 12, 6}, {2, 2, 5, 1, 7}, {0, 0, 18, 1, 8}})) all.push_back(o);
  return all;
}

TEST(ReferenceDrafter, BitsDoNotDependOnThreadsPageOrderOrRun) {
  for (Precision p : {Precision::kFp64, Precision::kFp32, Precision::kFp8, Precision::kW8a8}) {
    SCOPED_TRACE(precision_name(p));
    auto base = make(tiny_head(p), 1);
    auto again = make(tiny_head(p), 1);
    HeadSettings shuffled = tiny_head(p);
    shuffled.page_order_seed = 99;
    auto other = make(shuffled, 4);
    const auto x = run_trace(*base), y = run_trace(*again), z = run_trace(*other);
    ASSERT_EQ(x.size(), z.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_TRUE(same_bits(x[i], y[i])) << "output " << i << ": same settings, run twice";
      EXPECT_TRUE(same_bits(x[i], z[i])) << "output " << i << ": 4 threads and shuffled pages";
    }
    // The shuffled drafter really placed the sequence on other pages.
    EXPECT_NE(base->sequence_view(0).block_table, other->sequence_view(0).block_table);
  }
}

TEST(ReferenceDrafter, ContextInChunksGivesTheSameBitsAsAtOnce) {
  for (Precision p : {Precision::kFp64, Precision::kBf16}) {
    auto once = make(tiny_head(p));
    once->add_sequence(0);
    ProposeOutput a = propose(*once, {{0, 0, 21, 21, 30}})[0];
    auto chunked = make(tiny_head(p));
    chunked->add_sequence(0);
    propose(*chunked, {{0, 0, 7, 7, 1}});
    propose(*chunked, {{0, 0, 15, 8, 2}});
    ProposeOutput b = propose(*chunked, {{0, 0, 21, 6, 30}})[0];
    // ctx_proj covers only the rows that arrived in this propose; everything else must match.
    ASSERT_EQ(a.taps[0].name, "ctx_proj");
    EXPECT_EQ(a.taps[0].value.rows(), 21);
    EXPECT_EQ(b.taps[0].value.rows(), 6);
    a.taps.erase(a.taps.begin());
    b.taps.erase(b.taps.begin());
    EXPECT_TRUE(same_bits(a, b)) << precision_name(p);
  }
}

// Everything a caller can observe about the bookkeeping.
struct Snapshot {
  std::vector<int> sequences;
  std::map<int, std::vector<int64_t>> windows;
  std::map<int, std::vector<int64_t>> views;
  std::vector<int> free_pages, owners;
  bool operator==(const Snapshot& o) const {
    return sequences == o.sequences && windows == o.windows && views == o.views && free_pages == o.free_pages &&
           owners == o.owners;
  }
};

Snapshot snapshot(const DraftProposer& d) {
  Snapshot s;
  s.sequences = d.sequences();
  for (int seq : s.sequences) {
    s.windows[seq] = d.window_slots(seq);
    const SequenceView v = d.sequence_view(seq);
    std::vector<int64_t> flat{v.next_position, v.window_begin, v.first_logical_page};
    flat.insert(flat.end(), v.block_table.begin(), v.block_table.end());
    s.views[seq] = flat;
  }
  const PoolView pool = d.pool_view();
  s.free_pages = pool.free_pages;
  s.owners = pool.page_owner;
  return s;
}

TEST(ReferenceDrafter, ErrorsNameTheirCauseAndLeaveEverySequenceUnchanged) {
  HeadSettings head = tiny_head(Precision::kFp32);
  head.max_batch = 2;
  head.pool_pages = 6;  // 24 slots: seq 0 takes 3 pages, seq 1 two, one left
  auto d = make(head);
  auto clean = make(head);
  for (auto* x : {&d, &clean}) {
    (*x)->add_sequence(0);
    (*x)->add_sequence(1);
    (*x)->add_sequence(2);
    propose(**x, {{0, 0, 10, 10, 1}, {1, 1, 5, 5, 2}});
  }
  const Snapshot before = snapshot(*d);
  const int64_t F = 64;
  Tensor good0 = ctx_rows(0, 10, 2), good1 = ctx_rows(1, 5, 3);
  Tensor nan1 = good1, inf1 = good1, narrow = ctx_rows(1, 5, 3, F - 1), empty = Tensor::zeros({0, F});
  nan1.row(1)[3] = NAN;
  inf1.row(2)[0] = -INFINITY;
  Tensor too_many = ctx_rows(0, 10, 8);  // seq 0 to 18 rows: 5 pages, 2 more than it has; 1 free

  struct Case {
    const char* what;
    std::vector<ProposeInput> batch;
    ErrorKind kind;
    std::string message_part;
  };
  const std::vector<Case> cases = {
      {"gap", {{0, &good0, 13, 1}}, ErrorKind::kBadInput, "(a gap)"},
      {"overlap", {{0, &good0, 11, 1}}, ErrorKind::kBadInput, "(an overlap)"},
      {"NaN beside a valid sequence", {{0, &good0, 12, 1}, {1, &nan1, 8, 1}}, ErrorKind::kBadInput,
       "sequence 1: ctx value at row 1, column 3"},
      {"Inf", {{1, &inf1, 8, 1}}, ErrorKind::kBadInput, "row 2, column 0"},
      {"anchor = V", {{0, &good0, 12, 97}}, ErrorKind::kBadInput, "anchor token 97"},
      {"anchor < 0", {{0, &good0, 12, -1}}, ErrorKind::kBadInput, "anchor token -1"},
      {"ctx width", {{1, &narrow, 8, 1}}, ErrorKind::kBadInput, "expected [C, 64]"},
      {"batch > max_batch", {{0, &good0, 12, 1}, {1, &good1, 8, 1}, {2, &good1, 3, 1}}, ErrorKind::kBadInput,
       "exceeds max_batch 2"},
      {"duplicate", {{0, &good0, 12, 1}, {0, &good0, 12, 1}}, ErrorKind::kBadInput, "appears twice"},
      {"unknown sequence", {{7, &good0, 12, 1}}, ErrorKind::kBadInput, "sequence 7 is not active"},
      {"no ctx", {{0, nullptr, 12, 1}}, ErrorKind::kBadInput, "no ctx tensor"},
      {"empty batch", {}, ErrorKind::kBadInput, "empty batch"},
      {"C = 0 on a new sequence", {{2, &empty, 0, 1}}, ErrorKind::kBadInput, "at least one context row"},
      {"negative positions", {{2, &good1, 2, 1}}, ErrorKind::kBadInput, "negative position"},
      {"pool exhausted beside a valid sequence", {{1, &good1, 8, 1}, {0, &too_many, 18, 1}},
       ErrorKind::kPoolExhausted, "exhausted"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    testing::expect_mentions(testing::harness_error_message([&] { d->propose(c.batch, false); }, c.kind),
                             c.message_part);
    EXPECT_TRUE(snapshot(*d) == before) << c.what << " changed the state";
  }
  // The cached K/V were untouched too: the next valid propose matches a drafter that saw no errors.
  const auto after_errors = propose(*d, {{0, 0, 12, 2, 4}, {1, 1, 8, 3, 5}});
  const auto reference = propose(*clean, {{0, 0, 12, 2, 4}, {1, 1, 8, 3, 5}});
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(after_errors[i], reference[i])) << i;
}

TEST(ReferenceDrafter, BlockWidthIsClampedAndShapesFollowIt) {
  for (int gamma : {0, 1, 2, 4, 9}) {
    HeadSettings head = tiny_head();
    head.gamma = gamma;
    auto d = make(head);
    EXPECT_EQ(d->settings().gamma, gamma);
    EXPECT_EQ(d->block_g(), std::max(gamma, 2)) << "initial width is the head's maximum";
    d->add_sequence(0);
    int64_t start = 0;
    for (int requested : {0, 1, 2, gamma, gamma + 1, 1000, -5}) {
      d->set_block_g(requested);
      const int B = std::clamp(requested, 2, std::max(gamma, 2));
      ASSERT_EQ(d->block_g(), B) << "gamma " << gamma << " requested " << requested;
      start += 3;
      const ProposeOutput out = propose(*d, {{0, 0, start, 3, 1}})[0];
      EXPECT_EQ(out.block_width, B);
      EXPECT_EQ(out.logits.shape, (std::vector<int64_t>{B - 1, 97}));
      EXPECT_EQ(out.draft_tokens.size(), static_cast<size_t>(B - 1));
      for (const Tap& t : out.taps) {
        if (t.name == "ctx_proj") continue;
        EXPECT_EQ(t.value.rows(), t.name == "logits" ? B - 1 : B) << t.name;
      }
    }
  }
}

TEST(ReferenceDrafter, TapsComeInForwardOrderWithTheirShapesAndOnlyOnRequest) {
  HeadSettings head = tiny_head();
  head.ctx_cap = 6;
  auto d = make(head);
  d->add_sequence(0);
  const ProposeOutput with = propose(*d, {{0, 0, 9, 9, 1}}, true)[0];
  const std::vector<std::string> names = forward_stage_order(2);
  ASSERT_EQ(with.taps.size(), names.size());
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"ctx_proj", {6, 32}},  // min(C = 9, ctx_cap = 6) rows
      {"q", {4, 32}},         {"k", {4, 16}}, {"v", {4, 16}}, {"attn", {4, 32}}, {"logits", {3, 97}}};
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(with.taps[i].name, names[i]);
    const std::string stage = names[i].substr(names[i].find('.') + 1);
    const auto it = shapes.count(names[i]) ? shapes.find(names[i]) : shapes.find(stage);
    const std::vector<int64_t> expected = it != shapes.end() ? it->second : std::vector<int64_t>{4, 32};
    EXPECT_EQ(with.taps[i].value.shape, expected) << names[i];
  }
  // Without taps: none, and the same numbers.
  auto d2 = make(head);
  d2->add_sequence(0);
  ProposeOutput without = propose(*d2, {{0, 0, 9, 9, 1}}, false)[0];
  EXPECT_TRUE(without.taps.empty());
  ProposeOutput stripped = with;
  stripped.taps.clear();
  EXPECT_TRUE(same_bits(stripped, without));
}

const Tensor& tap(const ProposeOutput& out, const std::string& name) {
  for (const Tap& t : out.taps) {
    if (t.name == name) return t.value;
  }
  throw std::runtime_error("no tap " + name);
}

// Recomputes stages from neighbouring taps in float64, independently of the drafter's code path:
// the residual wiring, q's projection/norm/RoPE at the block positions, the final norm, lm_head
// and argmax. Bounds: fp32 dot products of length K within γ_K·Σ|a·b| (γ_K = K·2^-24), norms within
// a few units of 2^-24; 1e-5 of the row scale covers K <= 48 here with a wide margin.
TEST(ReferenceDrafter, TapsAgreeWithAFloat64RecomputationFromTheirNeighbours) {
  const DrafterConfig c = tiny_config();
  const auto weights = tiny_weights(c);
  auto d = make_reference_drafter(c, weights, tiny_head(), ReferenceOptions{1});
  d->add_sequence(0);
  const int64_t start = 11;
  const ProposeOutput out = propose(*d, {{0, 0, start, 11, 17}})[0];
  const int64_t B = 4, H = 32, d_head = 8;
  const auto rms = [&](const float* x, const Tensor& w, int64_t n, std::vector<double>* y) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + c.rms_norm_eps);
    y->resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) (*y)[static_cast<size_t>(i)] = w.values[static_cast<size_t>(i)] * (x[i] * inv);
  };
  const auto expect_row_near = [](const std::vector<double>& want, const float* got, const std::string& where) {
    double scale = 0;
    for (double v : want) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << where << " col " << i;
  };
  // Embedding rows: anchor then mask tokens.
  for (int64_t i = 0; i < B; ++i) {
    const int token = i == 0 ? 17 : c.mask_token_id;
    for (int64_t j = 0; j < H; ++j) ASSERT_EQ(tap(out, "embed").row(i)[j], weights->embed_tokens.row(token)[j]);
  }
  std::string previous = "embed";
  for (int l = 0; l < 2; ++l) {
    const std::string p = "L" + std::to_string(l) + ".";
    const LayerWeights& L = weights->layers[static_cast<size_t>(l)];
    for (int64_t i = 0; i < B; ++i) {
      // Residual wiring: out = (previous + o_proj) + mlp, in float, exactly.
      for (int64_t j = 0; j < H; ++j) {
        const float h = (tap(out, previous).row(i)[j] + tap(out, p + "o_proj").row(i)[j]) + tap(out, p + "mlp").row(i)[j];
        ASSERT_EQ(tap(out, p + "out").row(i)[j], h) << p << "out row " << i << " col " << j;
      }
      std::vector<double> x;
      rms(tap(out, previous).row(i), L.input_layernorm, H, &x);
      expect_row_near(x, tap(out, p + "attn_norm").row(i), p + "attn_norm");
      // q = RoPE_{start+i}(q_norm(attn_norm · Wqᵀ)) per head, rotate-half pairing.
      std::vector<float> cos(d_head / 2), sin(d_head / 2);
      rope_cos_sin(make_rope_table(c.rope, c.head_dim), start + i, cos.data(), sin.data());
      std::vector<double> q(static_cast<size_t>(c.q_dim()));
      for (int64_t n = 0; n < c.q_dim(); ++n) {
        double acc = 0;
        for (int64_t k = 0; k < H; ++k) acc += static_cast<double>(L.q_proj.row(n)[k]) * tap(out, p + "attn_norm").row(i)[k];
        q[static_cast<size_t>(n)] = acc;
      }
      for (int h = 0; h < c.num_heads; ++h) {
        double* head = q.data() + h * d_head;
        double ss = 0;
        for (int64_t j = 0; j < d_head; ++j) ss += head[j] * head[j];
        const double inv = 1.0 / std::sqrt(ss / d_head + c.rms_norm_eps);
        for (int64_t j = 0; j < d_head; ++j) head[j] = L.q_norm.values[static_cast<size_t>(j)] * (head[j] * inv);
        for (int64_t j = 0; j < d_head / 2; ++j) {
          const double a = head[j], b = head[j + d_head / 2];
          head[j] = a * cos[static_cast<size_t>(j)] - b * sin[static_cast<size_t>(j)];
          head[j + d_head / 2] = b * cos[static_cast<size_t>(j)] + a * sin[static_cast<size_t>(j)];
        }
      }
      expect_row_near(q, tap(out, p + "q").row(i), p + "q");
      // mlp_norm = post_attention_layernorm(previous + o_proj).
      std::vector<float> h_mid_f(static_cast<size_t>(H));
      for (int64_t j = 0; j < H; ++j) h_mid_f[static_cast<size_t>(j)] = tap(out, previous).row(i)[j] + tap(out, p + "o_proj").row(i)[j];
      rms(h_mid_f.data(), L.post_attention_layernorm, H, &x);
      expect_row_near(x, tap(out, p + "mlp_norm").row(i), p + "mlp_norm");
    }
    previous = p + "out";
  }
  // final_norm, logits of rows 1..B-1, argmax.
  for (int64_t i = 0; i < B; ++i) {
    std::vector<double> f;
    rms(tap(out, previous).row(i), weights->norm, H, &f);
    expect_row_near(f, tap(out, "final_norm").row(i), "final_norm");
  }
  for (int64_t i = 1; i < B; ++i) {
    std::vector<double> logits(97);
    for (int64_t v = 0; v < 97; ++v) {
      double acc = 0;
      for (int64_t k = 0; k < H; ++k) acc += static_cast<double>(weights->lm_head.row(v)[k]) * tap(out, "final_norm").row(i)[k];
      logits[static_cast<size_t>(v)] = acc;
    }
    expect_row_near(logits, out.logits.row(i - 1), "logits");
    int64_t best = 0;
    for (int64_t v = 1; v < 97; ++v) best = out.logits.row(i - 1)[v] > out.logits.row(i - 1)[best] ? v : best;
    EXPECT_EQ(out.draft_tokens[static_cast<size_t>(i - 1)], best);
  }
}

TEST(ReferenceDrafter, ContextWindowKeepsTheMostRecentRows) {
  for (int64_t cap : {1, 3, 4, 5, 7, 1000}) {
    HeadSettings head = tiny_head();
    head.ctx_cap = cap;
    auto d = make(head);
    d->add_sequence(0);
    d->add_sequence(1);
    // Two prompts that differ only in their first 8 rows (streams 0 and 5), then share rows 8..19.
    std::vector<Tensor> keep;
    const auto feed = [&](int seq, int stream, int64_t first, int64_t count) {
      keep.push_back(ctx_rows(stream, first, count));
      return ProposeInput{seq, &keep.back(), first + count, 2};
    };
    keep.reserve(8);
    d->propose({feed(0, 0, 0, 8), feed(1, 5, 0, 8)}, false);
    const auto out = d->propose({feed(0, 9, 8, 12), feed(1, 9, 8, 12)}, true);
    for (int seq : {0, 1}) {
      const SequenceView v = d->sequence_view(seq);
      EXPECT_EQ(v.next_position, 20);
      EXPECT_EQ(v.window_begin, std::max<int64_t>(0, 20 - cap));
      EXPECT_EQ(static_cast<int64_t>(d->window_slots(seq).size()), std::min<int64_t>(20, cap));
    }
    EXPECT_EQ(out[0].taps[0].value.rows(), std::min<int64_t>(12, cap)) << "ctx_proj rows = min(C, ctx_cap)";
    const PoolView pool = d->pool_view();
    int owned = 0;
    for (int owner : pool.page_owner) owned += owner >= 0;
    EXPECT_EQ(owned + static_cast<int>(pool.free_pages.size()), pool.num_pages);
    // The differing rows left both windows when cap <= 12: the outputs must then be identical;
    // with a larger cap they must differ (so the comparison can fail).
    if (cap <= 12) {
      EXPECT_TRUE(same_bits(out[0], out[1])) << "cap " << cap;
    } else {
      EXPECT_FALSE(same_bits(out[0], out[1])) << "cap " << cap;
    }
  }
}

TEST(ReferenceDrafter, ReleaseFreesPagesAndRetiresTheId) {
  auto d = make(tiny_head());
  const int total = d->pool_view().num_pages;
  d->add_sequence(4);
  propose(*d, {{4, 0, 10, 10, 1}});
  EXPECT_EQ(static_cast<int>(d->pool_view().free_pages.size()), total - 3);
  d->release_sequence(4);
  EXPECT_EQ(static_cast<int>(d->pool_view().free_pages.size()), total);
  EXPECT_TRUE(d->sequences().empty());
  EXPECT_THROW(d->add_sequence(4), HarnessError);
  EXPECT_THROW(d->release_sequence(4), HarnessError);
  EXPECT_THROW(propose(*d, {{4, 0, 12, 2, 1}}), HarnessError);
}

TEST(ReferenceDrafter, Fp64AndFp32AgreeWithinTheFp32Bound) {
  // Same bound as the oracle replay's fp32 mode (tests/oracle): 1e-4 of each row's max |logit|.
  auto d64 = make(tiny_head(Precision::kFp64));
  auto d32 = make(tiny_head(Precision::kFp32));
  const auto a = run_trace(*d64), b = run_trace(*d32);
  for (size_t i = 0; i < a.size(); ++i) {
    for (int64_t r = 0; r < a[i].logits.rows(); ++r) {
      double scale = 0, error = 0;
      for (int64_t c = 0; c < a[i].logits.cols(); ++c) {
        scale = std::max(scale, std::fabs(static_cast<double>(a[i].logits.row(r)[c])));
        error = std::max(error, std::fabs(static_cast<double>(a[i].logits.row(r)[c]) - b[i].logits.row(r)[c]));
      }
      EXPECT_LE(error, 1e-4 * scale) << "output " << i << " row " << r;
    }
  }
}

TEST(ReferenceDrafter, Bf16ModeRoundsExactlyAtTheStorageBoundaries) {
  for (Precision p : {Precision::kBf16, Precision::kFp8, Precision::kW8a8}) {
    auto d = make(tiny_head(p));
    d->add_sequence(0);
    const ProposeOutput out = propose(*d, {{0, 0, 9, 9, 1}})[0];
    const auto representable = [](const Tensor& t) {
      for (float v : t.values) {
        if (round_to_bf16(v) != v) return false;
      }
      return true;
    };
    for (const Tap& t : out.taps) {
      StageId stage;
      ASSERT_TRUE(parse_stage_name(t.name, 2, &stage)) << t.name;
      const bool stored_bf16 = stage.kind == StageKind::kCtxProj || stage.kind == StageKind::kEmbed ||
                               stage.kind == StageKind::kAttnNorm || stage.kind == StageKind::kQ ||
                               stage.kind == StageKind::kK || stage.kind == StageKind::kV ||
                               stage.kind == StageKind::kAttn || stage.kind == StageKind::kMlpNorm ||
                               stage.kind == StageKind::kFinalNorm;
      // GEMM outputs, the residual stream and logits stay fp32: most of their values are not bf16.
      EXPECT_EQ(representable(t.value), stored_bf16) << precision_name(p) << " " << t.name;
    }
  }
  // fp32 mode rounds nowhere.
  auto d = make(tiny_head(Precision::kFp32));
  d->add_sequence(0);
  const ProposeOutput out = propose(*d, {{0, 0, 9, 9, 1}})[0];
  bool any_off_grid = false;
  for (float v : tap(out, "L0.q").values) any_off_grid = any_off_grid || round_to_bf16(v) != v;
  EXPECT_TRUE(any_off_grid);
}

TEST(ReferenceDrafter, Fp8ModeUsesQuantizedWeights) {
  auto bf16 = make(tiny_head(Precision::kBf16));
  auto fp8 = make(tiny_head(Precision::kFp8));
  const auto a = run_trace(*bf16), b = run_trace(*fp8);
  for (size_t i = 0; i < a.size(); ++i) {
    // The context projection (fc) is never quantized; q already is.
    EXPECT_TRUE(std::memcmp(tap(a[i], "ctx_proj").values.data(), tap(b[i], "ctx_proj").values.data(),
                            tap(a[i], "ctx_proj").values.size() * sizeof(float)) == 0)
        << i;
    EXPECT_NE(tap(a[i], "L0.q").values, tap(b[i], "L0.q").values) << i;
  }
}

TEST(ReferenceDrafter, W8a8ModeQuantizesTheActivationsToo) {
  auto fp8 = make(tiny_head(Precision::kFp8));
  auto w8a8 = make(tiny_head(Precision::kW8a8));
  const auto a = run_trace(*fp8), b = run_trace(*w8a8);
  for (size_t i = 0; i < a.size(); ++i) {
    // fc and its input are never quantized; the attention norm's output (q/k/v's input) is the same
    // bf16 row in both modes, and q already differs.
    for (const char* same : {"ctx_proj", "L0.attn_norm"}) {
      EXPECT_TRUE(std::memcmp(tap(a[i], same).values.data(), tap(b[i], same).values.data(),
                              tap(a[i], same).values.size() * sizeof(float)) == 0)
          << i << " " << same;
    }
    EXPECT_NE(tap(a[i], "L0.q").values, tap(b[i], "L0.q").values) << i;
  }
}

TEST(ReferenceDrafter, W8a8UsesAStaticInputScaleWhereTheWeightsHaveOne) {
  const DrafterConfig c = tiny_config();
  DrafterWeights w = make_random_drafter_weights(c, 42, unit_gain_weight_ranges(), 1);
  const auto run = [&](const DrafterWeights& weights) {
    auto d = make_reference_drafter(c, std::make_shared<const DrafterWeights>(weights), tiny_head(Precision::kW8a8),
                                    ReferenceOptions{1});
    d->add_sequence(0);
    return propose(*d, {{0, 0, 9, 9, 1}})[0];
  };
  const ProposeOutput dynamic = run(w);
  // A static scale on v_proj alone: v differs, q does not (its input row keeps its dynamic scale).
  DrafterWeights with_static = w;
  with_static.layers[0].v_input_scale = 0.02f;
  const ProposeOutput fixed = run(with_static);
  EXPECT_EQ(tap(dynamic, "L0.q").values, tap(fixed, "L0.q").values);
  EXPECT_NE(tap(dynamic, "L0.v").values, tap(fixed, "L0.v").values);
  // fp8 (W8A16) ignores it.
  auto fp8_a = make_reference_drafter(c, std::make_shared<const DrafterWeights>(w), tiny_head(Precision::kFp8), ReferenceOptions{1});
  auto fp8_b = make_reference_drafter(c, std::make_shared<const DrafterWeights>(with_static), tiny_head(Precision::kFp8),
                                      ReferenceOptions{1});
  fp8_a->add_sequence(0);
  fp8_b->add_sequence(0);
  EXPECT_TRUE(same_bits(propose(*fp8_a, {{0, 0, 9, 9, 1}})[0], propose(*fp8_b, {{0, 0, 9, 9, 1}})[0]));
  // A scale that is not finite and > 0 is refused, naming the tensor.
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    DrafterWeights wrong = w;
    wrong.layers[1].down_input_scale = bad;
    testing::expect_mentions(testing::harness_error_message([&] { run(wrong); }), "layers.1.mlp.down_proj.input_scale");
  }
  DrafterWeights wrong_head = w;
  wrong_head.lm_head_input_scale = 0.0f;
  testing::expect_mentions(testing::harness_error_message([&] { run(wrong_head); }), "lm_head.input_scale");
}

TEST(ReferenceDrafter, RefusesBadWeightsConfigsAndThreadCounts) {
  const DrafterConfig c = tiny_config();
  DrafterWeights w = make_random_drafter_weights(c, 1, unit_gain_weight_ranges(), 1);
  w.layers[1].v_proj.values[5] = NAN;
  testing::expect_mentions(testing::harness_error_message([&] {
                             make_reference_drafter(c, std::make_shared<const DrafterWeights>(w), tiny_head(),
                                                    ReferenceOptions{1});
                           }),
                           "layers.1.self_attn.v_proj.weight");
  EXPECT_THROW(make_reference_drafter(c, nullptr, tiny_head(), ReferenceOptions{1}), HarnessError);
  DrafterConfig odd = c;
  odd.head_dim = 7;
  EXPECT_THROW(make_reference_drafter(odd, tiny_weights(c), tiny_head(), ReferenceOptions{1}), HarnessError);
  DrafterConfig groups = c;
  groups.num_kv_heads = 3;
  EXPECT_THROW(make_reference_drafter(groups, tiny_weights(c), tiny_head(), ReferenceOptions{1}), HarnessError);
  DrafterWeights wrong = make_random_drafter_weights(c, 1, unit_gain_weight_ranges(), 1);
  wrong.layers[0].q_proj = Tensor::zeros({31, 32});
  EXPECT_THROW(make_reference_drafter(c, std::make_shared<const DrafterWeights>(wrong), tiny_head(), ReferenceOptions{1}),
               HarnessError);
  EXPECT_THROW(make_reference_drafter(c, tiny_weights(c), tiny_head(), ReferenceOptions{0}), HarnessError);

  setenv("DFLASH_REF_THREADS", "3", 1);
  EXPECT_EQ(reference_threads_from_env(), 3);
  for (const char* bad : {"0", "-2", "two", "3x", ""}) {
    setenv("DFLASH_REF_THREADS", bad, 1);
    EXPECT_THROW(reference_threads_from_env(), HarnessError) << "'" << bad << "'";
  }
  unsetenv("DFLASH_REF_THREADS");
  EXPECT_EQ(reference_threads_from_env(), 1);
}

TEST(ReferenceDrafter, DescribesItself) {
  auto d = make(tiny_head(Precision::kFp8), 2);
  EXPECT_EQ(d->name(), "reference-fp8");
  std::map<std::string, std::string> info;
  for (const auto& [k, v] : d->describe()) info[k] = v;
  EXPECT_EQ(info["precision"], "fp8");
  EXPECT_EQ(info["compute_type"], "float");
  EXPECT_EQ(info["threads"], "2");
  EXPECT_NE(info["bf16_storage"], "off");
  EXPECT_NE(info["fp8_weights"], "off");
  EXPECT_FALSE(info["simd_target"].empty());
  EXPECT_EQ(info["fp8_activations"], "off");
  auto w8a8 = make(tiny_head(Precision::kW8a8));
  EXPECT_EQ(w8a8->name(), "reference-w8a8");
  for (const auto& [k, v] : w8a8->describe()) info[k] = v;
  EXPECT_EQ(info["precision"], "w8a8");
  EXPECT_NE(info["fp8_weights"], "off");
  EXPECT_NE(info["fp8_activations"].find("per token"), std::string::npos) << info["fp8_activations"];
  auto d64 = make(tiny_head(Precision::kFp64));
  for (const auto& [k, v] : d64->describe()) info[k] = v;
  EXPECT_EQ(info["compute_type"], "double");
  EXPECT_EQ(info["bf16_storage"], "off");
  EXPECT_EQ(info["fp8_weights"], "off");
  EXPECT_EQ(info["fp8_activations"], "off");
}

}  // namespace
}  // namespace dflash
