#include "cuda/runtime/graph_capture.h"

#include "cuda/runtime/cuda_check.h"

namespace dflash {

cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& enqueue) {
  DFLASH_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken != nullptr) cudaGraphDestroy(broken);
    throw;
  }
  cudaGraph_t graph = nullptr;
  DFLASH_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  DFLASH_CUDA_CHECK(status);
  return exec;
}

}  // namespace dflash
