#include "cuda/runtime/cuda_check.h"

#include <string>

#include "core/error.h"

namespace dflash {
namespace {

std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " at " + file + ":" + std::to_string(line);
}

}  // namespace

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
