#include "tests/properties/toy_proposer.h"

#include <cmath>
#include <set>
#include <string>

#include "core/error.h"

namespace dflash::prop {

ToyProposer::ToyProposer(const DrafterConfig& config, std::shared_ptr<const DrafterWeights> weights,
                         const HeadSettings& settings)
    : PagedProposer(config, settings.resolved(config)),
      weights_(std::move(weights)),
      cache_(static_cast<size_t>(settings_.pool_pages) * settings_.kv_page_size * config.hidden_size, 0.0f) {
  if (weights_->fc.shape != std::vector<int64_t>{config.hidden_size, config.ctx_feature_dim()} ||
      weights_->embed_tokens.shape != std::vector<int64_t>{config.vocab_size, config.hidden_size} ||
      weights_->lm_head.shape != std::vector<int64_t>{config.vocab_size, config.hidden_size}) {
    throw bad_input("toy: fc, embed_tokens or lm_head does not match the config");
  }
}

std::vector<std::pair<std::string, std::string>> ToyProposer::describe() const {
  return {{"proposer", "toy"}, {"precision", precision_name(settings_.precision)}};
}

std::vector<ProposeOutput> ToyProposer::propose(const std::vector<ProposeInput>& batch, bool /*want_taps*/) {
  const std::vector<ContextAdmission> admissions = admit_context(batch);  // validated, atomic

  // Project the admitted rows into their slots: x[k] = sum_j F[j] fc[k, j] / features.
  const int hidden = config_.hidden_size;
  const int64_t features = config_.ctx_feature_dim();
  for (size_t b = 0; b < batch.size(); ++b) {
    const ContextAdmission& a = admissions[b];
    for (size_t r = 0; r < a.slots.size(); ++r) {
      const float* row = batch[b].ctx->row(a.first_row + static_cast<int64_t>(r));
      float* slot = cache_.data() + a.slots[r] * hidden;
      for (int k = 0; k < hidden; ++k) {
        const float* w = weights_->fc.row(k);
        float sum = 0.0f;
        for (int64_t j = 0; j < features; ++j) sum += row[j] * w[j];
        slot[k] = sum / static_cast<float>(features);
      }
    }
  }
  std::vector<ProposeOutput> outputs;
  for (const ProposeInput& input : batch) outputs.push_back(propose_one(input));
  return outputs;
}

ProposeOutput ToyProposer::propose_one(const ProposeInput& input) const {
  const int hidden = config_.hidden_size;
  const int vocab = config_.vocab_size;
  const int width = block_g_;
  const SequenceView view = table_.view(input.seq);
  const std::vector<int64_t> slots = table_.window_slots(input.seq);
  const float window_weight = 1.0f / static_cast<float>(slots.size() + 1);

  // Each block row gathers the window in position order, through the slots.
  std::vector<float> acc(static_cast<size_t>(width) * hidden);
  for (int i = 0; i < width; ++i) {
    const int token = i == 0 ? input.anchor : config_.mask_token_id;
    const float* e = weights_->embed_tokens.row(token);
    float* a = acc.data() + static_cast<size_t>(i) * hidden;
    for (int k = 0; k < hidden; ++k) a[k] = e[k];
    for (size_t p = 0; p < slots.size(); ++p) {
      const int64_t position = view.window_begin + static_cast<int64_t>(p);
      const float* x = cache_.data() + slots[p] * hidden;
      float score = 0.0f;
      for (int k = 0; k < hidden; ++k) score += e[k] * x[k];
      const float distance_weight = 1.0f + 0.125f * static_cast<float>((input.start + i - position) % 5);
      const float w = window_weight * distance_weight * std::tanh(score / static_cast<float>(hidden));
      for (int k = 0; k < hidden; ++k) a[k] += w * x[k];
    }
  }
  // Bidirectional in-block mixing: every row adds the block's mean.
  std::vector<float> mean(hidden, 0.0f);
  for (int i = 0; i < width; ++i) {
    for (int k = 0; k < hidden; ++k) mean[k] += acc[static_cast<size_t>(i) * hidden + k];
  }
  ProposeOutput out;
  out.seq = input.seq;
  out.block_width = width;
  out.logits = Tensor::zeros({width - 1, vocab});
  for (int i = 1; i < width; ++i) {
    const float* a = acc.data() + static_cast<size_t>(i) * hidden;
    float* logits = out.logits.row(i - 1);
    for (int v = 0; v < vocab; ++v) {
      const float* w = weights_->lm_head.row(v);
      float sum = 0.0f;
      for (int k = 0; k < hidden; ++k) sum += (a[k] + mean[k] / static_cast<float>(width)) * w[k];
      logits[v] = sum;
    }
    int best = 0;
    for (int v = 1; v < vocab; ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    out.draft_tokens.push_back(best);
  }
  return out;
}

std::unique_ptr<DraftProposer> make_toy_proposer(const DrafterConfig& config,
                                                 std::shared_ptr<const DrafterWeights> weights,
                                                 const HeadSettings& settings) {
  return std::make_unique<ToyProposer>(config, std::move(weights), settings);
}

}  // namespace dflash::prop
