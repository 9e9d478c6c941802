// The compute ceiling the benchmarks compare with: the tensor cores' throughput on one large
// cuBLASLt GEMM, measured in the same run on the same device (as copy_bandwidth is for bytes).
#pragma once
#include <cstdint>
#include <string>

namespace dflash {

struct GemmPeak {
  int64_t size = 0;   // m = n = k of the timed GEMM
  double bf16 = 0;    // FLOP/s, bf16 x bf16 with fp32 accumulation: the math of every drafter mode
  double e4m3 = 0;    // FLOP/s, E4M3 x E4M3 with fp32 accumulation (a W8A8 mode's); 0 when unavailable
  std::string e4m3_unavailable;  // why e4m3 is 0
};

// Both peaks on the current device: 2·size³ FLOP over the median of `repeats` GEMMs after 3
// untimed ones, on random operands (zeros would let the clocks run higher than real data does).
GemmPeak measure_gemm_peak(int64_t size = 8192, int repeats = 20);

}  // namespace dflash
