#include "tests/properties/shadow_forward.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/stages.h"

namespace dflash::prop {
namespace {

Bounded exact_rows(const Tensor& t, int64_t first_row, int64_t rows) {
  Bounded b(rows, t.cols());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < t.cols(); ++c) b.v(r, c) = t.row(first_row + r)[c];
  }
  return b;
}

Bounded slice_rows(const Bounded& x, int64_t first, int64_t count) {
  Bounded out(count, x.cols);
  std::copy(x.value.begin() + first * x.cols, x.value.begin() + (first + count) * x.cols, out.value.begin());
  std::copy(x.bound.begin() + first * x.cols, x.bound.begin() + (first + count) * x.cols, out.bound.begin());
  return out;
}

double sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

}  // namespace

ShadowDrafter::ShadowDrafter(const DrafterConfig& config, const DrafterWeights& weights, int64_t ctx_cap,
                             double unit_roundoff)
    : config_(config),
      weights_(weights),
      ctx_cap_(ctx_cap),
      u_(unit_roundoff),
      rope_(make_rope_table(config.rope, config.head_dim)) {}

double ShadowDrafter::remainder_factor(const Bounded& stage) {
  if (stage.rho > 0x1p-5) return 0.0;
  return std::pow(1.0 + 2.0 * stage.rho, stage.depth);
}

Bounded ShadowDrafter::stage(const Bounded& b) const {
  Bounded out = b;
  out.rho = worst_;
  out.depth = depth_;
  return out;
}

double ShadowDrafter::gamma(int64_t n) const {
  const double nu = static_cast<double>(n) * u_;
  if (nu >= 0.5) throw internal_error("shadow: gamma(" + std::to_string(n) + ") is not small; the bound does not apply");
  return nu / (1.0 - nu);
}

Bounded ShadowDrafter::linear(const Bounded& x, const Tensor& w, const Tensor& bias) {
  const int64_t out = w.shape[0], in = w.shape[1];
  const bool has_bias = !bias.values.empty();
  const double g = gamma(in + (has_bias ? 1 : 0));
  ++depth_;
  Bounded y(x.rows, out);
  for (int64_t m = 0; m < x.rows; ++m) {
    for (int64_t n = 0; n < out; ++n) {
      const float* wr = w.row(n);
      double sum = 0, magnitude = 0, propagated = 0;
      for (int64_t k = 0; k < in; ++k) {
        sum += x.v(m, k) * wr[k];
        magnitude += std::fabs(x.v(m, k) * wr[k]);
        propagated += x.e(m, k) * std::fabs(wr[k]);
      }
      const double b = has_bias ? bias.values[static_cast<size_t>(n)] : 0.0;
      y.v(m, n) = sum + b;
      y.e(m, n) = propagated + g * (magnitude + std::fabs(b));
    }
  }
  return y;
}

void ShadowDrafter::rms_norm(Bounded* x, int64_t col0, int64_t n, const Tensor& w) {
  const double eps = config_.rms_norm_eps;
  ++depth_;
  for (int64_t r = 0; r < x->rows; ++r) {
    double squares = 0, propagated = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x->v(r, col0 + i);
      squares += xi * xi;
      propagated += 2.0 * std::fabs(xi) * x->e(r, col0 + i);
    }
    const double m = squares / static_cast<double>(n) + eps;
    const double dm = (propagated + gamma(n) * squares) / static_cast<double>(n) + gamma(2) * m + u_ * eps;
    const double inv = 1.0 / std::sqrt(m);
    const double dinv = inv * (dm / (2.0 * m) + gamma(2));
    worst_ = std::max(worst_, dm / m);
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x->v(r, col0 + i), wi = w.values[static_cast<size_t>(i)];
      const double y = wi * xi * inv;
      x->e(r, col0 + i) = std::fabs(wi) * (x->e(r, col0 + i) * inv + std::fabs(xi) * dinv) + gamma(2) * std::fabs(y);
      x->v(r, col0 + i) = y;
    }
  }
}

