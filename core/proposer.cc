#include "core/proposer.h"

#include <string>

#include "core/error.h"

namespace dflash {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp64: return "fp64";
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp8: return "fp8";
  }
  return "?";
}

bool parse_precision(const std::string& name, Precision* out) {
  for (Precision p : {Precision::kFp64, Precision::kFp32, Precision::kBf16, Precision::kFp8}) {
    if (name == precision_name(p)) { *out = p; return true; }
  }
  return false;
}

HeadSettings HeadSettings::resolved(const DrafterConfig& config) const {
  HeadSettings s = *this;
  if (s.gamma == -1) s.gamma = config.block_size;
  if (s.gamma < 0) throw bad_input("head: gamma must be >= 0, got " + std::to_string(s.gamma));
  if (s.ctx_cap < 0) throw bad_input("head: ctx_cap must be >= 0, got " + std::to_string(s.ctx_cap));
  if (s.ctx_cap == 0 && !s.uncapped) {
    throw bad_input("head: ctx_cap is 0; an uncapped window must be asked for explicitly (uncapped = true)");
  }
  if (s.uncapped && s.ctx_cap != 0) throw bad_input("head: uncapped needs ctx_cap = 0");
  if (s.max_batch < 1) throw bad_input("head: max_batch must be >= 1, got " + std::to_string(s.max_batch));
  if (s.kv_page_size < 1) throw bad_input("head: kv_page_size must be >= 1, got " + std::to_string(s.kv_page_size));
  if (s.pool_pages < 0) throw bad_input("head: pool_pages must be >= 0");
  if (s.pool_pages == 0) {
    if (s.uncapped) throw bad_input("head: an uncapped window needs an explicit pool_pages");
    const int64_t pages_per_window = (s.ctx_cap + s.kv_page_size - 1) / s.kv_page_size + 1;
    s.pool_pages = static_cast<int>(s.max_batch * pages_per_window);
  }
  return s;
}

}  // namespace dflash
