#include "cuda/cuda_check.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.h"
#include "core/parse_number.h"

namespace dflash {
namespace {

std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " at " + file + ":" + std::to_string(line);
}

// The injection plan: which site fails at which count (0: none), and the counts so far.
struct FaultPlan {
  std::mutex mutex;
  std::atomic<bool> armed{false};  // read without the lock: every launch asks
  CudaFaultSite site = CudaFaultSite::kAlloc;
  long long nth = 0, seen = 0;
};

FaultPlan& plan() {
  static FaultPlan* p = [] {
    auto* out = new FaultPlan();  // never destroyed: allocations may be freed after static destructors
    const char* value = std::getenv("DFLASH_CUDA_FAULT");
    if (value == nullptr || *value == '\0') return out;
    const std::string text = value;
    const size_t colon = text.find(':');
    const std::string kind = text.substr(0, colon);
    int nth = 0;
    if (colon == std::string::npos || (kind != "alloc" && kind != "launch") ||
        !parse_whole_int(text.substr(colon + 1), &nth) || nth < 1) {
      throw bad_input("DFLASH_CUDA_FAULT=" + text + ": expected alloc:N or launch:N with N >= 1 (a test-only lever)");
    }
    out->site = kind == "alloc" ? CudaFaultSite::kAlloc : CudaFaultSite::kLaunch;
    out->nth = nth;
    out->armed = true;
    return out;
  }();
  return *p;
}

}  // namespace

void set_cuda_fault(CudaFaultSite site, long long nth) {
  FaultPlan& p = plan();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.site = site;
  p.nth = nth;
  p.seen = 0;
  p.armed = nth > 0;
}

void clear_cuda_fault() { set_cuda_fault(CudaFaultSite::kAlloc, 0); }

bool cuda_fault_due(CudaFaultSite site) {
  FaultPlan& p = plan();
  if (!p.armed.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.nth == 0 || p.site != site) return false;
  return ++p.seen == p.nth;
}

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a non-sticky error so that the next call does not see it again
  const std::string message = "CUDA error " + std::string(cudaGetErrorName(status)) + " (" +
                              cudaGetErrorString(status) + ") in " + where(call, file, line);
  const bool cannot_run = status == cudaErrorMemoryAllocation || status == cudaErrorNoDevice ||
                          status == cudaErrorInsufficientDriver || status == cudaErrorNoKernelImageForDevice;
  throw HarnessError(cannot_run ? ErrorKind::kUnsupported : ErrorKind::kInternal, message);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  const std::string message = "cuBLAS error " + std::string(cublasGetStatusName(status)) + " (" +
                              cublasGetStatusString(status) + ") in " + where(call, file, line);
  throw HarnessError(status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kUnsupported : ErrorKind::kInternal, message);
}

}  // namespace dflash
