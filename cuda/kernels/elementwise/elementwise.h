// The drafter's row-wise kernels: embedding + RMSNorm, RMSNorm, per-head q/k RMSNorm + RoPE with
// the K/V writes, SwiGLU (when not fused into the GEMM), and the argmax reductions. Each has a
// tuned form and a plain "simple" form (one thread per row or head, straight loops) for bisecting.
// All reduce in a fixed order: same inputs, same bits.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

namespace dflash {

enum class RowKernel { kTuned, kSimple };

struct RmsNormArgs {
  const float* in = nullptr;  // [rows, ld_in] fp32
  int64_t ld_in = 0;
  const float* weight = nullptr;  // [cols]
  int64_t cols = 0;
  float eps = 0.0f;
  uint16_t* out = nullptr;  // [rows, ld_out] bf16
  int64_t ld_out = 0;
  // Optional: rows i >= 1 of each block of `block_width` rows also go to draft_out[b·(B-1) + i-1]
  // (the lm_head's input: the anchor row yields no draft).
  uint16_t* draft_out = nullptr;
  int block_width = 0;
  int64_t rows = 0;
};
// pdl: launch with programmatic dependent launch (cuda/runtime/launch.cuh); every kernel here waits for the
// previous kernel before it touches memory, so the flag is safe wherever a kernel precedes it.
void launch_rmsnorm(RowKernel kernel, const RmsNormArgs& args, cudaStream_t stream, bool pdl = false);

// h[r] = embed_tokens[token(r)] (fp32 from bf16) · scale, then the RMSNorm of `norm` on h. token(r)
// is anchors[r / B] for the first row of each block, mask_token_id otherwise.
struct EmbedArgs {
  const uint16_t* embed_tokens = nullptr;  // [V, cols] bf16
  const int32_t* anchors = nullptr;        // [batch]
  int mask_token_id = 0;
  float scale = 1.0f;  // DFlash2's input_embedding_scale (x·1 is x: plain DFlash keeps its bits)
  float* h = nullptr;  // [rows, cols] fp32 (ld cols)
};
void launch_embed_rmsnorm(RowKernel kernel, const EmbedArgs& embed, const RmsNormArgs& norm, cudaStream_t stream);
// Whether the tuned (vectorized) RMSNorm serves `norm` (with `embed`: the embedding variant): whole
// float4s, aligned rows, at most 16384 columns. Otherwise the tuned choice runs a loop kernel with
// another sum order.
bool rmsnorm_vec_fits(const RmsNormArgs& norm, const EmbedArgs* embed);

// Per head: RMSNorm over d (q_norm / k_norm weights), then rotate-half RoPE at the row's position:
// angle = float(position)·inv_freq[j] (fp32), cos/sin of it rounded to fp32 as core/rope.h does,
// times attention_scaling (fp32); stored bf16.
// V heads are only rounded to bf16. K/V rows go to row slots[r] (the paged pool) or r (scratch).
struct QkNormRopeArgs {
  const float* src = nullptr;  // [rows, ld_src] fp32 projections
  int64_t ld_src = 0;
  int64_t q_col = -1;  // column of q head 0 in src; -1: no query heads (context rows)
  int64_t k_col = 0, v_col = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  const float* q_norm = nullptr;  // [d]
  const float* k_norm = nullptr;  // [d]
  const float* inv_freq = nullptr;  // [d/2]
  float attention_scaling = 1.0f;
  float eps = 0.0f;
  const int64_t* positions = nullptr;  // [rows]
  uint16_t* q_out = nullptr;           // [rows, ld_q] bf16
  int64_t ld_q = 0;
  uint16_t* k_out = nullptr;  // [*, ld_kv] bf16
  uint16_t* v_out = nullptr;
  int64_t ld_kv = 0;
  const int64_t* slots = nullptr;  // [rows] destination row of K/V, or null for row r
  int64_t rows = 0;
};
void launch_qk_norm_rope(RowKernel kernel, const QkNormRopeArgs& args, cudaStream_t stream, bool pdl = false);

// act[r, i] = bf16(silu(gu[r, 2i]) · gu[r, 2i+1]) (gate and up interleaved), or with `split`
// bf16(silu(gu[r, i]) · gu[r, I + i]) (the gate block, then the up block).
void launch_swiglu(const float* gate_up, int64_t rows, int64_t intermediate, uint16_t* act, int64_t ld_act,
                   cudaStream_t stream, bool pdl = false, bool split = false);

// tokens[r] = the column of the best partial (NaN first, then largest, then lowest index).
void launch_argmax_reduce(const float* values, const int32_t* indices, int64_t rows, int64_t blocks, int32_t* tokens,
                          cudaStream_t stream, bool pdl = false);
// tokens[r] = argmax of logits[r, 0..cols) under the same order, scanning the logits.
void launch_argmax_rows(const float* logits, int64_t rows, int64_t cols, int32_t* tokens, cudaStream_t stream,
                        bool pdl = false);

// Loads the kernels of this file, so that nothing loads for the first time inside a graph capture.
void prepare_row_kernels();

// Launches a trivial kernel: cudaSuccess when this build's device code runs on the current device.
cudaError_t run_device_probe();

}  // namespace dflash
