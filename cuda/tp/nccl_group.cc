#include "cuda/tp/nccl_group.h"

#include <dlfcn.h>

#include <cstdlib>

#include <nccl.h>

#include "core/error.h"

#ifndef DFLASH_NCCL_WHEEL_LIBRARY
#define DFLASH_NCCL_WHEEL_LIBRARY ""
#endif

namespace dflash {

// The entry points the group uses, resolved from the loaded library.
struct NcclGroup::Api {
  void* handle = nullptr;
  decltype(&ncclCommInitAll) comm_init_all = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetVersion) version = nullptr;
};

namespace {

// Each candidate in turn; the first that loads and has every symbol.
std::shared_ptr<const NcclGroup::Api> load_nccl(std::string* from) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("DFLASH_NCCL_LIBRARY"); env != nullptr && *env != '\0') {
    candidates.push_back(env);  // asked for: no fallback behind the caller's back
  } else {
    if (*DFLASH_NCCL_WHEEL_LIBRARY != '\0') candidates.push_back(DFLASH_NCCL_WHEEL_LIBRARY);
    candidates.push_back("libnccl.so.2");
  }
  std::string tried;
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      tried += (tried.empty() ? "" : "; ") + path + ": " + dlerror();
      continue;
    }
    auto api = std::make_shared<NcclGroup::Api>();
    api->handle = handle;
    bool complete = true;
    auto resolve = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (fn == nullptr) complete = false, tried += (tried.empty() ? "" : "; ") + path + ": no " + name;
    };
    resolve(api->comm_init_all, "ncclCommInitAll");
    resolve(api->comm_destroy, "ncclCommDestroy");
    resolve(api->all_gather, "ncclAllGather");
    resolve(api->group_start, "ncclGroupStart");
    resolve(api->group_end, "ncclGroupEnd");
    resolve(api->error_string, "ncclGetErrorString");
    resolve(api->version, "ncclGetVersion");
    if (!complete) {
      dlclose(handle);
      continue;
    }
    *from = path;
    return api;
  }
  throw unsupported("tensor parallelism over NCCL: NCCL could not be loaded (" + tried +
                    "); set DFLASH_NCCL_LIBRARY to a libnccl.so.2, or run ci/setup for the nvidia-nccl-cu13 wheel");
}

void check(const NcclGroup::Api& api, ncclResult_t result, const char* what) {
  if (result != ncclSuccess) {
    throw unsupported(std::string("tensor parallelism over NCCL: ") + what + ": " + api.error_string(result));
  }
}

}  // namespace

int visible_gpus(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    return 0;
  }
  return count;
}

std::unique_ptr<NcclGroup> NcclGroup::open(int ranks) {
  if (ranks < 1) throw bad_input("tensor parallelism over NCCL: tp_size " + std::to_string(ranks) + " (must be >= 1)");
  std::string why;
  const int visible = visible_gpus(&why);
  if (visible < ranks) {
    throw unsupported("tensor parallelism over NCCL: tp_size " + std::to_string(ranks) + " needs " +
                      std::to_string(ranks) + " visible GPUs, one per rank; " + std::to_string(visible) + " visible" +
                      (why.empty() ? std::string() : " (" + why + ")"));
  }
  std::unique_ptr<NcclGroup> group(new NcclGroup());
  std::string from;
  group->api_ = load_nccl(&from);
  int version = 0;
  check(*group->api_, group->api_->version(&version), "ncclGetVersion");
  group->library_ = from + " (NCCL " + std::to_string(version) + ")";
  std::vector<ncclComm_t> comms(static_cast<size_t>(ranks));
  std::vector<int> devices(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) devices[static_cast<size_t>(r)] = r;
  check(*group->api_, group->api_->comm_init_all(comms.data(), ranks, devices.data()), "ncclCommInitAll");
  group->comms_.assign(comms.begin(), comms.end());
  return group;
}

NcclGroup::~NcclGroup() {
  for (void* comm : comms_) api_->comm_destroy(static_cast<ncclComm_t>(comm));
}

void NcclGroup::all_gather(const std::vector<const void*>& send, const std::vector<void*>& recv, size_t count,
                           TpWire wire, const std::vector<cudaStream_t>& streams) {
  const size_t n = comms_.size();
  if (send.size() != n || recv.size() != n || streams.size() != n) {
    throw internal_error("NcclGroup::all_gather: " + std::to_string(send.size()) + " sends, " +
                         std::to_string(recv.size()) + " receives and " + std::to_string(streams.size()) +
                         " streams for " + std::to_string(n) + " ranks");
  }
  const ncclDataType_t type = wire == TpWire::kFp32 ? ncclFloat32 : ncclBfloat16;
  check(*api_, api_->group_start(), "ncclGroupStart");
  for (size_t r = 0; r < n; ++r) {
    check(*api_, api_->all_gather(send[r], recv[r], count, type, static_cast<ncclComm_t>(comms_[r]), streams[r]),
          "ncclAllGather");
  }
  check(*api_, api_->group_end(), "ncclGroupEnd");
}

}  // namespace dflash
