// The one interface both drafters implement, shaped after an engine's DraftProposer: a head built
// from weights and settings; sequences added and released; a block width set and clamped; one
// batched propose; read-only introspection of the paged cache for invariant checks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/kv_pages.h"
#include "core/tensor.h"

namespace dflash {

// The numbers a drafter computes with (docs/spec/drafter.md §6).
//  kFp64: reference only, the oracle's own precision.
//  kFp32: reference only, fp32 activations from bf16 weights.
//  kBf16: bf16 weights, fp32 accumulation, bf16 storage at the CUDA drafter's stage boundaries
//         (the reference emulates the rounding).
//  kFp8:  kBf16 with q/k/v/o/gate/up/down and lm_head as per-row E4M3 (the reference emulates the
//         quantization bit for bit): W8A16.
//  kW8a8: kFp8 with the input rows of those eight GEMMs quantized too (what vLLM and SGLang serve):
//         per token, scale = max(amax, 2^-9) / 448 in fp32 or the projection's static input_scale,
//         codes = E4M3 RNE satfinite of x · (1 / scale); E4M3 × E4M3 products accumulated in fp32;
//         the epilogue multiplies by act_scale[token] · (weight_scale[row] · sum) (core/fp8.h).
enum class Precision { kFp64, kFp32, kBf16, kFp8, kW8a8 };
const char* precision_name(Precision precision);
bool parse_precision(const std::string& name, Precision* out);

// The dtype in which tensor-parallel row-parallel partials travel and their sum is stored
// (docs/spec/tensor-parallel.md §1, §4).
enum class TpReduceDtype { kFp32, kBf16 };
const char* tp_reduce_dtype_name(TpReduceDtype dtype);
// The §1 check 2: anything but "fp32" or "bf16" is a bad_input with the contract's message.
TpReduceDtype parse_tp_reduce_dtype(const std::string& name);

// The largest tensor-parallel size (HeadSettings::tp_size is 1, 2, 4 or 8).
constexpr int kMaxTpSize = 8;

struct HeadSettings {
  int gamma = -1;          // maximum block width; -1 takes the config's block_size
  int64_t ctx_cap = 4096;  // context window in positions, >= 1; 0 only with uncapped = true
  bool uncapped = false;   // an engine-style ctx_cap of 0 meaning "no cap", said explicitly
  int max_batch = 1;       // most sequences one propose serves
  int kv_page_size = 16;   // tokens per cache page
  int pool_pages = 0;      // pages per layer pool; 0 = max_batch · (ceil(ctx_cap / page) + 1)
  uint64_t page_order_seed = 0;  // 0: ascending page order; else a fixed shuffled order
  Precision precision = Precision::kFp32;
  // Debug mode: every slot of a page returned to the free list is filled with NaN in every layer,
  // so a stale read shows in the outputs (and the read-back checks can see the fill).
  bool poison_freed_pages = false;
  // Tensor parallelism (docs/spec/tensor-parallel.md §1): N ranks, N in {1, 2, 4, 8}; the
  // reduction dtype has no effect at N = 1.
  int tp_size = 1;
  TpReduceDtype tp_reduce_dtype = TpReduceDtype::kFp32;

