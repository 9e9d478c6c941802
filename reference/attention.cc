#include "reference/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <Eigen/Core>

#include "reference/ops/ops.h"

namespace dflash {

template <typename T>
void attend_kv_group(const AttentionGeometry& g, int kv_head, int64_t row0, int64_t block_width,
                     const AlignedMatrix<T>& q, const AlignedMatrix<T>& k_block, const AlignedMatrix<T>& v_block,
                     const AlignedMatrix<T>& k_pool, const AlignedMatrix<T>& v_pool,
                     const std::vector<int64_t>& window_slots, int64_t window_left, AlignedMatrix<T>* out,
                     bool causal_block, int kv_source) {
  using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  using StridedMap = Eigen::Map<const RowMajor, 0, Eigen::OuterStride<>>;
  const int64_t d = g.head_dim;
  const int64_t ctx = static_cast<int64_t>(window_slots.size());
  const int64_t keys = ctx + block_width;
  const int64_t column = static_cast<int64_t>(kv_source < 0 ? kv_head : kv_source) * d;

  // This kv head's keys and values, gathered in position order: window, then block rows.
  AlignedMatrix<T> k(keys, d), v(keys, d);
  for (int64_t j = 0; j < ctx; ++j) {
    std::memcpy(k.row(j), k_pool.row(window_slots[static_cast<size_t>(j)]) + column, static_cast<size_t>(d) * sizeof(T));
    std::memcpy(v.row(j), v_pool.row(window_slots[static_cast<size_t>(j)]) + column, static_cast<size_t>(d) * sizeof(T));
  }
  for (int64_t i = 0; i < block_width; ++i) {
    std::memcpy(k.row(ctx + i), k_block.row(row0 + i) + column, static_cast<size_t>(d) * sizeof(T));
    std::memcpy(v.row(ctx + i), v_block.row(row0 + i) + column, static_cast<size_t>(d) * sizeof(T));
  }
  const StridedMap keys_map(k.row(0), keys, d, Eigen::OuterStride<>(k.stride()));
  const StridedMap values_map(v.row(0), keys, d, Eigen::OuterStride<>(v.stride()));

  // d ** -0.5 as upstream forms it (a Python float), then in the compute type.
  const T scale = static_cast<T>(std::pow(static_cast<double>(d), -0.5));
  const int group = g.num_heads / g.num_kv_heads;
  Vector scores(keys), head_out(d);
  for (int h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    const int64_t q_column = static_cast<int64_t>(h) * d;
    for (int64_t i = 0; i < block_width; ++i) {
      const Eigen::Map<const Vector> query(q.row(row0 + i) + q_column, d);
      scores.noalias() = keys_map * query;
      for (int64_t j = 0; j < keys; ++j) scores[j] = scores[j] * scale;
      // Sliding: context key j (position s - ctx + j) is visible iff s - ctx + j >= s + i - window_left.
      const int64_t first = window_left < 0 ? 0 : ctx - std::clamp<int64_t>(window_left - i, 0, ctx);
      const int64_t end = causal_block ? ctx + i + 1 : keys;
      const int64_t seen = end - first;
      ops::softmax(scores.data() + first, static_cast<size_t>(seen));
      head_out.noalias() = values_map.middleRows(first, seen).transpose() * scores.segment(first, seen);
      std::memcpy(out->row(row0 + i) + q_column, head_out.data(), static_cast<size_t>(d) * sizeof(T));
    }
  }
}

template void attend_kv_group<float>(const AttentionGeometry&, int, int64_t, int64_t, const AlignedMatrix<float>&,
                                     const AlignedMatrix<float>&, const AlignedMatrix<float>&,
                                     const AlignedMatrix<float>&, const AlignedMatrix<float>&,
                                     const std::vector<int64_t>&, int64_t, AlignedMatrix<float>*, bool, int);
template void attend_kv_group<double>(const AttentionGeometry&, int, int64_t, int64_t, const AlignedMatrix<double>&,
                                      const AlignedMatrix<double>&, const AlignedMatrix<double>&,
                                      const AlignedMatrix<double>&, const AlignedMatrix<double>&,
                                      const std::vector<int64_t>&, int64_t, AlignedMatrix<double>*, bool, int);

}  // namespace dflash
