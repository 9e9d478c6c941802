// Tensor parallelism across GPUs (docs/spec/tensor-parallel.md): N ranks in one process, rank r on
// visible device r, one NCCL communicator each (ncclCommInitAll). NCCL is loaded when a group
// opens (dlopen: DFLASH_NCCL_LIBRARY, else the nvidia-nccl-cu13 wheel ci/setup installs, else
// libnccl.so.2 on the loader's path), so that nothing else of the harness needs it; what cannot
// open is refused by name: fewer GPUs visible than ranks asked, or no NCCL.
//
// The collectives move bytes only. The row-parallel reduction (§4) is an all-gather of the
// partials in rank order, then each rank's sum of them linearly from rank 0 (tp_reduce.h): the
// contract's order and dtype whatever algorithm NCCL picks.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda/tp/tp_reduce.h"

namespace dflash {

// The CUDA devices this process sees; 0 with the reason in `why` when the runtime reports none.
int visible_gpus(std::string* why);

class NcclGroup {
 public:
  struct Api;  // NCCL's entry points as loaded (nccl_group.cc)

  // kBadInput for ranks < 1; kUnsupported naming the numbers for fewer visible GPUs than ranks,
  // and naming the library when NCCL cannot be loaded or a communicator cannot be created.
  static std::unique_ptr<NcclGroup> open(int ranks);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int ranks() const { return static_cast<int>(comms_.size()); }
  // Where NCCL was loaded from, and its version (for describe()).
  const std::string& library() const { return library_; }

  // On each rank r (stream streams[r], device r): recv[r] = the `count` elements of send[0], ...,
  // send[N - 1], in rank order. Enqueued as one NCCL group; returns once enqueued.
  void all_gather(const std::vector<const void*>& send, const std::vector<void*>& recv, size_t count, TpWire wire,
                  const std::vector<cudaStream_t>& streams);

 private:
  NcclGroup() = default;
  std::shared_ptr<const Api> api_;
  std::vector<void*> comms_;  // ncclComm_t per rank
  std::string library_;
};

}  // namespace dflash
