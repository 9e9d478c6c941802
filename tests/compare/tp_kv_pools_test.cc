// The K/V invariants at TP = N check each rank's pool (docs/spec/tensor-parallel.md §6): a stored
// value off in one rank's KV heads is named with that rank (split heads) or its replicas (a
// replicated head), by kv-stored in a replay and by kv-outside-window on a changed free slot; a
// rounding bias the whole row dilutes is caught in the one rank's columns.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "compare/kv_invariants.h"
#include "compare/replay.h"
#include "core/forwarding_proposer.h"
#include "fixtures/fixture.h"
#include "reference/reference_drafter.h"

namespace dflash {
namespace {

// Reads back layer `layer`'s K edited by `edit` (a store fault the read-back shows).
class EditedKeys : public ForwardingProposer {
 public:
  EditedKeys(std::unique_ptr<DraftProposer> inner, int layer, std::function<void(Tensor&)> edit)
      : ForwardingProposer(std::move(inner)), layer_(layer), edit_(std::move(edit)) {}
  std::optional<KvRows> read_kv(int layer, const std::vector<int64_t>& slots) const override {
    return edited(layer, inner().read_kv(layer, slots));
  }
  std::optional<KvRows> read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const override {
    return edited(layer, inner().read_kv_at(layer, seq, positions));
  }

