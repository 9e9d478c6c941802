// A CUDA graph from the launches `enqueue` makes on `stream` (stream capture, thread-local mode),
// instantiated; on any error the capture is ended and nothing is left behind. The caller owns the
// result (cudaGraphExecDestroy).
#pragma once
#include <functional>

#include <cuda_runtime_api.h>

namespace dflash {

cudaGraphExec_t capture_graph(cudaStream_t stream, const std::function<void()>& enqueue);

}  // namespace dflash
