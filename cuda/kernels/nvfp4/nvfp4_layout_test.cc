// The NVFP4 device layout (cuda/kernels/nvfp4/nvfp4_layout.h) on the CPU: every code at every position of a
// word unpacks to its E2M1 value times 2^-126, sign of zero included; the upload's codes and
// block scales hold the head's values where the kernel looks for them. The expectations come from
// core/nvfp4's decode, never from the layout code.
#include "cuda/kernels/nvfp4/nvfp4_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>

#include "core/dtype.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

constexpr uint64_t kSeed = 2026;

// Code j of a packed word, as the kernel sees it: half j % 2 of unpacked register j / 2, times 2^126.
float unpacked_code(uint32_t packed, int j) {
  uint32_t raw[4];
  nvfp4_unpack_word(packed, raw);
  const uint16_t half = static_cast<uint16_t>(raw[j / 2] >> (16 * (j % 2)));
  return std::ldexp(bf16_bits_to_float(half), 126);
}

// How many of the word's 8 codes come out wrong (value or sign) after `packed`.
int wrong_codes(uint32_t word, uint32_t packed) {
  int wrong = 0;
  for (int j = 0; j < 8; ++j) {
    const uint8_t code = static_cast<uint8_t>((word >> (4 * j)) & 0xF);
    const float got = unpacked_code(packed, j), want = e2m1_to_float(code);
    if (got != want || std::signbit(got) != std::signbit(want)) ++wrong;
  }
  return wrong;
}

TEST(Nvfp4Layout, EveryCodeAtEveryPositionUnpacksToItsValue) {
  for (int j = 0; j < 8; ++j) {
    for (uint32_t code = 0; code < 16; ++code) {
      // The code at j, every other position holding its complement (bits that must not leak in).
      uint32_t word = 0;
      for (int p = 0; p < 8; ++p) word |= (p == j ? code : (~code & 0xFu)) << (4 * p);
      EXPECT_EQ(wrong_codes(word, nvfp4_pack_code_word(word)), 0) << "code " << code << " at " << j;
    }
  }
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  int failures = 0;
  for (int i = 0; i < 100000; ++i) {
    const uint32_t word = static_cast<uint32_t>(rng());
    failures += wrong_codes(word, nvfp4_pack_code_word(word)) != 0;
  }
  EXPECT_EQ(failures, 0);
}

TEST(Nvfp4Layout, TheCheckFailsOnTheCheckpointLayout) {
  // Unpacking a word that was never packed gets most codes wrong: the check above can fail.
  std::mt19937_64 rng(kSeed);
  int wrong = 0;
  for (int i = 0; i < 1000; ++i) {
    const uint32_t word = static_cast<uint32_t>(rng());
    wrong += wrong_codes(word, word);
  }
  EXPECT_GT(wrong, 4000);
}

TEST(Nvfp4Layout, UploadPutsCodesAndScalesWhereTheKernelReadsThem) {
  for (const int64_t cols : {int64_t{96}, int64_t{1040}}) {
    const NvFp4Weight head = make_random_nvfp4_head(7, cols, kSeed + static_cast<uint64_t>(cols));
    const std::vector<uint8_t> codes = nvfp4_device_codes(head), scales = nvfp4_device_block_scales(head);
    const int64_t k_pad = nvfp4_pad_k(cols);
    ASSERT_EQ(k_pad % kNvFp4KChunk, 0);
    ASSERT_EQ(codes.size(), static_cast<size_t>(head.rows * k_pad / 2));
    ASSERT_EQ(scales.size(), static_cast<size_t>(head.rows * k_pad / 16));
    for (int64_t r = 0; r < head.rows; ++r) {
      for (int64_t k = 0; k < k_pad; ++k) {
        // Code k sits in word k / 8 at position k % 8; past cols it is zero.
        const uint8_t* w = codes.data() + r * k_pad / 2 + (k / 8) * 4;
        const uint32_t packed = w[0] | w[1] << 8 | w[2] << 16 | static_cast<uint32_t>(w[3]) << 24;
        const uint8_t byte = k < cols ? head.codes[static_cast<size_t>(r * cols / 2 + k / 2)] : 0;
        const uint8_t code = static_cast<uint8_t>(k % 2 == 0 ? byte & 0xF : byte >> 4);
        ASSERT_EQ(unpacked_code(packed, static_cast<int>(k % 8)), e2m1_to_float(code)) << "row " << r << " k " << k;
      }
      for (int64_t block = 0; block < k_pad / 16; ++block) {
        // Block 32c + 8i + 2t + b at byte 32c + 8t + 2i + b.
        const int64_t c = block / 32, i = (block % 32) / 8, t = (block % 8) / 2, b = block % 2;
        const uint8_t want = block < cols / 16 ? head.block_scales[static_cast<size_t>(r * (cols / 16) + block)] : 0;
        ASSERT_EQ(scales[static_cast<size_t>(r * k_pad / 16 + 32 * c + 8 * t + 2 * i + b)], want)
            << "row " << r << " block " << block;
      }
    }
  }
}

}  // namespace
}  // namespace dflash
