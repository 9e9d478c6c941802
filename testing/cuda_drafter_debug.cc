#include "testing/cuda_drafter_debug.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/runtime/graph_capture.h"

namespace dflash {

// The private state the functions of cuda_drafter_debug.h read (a friend of CudaDrafter).
struct CudaDrafterDebug {
  static cudaStream_t stream(const CudaDrafter& d) { return d.stream_; }
  static const CudaDrafter::GraphEntry* graph(const CudaDrafter& d, int block_width, int batch) {
    auto it = d.graphs_.find({block_width, batch});
    return it == d.graphs_.end() ? nullptr : &it->second;
  }
  static void require_propose(const CudaDrafter& d, const char* who) {
    if (d.last_batch_ == 0) throw bad_input(std::string(who) + ": no propose has run yet");
  }
  static void enqueue_last(CudaDrafter& d) {
    require_propose(d, "enqueue_last_block_forward");
    d.run_block_forward(d.last_batch_, d.last_width_);
  }
  static std::vector<CudaDrafter::ForwardLaunch> last_launches(CudaDrafter& d) {
    require_propose(d, "block forward without kernels");
    return d.block_forward_launches(d.last_batch_, d.last_width_, nullptr);
  }
  static const DeviceDrafterWeights& weights(const CudaDrafter& d) { return d.weights_; }
  static void copy_kv_slot(CudaDrafter& d, int layer, int64_t from, int64_t to) {
    const int64_t kv_dim = d.config_.kv_dim();
    const int64_t pool_slots = static_cast<int64_t>(d.settings_.pool_pages) * d.settings_.kv_page_size;
    if (layer < 0 || layer >= d.config_.num_layers || from < 0 || to < 0 || from >= pool_slots || to >= pool_slots) {
      throw bad_input("copy_kv_slot: layer " + std::to_string(layer) + ", slots " + std::to_string(from) + " -> " +
                      std::to_string(to) + " outside the pools");
    }
    for (const DeviceBuffer<uint16_t>* pool : {&d.k_pool_[static_cast<size_t>(layer)], &d.v_pool_[static_cast<size_t>(layer)]}) {
      DFLASH_CUDA_CHECK(cudaMemcpyAsync(pool->get() + to * kv_dim, pool->get() + from * kv_dim,
                                        static_cast<size_t>(kv_dim) * 2, cudaMemcpyDeviceToDevice, d.stream_));
    }
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(d.stream_));
  }

  static void fill_kv_slots(CudaDrafter& d, int layer, const std::vector<int64_t>& slots, uint16_t bits) {
    const int64_t kv_dim = d.config_.kv_dim();
    const int64_t pool_slots = static_cast<int64_t>(d.settings_.pool_pages) * d.settings_.kv_page_size;
    if (layer < 0 || layer >= d.config_.num_layers) throw bad_input("fill_kv_slots: no layer " + std::to_string(layer));
    for (int64_t slot : slots) {
      if (slot < 0 || slot >= pool_slots) {
        throw bad_input("fill_kv_slots: slot " + std::to_string(slot) + " outside the pool of " + std::to_string(pool_slots));
      }
    }
    const std::vector<uint16_t> row(static_cast<size_t>(kv_dim), bits);
    for (int64_t slot : slots) {
      for (const DeviceBuffer<uint16_t>* pool : {&d.k_pool_[static_cast<size_t>(layer)], &d.v_pool_[static_cast<size_t>(layer)]}) {
        DFLASH_CUDA_CHECK(cudaMemcpyAsync(pool->get() + slot * kv_dim, row.data(), row.size() * 2,
                                          cudaMemcpyHostToDevice, d.stream_));
      }
    }
    // Stream-ordered after the last propose and complete before `row` goes out of scope.
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(d.stream_));
  }

  static void store_block_row(CudaDrafter& d, int64_t slot) {
    const int64_t kv_dim = d.config_.kv_dim();
    const int64_t pool_slots = static_cast<int64_t>(d.settings_.pool_pages) * d.settings_.kv_page_size;
    if (d.last_batch_ == 0 || slot < 0 || slot >= pool_slots) {
      throw bad_input("store_block_row: slot " + std::to_string(slot) + " (no propose yet, or outside the pools)");
    }
    const size_t last = static_cast<size_t>(d.config_.num_layers - 1);
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(d.k_pool_[last].get() + slot * kv_dim, d.k_block_.get(), static_cast<size_t>(kv_dim) * 2,
                                      cudaMemcpyDeviceToDevice, d.stream_));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(d.v_pool_[last].get() + slot * kv_dim, d.v_block_.get(), static_cast<size_t>(kv_dim) * 2,
                                      cudaMemcpyDeviceToDevice, d.stream_));
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(d.stream_));
  }

  static void lengthen_last_windows(CudaDrafter& d) {
    if (d.last_batch_ == 0) throw bad_input("lengthen_last_windows: no propose has run yet");
    for (int b = 0; b < d.last_batch_; ++b) {
      const int64_t next = d.h_window_begin_.get()[b] + d.h_window_length_.get()[b];
      if (d.h_window_length_.get()[b] >= d.max_window_ ||
          next / d.settings_.kv_page_size - d.h_first_page_.get()[b] >= d.max_pages_per_seq_) {
        throw bad_input("lengthen_last_windows: sequence " + std::to_string(d.last_seqs_[static_cast<size_t>(b)]) +
                        "'s window is already the longest its scratch and block table were sized for");
      }
      ++d.h_window_length_.get()[b];
    }
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(d.d_window_length_.get(), d.h_window_length_.get(), static_cast<size_t>(d.last_batch_) * 4,
                                      cudaMemcpyHostToDevice, d.stream_));
    DFLASH_CUDA_CHECK(cudaStreamSynchronize(d.stream_));
  }
  static bool fp8(const CudaDrafter& d) { return d.fp8_; }
  static const KernelPlan& plan(const CudaDrafter& d) { return d.plan_; }
  static int num_layers(const CudaDrafter& d) { return d.config_.num_layers; }
};

