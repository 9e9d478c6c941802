#include "compare/tp_attribution.h"

#include <vector>

#include "compare/stage_check.h"
#include "core/stages.h"

namespace dflash {
namespace {

std::string range(int64_t first, int64_t count) {
  return std::to_string(first) + ".." + std::to_string(first + count - 1);
}

// The rank whose vocabulary shard holds global token id `token` (§5.2; N divides V).
int64_t vocab_rank(int64_t token, const TpPartition& p) { return token / (p.vocab_size / p.ranks); }

}  // namespace

std::vector<TpColumnSlice> tp_column_slices(const std::string& stage, int64_t cols, const TpPartition& p) {
  const int n = p.ranks;
  // `unit` is singular; a slice of several takes an "s" ("query heads 4..5", "KV head 1").
  auto per_rank = [&](int64_t units, int64_t width, const std::string& unit) {
    std::vector<TpColumnSlice> out;
    if (units % n != 0 || units * width != cols) return out;
    const int64_t each = units / n;
    for (int r = 0; r < n; ++r) {
      const std::string what = each == 1 ? unit + " " + std::to_string(r) : unit + "s " + range(r * each, each);
      out.push_back({"rank " + std::to_string(r), what, r * each * width, each * width});
    }
    return out;
  };
  if (stage == "logits") return per_rank(p.vocab_size, 1, "token");
  StageId id;
  if (!parse_stage_name(stage, p.num_layers, &id, /*dflash2=*/true)) return {};
  const int64_t d = p.head_dim;
  if (id.kind == StageKind::kQ || id.kind == StageKind::kAttn) return per_rank(p.num_heads, d, "query head");
  if (id.kind != StageKind::kK && id.kind != StageKind::kV) return {};
  if (n <= p.num_kv_heads) return per_rank(p.num_kv_heads, d, "KV head");
  // Replicated (§2): KV head κ on ranks κ·R .. κ·R + R − 1.
  std::vector<TpColumnSlice> out;
  if (n % p.num_kv_heads != 0 || p.num_kv_heads * d != cols) return out;
  const int replicas = n / p.num_kv_heads;
  for (int k = 0; k < p.num_kv_heads; ++k) {
    out.push_back({"ranks " + range(int64_t{k} * replicas, replicas), "KV head " + std::to_string(k), k * d, d});
  }
  return out;
}

Tensor tp_columns(const Tensor& t, const TpColumnSlice& slice) {
  Tensor out = Tensor::zeros({t.rows(), slice.count});
  for (int64_t r = 0; r < t.rows(); ++r) {
    for (int64_t c = 0; c < slice.count; ++c) out.row(r)[c] = t.row(r)[slice.first + c];
  }
  return out;
}

std::string describe_slice(const TpColumnSlice& slice) {
  return slice.owner + " (" + slice.what + ", columns " + range(slice.first, slice.count) + ")";
}

std::string attribute_stage(const std::string& stage, const Tensor& expected, const Tensor& actual,
                            const StageBound& bound, const TpPartition& partition) {
  if (partition.ranks <= 1 || expected.shape != actual.shape || expected.shape.size() != 2) return "";
  StageId id;
  if (parse_stage_name(stage, partition.num_layers, &id, /*dflash2=*/true, partition.ranks) && id.rank >= 0) {
    return "rank " + std::to_string(id.rank) + " (its partial)";  // one rank's own value
  }
  if (stage == stage_name(StageKind::kSelTopkIds) && partition.vocab_size % partition.ranks == 0) {
    // Candidate ids are global token ids (§5.3): the shards of the first two that differ.
    for (size_t i = 0; i < expected.values.size(); ++i) {
      const float e = expected.values[i], a = actual.values[i];
      if (e == a || !(e >= 0 && a >= 0 && e < partition.vocab_size && a < partition.vocab_size)) continue;
      const auto e_id = static_cast<int64_t>(e), a_id = static_cast<int64_t>(a);
      return "expected candidate " + std::to_string(e_id) + " from rank " + std::to_string(vocab_rank(e_id, partition)) +
             ", actual candidate " + std::to_string(a_id) + " from rank " + std::to_string(vocab_rank(a_id, partition));
    }
    return "";
  }
  const std::vector<TpColumnSlice> slices = tp_column_slices(stage, expected.cols(), partition);
  std::string failing;
  const TpColumnSlice* worst = nullptr;
  double worst_ratio = -1;
  for (const TpColumnSlice& s : slices) {
    const StageCheck check = check_stage(stage, 0, tp_columns(expected, s), tp_columns(actual, s), bound);
    if (!check.passed) failing += (failing.empty() ? "" : "; ") + describe_slice(s);
    if (check.ratio > worst_ratio) worst_ratio = check.ratio, worst = &s;
  }
  if (!failing.empty() || worst == nullptr) return failing;
  return worst->owner + " (" + worst->what + ", columns " + range(worst->first, worst->count) +
         "; no slice alone over its bound, this one the nearest)";
}

TpPartition tp_partition(const DrafterConfig& config, int ranks) {
  return {ranks, config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size, config.num_layers};
}

std::string kv_column_owner(int64_t column, const TpPartition& partition) {
  if (partition.ranks <= 1) return "";
  const int64_t cols = int64_t{partition.num_kv_heads} * partition.head_dim;
  for (const TpColumnSlice& s : tp_column_slices("L0.k", cols, partition)) {
    if (column >= s.first && column < s.first + s.count) return s.owner + " (" + s.what + ")";
  }
  return "";
}

std::string attribute_tokens(int64_t expected, int64_t actual, const TpPartition& partition) {
  if (partition.ranks <= 1 || partition.vocab_size % partition.ranks != 0) return "";
  return "expected token " + std::to_string(expected) + " on rank " + std::to_string(vocab_rank(expected, partition)) +
         ", actual token " + std::to_string(actual) + " on rank " + std::to_string(vocab_rank(actual, partition));
}

}  // namespace dflash
