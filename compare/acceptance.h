// Acceptance: how many drafted tokens the target accepts, measured offline from a fixture's target
// side (fixtures/target_side.h), per side of a replay (the fixture's own draft tokens, and each
// drafter), with the fixture's pinned acceptance held to a binomial test and the collapse canary
// (docs/acceptance.md).
//   Greedy verification: a block's accepted run is the number of leading draft tokens equal to the
//   target's tokens; its acceptance length is that run + 1 (the target's own next token).
//   Speculative sampling: the acceptance probability at a position is
//   alpha = Σ_j min(p_target_j, q_draft_j) = 1 - TV(p_target, q_draft), and a block's expected
//   acceptance length is 1 + Σ_k Π_{i<=k} alpha_i.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "fixtures/target_side.h"

namespace dflash {

// The false-alarm rate of the pinned-acceptance test, per side and fixture (Bonferroni over the
// pinned positions): a side as good as the pin fails it with probability at most this.
constexpr double kAcceptanceFalseAlarm = 1e-3;
// The canary: a side whose mean acceptance length is at or below this while its reference's is
// above kCanaryReferenceLength has collapsed, whatever its logits look like.
constexpr double kCanaryCollapsedLength = 1.05;
constexpr double kCanaryReferenceLength = 1.5;

// The leading rows where drafts[i] == target[i] (over the shorter of the two).
int greedy_accepted(const std::vector<int32_t>& drafts, const std::vector<int32_t>& target);

// alpha at logits row `row`: Σ_j min(p_j, q_j) with q = softmax(draft_logits) and p the target's
// distribution: softmax of its full logits row, or the softmax of its top-k values on their ids (a
// target that samples with top-k = k). Requires target.has_distribution(). NaN for non-finite logits.
double sampling_acceptance(const TargetSide& target, int64_t row, const float* draft_logits, int64_t vocab);

// One block (one sequence of one propose) on one side.
struct BlockAcceptance {
  int step = -1, seq = -1;
  int rows = 0;                  // drafted positions B - 1
  int accepted = 0;              // greedy accepted run
  std::vector<uint8_t> match;    // per row: draft == target
  std::vector<double> sampling;  // per row: alpha (empty without the target's distribution or draft logits)
};
BlockAcceptance measure_block(int step, int seq, const TargetSide& target, const std::vector<int32_t>& drafts,
                              const Tensor* draft_logits);

// One block position k over the blocks wide enough to draft it.
struct PositionAcceptance {
  int64_t position = 0;  // block position k = 1 .. B - 1
  int blocks = 0;        // blocks that draft position k
  int reached = 0;       // of them, blocks whose accepted run reaches k (greedy)
  int matched = 0;       // of them, blocks whose draft at k equals the target's token (whatever came before)
  int sampling_blocks = 0;
  double sampling_mean = 0;  // mean alpha at k over the blocks that have it
};

// One side of a replay: the fixture's draft tokens or a drafter's.
struct SideAcceptance {
  std::string name;  // "fixture" or the drafter's name
  int lane = -1;     // -1: the fixture
  int blocks = 0, drafted = 0, accepted = 0;
  double mean_length = 0;                 // greedy: 1 + mean accepted run
  std::optional<double> sampling_length;  // mean over blocks of 1 + Σ_k Π_{i<=k} alpha_i (all blocks have alpha)
  std::vector<PositionAcceptance> positions;
  std::vector<BlockAcceptance> block_list;
};
SideAcceptance summarize_side(const std::string& name, int lane, std::vector<BlockAcceptance> blocks);

// P(X <= x) for X ~ Binomial(n, p), summed in log space (exact to rounding for every n, p).
double binomial_lower_tail(int x, int n, double p);

// The pinned-acceptance test of one position of one side: reached of blocks against the pinned
// probability, one-sided at level kAcceptanceFalseAlarm / (positions tested).
struct PinTest {
  int64_t position = 0;
  int blocks = 0, reached = 0;
  double pinned = 0;
  double p_value = 1;     // P(X <= reached) under Binomial(blocks, pinned)
  double level = 0;       // the per-position level it is held to
  int least_passing = 0;  // the smallest count that passes
  bool passed = true;
};
std::vector<PinTest> test_pin(const SideAcceptance& side, const AcceptancePin& pin);

// A failed acceptance check: "pinned-acceptance" (a position below its pin) or "canary".
struct AcceptanceFailure {
  std::string side;    // who failed
  std::string check;   // "pinned-acceptance" or "canary"
  std::string detail;  // one line, naming the fixture's numbers; the canary's names "quantized drafter"
};

// The canary for one comparison: `actual` collapsed (mean length <= 1.05) where `reference` is
// above 1.5. The message names the failure class "quantized drafter".
std::optional<AcceptanceFailure> canary(const SideAcceptance& reference, const SideAcceptance& actual);

// Everything a replay measured about acceptance.
struct AcceptanceReport {
  std::vector<SideAcceptance> sides;  // the fixture (when it has draft tokens), then the drafters in lane order
  std::optional<AcceptancePin> pin;
  std::vector<std::pair<int, std::vector<PinTest>>> pin_tests;  // (index into sides, its tests)
  std::vector<AcceptanceFailure> failures;
  bool measured() const { return !sides.empty(); }
  const SideAcceptance* side_of_lane(int lane) const;  // lane -1: the fixture; nullptr when not measured
};

// Collects the blocks of every side during a replay and judges them at the end.
class AcceptanceTally {
 public:
  // `lane` -1 is the fixture's draft tokens. `draft_logits` may be null (no sampling acceptance).
  void add(int lane, const std::string& name, int step, int seq, const TargetSide& target,
           const std::vector<int32_t>& drafts, const Tensor* draft_logits);
  // `comparisons`: (expected lane, actual lane) of each pair, lane -1 the fixture; the canary runs
  // on each, the pin test on every drafter side.
  AcceptanceReport finish(const std::optional<AcceptancePin>& pin,
                          const std::vector<std::pair<int, int>>& comparisons) const;

 private:
  struct Side {
    std::string name;
    std::vector<BlockAcceptance> blocks;
  };
  std::vector<std::pair<int, Side>> sides_;  // in order of first appearance
};

}  // namespace dflash
