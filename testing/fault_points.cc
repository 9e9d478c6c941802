// The registry of fault points and the environment's request (testing/fault_points.h).
#include "testing/fault_points.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/parse_number.h"

namespace dflash {

const std::vector<PlantedMutation>& mutation_registry() {
  // Declared stages follow from where each fault first enters a propose (drafter.md §7, and the
  // order of compare/catch_table.h first_failure): a fault in the stored context K/V, RoPE's
  // included, at the kv-stored invariant (context ingestion precedes the block forward); in the
  // block's RoPE alone at L0.q; in attention's inputs at L0.attn; in the logits alone at logits.
  static const std::vector<PlantedMutation> registry = {
      {Mutation::kGemmKTail, "gemm-k-tail", "GEMM K tile",
       "the m <= 16 tensor-core GEMM drops its last 64-wide K tile at m = 7 (the lm_head of one sequence at width 8)",
       "replay", "logits", "oracle/tiny-gqa", "bf16"},
      {Mutation::kFp8RowScale, "fp8-row-scale", "fp8 row scale",
       "layer 0's E4M3 o_proj scales made for E4M3FNUZ's range (absmax/240) while its codes use E4M3's (absmax/448)",
       "replay", "L0.o_proj", "oracle/tiny-gqa", "fp8"},
      {Mutation::kRopePairLayout, "rope-pair-layout", "RoPE pair layout",
       "q/k rotated in interleaved pairs (2j, 2j+1) instead of rotate-half pairs (j, j + d/2)", "invariant", "kv-stored",
       "oracle/tiny-gqa", "bf16"},
      {Mutation::kInvFreqBf16, "inv-freq-bf16", "RoPE inv_freq at far positions",
       "inv_freq held in bf16: the angle's error grows with the position", "invariant", "kv-stored",
       "recorded/rope-default-32k", "bf16"},
      {Mutation::kYarnAttentionFactor, "yarn-attention-factor", "YaRN attention factor",
       "YaRN's attention factor (mscale) dropped: cos/sin not scaled", "invariant", "kv-stored", "oracle/yarn",
       "bf16"},
      {Mutation::kStaleKey, "stale-key", "stale key in the cache",
       "the second context row of each propose is rotated at the first row's position (one stale key per propose)",
       "invariant", "kv-stored", "blind-spots/long-window", "bf16"},
      {Mutation::kBlockRowsInPool, "block-rows-in-pool", "block rows left in the pool",
       "the last layer's block K/V rows are also copied into the last slots of its pools", "invariant",
       "kv-outside-window", "oracle/tiny-gqa", "bf16"},
      {Mutation::kPageTableOrder, "page-table-order", "page-table order",
       "the block tables are uploaded page-major into a buffer the kernels read sequence-major", "replay", "L0.attn",
       "oracle/batch-widths-release", "bf16"},
      {Mutation::kWindowOneShort, "window-one-short", "window edge",
       "past the cap, attention skips the window's oldest position (ctx_cap - 1 keys)", "replay", "L0.attn",
       "blind-spots/window-cap4", "bf16"},
      {Mutation::kGraphBakedPositions, "graph-baked-positions", "per-step value baked into a graph",
       "block positions uploaded only when no graph of the shape exists: graph replays run the capture's positions",
       "replay", "L0.q", "oracle/tiny-gqa", "bf16"},
      {Mutation::kAnchorLeak, "anchor-leak", "leak between sequences",
       "every sequence of a batch embeds the first sequence's anchor", "replay", "embed",
       "oracle/batch-widths-release", "bf16"},
      {Mutation::kArgmaxTieOrder, "argmax-tie-order", "argmax tie order",
       "the argmax partials and reduction give exact ties to the highest index", "invariant", "draft-argmax",
       "blind-spots/logit-ties", "bf16"},
      {Mutation::kAttentionWrongHead, "attention-wrong-head", "attention reads the wrong head",
       "the split-KV combine reads head (h + 1) mod nh's partials for head h (whole-window: head h's output lands in head h + 1)", "replay", "L0.attn", "oracle/tiny-gqa",
       "bf16"},
      {Mutation::kGammaSizedBuffer, "gamma-sized-buffer", "buffer sized by gamma",
       "attention's partial buffers strided by gamma rows instead of max(gamma, 2)", "replay", "L0.attn",
       "blind-spots/gamma1-batch3", "bf16"},
      {Mutation::kEpsIgnored, "eps-ignored", "eps ignored", "the RMSNorms run with eps 0 (the field not forwarded)",
       "replay", "ctx_proj", "blind-spots/norm-eps", "bf16"},
      {Mutation::kBiasIgnored, "bias-ignored", "bias ignored", "o_proj's bias is not applied in the block forward",
       "replay", "L0.o_proj", "oracle/bias-mqa-eps", "bf16"},
      {Mutation::kDraftRowShift, "draft-row-shift", "lm_head input rows",
       "final_norm writes block row i to the lm_head's input row i instead of i - 1", "replay", "logits",
       "oracle/tiny-gqa", "bf16"},
      // From 64 block rows the GEMMs go to the libraries: fixtures of 64-96 block rows show these.
      {Mutation::kCutlassNeighbourScale, "cutlass-neighbour-scale", "fp8 row scale (library path)",
       "the CUTLASS GEMM (E4M3, 64 block rows and more) scales each row of a weight's last 128-row tile by its "
       "neighbour's scale (row n + 1's, the tile's last row by its first's)",
       "replay", "L0.v", "blind-spots/rows64-d128", "fp8"},
      {Mutation::kCublasLtResidualTwice, "cublaslt-residual-twice", "residual added twice (library path)",
       "the cuBLASLt path (bf16, 64 block rows and more) adds o_proj's and down_proj's products to the residual "
       "stream twice",
       "replay", "L0.mlp_norm", "blind-spots/rows64-d128", "bf16"},
      // Under one ulp per element: only the rounding-bias check sees these.
      {Mutation::kTruncatedKvStore, "truncated-kv-store", "rounding bias",
       "qk_norm_rope_kernel cuts the context K and V it stores in the pools to bf16 toward zero", "invariant",
       "kv-stored", "oracle/tiny-gqa", "bf16"},
      {Mutation::kTruncatedSwiglu, "truncated-swiglu", "rounding bias",
       "the gate|up GEMM's SwiGLU epilogue cuts silu(gate)·up to bf16 toward zero", "replay", "L0.mlp",
       "oracle/tiny-gqa", "bf16"},
      // Stale graphs (blind-spots/serving-loop interleaves widths, batches, releases and window
      // growth; property 11 finds them on random traces). Taps come from an eager second pass, so a
      // fault of the graph alone shows at the logits; a stale device input shows in both passes.
      {Mutation::kGraphKeyedByWidth, "graph-keyed-by-width", "graph keyed by width alone",
       "a propose whose width has a graph captured at another batch size replays that graph: the sequences past its "
       "batch read back stale logits",
       "replay", "logits", "blind-spots/serving-loop", "bf16"},
      {Mutation::kBakedPageTable, "baked-page-table", "page table baked at capture",
       "the block tables are uploaded only when no graph of the shape exists: replays read the tables of the last "
       "upload",
       "replay", "L0.attn", "blind-spots/serving-loop", "bf16"},
      {Mutation::kPaddedWidthGraph, "padded-width-graph", "scratch shared between two widths",
       "a propose whose batch size has a graph captured at a wider width replays that graph (a padded block) and "
       "copies its logits back with its own width's layout",
       "replay", "logits", "blind-spots/serving-loop", "bf16"},
      {Mutation::kStaleAttentionPlan, "stale-attention-plan", "stale attention plan after a window change",
       "attention's chunk count is taken from the longest window of the propose being enqueued: a graph replays "
       "the count of its capture's windows",
       "replay", "logits", "blind-spots/serving-loop", "bf16"},
      // Tensor parallelism (docs/spec/tensor-parallel.md), the fake shards of one GPU, replayed with
      // --tp: the reference's plants of the same names (testing/reference_faults.h TpFault), and an
      // order that only the captured graph runs (the tapped pass is eager: taps-change-result).
      {Mutation::kTpMissingAllReduce, "tp-missing-all-reduce", "missing all-reduce",
       "layer 0's o_proj reduction keeps rank 0's partial alone", "replay", "L0.o_proj", "oracle/tiny-mha", "bf16", 2},
      {Mutation::kTpVocabOffset, "tp-vocab-offset", "vocabulary offset off by one block",
       "rank r > 0 sends its best token with rank r - 1's vocabulary offset", "replay", "draft_tokens",
       "oracle/tiny-mha", "bf16", 2},
      {Mutation::kTpGraphReductionOrder, "tp-graph-reduction-order", "reduction order of the graph differs from eager",
       "under graph capture the row-parallel partials are summed from the last rank down", "invariant",
       "taps-change-result", "oracle/tiny-mha", "bf16", 4},
      {Mutation::kTpShardTopkUnmerged, "tp-shard-topk-unmerged", "per-shard top-k without the global merge",
       "the DFlash2 selector's merge reads rank 0's shard candidates alone", "replay", "selector.topk_ids",
       "oracle/d2-tiny", "bf16", 2},
      // One pool holds every shard's KV heads (docs/cuda-drafter.md): the generic attention kernel's
      // query heads read the KV heads one TP 2 shard over.
      {Mutation::kTpWrongShardKvHeads, "tp-wrong-shard-kv-heads", "KV heads assigned to the wrong shard",
       "rank r's query heads read rank r + 1's KV heads (the generic attention kernel, half the KV heads "
       "away)", "replay", "L0.attn", "oracle/tiny-mha", "bf16", 2},
  };
  return registry;
}

const char* mutation_id(Mutation mutation) {
  if (mutation == Mutation::kNone) return "none";
  for (const PlantedMutation& m : mutation_registry()) {
    if (m.mutation == mutation) return m.id;
  }
  return "?";
}

#ifdef DFLASH_FAULT_POINTS
namespace {

// DFLASH_FAULT's value, "" when unset.
std::string fault_request() {
  const char* value = std::getenv("DFLASH_FAULT");
  return value != nullptr ? value : "";
}

// "alloc:N" or "launch:N": sets *site and *nth; false for anything else.
bool parse_injected_failure(const std::string& text, FailureSite* site, long long* nth) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos) return false;
  const std::string kind = text.substr(0, colon);
  int n = 0;
  if ((kind != "alloc" && kind != "launch") || !parse_whole_int(text.substr(colon + 1), &n) || n < 1) return false;
  *site = kind == "alloc" ? FailureSite::kAlloc : FailureSite::kLaunch;
  *nth = n;
  return true;
}

