// A proposer whose outputs and introspection pass through optional edits: hand-made violations of
// one invariant at a time, for showing that each check of compare/invariants.h fires.
#pragma once
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/forwarding_proposer.h"

namespace dflash::prop {

class TamperingProposer : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;

  std::function<void(ProposeOutput&)> edit_output;
  std::function<void(int&)> edit_block_g;
  std::function<void(std::vector<int>&)> edit_sequences;
  std::function<void(SequenceView&)> edit_view;
  std::function<void(int seq, std::vector<int64_t>&)> edit_slots;
  std::function<void(PoolView&)> edit_pool;

  int block_g() const override {
    int g = ForwardingProposer::block_g();
    if (edit_block_g) edit_block_g(g);
    return g;
  }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    if (edit_output) {
      for (ProposeOutput& out : outputs) edit_output(out);
    }
    return outputs;
  }
  std::vector<int> sequences() const override {
    std::vector<int> ids = ForwardingProposer::sequences();
    if (edit_sequences) edit_sequences(ids);
    return ids;
  }
  SequenceView sequence_view(int seq) const override {
    SequenceView view = ForwardingProposer::sequence_view(seq);
    if (edit_view) edit_view(view);
    return view;
  }
  std::vector<int64_t> window_slots(int seq) const override {
    std::vector<int64_t> slots = ForwardingProposer::window_slots(seq);
    if (edit_slots) edit_slots(seq, slots);
    return slots;
  }
  PoolView pool_view() const override {
    PoolView pool = ForwardingProposer::pool_view();
    if (edit_pool) edit_pool(pool);
    return pool;
  }
};

}  // namespace dflash::prop