  // Checks the values against their bounds (core/limits.h: the KV cache of every pool included)
  // and fills the defaults (gamma from the config, pool size).
  // `source` (the config's path) prefixes the config-dependent refusals.
  HeadSettings resolved(const DrafterConfig& config, const std::string& source = "config") const;
  // The fields' own ranges and bounds, nothing derived (resolved() starts with this).
  void check_fields() const;
  // Pages per layer pool for max_batch windows of `window_positions` each (a window can straddle
  // one page more than it fills); refused past limits::kPoolPages.
  int64_t pages_for(int64_t window_positions) const;
  // The most context positions one window can hold: retained_context, or the whole pool when that
  // is unbounded or smaller (resolved settings).
  int64_t max_window(const DrafterConfig& config) const;
};

// docs/spec/tensor-parallel.md §1 checks 3-6, in order: N must divide nh, split or replicate the KV
// heads, and divide I and V; the first failure is a bad_input with the contract's message, `source`
// (the config's path) in place of {config}. Check 1 (N itself) is check_fields'.
void check_tensor_parallel(const DrafterConfig& config, int tp_size, const std::string& source);

// The context positions each sequence keeps cached, the newest ones; 0 = every position (uncapped).
// ctx_cap (docs/spec/drafter.md §5), and when every layer of a DFlash2 drafter slides, at most
// W - 1: no block row can attend to an older position, so older rows are evicted
// (docs/spec/dflash2.md §4). The one rule both drafters, their pool sizes and the checks use.
int64_t retained_context(const DrafterConfig& config, const HeadSettings& settings);
// Of a propose's `new_rows` context rows, how many enter the sequence's window: min(new_rows,
// retained_context), or all of them when every position is retained.
int64_t retained_new_rows(const DrafterConfig& config, const HeadSettings& settings, int64_t new_rows);
// The same in words, for describe() and the checks' messages: "ctx_cap 4096", "uncapped", or
// "min(ctx_cap 4096, W - 1 = 7): every layer slides, older positions are evicted".
std::string retained_context_rule(const DrafterConfig& config, const HeadSettings& settings);

// One sequence's part of a batched propose.
struct ProposeInput {
  int seq = -1;
  const Tensor* ctx = nullptr;  // [C, nT·Ht]: target hidden states of positions start-C .. start-1
  int64_t start = 0;            // absolute position of the anchor
  int anchor = 0;               // anchor token id
};

// A named intermediate of one propose (docs/spec/drafter.md §7), in forward order.
struct Tap {
  std::string name;
  Tensor value;
};

// Which execution path produced a propose's judged outputs (logits, draft tokens, cache state).
struct ForwardPath {
  // "cpu" (the reference), "eager" (kernels launched one by one: graphs off, or a warmup pass),
  // "graph-capture" (the graph of this width and batch captured in this propose and launched) or
  // "graph-replay" (a graph captured in an earlier propose launched with this propose's values).
  std::string mode = "cpu";
  bool pdl = false;  // the judged pass launched its kernels with programmatic dependent launch
  // What the judged pass ran at this propose's (block width, batch): kernel class -> kernel and
  // launch shape, in forward order (e.g. {"qkv", "mma e4m3, 64 columns"}, {"attention_chunks",
  // "tuned split-KV, one CTA per chunk"}, {"pdl", "on"}); empty for the reference.
  std::vector<std::pair<std::string, std::string>> plan;
  // The taps came from a second, tapped pass after the judged one; tap_pass_difference says where
  // its logits or draft tokens differ from the judged pass (empty: equal bit for bit).
  bool taps_from_second_pass = false;
  std::string tap_pass_difference;
};

struct ProposeOutput {
  int seq = -1;
  int block_width = 0;                // the clamped width B this propose ran at
  Tensor logits;                      // [B-1, V]
  std::vector<int32_t> draft_tokens;  // B-1 tokens, argmax of each logits row, lowest index on ties
  std::vector<Tap> taps;              // empty unless requested
  ForwardPath path;
};

// The stored K and V of some slots of one layer, as floats [slots, kv_dim].
struct KvRows {
  Tensor k, v;
};

// Every layer's K and V of context rows [n, F] at positions first_position..: what a drafter's
// pools must hold for them (compare/kv_invariants.h checks the stored state against it).
using ContextKvFunction = std::function<std::vector<KvRows>(const Tensor& rows, int64_t first_position)>;

// The context positions one sequence's attention read in the last propose: first .. last, as the
// drafter's attention received them (its kernels' inputs, not the shared page table).
struct AttentionSpan {
  int seq = -1;
  int64_t first = 0, last = -1;  // last < first: no context position
};

// What a drafter's introspection can serve the checks. The harness's own drafters serve all of it; a
// plugin announces what it has (include/dflash/drafter_plugin.h), and the replay lists every check
// the rest would feed as not run (compare/replay.h ProposerSummary::checks_not_run).
struct Introspection {
  bool cache_view = true;       // sequences(), sequence_view, window_slots, pool_view: the page tables
  bool slot_read = true;        // read_kv by slot (needs cache_view)
  bool position_read = true;    // read_kv_at by (layer, sequence, position)
  bool taps = true;             // taps of the stages
  bool attention_spans = true;  // attention_spans()
  bool path = true;             // ProposeOutput::path
  std::vector<std::string> stages_not_given;  // with taps: the stages it said it does not give
  std::string why;              // the reason the missing parts are missing, for the report
};

class DraftProposer {
 public:
  virtual ~DraftProposer() = default;

  // "reference-fp64", "cuda-fp8", ...
  virtual std::string name() const = 0;
  virtual const DrafterConfig& config() const = 0;
  virtual const HeadSettings& settings() const = 0;

  virtual void add_sequence(int seq) = 0;
  virtual void release_sequence(int seq) = 0;

  // Stores clamp(g, 2, max(gamma, 2)); every propose runs at that width.
  virtual void set_block_g(int g) = 0;
  virtual int block_g() const = 0;

  // One batched call: at most max_batch distinct, active sequences. Context rows are validated
  // (no gap, no overlap) and admitted atomically; on any error no sequence changes.
  virtual std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) = 0;

  // Introspection for invariant checks from outside.
  virtual std::vector<int> sequences() const = 0;
  virtual SequenceView sequence_view(int seq) const = 0;
  virtual std::vector<int64_t> window_slots(int seq) const = 0;
  virtual PoolView pool_view() const = 0;

  // Test/debug read-back of the stored state, not the hot path. A proposer that stores no K/V of
  // its own (a test double) returns nullopt / an empty list, and the checks that need them say so.
  // read_kv: rows `slots` of layer `layer`'s K and V pools.
  virtual std::optional<KvRows> read_kv(int layer, const std::vector<int64_t>& slots) const {
    (void)layer;
    (void)slots;
    return std::nullopt;
  }
  // read_kv by position: layer `layer`'s K and V of sequence `seq` at absolute `positions` (in the
  // window). The default reads the slots the sequence's page table gives.
  virtual std::optional<KvRows> read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const;
  // One span per sequence of the last propose, in batch order.
  virtual std::vector<AttentionSpan> attention_spans() const { return {}; }

  virtual Introspection introspection() const { return {}; }

  // Whether the drafter stores its attention's split-KV partials as bf16, as engines' split-KV
  // kernels do (a plugin announces it; the harness's own drafters keep fp32 partials): a rounding
  // past its precision's bf16 boundaries, which the tolerance model counts on its side
  // (docs/tolerances.md §4).
  virtual bool bf16_attention_partials() const { return false; }

  // Settings and choices in force (precision, kernels per stage, fallbacks taken, graphs on/off),
  // printed in every report.
  virtual std::vector<std::pair<std::string, std::string>> describe() const = 0;
};

}  // namespace dflash