 private:
  std::optional<KvRows> edited(int layer, std::optional<KvRows> rows) const {
    if (rows && layer == layer_) edit_(rows->k);
    return rows;
  }
  int layer_;
  std::function<void(Tensor&)> edit_;
};

// `delta` added at column `column` of every slot.
std::function<void(Tensor&)> off_column(int64_t column, float delta) {
  return [=](Tensor& k) {
    for (int64_t r = 0; r < k.rows(); ++r) k.row(r)[column] += delta;
  };
}

// Every `every`-th element of columns [first, first + count) one bf16 ulp toward zero: a
// truncating store confined to those columns.
std::function<void(Tensor&)> truncated_columns(int64_t first, int64_t count, int every) {
  return [=](Tensor& k) {
    for (int64_t r = 0; r < k.rows(); ++r) {
      for (int64_t c = first; c < first + count; ++c) {
        float& x = k.row(r)[c];
        if ((r * count + c) % every != 0 || x == 0 || !std::isfinite(x)) continue;
        x = std::nextafter(x, 0.0f);  // below the bf16 value: then cut to bf16 toward zero
        uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        bits &= 0xFFFF0000u;
        std::memcpy(&x, &bits, sizeof bits);
      }
    }
  };
}

Fixture loaded(const std::string& dir) {
  Fixture fixture = read_fixture(std::string(DFLASH_SOURCE_DIR) + "/fixtures/" + dir);
  fixture.load_weights();
  return fixture;
}

HeadSettings head_at(const Fixture& fixture, int tp) {
  HeadSettings head = fixture.head;
  head.precision = Precision::kFp32;
  head.tp_size = tp;
  return head;
}

// The kv-stored failures of a reference at TP = `tp` and `precision` on fixture `dir` whose
// layer-`layer` K reads back edited by `edit`, over steps 0..`last_step` (-1: all).
std::vector<std::string> kv_stored(const std::string& dir, int tp, Precision precision, int layer,
                                   std::function<void(Tensor&)> edit, int last_step) {
  const Fixture fixture = loaded(dir);
  HeadSettings head = head_at(fixture, tp);
  head.precision = precision;
  EditedKeys drafter(make_reference_drafter(fixture.config, fixture.weights, head), layer, std::move(edit));
  const int64_t window = head.resolved(fixture.config).max_window(fixture.config);
  const std::vector<ReplayLane> lanes = {
      {&drafter, precision, false, make_reference_context_kv(fixture.config, fixture.weights, precision, window)}};
  ReplayOptions options;
  options.tp_size = tp;
  options.last_step = last_step;
  std::vector<std::string> out;
  for (const InvariantFailure& f : replay_fixture(fixture, lanes, {}, options).invariant_failures) {
    if (f.invariant == "kv-stored") out.push_back(f.detail);
  }
  return out;
}

// Step 0 at fp32, layer 1's K `delta` off at `column`.
std::vector<std::string> kv_stored_failures(const std::string& dir, int tp, int64_t column, float delta) {
  return kv_stored(dir, tp, Precision::kFp32, 1, off_column(column, delta), 0);
}

// Every step at bf16, every `every`-th element of rank 1's columns of layer 0's K (16..31 of
// tiny-gqa) cut toward zero.
std::vector<std::string> truncated_failures(int tp, int every) {
  return kv_stored("oracle/tiny-gqa", tp, Precision::kBf16, 0, truncated_columns(16, 16, every), -1);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(TpKvPools, AStoredKeyOffInOneRanksHeadsNamesThatRanksPool) {
  // tiny-gqa: 2 KV heads of 16 at TP 2, one per rank; column 20 is KV head 1, rank 1's.
  const std::vector<std::string> failures = kv_stored_failures("oracle/tiny-gqa", 2, 20, 0.5f);
  ASSERT_FALSE(failures.empty());
  EXPECT_TRUE(contains(failures[0], "L1.K")) << failures[0];
  EXPECT_TRUE(contains(failures[0], "column 20")) << failures[0];
  EXPECT_TRUE(contains(failures[0], "; pool of rank 1 (KV head 1, columns 16..31)")) << failures[0];
  EXPECT_FALSE(contains(failures[0], "rank 0")) << failures[0];
}

TEST(TpKvPools, AReplicatedHeadNamesItsReplicas) {
  // bias-mqa-eps: one KV head of 32, held by both ranks at TP 2.
  const std::vector<std::string> failures = kv_stored_failures("oracle/bias-mqa-eps", 2, 7, 0.5f);
  ASSERT_FALSE(failures.empty());
  EXPECT_TRUE(contains(failures[0], "; pool of ranks 0..1 (KV head 0, columns 0..31)")) << failures[0];
}

// An eighth of rank 1's elements cut toward zero: -0.125 ulp over its columns, -0.0625 over the
// whole row, which the floor of the whole row's bias bound (1/16 ulp) lets pass. Each rank's pool
// checked on its own catches it; at TP 1 there is only the whole row.
TEST(TpKvPools, ABiasConfinedToOneRanksPoolIsCaughtInThatPool) {
  const std::vector<std::string> tp2 = truncated_failures(2, 8);
  ASSERT_FALSE(tp2.empty());
  EXPECT_EQ(tp2[0].rfind("sequence 0, L0.K in the pool of rank 1 (KV head 1, columns 16..31) of positions 0..", 0), 0u)
      << tp2[0];
  EXPECT_TRUE(contains(tp2[0], "rounding bias: stored vs recomputed mean signed error -0.125 bf16 ulp")) << tp2[0];
  EXPECT_TRUE(truncated_failures(1, 8).empty()) << "the whole row's mean stays under its bound";
  // Every element of rank 1's columns: the whole row fails too, and names the rank.
  const std::vector<std::string> all = truncated_failures(2, 1);
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(contains(all[0], "; pool of rank 1 (KV head 1, columns 16..31)")) << all[0];
}

TEST(TpKvPools, TheCleanReferenceAndTpOneNameNoRank) {
  EXPECT_TRUE(kv_stored_failures("oracle/tiny-gqa", 2, 20, 0.0f).empty());
  const std::vector<std::string> tp1 = kv_stored_failures("oracle/tiny-gqa", 1, 20, 0.5f);
  ASSERT_FALSE(tp1.empty());
  EXPECT_FALSE(contains(tp1[0], "pool of")) << tp1[0];
}

TEST(TpKvPools, AFreeSlotChangedInOneRanksColumnsNamesThatRank) {
  const Fixture fixture = loaded("oracle/tiny-gqa");
  const auto drafter = make_reference_drafter(fixture.config, fixture.weights, head_at(fixture, 2));
  const std::optional<PoolSnapshot> before = snapshot_pools(*drafter);
  ASSERT_TRUE(before.has_value());
  PoolSnapshot after = *before;
  // No sequence: every slot is free and in no window. Slot 3's V in KV head 0's columns (rank 0).
  after.layers[0].v.row(3)[9] += 1.0f;
  const std::vector<InvariantViolation> found = check_kv_outside_windows(*drafter, *before, after);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].invariant, "kv-outside-window");
  EXPECT_TRUE(contains(found[0].detail, "L0.V of slot 3")) << found[0].detail;
  EXPECT_TRUE(contains(found[0].detail, "column 9 ")) << found[0].detail;
  EXPECT_TRUE(contains(found[0].detail, ", in the pool of rank 0 (KV head 0)")) << found[0].detail;
}

}  // namespace
}  // namespace dflash