void ShadowDrafter::norm_heads(Bounded* x, int heads, const Tensor& w) {
  for (int h = 0; h < heads; ++h) rms_norm(x, static_cast<int64_t>(h) * config_.head_dim, config_.head_dim, w);
}

void ShadowDrafter::rope(Bounded* x, int heads, const std::vector<int64_t>& positions) {
  const int64_t half = config_.head_dim / 2;
  ++depth_;
  std::vector<float> cos(static_cast<size_t>(half)), sin(static_cast<size_t>(half));
  for (int64_t r = 0; r < x->rows; ++r) {
    rope_cos_sin(rope_, positions[static_cast<size_t>(r)], cos.data(), sin.data());
    for (int h = 0; h < heads; ++h) {
      const int64_t base = static_cast<int64_t>(h) * config_.head_dim;
      for (int64_t j = 0; j < half; ++j) {
        const double c = cos[static_cast<size_t>(j)], s = sin[static_cast<size_t>(j)];
        const double a = x->v(r, base + j), b = x->v(r, base + j + half);
        const double ea = x->e(r, base + j), eb = x->e(r, base + j + half);
        const double rounding = gamma(2) * (std::fabs(a * c) + std::fabs(b * s));
        const double rounding_other = gamma(2) * (std::fabs(b * c) + std::fabs(a * s));
        x->v(r, base + j) = a * c - b * s;
        x->v(r, base + j + half) = b * c + a * s;
        x->e(r, base + j) = std::fabs(c) * ea + std::fabs(s) * eb + rounding;
        x->e(r, base + j + half) = std::fabs(c) * eb + std::fabs(s) * ea + rounding_other;
      }
    }
  }
}

Bounded ShadowDrafter::attention(int layer, const Bounded& q, const Bounded& k, const Bounded& v,
                                 const std::deque<CachedRow>& window) {
  const int64_t d = config_.head_dim;
  const int group = config_.num_heads / config_.num_kv_heads;
  const int64_t ctx = static_cast<int64_t>(window.size());
  const int64_t keys = ctx + q.rows;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double g_score = gamma(d + 2), g_softmax = gamma(keys + 4), g_sum = gamma(keys);
  depth_ += 3;  // scores, softmax, weighted sum
  Bounded out(q.rows, q.cols);
  std::vector<double> s(static_cast<size_t>(keys)), es(static_cast<size_t>(keys)), p(static_cast<size_t>(keys)),
      ep(static_cast<size_t>(keys));
  // Key / value j of kv head kvh: the window in position order, then the block rows.
  auto key = [&](int64_t j, int64_t col, bool value_side, double* val, double* err) {
    const Bounded& m = j < ctx ? (value_side ? window[static_cast<size_t>(j)].v[static_cast<size_t>(layer)]
                                             : window[static_cast<size_t>(j)].k[static_cast<size_t>(layer)])
                               : (value_side ? v : k);
    const int64_t row = j < ctx ? 0 : j - ctx;
    *val = m.v(row, col);
    *err = m.e(row, col);
  };
  for (int64_t i = 0; i < q.rows; ++i) {
    for (int h = 0; h < config_.num_heads; ++h) {
      const int64_t qc = static_cast<int64_t>(h) * d, kc = static_cast<int64_t>(h / group) * d;
      double max_s = -INFINITY;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0, magnitude = 0, propagated = 0;
        for (int64_t t = 0; t < d; ++t) {
          double kv, ke;
          key(j, kc + t, false, &kv, &ke);
          const double qv = q.v(i, qc + t), qe = q.e(i, qc + t);
          dot += qv * kv;
          magnitude += std::fabs(qv * kv);
          propagated += qe * std::fabs(kv) + std::fabs(qv) * ke;
        }
        s[static_cast<size_t>(j)] = dot * scale;
        es[static_cast<size_t>(j)] = scale * (propagated + g_score * magnitude);
        max_s = std::max(max_s, s[static_cast<size_t>(j)]);
      }
      double total = 0;
      for (int64_t j = 0; j < keys; ++j) total += std::exp(s[static_cast<size_t>(j)] - max_s);
      double mean_delta = 0;
      for (int64_t j = 0; j < keys; ++j) {
        p[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - max_s) / total;
        es[static_cast<size_t>(j)] += u_ * std::fabs(s[static_cast<size_t>(j)] - max_s);  // Δ_j
        mean_delta += p[static_cast<size_t>(j)] * es[static_cast<size_t>(j)];
        worst_ = std::max(worst_, es[static_cast<size_t>(j)]);
      }
      for (int64_t j = 0; j < keys; ++j) {
        ep[static_cast<size_t>(j)] = p[static_cast<size_t>(j)] * (es[static_cast<size_t>(j)] + mean_delta + g_softmax);
      }
      for (int64_t t = 0; t < d; ++t) {
        double acc = 0, magnitude = 0, propagated = 0;
        for (int64_t j = 0; j < keys; ++j) {
          double vv, ve;
          key(j, kc + t, true, &vv, &ve);
          acc += p[static_cast<size_t>(j)] * vv;
          magnitude += p[static_cast<size_t>(j)] * std::fabs(vv);
          propagated += ep[static_cast<size_t>(j)] * std::fabs(vv) + p[static_cast<size_t>(j)] * ve;
        }
        out.v(i, qc + t) = acc;
        out.e(i, qc + t) = propagated + g_sum * magnitude;
      }
    }
  }
  return out;
}

