// A test double for the replay engine: real paged bookkeeping (KvPageTable) and outputs from a
// closed-form rule of (sequence, start, anchor, row), so a test can write the fixture's expectations
// from the same rule and perturb one drafter or one expectation on purpose.
#pragma once
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/kv_pages.h"
#include "core/proposer.h"
#include "fixtures/fixture.h"

namespace dflash::testing_support {

// Geometry of the double: 1 layer, H 4, nh·d 4, vocab 6.
inline DrafterConfig scripted_config() {
  DrafterConfig c;
  c.hidden_size = 4;
  c.num_layers = 1;
  c.num_heads = 1;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 8;
  c.vocab_size = 6;
  c.block_size = 4;
  c.target_layer_ids = {0};
  c.target_hidden_size = 4;
  return c;
}

// The rule: tap value of (tap index, row, col) and logits of (row, token); the largest logit of a
// row is token (anchor + row) % 6, by a clear margin.
inline float scripted_tap(int seq, int64_t start, int tap, int64_t row, int64_t col) {
  return static_cast<float>(std::sin(0.1 * seq + 0.01 * start + tap + 0.3 * row + 0.7 * col) + 2.0);
}
inline float scripted_logit(int anchor, int64_t row, int64_t token) {
  return token == (anchor + row) % 6 ? 5.0f : static_cast<float>(0.5 * std::cos(row + 2.0 * token));
}
inline const std::vector<std::string>& scripted_tap_names() {
  static const std::vector<std::string> names = {"embed", "L0.q", "L0.v"};
  return names;
}
inline Tensor scripted_tap_tensor(int seq, int64_t start, int tap, int width) {
  const int64_t cols = 4;  // H = nh·d = nkv·d = 4
  Tensor t = Tensor::zeros({width, cols});
  for (int64_t r = 0; r < width; ++r) {
    for (int64_t c = 0; c < cols; ++c) t.row(r)[c] = scripted_tap(seq, start, tap, r, c);
  }
  return t;
}
inline Tensor scripted_logits(int anchor, int width) {
  Tensor t = Tensor::zeros({width - 1, 6});
  for (int64_t r = 0; r < width - 1; ++r) {
    for (int64_t v = 0; v < 6; ++v) t.row(r)[v] = scripted_logit(anchor, r, v);
  }
  return t;
}
inline std::vector<int32_t> scripted_drafts(int anchor, int width) {
  std::vector<int32_t> tokens;
  for (int64_t r = 0; r < width - 1; ++r) tokens.push_back(static_cast<int32_t>((anchor + r) % 6));
  return tokens;
}

// The head the double's fixtures use: blocks of 4, a 64-position window in pages of 4.
inline HeadSettings scripted_head(int max_batch = 1) {
  HeadSettings h;
  h.gamma = 4;
  h.ctx_cap = 64;
  h.max_batch = max_batch;
  h.kv_page_size = 4;
  return h;
}

class ScriptedProposer : public DraftProposer {
 public:
  // `tamper` may change an output after the rule made it (a planted fault).
  ScriptedProposer(std::string name, HeadSettings settings, std::function<void(ProposeOutput*)> tamper = {})
      : name_(std::move(name)),
        config_(scripted_config()),
        settings_(settings.resolved(config_)),
        table_(settings_.pool_pages, settings_.kv_page_size, settings_.ctx_cap),
        block_g_(clamp_block_width(settings_.gamma, settings_.gamma)),
        tamper_(std::move(tamper)) {}

  std::string name() const override { return name_; }
  const DrafterConfig& config() const override { return config_; }
  const HeadSettings& settings() const override { return settings_; }
  void add_sequence(int seq) override {
    table_.add(seq);
    calls.push_back("add " + std::to_string(seq));
  }
  void release_sequence(int seq) override {
    table_.release(seq);
    calls.push_back("release " + std::to_string(seq));
  }
  void set_block_g(int g) override { block_g_ = clamp_block_width(g, settings_.gamma); }
  int block_g() const override { return block_g_; }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ContextRequest> requests;
    for (const ProposeInput& in : batch) requests.push_back({in.seq, in.start, in.ctx->rows()});
    table_.admit(requests);
    std::vector<ProposeOutput> outputs;
    for (const ProposeInput& in : batch) {
      ProposeOutput out;
      out.seq = in.seq;
      out.block_width = block_g_;
      out.logits = scripted_logits(in.anchor, block_g_);
      out.draft_tokens = scripted_drafts(in.anchor, block_g_);
      if (want_taps) {
        for (size_t t = 0; t < scripted_tap_names().size(); ++t) {
          out.taps.push_back({scripted_tap_names()[t], scripted_tap_tensor(in.seq, in.start, static_cast<int>(t), block_g_)});
        }
      }
      if (tamper_) tamper_(&out);
      outputs.push_back(std::move(out));
    }
    calls.push_back("propose " + std::to_string(batch.size()) + (want_taps ? " taps" : ""));
    return outputs;
  }
  std::vector<int> sequences() const override { return table_.sequences(); }
  SequenceView sequence_view(int seq) const override { return table_.view(seq); }
  std::vector<int64_t> window_slots(int seq) const override { return table_.window_slots(seq); }
  PoolView pool_view() const override { return table_.pool(); }
  std::vector<std::pair<std::string, std::string>> describe() const override { return {{"rule", "scripted"}}; }

  std::vector<std::string> calls;

 private:
  std::string name_;
  DrafterConfig config_;
  HeadSettings settings_;
  KvPageTable table_;
  int block_g_;
  std::function<void(ProposeOutput*)> tamper_;
};

// One sequence, `steps` proposes with the scripted expectations (taps included); `plant` may
// corrupt the fixture's expectations of a step.
inline Fixture scripted_fixture(const std::string& name, int steps,
                         const std::function<void(int step, ExpectedOutputs&)>& plant = {}) {
  Fixture f;
  f.name = name;
  f.expect_precision = "bf16";
  f.config = scripted_config();
  f.head = scripted_head();
  for (int step = 0; step < steps; ++step) {
    ProposeEntry e;
    e.seq = 0;
    e.ctx = Tensor::zeros({3, 4});
    e.start = 3 * (step + 1);
    e.anchor = step;
    e.block_width = 4;
    ExpectedOutputs x;
    x.logits = scripted_logits(e.anchor, 4);
    x.draft_tokens = scripted_drafts(e.anchor, 4);
    for (size_t t = 0; t < scripted_tap_names().size(); ++t) {
      x.taps.push_back({scripted_tap_names()[t], scripted_tap_tensor(0, e.start, static_cast<int>(t), 4)});
    }
    if (plant) plant(step, x);
    e.expect = x;
    FixtureStep s;
    s.propose = {e};
    f.steps.push_back(s);
  }
  return f;
}

}  // namespace dflash::testing_support
