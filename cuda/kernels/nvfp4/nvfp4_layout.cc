#include "cuda/kernels/nvfp4/nvfp4_layout.h"

#include <algorithm>

namespace dflash {

uint32_t nvfp4_pack_code_word(uint32_t word) {
  uint32_t out = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t code = (word >> (4 * j)) & 0xFu;
    const uint32_t bits[4] = {(code >> 3) & 1u, (code >> 2) & 1u, (code >> 1) & 1u, code & 1u};  // s, e1, e0, m
    for (int b = 0; b < 4; ++b) out |= bits[b] << kNvFp4PackedBits[j][b];
  }
  return out;
}

std::vector<uint8_t> nvfp4_device_codes(const NvFp4Weight& w) {
  const int64_t code_row = w.cols / 2, code_row_pad = nvfp4_pad_k(w.cols) / 2;
  std::vector<uint8_t> out(static_cast<size_t>(w.rows * code_row_pad), 0);
  for (int64_t r = 0; r < w.rows; ++r) {
    uint8_t* dst = out.data() + r * code_row_pad;
    std::copy(w.codes.begin() + r * code_row, w.codes.begin() + (r + 1) * code_row, dst);
    for (int64_t b = 0; b < code_row_pad; b += 4) {
      uint32_t word = 0;
      for (int i = 0; i < 4; ++i) word |= static_cast<uint32_t>(dst[b + i]) << (8 * i);
      const uint32_t packed = nvfp4_pack_code_word(word);
      for (int i = 0; i < 4; ++i) dst[b + i] = static_cast<uint8_t>(packed >> (8 * i));
    }
  }
  return out;
}

std::vector<uint8_t> nvfp4_device_block_scales(const NvFp4Weight& w) {
  const int64_t scale_row = w.cols / kNvFp4GroupSize, scale_row_pad = nvfp4_pad_k(w.cols) / kNvFp4GroupSize;
  constexpr int64_t kChunkBlocks = kNvFp4KChunk / kNvFp4GroupSize;  // 32
  std::vector<uint8_t> padded(static_cast<size_t>(scale_row_pad)), out(static_cast<size_t>(w.rows * scale_row_pad));
  for (int64_t r = 0; r < w.rows; ++r) {
    std::fill(padded.begin(), padded.end(), 0);
    std::copy(w.block_scales.begin() + r * scale_row, w.block_scales.begin() + (r + 1) * scale_row, padded.begin());
    uint8_t* dst = out.data() + r * scale_row_pad;
    for (int64_t c = 0; c < scale_row_pad; c += kChunkBlocks) {
      for (int t = 0; t < 4; ++t) {
        for (int i = 0; i < 4; ++i) {
          for (int b = 0; b < 2; ++b) dst[c + 8 * t + 2 * i + b] = padded[static_cast<size_t>(c + 8 * i + 2 * t + b)];
        }
      }
    }
  }
  return out;
}

}  // namespace dflash
