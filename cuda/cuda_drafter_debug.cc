#include "cuda/cuda_drafter_debug.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/graph_capture.h"

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
    d.run_block_forward(d.last_batch_, d.last_width_, nullptr);
  }
  static std::vector<CudaDrafter::ForwardLaunch> last_launches(CudaDrafter& d) {
    require_propose(d, "block forward without kernels");
    return d.block_forward_launches(d.last_batch_, d.last_width_, nullptr);
  }
  static const DeviceDrafterWeights& weights(const CudaDrafter& d) { return d.weights_; }
  static bool fp8(const CudaDrafter& d) { return d.fp8_; }
  static int num_layers(const CudaDrafter& d) { return d.config_.num_layers; }
};

cudaStream_t drafter_stream(const CudaDrafter& drafter) { return CudaDrafterDebug::stream(drafter); }

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

int64_t block_weight_bytes(const CudaDrafter& drafter) {
  const DeviceDrafterWeights& w = CudaDrafterDebug::weights(drafter);
  int64_t bytes = w.lm_head.storage_bytes() + w.lm_head_nvfp4.storage_bytes();
  for (const DeviceLayerWeights& l : w.layers) {
    bytes += l.qkv.storage_bytes() + l.o.storage_bytes() + l.gate_up.storage_bytes() + l.down.storage_bytes();
    bytes += static_cast<int64_t>(l.input_norm.bytes() + l.post_norm.bytes() + l.q_norm.bytes() + l.k_norm.bytes());
  }
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
