#include "tests/properties/broken_proposers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>

#include "core/error.h"
#include "core/forwarding_proposer.h"

namespace dflash::prop {
namespace {

// Draft tokens recomputed from (edited) logits, lowest index on ties: an edit then breaks only
// the property it is aimed at, not the argmax check.
void recompute_drafts(ProposeOutput& out) {
  const int64_t vocab = out.logits.cols();
  for (int64_t r = 0; r < out.logits.rows() && r < static_cast<int64_t>(out.draft_tokens.size()); ++r) {
    const float* row = out.logits.row(r);
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v) {
      if (row[v] > row[best]) best = v;
    }
    out.draft_tokens[r] = static_cast<int32_t>(best);
  }
}

// The logits tap shows what the returned logits show (the fault is in the computation).
void sync_logits_tap(ProposeOutput& out) {
  for (Tap& tap : out.taps) {
    if (tap.name == "logits") tap.value = out.logits;
  }
}

void nudge_first_logit(ProposeOutput& out, int ulps) {
  if (out.logits.values.empty()) return;
  float& x = out.logits.values[0];
  for (int i = 0; i < ulps; ++i) x = std::nextafter(x, std::numeric_limits<float>::infinity());
  recompute_drafts(out);
  sync_logits_tap(out);
}

// Reports `claimed` settings while the inner proposer runs with others.
class MisreportingProposer : public ForwardingProposer {
 public:
  MisreportingProposer(std::unique_ptr<DraftProposer> inner, const HeadSettings& claimed)
      : ForwardingProposer(std::move(inner)), claimed_(claimed) {}
  const HeadSettings& settings() const override { return claimed_; }

 private:
  HeadSettings claimed_;
};

// Reports `claimed` config while the inner proposer runs with another.
class ConfigMisreportingProposer : public ForwardingProposer {
 public:
  ConfigMisreportingProposer(std::unique_ptr<DraftProposer> inner, const DrafterConfig& claimed)
      : ForwardingProposer(std::move(inner)), claimed_(claimed) {}
  const DrafterConfig& config() const override { return claimed_; }

 private:
  DrafterConfig claimed_;
};

class RowPastTheBlock : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    for (ProposeOutput& out : outputs) {
      out.logits.shape[0] += 1;
      out.logits.values.resize(out.logits.values.size() + static_cast<size_t>(out.logits.cols()), 0.0f);
    }
    return outputs;
  }
};

class LeakyBatch : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    if (batch.size() < 2 || batch[0].ctx->rows() == 0 || batch[1].ctx->rows() == 0) {
      return ForwardingProposer::propose(batch, want_taps);
    }
    Tensor leaked = *batch[1].ctx;
    for (int64_t k = 0; k < leaked.cols(); ++k) leaked.row(0)[k] = batch[0].ctx->row(0)[k];
    std::vector<ProposeInput> edited = batch;
    edited[1].ctx = &leaked;
    return ForwardingProposer::propose(edited, want_taps);
  }
};

class PageDependent : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    for (ProposeOutput& out : outputs) {
      const SequenceView view = sequence_view(out.seq);
      if (!view.block_table.empty() && view.block_table.front() % 2 == 1) nudge_first_logit(out, 1);
    }
    return outputs;
  }
};

class Nondeterministic : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    static int calls = 0;  // survives the instance, like a stale device buffer
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    for (ProposeOutput& out : outputs) nudge_first_logit(out, ++calls % 3);
    return outputs;
  }
};

class HighestIndexTies : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    for (ProposeOutput& out : outputs) {
      for (int64_t r = 0; r < out.logits.rows() && r < static_cast<int64_t>(out.draft_tokens.size()); ++r) {
        const float* row = out.logits.row(r);
        int64_t best = 0;
        for (int64_t v = 1; v < out.logits.cols(); ++v) {
          if (row[v] >= row[best]) best = v;  // ">=": the last of equal maxima wins
        }
        out.draft_tokens[r] = static_cast<int32_t>(best);
      }
    }
    return outputs;
  }
};

