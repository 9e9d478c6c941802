#include "tests/properties/scenario.h"

#include <algorithm>

namespace dflash::prop {

std::unique_ptr<DraftProposer> Scenario::build(const Backend& backend) const { return build(backend, settings); }

std::unique_ptr<DraftProposer> Scenario::build(const Backend& backend, const HeadSettings& altered) const {
  HeadSettings head = altered;
  // A backend the stored-state checks can judge runs in the debug mode they read.
  if (backend.kv_oracle) head.poison_freed_pages = true;
  return backend.make(config, weights, head);
}

int Scenario::gamma() const { return settings.gamma >= 0 ? settings.gamma : config.block_size; }

std::ostream& operator<<(std::ostream& os, const HeadSettings& s) {
  return os << "{gamma " << s.gamma << ", ctx_cap " << (s.uncapped ? std::string("uncapped") : std::to_string(s.ctx_cap))
            << ", max_batch " << s.max_batch << ", kv_page_size " << s.kv_page_size << ", pool_pages " << s.pool_pages
            << ", page_order_seed " << s.page_order_seed << ", precision " << precision_name(s.precision) << "}";
}

void showValue(const Scenario& s, std::ostream& os) {
  os << "geometry " << describe_geometry(s.geometry) << "\n  lm_head " << s.lm_head << ", weight seed " << s.weight_seed
     << "\n  settings " << s.settings << "\n  trace " << s.trace;
}

rc::Gen<DrafterGeometry> gen_geometry(const GeometryLimits& limits) {
  return rc::gen::exec([limits] {
    DrafterGeometry g = tiny_geometry();
    g.heads = *rc::gen::inRange(1, limits.max_heads + 1);
    std::vector<int> divisors;  // every GQA ratio the head count allows, MHA and MQA included
    for (int k = 1; k <= g.heads; ++k) {
      if (g.heads % k == 0) divisors.push_back(k);
    }
    g.kv_heads = *rc::gen::elementOf(divisors);
    g.head_dim = *rc::gen::elementOf(limits.head_dims);
    g.hidden = *rc::gen::elementOf(limits.hidden_sizes);
    g.layers = *rc::gen::inRange(1, limits.max_layers + 1);
    g.intermediate = *rc::gen::elementOf(limits.intermediate_sizes);
    g.vocab = *rc::gen::inRange(limits.min_vocab, limits.max_vocab + 1);
    const int captured_layers = *rc::gen::inRange(1, limits.max_captured_layers + 1);
    g.target_layer_ids.clear();
    for (int i = 0; i < captured_layers; ++i) g.target_layer_ids.push_back(1 + 4 * i);
    g.block = *rc::gen::inRange(1, 9);
    g.mask_token_id = *rc::gen::inRange(0, g.vocab);
    g.bias = *rc::gen::arbitrary<bool>();
    if (*rc::gen::arbitrary<bool>()) {  // YaRN
      g.yarn_factor = *rc::gen::element(2.0, 4.0, 32.0);
      g.yarn_original = *rc::gen::element(16, 64, 4096);
    }
    g.theta = *rc::gen::element(10000.0, 150000.0, 1000000.0);
    g.eps = *rc::gen::element(1e-6, 1e-5);
    return g;
  });
}

namespace {

rc::Gen<LmHeadPlan> gen_lm_head(const std::vector<LmHead>& kinds, int vocab) {
  return rc::gen::exec([kinds, vocab] {
    LmHeadPlan plan;
    plan.kind = *rc::gen::elementOf(kinds);
    // Four rows in four different quarters of the vocabulary: duplicates far apart.
    const int q = vocab / 4;
    plan.a = *rc::gen::inRange(0, q);
    plan.c = *rc::gen::inRange(q, 2 * q);
    plan.d = *rc::gen::inRange(2 * q, 3 * q);
    plan.b = *rc::gen::inRange(3 * q, vocab);
    return plan;
  });
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

rc::Gen<Scenario> gen_scenario(const Backend& backend, const ScenarioOptions& options) {
  return rc::gen::exec([backend, options] {
    Scenario s;
    GeometryLimits limits = backend.limits;
    if (options.min_vocab > 0) {
      limits.min_vocab = std::max(limits.min_vocab, options.min_vocab);
      limits.max_vocab = std::max(limits.max_vocab, 4 * limits.min_vocab);
    }
    s.geometry = *gen_geometry(limits);
    s.config = make_config(s.geometry);
    s.lm_head = *gen_lm_head(options.lm_heads, s.geometry.vocab);
    s.weight_seed = *rc::gen::resize(100, rc::gen::inRange<uint64_t>(0, uint64_t{1} << 30));
    s.weights = make_weights(s.config, s.weight_seed, s.lm_head);

    HeadSettings& h = s.settings;
    h.gamma = *rc::gen::weightedOneOf<int>({{3, rc::gen::just(-1)}, {7, rc::gen::element(0, 1, 2, 3, 4, 8)}});
    const int gamma = s.gamma();
    h.kv_page_size = *rc::gen::element(1, 2, 3, 4, 8, 16);
    const int ps = h.kv_page_size;
    // Caps at the edges the failure classes name: 1, gamma, page size +- 1, very large, none.
    switch (*any_of(10)) {
      case 0: h.ctx_cap = 1; break;
      case 1: h.ctx_cap = 2; break;
      case 2: h.ctx_cap = std::max(1, gamma); break;
      case 3: h.ctx_cap = std::max(1, ps - 1); break;
      case 4: h.ctx_cap = ps; break;
      case 5: h.ctx_cap = ps + 1; break;
      case 6: h.ctx_cap = 2 * ps + 1; break;
      case 7: h.ctx_cap = *rc::gen::inRange(1, 49); break;
      case 8: h.ctx_cap = 4096; break;
      default: h.ctx_cap = 0; h.uncapped = true; break;
    }
    h.max_batch = *rc::gen::inRange(options.min_max_batch, std::max(options.min_max_batch, 4) + 1);
    h.page_order_seed = *rc::gen::weightedOneOf<uint64_t>(
        {{1, rc::gen::just<uint64_t>(0)}, {1, rc::gen::inRange<uint64_t>(1, uint64_t{1} << 40)}});
    h.precision = *rc::gen::elementOf(backend.precisions);

    TraceShape shape;
    shape.max_steps = options.max_steps;
    shape.max_batch = h.max_batch;
    shape.max_sequences = options.max_sequences;
    shape.max_active = std::min(options.max_sequences, options.small_pools ? h.max_batch + 2 : h.max_batch);
    shape.ctx_cap = h.uncapped ? 0 : h.ctx_cap;
    shape.page_size = ps;
    shape.gamma = gamma;
    shape.vocab = s.geometry.vocab;
    shape.max_positions = (!h.uncapped && h.ctx_cap <= 48) ? 2 * h.ctx_cap + 2 * ps + 8 : 96;
    shape.releases = options.releases;
    for (int i = 0; i < options.distinct_widths; ++i) shape.width_choices.push_back(*gen_width(gamma));

    // Enough pages for every active window; the default pool already is for a capped head.
    const int64_t window = h.uncapped ? shape.max_positions : std::min<int64_t>(h.ctx_cap, shape.max_positions);
    const int64_t enough = shape.max_active * (ceil_div(window, ps) + 1);
    if (options.small_pools) {
      h.pool_pages = static_cast<int>(*rc::gen::inRange<int64_t>(1, enough + 1));
    } else if (h.uncapped) {
      h.pool_pages = static_cast<int>(enough + *rc::gen::inRange(0, 4));
    } else {
      h.pool_pages = *rc::gen::element(0, static_cast<int>(enough) + 3);
    }
    s.trace = *gen_trace(shape);
    return s;
  });
}

}  // namespace dflash::prop
