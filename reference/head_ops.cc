#include "reference/head_ops.h"

#include "reference/ops/ops.h"

namespace dflash {

template <typename T>
RopeRows<T> make_rope_rows(const RopeTable& table, const std::vector<int64_t>& positions) {
  const int64_t half = static_cast<int64_t>(table.inv_freq.size());
  RopeRows<T> rows;
  rows.cos.resize(static_cast<int64_t>(positions.size()), half);
  rows.sin.resize(static_cast<int64_t>(positions.size()), half);
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (size_t i = 0; i < positions.size(); ++i) {
    rope_cos_sin(table, positions[i], c.data(), s.data());
    T* cr = rows.cos.row(static_cast<int64_t>(i));
    T* sr = rows.sin.row(static_cast<int64_t>(i));
    for (int64_t j = 0; j < half; ++j) {
      cr[j] = static_cast<T>(c[static_cast<size_t>(j)]);  // float -> T exact
      sr[j] = static_cast<T>(s[static_cast<size_t>(j)]);
    }
  }
  return rows;
}

template <typename T>
void norm_and_rotate_heads(AlignedMatrix<T>* m, int64_t rows, int heads, int head_dim, const std::vector<T>& norm_weight,
                           T eps, const RopeRows<T>& rope, int64_t rope_row_begin) {
  const size_t d = static_cast<size_t>(head_dim);
  for (int64_t r = 0; r < rows; ++r) {
    const T* c = rope.cos.row(rope_row_begin + r);
    const T* s = rope.sin.row(rope_row_begin + r);
    for (int h = 0; h < heads; ++h) {
      T* head = m->row(r) + static_cast<size_t>(h) * d;
      ops::rms_norm(head, norm_weight.data(), d, eps, head);
      ops::rope_rotate_half(head, c, s, d / 2);
    }
  }
}

template struct RopeRows<float>;
template struct RopeRows<double>;
template RopeRows<float> make_rope_rows<float>(const RopeTable&, const std::vector<int64_t>&);
template RopeRows<double> make_rope_rows<double>(const RopeTable&, const std::vector<int64_t>&);
template void norm_and_rotate_heads<float>(AlignedMatrix<float>*, int64_t, int, int, const std::vector<float>&, float,
                                           const RopeRows<float>&, int64_t);
template void norm_and_rotate_heads<double>(AlignedMatrix<double>*, int64_t, int, int, const std::vector<double>&,
                                            double, const RopeRows<double>&, int64_t);

}  // namespace dflash