class NonAtomicExhaustion : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    try {
      return ForwardingProposer::propose(batch, want_taps);
    } catch (const HarnessError& e) {
      if (e.kind() != ErrorKind::kPoolExhausted || batch.size() < 2) throw;
      try {
        ForwardingProposer::propose({batch.front()}, want_taps);  // half-applied batch
      } catch (const HarnessError&) {
      }
      throw;
    }
  }
};

class StaleGraphReplay : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    const std::pair<size_t, int> shape{batch.size(), block_g()};
    auto it = captured_.find(shape);
    if (it == captured_.end()) {
      captured_.emplace(shape, outputs);
      return outputs;
    }
    // The captured run's logits and drafts in place of this run's.
    for (size_t b = 0; b < outputs.size(); ++b) {
      outputs[b].logits = it->second[b].logits;
      outputs[b].draft_tokens = it->second[b].draft_tokens;
      sync_logits_tap(outputs[b]);
    }
    return outputs;
  }

 private:
  std::map<std::pair<size_t, int>, std::vector<ProposeOutput>> captured_;
};

// Which (width, batch) shapes a CUDA drafter with one eager pass per shape holds graphs of: a
// shape's second propose captures it (testing/reference_faults.h, the graph faults).
class GraphBook {
 public:
  void count(int width, int batch) { ++proposes_[{width, batch}]; }
  // The first captured shape that `pick(width, batch)` accepts, or nullptr.
  template <typename Pick>
  const std::pair<int, int>* find(Pick pick) const {
    for (const auto& [shape, proposes] : proposes_) {
      if (proposes >= 2 && pick(shape.first, shape.second)) return &shape;
    }
    return nullptr;
  }

 private:
  std::map<std::pair<int, int>, int> proposes_;
};

// The device's logits and tokens buffers, by flat draft row (sequence b, row i of width w at
// b·(w - 1) + i): what a graph that did not write a row leaves there to be read back.
class DraftRowBuffers {
 public:
  void store(const std::vector<ProposeOutput>& outputs, size_t sequences, int width) {
    for (size_t b = 0; b < sequences && b < outputs.size(); ++b) {
      for (int64_t i = 0; i < width - 1; ++i) {
        const int64_t row = static_cast<int64_t>(b) * (width - 1) + i;
        const float* src = outputs[b].logits.row(i);
        std::vector<float>& dst = logits_[row];
        dst.assign(src, src + outputs[b].logits.cols());
        tokens_[row] = outputs[b].draft_tokens[static_cast<size_t>(i)];
      }
    }
  }
  // Flat draft rows [first, first + rows) as one sequence's logits and tokens.
  void read(int64_t first, int64_t rows, ProposeOutput* out) const {
    const int64_t vocab = out->logits.cols();
    out->logits = Tensor::zeros({rows, vocab});
    out->draft_tokens.assign(static_cast<size_t>(rows), 0);
    for (int64_t i = 0; i < rows; ++i) {
      const auto logits = logits_.find(first + i);
      if (logits != logits_.end()) std::copy(logits->second.begin(), logits->second.end(), out->logits.row(i));
      const auto token = tokens_.find(first + i);
      if (token != tokens_.end()) out->draft_tokens[static_cast<size_t>(i)] = token->second;
    }
    sync_logits_tap(*out);
  }

 private:
  std::map<int64_t, std::vector<float>> logits_;
  std::map<int64_t, int32_t> tokens_;
};

class GraphKeyedByWidth : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    const int width = block_g(), n = static_cast<int>(batch.size());
    const std::pair<int, int>* other = graphs_.find([&](int w, int b) { return w == width && b != n; });
    if (other == nullptr) {
      graphs_.count(width, n);
      buffers_.store(outputs, outputs.size(), width);
      return outputs;
    }
    // The other batch's graph ran: its sequences are right, the ones past it read stale rows.
    const size_t ran = static_cast<size_t>(other->second);
    buffers_.store(outputs, ran, width);
    for (size_t b = ran; b < outputs.size(); ++b) {
      buffers_.read(static_cast<int64_t>(b) * (width - 1), width - 1, &outputs[b]);
    }
    return outputs;
  }

 private:
  GraphBook graphs_;
  DraftRowBuffers buffers_;
};

