// The host side of the planted mutations' hooks (testing/fault_points.h), in the CUDA drafter's library.
#include <cuda_runtime_api.h>

#include <map>
#include <vector>

#include "core/dtype.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/device_buffer.h"
#include "testing/fault_points.h"

namespace dflash {

#ifdef DFLASH_FAULT_POINTS
void set_device_mutation(Mutation mutation) {
  set_device_mutation_attention(mutation);
  set_device_mutation_elementwise(mutation);
  set_device_mutation_gemm_mma(mutation);
  set_device_mutation_gemm_fallback(mutation);
  set_device_mutation_vocab_parallel(mutation);
  set_kernel_mutation(mutation);
}

namespace {
// The planted copies of row scales, by the original's address (a later drafter's weights at a
// reused address replace the entry when it plants its own).
std::map<const float*, DeviceBuffer<float>>& neighbour_scale_copies() {
  static auto* copies = new std::map<const float*, DeviceBuffer<float>>();  // freed after static destructors
  return *copies;
}
}  // namespace

void plant_neighbour_scales(const float* scale, int64_t rows) {
  if (scale == nullptr || rows < 2) return;
  constexpr int64_t kTile = 128;  // CUTLASS's tile of weight rows (gemm_cutlass_mixed.cu)
  const int64_t first = (rows - 1) / kTile * kTile;
  std::vector<float> host(static_cast<size_t>(rows));
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  DFLASH_CUDA_CHECK(cudaMemcpy(host.data(), scale, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<float> planted = host;
  for (int64_t n = first; n < rows; ++n) planted[static_cast<size_t>(n)] = host[static_cast<size_t>(n + 1 < rows ? n + 1 : first)];
  DeviceBuffer<float>& copy = neighbour_scale_copies()[scale];
  copy.allocate(planted.size());
  DFLASH_CUDA_CHECK(cudaMemcpy(copy.get(), planted.data(), planted.size() * sizeof(float), cudaMemcpyHostToDevice));
}

const float* planted_neighbour_scales(const float* scale) {
  const auto it = neighbour_scale_copies().find(scale);
  return it == neighbour_scale_copies().end() ? scale : it->second.get();
}

void plant_fnuz_row_scales(const float* scales, int64_t rows, bool e4m3) {
  if (!e4m3 || scales == nullptr || rows < 1) return;
  std::vector<float> host(static_cast<size_t>(rows));
  // The drafter's stream does not synchronize with the legacy stream: the device, before and after.
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
  DFLASH_CUDA_CHECK(cudaMemcpy(host.data(), scales, host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (float& s : host) s = s * 448.0f / 240.0f;  // absmax/240 (E4M3FNUZ's largest) for absmax/448 (E4M3's)
  DFLASH_CUDA_CHECK(cudaMemcpy(const_cast<float*>(scales), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  DFLASH_CUDA_CHECK(cudaDeviceSynchronize());
}

void plant_bf16_inv_freq(std::vector<float>& inv_freq) {
  for (float& f : inv_freq) f = round_to_bf16(f);
}

void plant_page_major_tables(int32_t* tables, int batch, int max_pages_per_seq) {
  const std::vector<int32_t> by_sequence(tables, tables + static_cast<int64_t>(batch) * max_pages_per_seq);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < max_pages_per_seq; ++p) {
      tables[static_cast<int64_t>(p) * batch + b] = by_sequence[static_cast<size_t>(b * max_pages_per_seq + p)];
    }
  }
}

void plant_block_rows_in_pool(const uint16_t* k_block, const uint16_t* v_block, uint16_t* k_pool, uint16_t* v_pool,
                              int64_t pool_slots, int64_t rows, int64_t kv_dim, void* stream) {
  const int64_t count = rows < pool_slots ? rows : pool_slots;
  const size_t bytes = static_cast<size_t>(count * kv_dim) * 2;
  const int64_t first = (pool_slots - count) * kv_dim;
  auto s = static_cast<cudaStream_t>(stream);
  DFLASH_CUDA_CHECK(cudaMemcpyAsync(k_pool + first, k_block, bytes, cudaMemcpyDeviceToDevice, s));
  DFLASH_CUDA_CHECK(cudaMemcpyAsync(v_pool + first, v_block, bytes, cudaMemcpyDeviceToDevice, s));
}
#endif

}  // namespace dflash
