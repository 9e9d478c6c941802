// The numbers of one batched propose, for one compute type: context ingestion (projection, K/V of
// the rows entering the window, written to the pools at their slots) and the block forward
// (layers, final norm, lm_head, argmax). Bookkeeping (which rows, which slots) is decided by the
// caller through KvPageTable; the engine only computes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/proposer.h"
#include "core/weights.h"
#include "reference/stage_policy.h"

namespace dflash {

// One sequence of a batched propose, after admission.
struct SequenceStep {
  int seq = -1;
  const Tensor* ctx = nullptr;         // the propose's ctx rows [C, nT·Ht]
  int64_t first_row = 0;               // first ctx row that enters the window
  int64_t first_position = 0;          // its absolute position
  std::vector<int64_t> new_slots;      // slot of each entering row, in position order
  std::vector<int64_t> window_slots;   // the whole window after admission, in position order
  int64_t start = 0;                   // anchor position s
  int anchor = 0;
};

class DrafterEngine {
 public:
  virtual ~DrafterEngine() = default;
  // Returns one output per step, in order. Does not throw on valid steps.
  virtual std::vector<ProposeOutput> propose(const std::vector<SequenceStep>& steps, int block_width,
                                             bool want_taps) = 0;
  // Only the context half: the rows entering the windows, written to the pools at their slots.
  virtual void ingest(const std::vector<SequenceStep>& steps) = 0;
  // The stored K and V of `slots` in `layer` (test/debug read-back).
  virtual KvRows read_kv(int layer, const std::vector<int64_t>& slots) const = 0;
  // Every layer's K and V of `slots` set to NaN (HeadSettings::poison_freed_pages).
  virtual void poison(const std::vector<int64_t>& slots) = 0;
  virtual std::string compute_type() const = 0;
  virtual int threads() const = 0;
};

// `weights` must outlive the engine (fp32 projections read it in place). num_slots = pool pages ×
// page size.
std::unique_ptr<DrafterEngine> make_drafter_engine(const DrafterConfig& config, const DrafterWeights& weights,
                                                   const StagePolicy& policy, int64_t num_slots, int threads);

}  // namespace dflash