class PaddedWidthGraph : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    const int width = block_g(), n = static_cast<int>(batch.size());
    const std::pair<int, int>* wider = graphs_.find([&](int w, int b) { return b == n && w > width; });
    if (wider == nullptr) {
      graphs_.count(width, n);
      return ForwardingProposer::propose(batch, want_taps);
    }
    // The wider block runs (the same context rows, more mask rows), and its draft rows are read
    // back as if they were this width's.
    const int wide = wider->first;
    inner().set_block_g(wide);
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    inner().set_block_g(width);
    DraftRowBuffers buffers;
    buffers.store(outputs, outputs.size(), wide);
    for (size_t b = 0; b < outputs.size(); ++b) {
      outputs[b].block_width = width;
      outputs[b].taps.clear();  // the wide block's taps have another shape
      buffers.read(static_cast<int64_t>(b) * (width - 1), width - 1, &outputs[b]);
    }
    return outputs;
  }

 private:
  GraphBook graphs_;
};

class UnflooredClamp : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  void set_block_g(int g) override {
    requested_ = g;
    ForwardingProposer::set_block_g(g);
  }
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<ProposeOutput> outputs = ForwardingProposer::propose(batch, want_taps);
    if (requested_ >= 2) return outputs;
    const int64_t rows = std::max(requested_, 1) - 1;  // logits rows of an unclamped block
    for (ProposeOutput& out : outputs) {
      out.logits.shape[0] = rows;
      out.logits.values.resize(static_cast<size_t>(rows * out.logits.cols()));
      out.draft_tokens.resize(static_cast<size_t>(rows));
      sync_logits_tap(out);
    }
    return outputs;
  }

 private:
  int requested_ = 2;
};

class StaleContextRow : public ForwardingProposer {
 public:
  using ForwardingProposer::ForwardingProposer;
  std::vector<ProposeOutput> propose(const std::vector<ProposeInput>& batch, bool want_taps) override {
    std::vector<Tensor> edited_ctx(batch.size());
    std::vector<ProposeInput> edited = batch;
    for (size_t b = 0; b < batch.size(); ++b) {
      if (batch[b].ctx->rows() < 2) continue;
      edited_ctx[b] = *batch[b].ctx;
      std::copy(edited_ctx[b].row(0), edited_ctx[b].row(0) + edited_ctx[b].cols(), edited_ctx[b].row(1));
      edited[b].ctx = &edited_ctx[b];
    }
    return ForwardingProposer::propose(edited, want_taps);
  }
};

template <typename Wrapper>
Backend wrap_with(const Backend& backend, const std::string& name) {
  return wrapped(backend, backend.name + "+" + name,
                 [](const ProposerFactory& inner, const DrafterConfig& config,
                    std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings) {
                   return std::unique_ptr<DraftProposer>(std::make_unique<Wrapper>(inner(config, std::move(weights), settings)));
                 });
}

// Runs the inner proposer with `edit` applied to the config while reporting the real config.
Backend misconfigured(const Backend& backend, const std::string& name, void (*edit)(DrafterConfig&)) {
  return wrapped(backend, backend.name + "+" + name,
                 [edit](const ProposerFactory& inner, const DrafterConfig& config,
                        std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings) {
                   DrafterConfig edited = config;
                   edit(edited);
                   return std::unique_ptr<DraftProposer>(std::make_unique<ConfigMisreportingProposer>(
                       inner(edited, std::move(weights), settings), config));
                 });
}

// Runs an all-sliding DFlash2 drafter with W shifted by shift(settings) while reporting the real config.
Backend with_window_shift(const Backend& backend, const std::string& name, int (*shift)(const HeadSettings&)) {
  return wrapped(backend, backend.name + "+" + name,
                 [shift, name](const ProposerFactory& inner, const DrafterConfig& config,
                               std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings) {
                   if (!config.dflash2.all_sliding()) throw bad_input(name + ": needs a drafter whose every layer slides");
                   DrafterConfig shifted = config;
                   shifted.dflash2.sliding_window += shift(settings);
                   return std::unique_ptr<DraftProposer>(std::make_unique<ConfigMisreportingProposer>(
                       inner(shifted, std::move(weights), settings), config));
                 });
}

}  // namespace

