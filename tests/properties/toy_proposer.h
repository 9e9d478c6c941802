// A drafter-shaped test double: the real paged bookkeeping (KvPageTable) and a tiny, exactly
// defined computation that reads context only through its own slot-addressed cache. It obeys
// every property of docs/spec/drafter.md §5 without the drafter's math, so the invariant checker and the
// property code can be exercised on their own, and view-tampering wrappers around it give
// hand-made violations. It exposes no taps.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/kv_pages.h"
#include "core/paged_proposer.h"
#include "core/proposer.h"
#include "core/weights.h"

namespace dflash::prop {

class ToyProposer : public PagedProposer {
 public:
  ToyProposer(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
              const HeadSettings& settings);

  std::string name() const override { return "toy"; }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override;
  std::vector<std::pair<std::string, std::string>> describe() const override;

 private:
  ProposeOutput propose_one(const ProposeInput& input) const;

  std::shared_ptr<const DrafterWeights> weights_;
  std::vector<float> cache_;  // [num_pages · page_size, H]: the projected context row of each slot
};

std::unique_ptr<DraftProposer> make_toy_proposer(const DrafterConfig& config,
                                                 std::shared_ptr<const DrafterWeights> weights,
                                                 const HeadSettings& settings);

}  // namespace dflash::prop
