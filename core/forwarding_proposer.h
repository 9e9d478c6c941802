// A proposer that passes every call to an inner one. The property tests' broken variants and
// view-tampering doubles, and the example plugin's planted faults, derive from it and override the
// one behaviour they change, so each is a few lines.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/proposer.h"

namespace dflash {

class ForwardingProposer : public DraftProposer {
 public:
  explicit ForwardingProposer(std::unique_ptr<DraftProposer> inner) : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name(); }
  const DrafterConfig& config() const override { return inner_->config(); }
  const HeadSettings& settings() const override { return inner_->settings(); }
  void add_sequence(int seq) override { inner_->add_sequence(seq); }
  void release_sequence(int seq) override { inner_->release_sequence(seq); }
  void set_block_g(int g) override { inner_->set_block_g(g); }
  int block_g() const override { return inner_->block_g(); }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    return inner_->propose(batch, want_taps);
  }
  std::vector<int> sequences() const override { return inner_->sequences(); }
  SequenceView sequence_view(int seq) const override { return inner_->sequence_view(seq); }
  std::vector<int64_t> window_slots(int seq) const override { return inner_->window_slots(seq); }
  PoolView pool_view() const override { return inner_->pool_view(); }
  std::optional<KvRows> read_kv(int layer, const std::vector<int64_t>& slots) const override {
    return inner_->read_kv(layer, slots);
  }
  std::optional<KvRows> read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const override {
    return inner_->read_kv_at(layer, seq, positions);
  }
  std::vector<AttentionSpan> attention_spans() const override { return inner_->attention_spans(); }
  Introspection introspection() const override { return inner_->introspection(); }
  std::vector<std::pair<std::string, std::string>> describe() const override { return inner_->describe(); }
  bool bf16_attention_partials() const override { return inner_->bf16_attention_partials(); }

 protected:
  DraftProposer& inner() { return *inner_; }
  const DraftProposer& inner() const { return *inner_; }

 private:
  std::unique_ptr<DraftProposer> inner_;
};

}  // namespace dflash