Backend clamp_off_by_one(const Backend& backend) {
  return wrapped(backend, backend.name + "+clamp-off-by-one",
                 [](const ProposerFactory& inner, const DrafterConfig& config,
                    std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings) {
                   HeadSettings wider = settings;
                   wider.gamma = (settings.gamma >= 0 ? settings.gamma : config.block_size) + 1;
                   auto proposer = inner(config, std::move(weights), wider);
                   HeadSettings claimed = proposer->settings();
                   claimed.gamma = wider.gamma - 1;
                   return std::unique_ptr<DraftProposer>(std::make_unique<MisreportingProposer>(std::move(proposer), claimed));
                 });
}

Backend non_atomic_exhaustion(const Backend& backend) {
  return wrap_with<NonAtomicExhaustion>(backend, "non-atomic-exhaustion");
}
Backend row_past_the_block(const Backend& backend) { return wrap_with<RowPastTheBlock>(backend, "row-past-the-block"); }

Backend window_off_by_one(const Backend& backend) {
  return wrapped(backend, backend.name + "+window-off-by-one",
                 [](const ProposerFactory& inner, const DrafterConfig& config,
                    std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings) {
                   HeadSettings wider = settings;
                   if (!settings.uncapped) wider.ctx_cap = settings.ctx_cap + 1;
                   auto proposer = inner(config, std::move(weights), wider);
                   HeadSettings claimed = proposer->settings();
                   claimed.ctx_cap = settings.ctx_cap;
                   return std::unique_ptr<DraftProposer>(std::make_unique<MisreportingProposer>(std::move(proposer), claimed));
                 });
}

Backend keeps_evicted_page(const Backend& backend) {
  return with_window_shift(backend, "keeps-evicted-page", [](const HeadSettings& s) { return s.kv_page_size; });
}

Backend evicts_one_position_too_many(const Backend& backend) {
  return with_window_shift(backend, "evicts-one-too-many", [](const HeadSettings&) { return -1; });
}

Backend leaky_batch(const Backend& backend) { return wrap_with<LeakyBatch>(backend, "leaky-batch"); }
Backend page_dependent(const Backend& backend) { return wrap_with<PageDependent>(backend, "page-dependent"); }
Backend nondeterministic(const Backend& backend) { return wrap_with<Nondeterministic>(backend, "nondeterministic"); }
Backend highest_index_ties(const Backend& backend) { return wrap_with<HighestIndexTies>(backend, "highest-index-ties"); }
Backend stale_graph_replay(const Backend& backend) { return wrap_with<StaleGraphReplay>(backend, "stale-graph-replay"); }

Backend graph_keyed_by_width(const Backend& backend) {
  return wrap_with<GraphKeyedByWidth>(backend, "graph-keyed-by-width");
}
Backend padded_width_graph(const Backend& backend) { return wrap_with<PaddedWidthGraph>(backend, "padded-width-graph"); }

Backend unfloored_clamp(const Backend& backend) { return wrap_with<UnflooredClamp>(backend, "unfloored-clamp"); }
Backend stale_context_row(const Backend& backend) { return wrap_with<StaleContextRow>(backend, "stale-context-row"); }

Backend ignored_norm_eps(const Backend& backend) {
  // The config must stay valid (eps > 0); 1e-30 adds nothing to any mean square here.
  return misconfigured(backend, "ignored-norm-eps", [](DrafterConfig& c) { c.rms_norm_eps = 1e-30; });
}

Backend bf16_posing_as_fp32(const Backend& backend) {
  return wrapped(backend, backend.name + "+bf16-posing-as-fp32",
                 [](const ProposerFactory& inner, const DrafterConfig& config,
                    std::shared_ptr<const DrafterWeights> weights, const HeadSettings& settings) {
                   HeadSettings bf16 = settings;
                   bf16.precision = Precision::kBf16;
                   auto proposer = inner(config, std::move(weights), bf16);
                   HeadSettings claimed = proposer->settings();
                   claimed.precision = settings.precision;
                   return std::unique_ptr<DraftProposer>(std::make_unique<MisreportingProposer>(std::move(proposer), claimed));
                 });
}

Backend default_rope_theta(const Backend& backend) {
  return misconfigured(backend, "default-rope-theta", [](DrafterConfig& c) { c.rope.theta = 10000.0; });
}

}  // namespace dflash::prop