cudaStream_t drafter_stream(const CudaDrafter& drafter) { return CudaDrafterDebug::stream(drafter); }

const KernelPlan& drafter_kernel_plan(const CudaDrafter& drafter) { return CudaDrafterDebug::plan(drafter); }

bool drafter_graph_captured(const CudaDrafter& drafter, int block_width, int batch) {
  const auto* entry = CudaDrafterDebug::graph(drafter, block_width, batch);
  return entry != nullptr && entry->exec != nullptr;
}

void enqueue_last_block_forward(CudaDrafter& drafter) { CudaDrafterDebug::enqueue_last(drafter); }

QuantizedRows download_fp8_weight(const CudaDrafter& drafter, const std::string& which, int layer) {
  if (!CudaDrafterDebug::fp8(drafter)) throw bad_input("download_fp8_weight: the drafter holds bf16 weights");
  const DeviceDrafterWeights& w = CudaDrafterDebug::weights(drafter);
  if (which == "lm_head" && w.lm_head_nvfp4.present()) {
    throw bad_input("download_fp8_weight: the lm_head is the target's NVFP4 head (never quantized to E4M3)");
  }
  if (which == "lm_head") return download_quantized(w.lm_head);
  if (layer < 0 || layer >= CudaDrafterDebug::num_layers(drafter)) {
    throw bad_input("download_fp8_weight: no layer " + std::to_string(layer));
  }
  const DeviceLayerWeights& l = w.layers[static_cast<size_t>(layer)];
  if (which == "qkv") return download_quantized(l.qkv);
  if (which == "o") return download_quantized(l.o);
  if (which == "gate_up") return download_quantized(l.gate_up);
  if (which == "down") return download_quantized(l.down);
  throw bad_input("download_fp8_weight: unknown weight '" + which + "'");
}

void copy_kv_slot(CudaDrafter& drafter, int layer, int64_t from, int64_t to) {
  CudaDrafterDebug::copy_kv_slot(drafter, layer, from, to);
}
void fill_kv_slots(CudaDrafter& drafter, int layer, const std::vector<int64_t>& slots, uint16_t bits) {
  CudaDrafterDebug::fill_kv_slots(drafter, layer, slots, bits);
}
void store_block_row(CudaDrafter& drafter, int64_t slot) { CudaDrafterDebug::store_block_row(drafter, slot); }
void lengthen_last_windows(CudaDrafter& drafter) { CudaDrafterDebug::lengthen_last_windows(drafter); }

int64_t block_weight_bytes(const CudaDrafter& drafter) {
  const DeviceDrafterWeights& w = CudaDrafterDebug::weights(drafter);
  int64_t bytes = w.lm_head.storage_bytes() + w.lm_head_nvfp4.storage_bytes();
  for (const DeviceLayerWeights& l : w.layers) {
    bytes += l.qkv.storage_bytes() + l.o.storage_bytes() + l.gate_up.storage_bytes() + l.down.storage_bytes();
    bytes += static_cast<int64_t>(l.input_norm.bytes() + l.post_norm.bytes() + l.q_norm.bytes() + l.k_norm.bytes());
    // DFlash2's convolutions (empty, so nothing, for plain DFlash).
    bytes += l.attn_conv_proj.storage_bytes() + l.mlp_conv_proj.storage_bytes();
    bytes += static_cast<int64_t>(l.attn_conv_base.bytes() + l.mlp_conv_base.bytes());
  }
  bytes += w.selector.hidden_projection.storage_bytes();  // the codebooks are read by row, per propose
  return bytes + static_cast<int64_t>(w.final_norm.bytes());
}

BlockForwardWithout::BlockForwardWithout(CudaDrafter& drafter, const std::set<std::string>& without)
    : stream_(CudaDrafterDebug::stream(drafter)) {
  const auto launches = CudaDrafterDebug::last_launches(drafter);  // (a private type of the drafter)
  std::vector<std::string> classes;  // in launch order, each once
  for (const auto& l : launches) {
    if (l.kernel_class != nullptr && std::find(classes.begin(), classes.end(), l.kernel_class) == classes.end()) {
      classes.emplace_back(l.kernel_class);
    }
  }
  for (const std::string& c : without) {
    if (c == "embed" || std::find(classes.begin(), classes.end(), c) == classes.end()) {
      std::string names;
      for (const std::string& n : classes) {
        if (n != "embed") names += (names.empty() ? "" : ", ") + n;
      }
      throw bad_input("block forward without '" + c + "': not a kernel class this forward can leave out (" + names + ")");
    }
  }
  exec_ = capture_graph(stream_, [&] {
    for (const auto& l : launches) {
      if (l.kernel_class == nullptr || without.count(l.kernel_class) == 0) l.enqueue();
    }
  });
}

BlockForwardWithout::~BlockForwardWithout() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

void BlockForwardWithout::enqueue() { DFLASH_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

std::set<std::string> parse_kernel_classes(const std::string& list) {
  std::set<std::string> classes;
  if (list.empty() || list == "none") return classes;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find('+', begin), list.size());
    const std::string name = list.substr(begin, end - begin);
    if (name.empty()) throw bad_input("kernel classes '" + list + "': an empty name ('+' between names)");
    classes.insert(name);
    begin = end + 1;
  }
  return classes;
}

}  // namespace dflash