Bounded ShadowDrafter::silu_mul(const Bounded& gate, const Bounded& up) {
  ++depth_;
  Bounded out(gate.rows, gate.cols);
  for (size_t i = 0; i < gate.value.size(); ++i) {
    const double g = gate.value[i], sg = sigmoid(g);
    // Mean value theorem with |silu''| <= 1/2: the slope anywhere within E_g of g.
    const double silu = g * sg, slope = std::fabs(sg * (1.0 + g * (1.0 - sg))) + 0.5 * gate.bound[i];
    out.value[i] = silu * up.value[i];
    out.bound[i] = std::fabs(slope * up.value[i]) * gate.bound[i] + std::fabs(silu) * up.bound[i] +
                   gamma(8) * std::fabs(out.value[i]);
    worst_ = std::max(worst_, gate.bound[i]);
  }
  return out;
}

Bounded ShadowDrafter::add(const Bounded& a, const Bounded& b) {
  ++depth_;
  Bounded out(a.rows, a.cols);
  for (size_t i = 0; i < a.value.size(); ++i) {
    out.value[i] = a.value[i] + b.value[i];
    out.bound[i] = a.bound[i] + b.bound[i] + u_ * std::fabs(out.value[i]);
  }
  return out;
}

std::map<std::string, Bounded> ShadowDrafter::propose(int seq, const Tensor& ctx, int64_t start, int anchor, int width) {
  std::map<std::string, Bounded> taps;
  depth_ = 0;
  worst_ = context_worst_;  // cached rows carry what their own ingestion met
  const int64_t count = ctx.rows();
  const int64_t kept = ctx_cap_ > 0 ? std::min(count, ctx_cap_) : count;
  const Tensor none;

  // Context rows entering the window: projected, normalized, their K/V cached per layer.
  Bounded xc = linear(exact_rows(ctx, count - kept, kept), weights_.fc, none);
  rms_norm(&xc, 0, xc.cols, weights_.hidden_norm);
  taps[stage_name(StageKind::kCtxProj)] = stage(xc);
  std::vector<int64_t> ctx_positions;
  for (int64_t r = 0; r < kept; ++r) ctx_positions.push_back(start - kept + r);
  std::deque<CachedRow>& window = windows_[seq];
  std::vector<CachedRow> entering(static_cast<size_t>(kept));
  for (int64_t r = 0; r < kept; ++r) entering[static_cast<size_t>(r)].position = ctx_positions[static_cast<size_t>(r)];
  for (int l = 0; l < config_.num_layers; ++l) {
    const LayerWeights& L = weights_.layers[static_cast<size_t>(l)];
    Bounded k = linear(xc, L.k_proj, L.k_bias);
    norm_heads(&k, config_.num_kv_heads, L.k_norm);
    rope(&k, config_.num_kv_heads, ctx_positions);
    const Bounded v = linear(xc, L.v_proj, L.v_bias);
    for (int64_t r = 0; r < kept; ++r) {
      entering[static_cast<size_t>(r)].k.push_back(slice_rows(k, r, 1));
      entering[static_cast<size_t>(r)].v.push_back(slice_rows(v, r, 1));
    }
  }
  context_worst_ = std::max(context_worst_, worst_);
  for (CachedRow& row : entering) window.push_back(std::move(row));
  while (ctx_cap_ > 0 && static_cast<int64_t>(window.size()) > ctx_cap_) window.pop_front();

  // The block: anchor then mask tokens at positions start .. start+B-1.
  Bounded h(width, config_.hidden_size);
  std::vector<int64_t> positions;
  for (int i = 0; i < width; ++i) {
    const float* e = weights_.embed_tokens.row(i == 0 ? anchor : config_.mask_token_id);
    for (int64_t c = 0; c < h.cols; ++c) h.v(i, c) = e[c];
    positions.push_back(start + i);
  }
  taps[stage_name(StageKind::kEmbed)] = stage(h);
  for (int l = 0; l < config_.num_layers; ++l) {
    const LayerWeights& L = weights_.layers[static_cast<size_t>(l)];
    Bounded x = h;
    rms_norm(&x, 0, x.cols, L.input_layernorm);
    taps[stage_name(StageKind::kAttnNorm, l)] = stage(x);
    Bounded q = linear(x, L.q_proj, L.q_bias);
    norm_heads(&q, config_.num_heads, L.q_norm);
    rope(&q, config_.num_heads, positions);
    taps[stage_name(StageKind::kQ, l)] = stage(q);
    Bounded k = linear(x, L.k_proj, L.k_bias);
    norm_heads(&k, config_.num_kv_heads, L.k_norm);
    rope(&k, config_.num_kv_heads, positions);
    taps[stage_name(StageKind::kK, l)] = stage(k);
    const Bounded v = linear(x, L.v_proj, L.v_bias);
    taps[stage_name(StageKind::kV, l)] = stage(v);
    const Bounded attn = attention(l, q, k, v, window);
    taps[stage_name(StageKind::kAttn, l)] = stage(attn);
    const Bounded o = linear(attn, L.o_proj, L.o_bias);
    taps[stage_name(StageKind::kOProj, l)] = stage(o);
    h = add(h, o);
    Bounded y = h;
    rms_norm(&y, 0, y.cols, L.post_attention_layernorm);
    taps[stage_name(StageKind::kMlpNorm, l)] = stage(y);
    const Bounded z = silu_mul(linear(y, L.gate_proj, none), linear(y, L.up_proj, none));
    const Bounded mlp = linear(z, L.down_proj, none);
    taps[stage_name(StageKind::kMlp, l)] = stage(mlp);
    h = add(h, mlp);
    taps[stage_name(StageKind::kOut, l)] = stage(h);
  }
  rms_norm(&h, 0, h.cols, weights_.norm);
  taps[stage_name(StageKind::kFinalNorm)] = stage(h);
  taps[stage_name(StageKind::kLogits)] = stage(linear(slice_rows(h, 1, width - 1), weights_.lm_head, none));
  return taps;
}

}  // namespace dflash::prop
