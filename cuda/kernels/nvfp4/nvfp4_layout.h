// The device layout of an NVFP4 head for the w4a16 kernel (gemm_nvfp4.cu), built on the host at
// upload: K padded to whole 512-column chunks with zero codes and zero scales, each 4-byte code
// word re-packed so that the kernel decodes it with a few integer instructions, and each chunk's
// 32 block scales permuted so that one thread's eight are one 8-byte load. Plain C++ (the layout
// test runs without a GPU); the unpacking is shared with the kernel.
#pragma once
#include <cstdint>
#include <vector>

#include "core/nvfp4.h"

#if defined(__CUDACC__)
#define DFLASH_HOST_DEVICE __host__ __device__
#else
#define DFLASH_HOST_DEVICE
#endif

namespace dflash {

// K per step of the kernel's main loop.
constexpr int64_t kNvFp4KChunk = 512;
inline int64_t nvfp4_pad_k(int64_t k) { return (k + kNvFp4KChunk - 1) / kNvFp4KChunk * kNvFp4KChunk; }

// Where the 8 codes of a packed word live: for code j of the checkpoint's word (element 2j' in the
// low nibble of byte j'), the bits of its sign, e1, e0 and m. Each sign lands on bit 15 of a bf16
// half and each magnitude (e1 e0 m) on bits 8..6: the two low exponent bits and the top mantissa
// bit, which as bf16 is the E2M1 value times 2^-126 exactly (e = 0 gives the subnormals that
// E2M1's 0 and 0.5 need). Codes 2r and 2r+1 come out as bf16x2 register r. The positions make
// the unpacking 9 integer instructions per word (register 0 a mask, 1 and 2 a shift and a mask, 3
// two of each): no placement of whole codes makes every register a single shift and mask (an
// exhaustive search over rotations finds none).
constexpr int kNvFp4PackedBits[8][4] = {{15, 8, 7, 6},  {31, 24, 23, 22}, {5, 30, 29, 28}, {21, 14, 13, 12},
                                        {11, 4, 3, 2},  {27, 20, 19, 18}, {1, 26, 25, 0},  {17, 10, 9, 16}};

DFLASH_HOST_DEVICE inline uint32_t nvfp4_rotate_right(uint32_t w, int r) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(w, w, r);
#else
  return (w >> r) | (w << (32 - r));
#endif
}

// A packed word's 8 codes as four bf16x2 bit patterns (codes 2r, 2r+1, the lower in the low half),
// each the E2M1 value times 2^-126.
DFLASH_HOST_DEVICE inline void nvfp4_unpack_word(uint32_t w, uint32_t (&raw)[4]) {
  constexpr uint32_t kSignMagnitude = 0x81C081C0u;  // bits 15, 8..6 and 31, 24..22
  constexpr uint32_t kAllButM = 0x81808180u;        // register 3 takes m (bits 6, 22) from elsewhere
  raw[0] = w & kSignMagnitude;
  raw[1] = nvfp4_rotate_right(w, 22) & kSignMagnitude;
  raw[2] = (w << 4) & kSignMagnitude;
  raw[3] = (nvfp4_rotate_right(w, 18) & kAllButM) | ((w << 6) & (kSignMagnitude & ~kAllButM));
}

// The checkpoint's code word (code j in bits 4j..4j+3: m, e0, e1, sign from the low bit) re-packed.
uint32_t nvfp4_pack_code_word(uint32_t word);

// The head's codes and block scales in the device layout: [rows, nvfp4_pad_k(cols) / 2] and
// [rows, nvfp4_pad_k(cols) / 16]. In each chunk's 32 scales, thread t = 0..3 of a row finds
// blocks 8i + 2t + b (i = 0..3, b = 0, 1) at byte 8t + 2i + b.
std::vector<uint8_t> nvfp4_device_codes(const NvFp4Weight& w);
std::vector<uint8_t> nvfp4_device_block_scales(const NvFp4Weight& w);

}  // namespace dflash
