#include "core/proposer.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/limits.h"

namespace dflash {

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFp64: return "fp64";
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp8: return "fp8";
    case Precision::kW8a8: return "w8a8";
  }
  return "?";
}

bool parse_precision(const std::string& name, Precision* out) {
  for (Precision p : {Precision::kFp64, Precision::kFp32, Precision::kBf16, Precision::kFp8, Precision::kW8a8}) {
    if (name == precision_name(p)) { *out = p; return true; }
  }
  return false;
}

const char* tp_reduce_dtype_name(TpReduceDtype dtype) {
  return dtype == TpReduceDtype::kBf16 ? "bf16" : "fp32";
}

TpReduceDtype parse_tp_reduce_dtype(const std::string& name) {
  if (name == "fp32") return TpReduceDtype::kFp32;
  if (name == "bf16") return TpReduceDtype::kBf16;
  throw bad_input("tp_reduce_dtype '" + name + "' is not supported: expected 'fp32' or 'bf16'");
}

void check_tensor_parallel(const DrafterConfig& config, int tp_size, const std::string& source) {
  const std::string n = std::to_string(tp_size);
  if (tp_size < 1) throw internal_error("check_tensor_parallel: tp_size " + n + " (check_fields refuses it first)");
  if (tp_size == 1) return;  // one rank: nothing is split
  if (config.num_heads < 1 || config.num_kv_heads < 1) {
    throw bad_input(source + ": keys 'num_attention_heads' = " + std::to_string(config.num_heads) +
                    " and 'num_key_value_heads' = " + std::to_string(config.num_kv_heads) + " must be >= 1");
  }
  auto key = [&](const char* name, int value) {
    return source + ": key '" + name + "' = " + std::to_string(value);
  };
  if (config.num_heads % tp_size != 0) {
    throw bad_input(key("num_attention_heads", config.num_heads) + " is not divisible by tp_size " + n + "; refusing");
  }
  // KV heads split when N divides them, replicated when they divide N (§2, §11 item 1).
  if (config.num_kv_heads % tp_size != 0 && tp_size % config.num_kv_heads != 0) {
    throw bad_input(key("num_key_value_heads", config.num_kv_heads) + " and tp_size " + n +
                    ": neither divides the other (KV heads are split when tp_size divides them and replicated when "
                    "they divide tp_size); refusing");
  }
  if (config.intermediate_size % tp_size != 0) {
    throw bad_input(key("intermediate_size", config.intermediate_size) + " is not divisible by tp_size " + n + "; refusing");
  }
  if (config.vocab_size % tp_size != 0) {
    throw bad_input(key("vocab_size", config.vocab_size) + " is not divisible by tp_size " + n +
                    " (the vocabulary is not padded); refusing");
  }
}

int64_t HeadSettings::max_window(const DrafterConfig& config) const {
  const int64_t pool_slots = static_cast<int64_t>(pool_pages) * kv_page_size;
  const int64_t retained = retained_context(config, *this);
  return retained == 0 ? pool_slots : std::min<int64_t>(retained, pool_slots);
}

int64_t retained_context(const DrafterConfig& config, const HeadSettings& settings) {
  const int64_t cap = settings.uncapped ? 0 : settings.ctx_cap;
  if (!config.dflash2.all_sliding()) return cap;
  // W >= 2 whenever a head is built (B <= W, B >= 2), so W - 1 >= 1 never reads as "uncapped".
  const int64_t visible = std::max<int64_t>(int64_t{config.dflash2.sliding_window} - 1, 1);
  return cap == 0 ? visible : std::min(cap, visible);
}

int64_t retained_new_rows(const DrafterConfig& config, const HeadSettings& settings, int64_t new_rows) {
  const int64_t retained = retained_context(config, settings);
  return retained == 0 ? new_rows : std::min(new_rows, retained);
}

std::string retained_context_rule(const DrafterConfig& config, const HeadSettings& settings) {
  const std::string cap = settings.uncapped ? std::string("uncapped") : "ctx_cap " + std::to_string(settings.ctx_cap);
  if (!config.dflash2.all_sliding()) return cap;
  return "min(" + cap + ", W - 1 = " + std::to_string(config.dflash2.sliding_window - 1) +
         "): every layer slides, older positions are evicted";
}

int64_t HeadSettings::pages_for(int64_t window_positions) const {
  const int64_t pages_per_window = (window_positions + kv_page_size - 1) / kv_page_size + 1;
  return limits::checked_product("head: pool pages: max_batch x pages per window", max_batch, pages_per_window,
                                 limits::kPoolPages);
}