std::string known_faults() {
  std::string known = "none, alloc:N, launch:N";
  for (const PlantedMutation& m : mutation_registry()) known += ", " + std::string(m.id);
  return known;
}

// The injection plan: which site fails at which count (0: none), and the counts so far.
struct FailurePlan {
  std::mutex mutex;
  std::atomic<bool> armed{false};  // read without the lock: every launch asks
  FailureSite site = FailureSite::kAlloc;
  long long nth = 0, seen = 0;
};

FailurePlan& plan() {
  static FailurePlan* p = [] {
    auto* out = new FailurePlan();  // never destroyed: allocations may be freed after static destructors
    const std::string text = fault_request();
    if (parse_injected_failure(text, &out->site, &out->nth)) out->armed = true;
    return out;
  }();
  return *p;
}

}  // namespace

namespace {
std::atomic<int> g_kernel_mutation{0};
}  // namespace

void set_kernel_mutation(Mutation mutation) { g_kernel_mutation = static_cast<int>(mutation); }
Mutation kernel_mutation() { return static_cast<Mutation>(g_kernel_mutation.load()); }

Mutation read_planted_mutation() {
  const std::string id = fault_request();
  if (id.empty() || id == "none") return Mutation::kNone;
  for (const PlantedMutation& m : mutation_registry()) {
    if (id == m.id) return m.mutation;
  }
  FailureSite site;
  long long nth = 0;
  if (parse_injected_failure(id, &site, &nth)) return Mutation::kNone;
  throw bad_input("DFLASH_FAULT=" + id + ": no such fault point (known: " + known_faults() + ")");
}

void set_injected_failure(FailureSite site, long long nth) {
  FailurePlan& p = plan();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.site = site;
  p.nth = nth;
  p.seen = 0;
  p.armed = nth > 0;
}

void clear_injected_failure() { set_injected_failure(FailureSite::kAlloc, 0); }

bool injected_failure_due(FailureSite site) {
  FailurePlan& p = plan();
  if (!p.armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.nth == 0 || p.site != site) return false;
  return ++p.seen == p.nth;
}
#endif

}  // namespace dflash
