#include "reference/grouped_conv.h"

namespace dflash {

template <typename T>
void grouped_conv_block(const ConvGeometry& g, int side, const std::vector<T>& base, const AlignedMatrix<T>& coef,
                        const AlignedMatrix<T>& z, int64_t row0, int64_t block_width, AlignedMatrix<T>* out,
                        bool wraps) {
  const int64_t k = g.taps, H = g.channels, ng = g.groups();
  for (int64_t t = 0; t < block_width; ++t) {
    const T* c = coef.row(row0 + t) + side * k * ng;  // the output row's coefficients
    T* o = out->row(row0 + t);
    for (int64_t ch = 0; ch < H; ++ch) o[ch] = T(0);
    for (int64_t tau = 0; tau < k && (tau <= t || wraps); ++tau) {  // block boundary: tap τ is zero for rows t < τ
      const T* b = base.data() + (side * k + tau) * H;
      const T* src = z.row(((row0 + t - tau) % z.rows() + z.rows()) % z.rows());
      for (int64_t ch = 0; ch < H; ++ch) o[ch] += (b[ch] + c[tau * ng + ch / g.group_size]) * src[ch];
    }
  }
}

template void grouped_conv_block<float>(const ConvGeometry&, int, const std::vector<float>&, const AlignedMatrix<float>&,
                                        const AlignedMatrix<float>&, int64_t, int64_t, AlignedMatrix<float>*, bool);
template void grouped_conv_block<double>(const ConvGeometry&, int, const std::vector<double>&,
                                         const AlignedMatrix<double>&, const AlignedMatrix<double>&, int64_t, int64_t,
                                         AlignedMatrix<double>*, bool);

}  // namespace dflash