void HeadSettings::check_fields() const {
  const HeadSettings& s = *this;
  if (s.gamma < -1) throw bad_input("head: gamma must be >= 0, got " + std::to_string(s.gamma));
  if (s.ctx_cap < 0) throw bad_input("head: ctx_cap must be >= 0, got " + std::to_string(s.ctx_cap));
  if (s.ctx_cap == 0 && !s.uncapped) {
    throw bad_input("head: ctx_cap is 0; an uncapped window must be asked for explicitly (uncapped = true)");
  }
  if (s.uncapped && s.ctx_cap != 0) throw bad_input("head: uncapped needs ctx_cap = 0");
  if (s.max_batch < 1) throw bad_input("head: max_batch must be >= 1, got " + std::to_string(s.max_batch));
  if (s.kv_page_size < 1) throw bad_input("head: kv_page_size must be >= 1, got " + std::to_string(s.kv_page_size));
  if (s.pool_pages < 0) throw bad_input("head: pool_pages must be >= 0");
  limits::check_at_most("head: field 'gamma'", s.gamma, limits::kBlockSize);
  limits::check_at_most("head: field 'ctx_cap'", s.ctx_cap, limits::kCtxCap);
  limits::check_at_most("head: field 'max_batch'", s.max_batch, limits::kMaxBatch);
  limits::check_at_most("head: field 'kv_page_size'", s.kv_page_size, limits::kKvPageSize);
  limits::check_at_most("head: pool_pages", s.pool_pages, limits::kPoolPages);
  // docs/spec/tensor-parallel.md §1 check 1; check 2 is parse_tp_reduce_dtype's (the enum holds no other).
  if (s.tp_size != 1 && s.tp_size != 2 && s.tp_size != 4 && s.tp_size != 8) {
    throw bad_input("tp_size " + std::to_string(s.tp_size) + " is not supported: expected 1, 2, 4 or 8");
  }
}

HeadSettings HeadSettings::resolved(const DrafterConfig& config, const std::string& source) const {
  check_config_limits(config, source);
  check_fields();
  check_tensor_parallel(config, tp_size, source);
  HeadSettings s = *this;
  if (s.gamma == -1) s.gamma = config.block_size;
  // docs/spec/dflash2.md §3.3: with a block wider than the window the sources disagree on the in-block band.
  if (config.dflash2.any_sliding() && std::max(s.gamma, 2) > config.dflash2.sliding_window) {
    throw bad_input("head: gamma " + std::to_string(s.gamma) + " gives blocks of up to " +
                    std::to_string(std::max(s.gamma, 2)) + " rows, wider than the config's sliding_window " +
                    std::to_string(config.dflash2.sliding_window) + " (DFlash2 requires B <= W); refusing");
  }
  if (s.pool_pages == 0) {
    const int64_t retained = retained_context(config, s);
    if (retained == 0) throw bad_input("head: an uncapped window needs an explicit pool_pages");
    s.pool_pages = static_cast<int>(s.pages_for(retained));
  }
  // Every pool together: K and V of every layer, one nkv·d row per slot.
  const int64_t slots = int64_t{s.pool_pages} * s.kv_page_size;
  const int64_t per_layer = limits::checked_product("head: KV cache: pool slots x 2 x nkv·d", slots,
                                                    2 * int64_t{config.kv_dim()}, limits::kKvCacheElements);
  limits::checked_product("head: KV cache elements: layers x per-layer elements", config.num_layers, per_layer,
                          limits::kKvCacheElements);
  return s;
}

std::optional<KvRows> DraftProposer::read_kv_at(int layer, int seq, const std::vector<int64_t>& positions) const {
  const SequenceView view = sequence_view(seq);
  const std::vector<int64_t> window = window_slots(seq);
  std::vector<int64_t> slots;
  for (int64_t position : positions) {
    const int64_t i = position - view.window_begin;
    if (i < 0 || i >= static_cast<int64_t>(window.size())) {
      throw bad_input("read_kv_at: position " + std::to_string(position) + " of sequence " + std::to_string(seq) +
                      " is outside its window " + std::to_string(view.window_begin) + ".." +
                      std::to_string(view.next_position - 1));
    }
    slots.push_back(window[static_cast<size_t>(i)]);
  }
  return read_kv(layer, slots);
}

}  // namespace dflash
