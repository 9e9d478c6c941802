// CudaOptions::with_environment: the environment levers (docs/cuda-drafter.md) on top of the
// caller's options. A malformed value is an error naming the variable, never ignored.
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/parse_number.h"
#include "cuda/drafter/cuda_drafter.h"

namespace dflash {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

int parse_int(const char* name, const std::string& text, int min_value) {
  int value = 0;
  if (!parse_whole_int(text, &value) || value < min_value) {
    throw bad_input(std::string(name) + "=" + text + ": expected an integer >= " + std::to_string(min_value));
  }
  return value;
}

}  // namespace

CudaOptions CudaOptions::with_environment() const {
  CudaOptions o = *this;
  if (const char* v = env("DFLASH_CUDA_GRAPHS")) {
    const std::string s = v;
    if (s == "0" || s == "off" || s == "false") {
      o.graphs = false;
    } else if (s == "1" || s == "on" || s == "true") {
      o.graphs = true;
    } else {
      throw bad_input("DFLASH_CUDA_GRAPHS=" + s + ": expected 0 or 1");
    }
  }
  if (const char* v = env("DFLASH_CUDA_WARMUP")) o.warmup = parse_int("DFLASH_CUDA_WARMUP", v, 0);
  if (const char* v = env("DFLASH_CUDA_DEVICE")) o.device = parse_int("DFLASH_CUDA_DEVICE", v, 0);
  if (const char* v = env("DFLASH_CUDA_PRECISION")) {
    const std::string s = v;
    if (s != "bf16" && s != "fp8") throw bad_input("DFLASH_CUDA_PRECISION=" + s + ": expected bf16 or fp8");
    o.precision = s;
  }
  if (const char* v = env("DFLASH_CUDA_KERNELS")) {
    // "stage=kernel,stage=kernel"
    const std::string s = v;
    size_t begin = 0;
    while (begin <= s.size()) {
      size_t end = s.find(',', begin);
      if (end == std::string::npos) end = s.size();
      const std::string item = s.substr(begin, end - begin);
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
        throw bad_input("DFLASH_CUDA_KERNELS=" + s + ": '" + item + "' is not stage=kernel");
      }
      o.kernels[item.substr(0, eq)] = item.substr(eq + 1);
      begin = end + 1;
    }
  }
  return o;
}

}  // namespace dflash
