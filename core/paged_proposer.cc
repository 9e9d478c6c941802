#include "core/paged_proposer.h"

#include <cmath>
#include <set>
#include <string>

#include "core/error.h"

namespace dflash {

PagedProposer::PagedProposer(const DrafterConfig& config, const HeadSettings& settings)
    : config_(config),
      settings_(settings),
      table_(settings.pool_pages, settings.kv_page_size, retained_context(config, settings),
             settings.page_order_seed),
      block_g_(clamp_block_width(settings.gamma, settings.gamma)) {}

void PagedProposer::validate_batch(const std::vector<ProposeInput>& batch) const {
  if (batch.empty()) throw bad_input("propose: empty batch");
  if (static_cast<int>(batch.size()) > settings_.max_batch) {
    throw bad_input("propose: batch of " + std::to_string(batch.size()) + " sequences exceeds max_batch " +
                    std::to_string(settings_.max_batch));
  }
  const int64_t features = config_.ctx_feature_dim();
  std::set<int> seen;
  for (const ProposeInput& in : batch) {
    const std::string who = "propose: sequence " + std::to_string(in.seq);
    if (!seen.insert(in.seq).second) throw bad_input(who + " appears twice in one batch");
    if (!table_.has(in.seq)) throw bad_input(who + " is not active (add_sequence first; released ids stay retired)");
    if (!in.ctx) throw bad_input(who + ": no ctx tensor (pass a [0, " + std::to_string(features) + "] one for C = 0)");
    if (in.ctx->shape.size() != 2 || in.ctx->shape[1] != features) {
      throw bad_input(who + ": ctx has shape " + shape_string(in.ctx->shape) + ", expected [C, " +
                      std::to_string(features) + "] (nT·Ht = " + std::to_string(config_.num_target_layers()) + "·" +
                      std::to_string(config_.target_hidden_size) + ")");
    }
    if (static_cast<int64_t>(in.ctx->values.size()) != in.ctx->numel()) {
      throw bad_input(who + ": ctx holds " + std::to_string(in.ctx->values.size()) + " values for shape " +
                      shape_string(in.ctx->shape));
    }
    if (in.anchor < 0 || in.anchor >= config_.vocab_size) {
      throw bad_input(who + ": anchor token " + std::to_string(in.anchor) + " is outside [0, " +
                      std::to_string(config_.vocab_size) + ")");
    }
    const int64_t rows = in.ctx->rows();
    if (in.start - rows < 0) {
      throw bad_input(who + ": " + std::to_string(rows) + " ctx rows before anchor position " +
                      std::to_string(in.start) + " would start at a negative position");
    }
    const int64_t bad = first_non_finite(in.ctx->values.data(), in.ctx->numel());
    if (bad >= 0) {
      const float value = in.ctx->values[static_cast<size_t>(bad)];
      throw bad_input(who + ": ctx value at row " + std::to_string(bad / features) + ", column " +
                      std::to_string(bad % features) + " is " + (std::isnan(value) ? "NaN" : "infinite") +
                      " (flat index " + std::to_string(bad) + ", position " +
                      std::to_string(in.start - rows + bad / features) + ")");
    }
  }
}

template <typename Change>
auto PagedProposer::poisoning_freed(Change change) -> decltype(change()) {
  if (!settings_.poison_freed_pages) return change();
  const std::vector<int> owner_before = table_.pool().page_owner;
  auto result = change();
  const std::vector<int> owner_after = table_.pool().page_owner;
  std::vector<int> freed;
  for (size_t page = 0; page < owner_before.size(); ++page) {
    if (owner_before[page] != -1 && owner_after[page] == -1) freed.push_back(static_cast<int>(page));
  }
  if (!freed.empty()) poison_pages(freed);
  return result;
}

std::vector<ContextAdmission> PagedProposer::admit_context(const std::vector<ProposeInput>& batch) {
  validate_batch(batch);
  std::vector<ContextRequest> requests;
  requests.reserve(batch.size());
  for (const ProposeInput& in : batch) requests.push_back({in.seq, in.start, in.ctx->rows()});
  return poisoning_freed([&] { return table_.admit(requests); });
}

void PagedProposer::release_sequence(int seq) {
  poisoning_freed([&] {
    table_.release(seq);
    return 0;
  });
}

void PagedProposer::poison_free_pool() {
  if (!settings_.poison_freed_pages) return;
  std::vector<int> pages(static_cast<size_t>(settings_.pool_pages));
  for (int p = 0; p < settings_.pool_pages; ++p) pages[static_cast<size_t>(p)] = p;
  poison_pages(pages);
}

void PagedProposer::poison_pages(const std::vector<int>& pages) {
  (void)pages;
  throw bad_input(name() + ": poison_freed_pages asked, but this proposer keeps no K/V pools of its own");
}

}  // namespace dflash
