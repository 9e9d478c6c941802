// The one fault-point mechanism of the harness, for the catch suite and the error-path tests
// (docs/catch-rate.md, docs/fuzzing.md). Every hook in production code is a macro of this header
// and compiles to nothing unless the build is configured with -DDFLASH_FAULT_POINTS=ON: the default
// build (what ships and is measured) holds no fault point and reads no test-only variable.
//
// Two kinds of fault point, one registry and one environment variable, DFLASH_FAULT, read once per
// process (a planted bug when a drafter is constructed, an injected failure at its first event):
//   - planted bugs ("mutations") of the CUDA drafter: DFLASH_FAULT=<id> (mutation_registry());
//   - injected failures of the CUDA runtime: DFLASH_FAULT=alloc:N (the N-th device allocation
//     fails with cudaErrorMemoryAllocation) or launch:N (the N-th kernel launch fails with
//     cudaErrorLaunchFailure and is not made); set_injected_failure() arms one in a test.
// The reference's planted faults (testing/reference_faults.h) are chosen per drafter through
// ReferenceOptions, under the same build option.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dflash {

enum class Mutation : int {
  kNone = 0,
  kGemmKTail,
  kFp8RowScale,
  kRopePairLayout,
  kInvFreqBf16,
  kYarnAttentionFactor,
  kStaleKey,
  kBlockRowsInPool,
  kPageTableOrder,
  kWindowOneShort,
  kGraphBakedPositions,
  kAnchorLeak,
  kArgmaxTieOrder,
  kAttentionWrongHead,
  kGammaSizedBuffer,
  kEpsIgnored,
  kBiasIgnored,
  kDraftRowShift,
  // Reachable only from 64 block rows (the library GEMMs, gemm_m64=library).
  kCutlassNeighbourScale,
  kCublasLtResidualTwice,
  // Rounding toward zero: under every per-row bound, seen by the rounding-bias check.
  kTruncatedKvStore,
  kTruncatedSwiglu,
  // Stale-graph classes (property 11, the serving loop).
  kGraphKeyedByWidth,
  kBakedPageTable,
  kPaddedWidthGraph,
  kStaleAttentionPlan,
  // The CUDA drafter at TP = N (docs/spec/tensor-parallel.md), replayed with `--tp N`.
  kTpMissingAllReduce,
  kTpVocabOffset,
  kTpGraphReductionOrder,
  kTpShardTopkUnmerged,
  kTpWrongShardKvHeads,
};

struct PlantedMutation {
  Mutation mutation;
  const char* id;           // DFLASH_MUTATION's value, e.g. "rope-pair-layout"
  const char* bug_class;    // the failure class it stands for (docs/failure-classes.md)
  const char* description;  // what the planted code does
  const char* check;        // compare/catch_table.h catch_check_name(): "replay", "invariant", ...
  const char* stage;        // the first stage (or invariant) the check must name
  const char* fixture;      // the bundled fixture, relative to fixtures/, that shows it
  const char* precision;    // the replay precision that shows it: "bf16" or "fp8"
  int tp = 1;               // the replay's --tp
};

// Every planted mutation, in a fixed order (kNone is not listed).
const std::vector<PlantedMutation>& mutation_registry();

const char* mutation_id(Mutation mutation);

#ifdef DFLASH_FAULT_POINTS
// The planted bug DFLASH_FAULT asks for: kNone when it is unset, empty, "none" or an injected
// failure. kBadInput naming the variable for an unknown id (a planted bug that silently does not
// run would pass the suite).
Mutation read_planted_mutation();

// Injected failures: the `nth` event at `site` (counted from this call, or from the start of the
// process for DFLASH_FAULT) fails; nth 0 disarms. injected_failure_due counts one event.
enum class FailureSite { kAlloc, kLaunch };
void set_injected_failure(FailureSite site, long long nth);
void clear_injected_failure();
bool injected_failure_due(FailureSite site);
#define DFLASH_INJECTED_FAILURE(site) (::dflash::injected_failure_due(::dflash::FailureSite::site))

// Hands the mutation to the device code of the files that hold device-side hooks (a __device__
// constant per file, testing/fault_points.cuh), and to kernel_mutation().
void set_device_mutation(Mutation mutation);
void set_device_mutation_attention(Mutation mutation);
void set_device_mutation_elementwise(Mutation mutation);
void set_device_mutation_gemm_mma(Mutation mutation);
void set_device_mutation_gemm_fallback(Mutation mutation);
void set_device_mutation_vocab_parallel(Mutation mutation);
// The mutation of the CUDA drafter constructed last (the process's DFLASH_FAULT), for the host hooks
// of kernel launchers that have no drafter at hand (the library GEMMs): DFLASH_MUTATE(kernel_mutation(), ...).
void set_kernel_mutation(Mutation mutation);
Mutation kernel_mutation();

// Host-side helpers of the hooks that need more than one statement.
// An E4M3 weight's row scales taken for E4M3FNUZ's range (largest 240) while its codes use E4M3's
// (largest 448): every row dequantized 448/240 times too large; bf16: nothing.
void plant_fnuz_row_scales(const float* scales, int64_t rows, bool e4m3);
// inv_freq rounded to bf16 (a table kept in the activation type): angles drift with the position.
void plant_bf16_inv_freq(std::vector<float>& inv_freq);
// The block tables written page-major ([page][sequence]) into a buffer read sequence-major.
void plant_page_major_tables(int32_t* tables, int batch, int max_pages_per_seq);
// kCutlassNeighbourScale: a copy of an E4M3 weight's row scales in which each row of its last tile
// of 128 rows (CUTLASS's tile of weight rows) has its neighbour's scale (row n + 1's; the tile's
// last row its first row's), made at construction (graph capture allocates nothing);
// planted_neighbour_scales returns the copy made for `scale`, or `scale` when none was.
void plant_neighbour_scales(const float* scale, int64_t rows);
const float* planted_neighbour_scales(const float* scale);
// The block's K and V rows ([rows, kv_dim] bf16) also copied into the last slots of a layer's pools
// (stream-ordered, after the forward's last kernel).
void plant_block_rows_in_pool(const uint16_t* k_block, const uint16_t* v_block, uint16_t* k_pool, uint16_t* v_pool,
                              int64_t pool_slots, int64_t rows, int64_t kv_dim, void* stream);

// Host hooks: `current` is the drafter's active mutation.
#define DFLASH_MUTATE(current, id, ...)             \
  do {                                              \
    if ((current) == ::dflash::Mutation::id) {      \
      __VA_ARGS__;                                  \
    }                                               \
  } while (0)
// Prefixes a statement that the mutation skips while `cond` holds.
#define DFLASH_UNLESS_MUTANT(current, id, cond) if ((current) == ::dflash::Mutation::id && (cond)) { } else
#else
#define DFLASH_INJECTED_FAILURE(site) false
#define DFLASH_MUTATE(current, id, ...) \
  do {                                  \
  } while (0)
#define DFLASH_UNLESS_MUTANT(current, id, cond)
#endif

}  // namespace dflash
