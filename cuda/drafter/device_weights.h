// The drafter's weights on the device, in the layouts the kernels read:
//   qkv      [q_dim + 2·kv_dim, H]  q | k | v rows (one GEMM for block rows; k|v rows for context)
//   o        [H, q_dim]
//   gate_up  [2·I, H]               rows interleaved gate_0, up_0, gate_1, up_1, ... so that the
//                                   GEMM epilogue sees each (gate, up) pair in adjacent columns
//   down     [H, I]
//   lm_head  [V, H]                  or the target's NVFP4 head, never requantized (gemm_nvfp4.h)
// as E4M3 codes + per-row scales (fp8, quantized on the device) or bf16; fc [H, nT·Ht] always
// bf16; every row padded with zeros to a multiple of 64 columns. DFlash2 (docs/spec/dflash2.md §2):
// each layer's two kernel_projections [2·k·ng, H] and the selector's hidden_projection [r, H] stay
// bf16 in every mode (as in the engine), the base kernels [2, k, H] are fp32 copies, the codebooks
// [V, r] bf16. Norm weights are fp32 copies of
// the bf16 values; embed_tokens stays bf16. Host weights must be finite bf16 values (checked).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/config.h"
#include "core/fp8.h"
#include "core/weights.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/nvfp4/gemm_nvfp4.h"

namespace dflash {

// W8A8 with a pre-quantized checkpoint's static activation scales (docs/spec/drafter.md §6): rows
// [first, first + count) of a fused weight are one projection, whose input rows are quantized with
// its own `input_scale` (0: per token).
struct ActivationPart {
  int64_t first = 0, count = 0;
  float static_scale = 0.0f;
};

struct DeviceLinear {
  WeightFormat format = WeightFormat::kBf16;
  int64_t n = 0, k = 0, k_pad = 0;
  DeviceBuffer<uint8_t> data;       // [n, k_pad] bf16 or E4M3
  DeviceBuffer<float> scale;        // [n], E4M3 only
  DeviceBuffer<float> bias;         // [n] or empty
  DeviceBuffer<uint16_t> decoded;   // [n, k_pad] bf16 copy of the codes, only when cuBLASLt needs it
  // W8A8 with static activation scales only: one part per projection (empty: one per-token part).
  std::vector<ActivationPart> activation_parts;
  // gate|up only: the gate rows then the up rows (static activation scales: each its own part),
  // instead of interleaved.
  bool split_gate_up = false;
  DeviceMatrixView view() const;
  int64_t storage_bytes() const;    // what one pass over the weight reads (data + scales + bias)
};

struct DeviceLayerWeights {
  DeviceLinear qkv, o, gate_up, down;
  // TP = N > 1 (shard_weights): rank r's contiguous K slice of o and down, with the full-row scales
  // and no bias (docs/spec/tensor-parallel.md §2).
  std::vector<DeviceLinear> o_shards, down_shards;
  DeviceBuffer<float> input_norm, post_norm, q_norm, k_norm;
  DeviceLinear attn_conv_proj, mlp_conv_proj;        // DFlash2 only
  DeviceBuffer<float> attn_conv_base, mlp_conv_base;  // DFlash2 only
};

struct DeviceSelectorWeights {  // DFlash2 only
  DeviceLinear hidden_projection;
  DeviceBuffer<uint16_t> predecessor, successor;
};

struct DeviceDrafterWeights {
  DeviceLinear fc;
  DeviceBuffer<float> hidden_norm, final_norm;
  std::vector<DeviceLayerWeights> layers;
  DeviceBuffer<uint16_t> embed;  // [V, H] bf16
  DeviceLinear lm_head;              // empty when the target's head is NVFP4
  std::vector<DeviceLinear> lm_head_shards;  // TP = N > 1: rank r's V/N rows (none for an NVFP4 head)
  DeviceNvFp4Linear lm_head_nvfp4;   // the target's NVFP4 head, as it is (cuda/kernels/nvfp4/gemm_nvfp4.h)
  DeviceSelectorWeights selector;
};

// Uploads and, for E4M3, quantizes on `stream`; returns when the device holds everything.
// keep_decoded: also keep bf16 copies of the E4M3 codes (for cuBLASLt). static_activations (w8a8):
// a layer or lm_head with `input_scale`s gets its activation parts (gate|up then split).
DeviceDrafterWeights upload_drafter_weights(const DrafterConfig& config, const DrafterWeights& weights,
                                            WeightFormat projections, bool keep_decoded, cudaStream_t stream,
                                            bool static_activations = false);

// The parts of rows [first, first + count) of `parts`, counted from `first` (e.g. k|v of q|k|v).
std::vector<ActivationPart> activation_parts_of_rows(const std::vector<ActivationPart>& parts, int64_t first,
                                                     int64_t count);

// TP = N > 1 (docs/spec/tensor-parallel.md §2): the row-parallel shards of every layer's o and down
// and the vocabulary shards of the lm_head, copied from the uploaded weights byte for byte (each
// shard padded with zeros to a multiple of 64 columns); N divides q_dim, I and V
// (check_tensor_parallel).
void shard_weights(DeviceDrafterWeights& weights, const DrafterConfig& config, int tp, cudaStream_t stream);

// The codes and scales of an E4M3 weight as the device holds them (rows in the fused order).
QuantizedRows download_quantized(const DeviceLinear& linear);

}  // namespace dflash
