// An independent float64 evaluation of docs/spec/drafter.md §3-§5 that carries, beside every value, a
// first-order bound on how far an evaluation of the same formulas in a lower precision (unit
// roundoff u, any summation order) can be from it. Property 9 holds the fp32 reference to these
// bounds against its fp64 mode; the derivation is in docs/properties.md ("Property 9").
//
// Error model per operation (γ(n) = n·u / (1 − n·u), first order, E = bound of the input error):
//   dot products / GEMV rows + bias:  Σ E_x·|W| + γ(K + bias)·(Σ |x·W| + |b|)
//   RMSNorm (n values):  δS = Σ 2|x|E + γ(n)·S;  δm = δS/n + γ(2)·m + u·eps;
//                        δinv = inv·(δm/(2m) + γ(2));  E_y = |w|(E·inv + |x|·δinv) + γ(2)|y|
//   RoPE:  E = |c|E_a + |s|E_b + γ(2)(|a·c| + |b·s|)   (cos/sin are the same fp32 table in every mode)
//   scores: scale·(Σ E_q|k| + |q|E_k) + γ(d + 2)·scale·Σ|q||k|   (+2: scale rounding, multiply)
//   softmax: Δ_j = E_S_j + u|S_j − max|;  E_p_j = p_j(Δ_j + Σ_l p_l Δ_l + γ(n + 4))
//            (exp ≤ 1 ulp on the value and in the sum, n−1 additions, one division)
//   attention output: Σ_j (E_p_j|V_j| + p_j E_V_j) + γ(n)·Σ_j p_j|V_j|
//   silu(g)·up: (|silu'(g)| + E_g/2)|up|E_g + |silu(g)|E_up + γ(8)|silu(g)·up|
//            (mean value theorem, |silu''| ≤ 1/2; exp, 4 ops, product)
//   residual: E_h + E_o + u|h + o|
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/rope.h"
#include "core/tensor.h"
#include "core/weights.h"

namespace dflash::prop {

// Values and their error bounds, row-major [rows, cols]. As a recorded stage it also carries the
// validity of its first-order bounds: the largest relative perturbation met so far (rho) and the
// number of bounded operations evaluated before it (depth, at least the longest path's length).
struct Bounded {
  int64_t rows = 0, cols = 0;
  std::vector<double> value, bound;
  double rho = 0;
  int depth = 0;

  Bounded() = default;
  Bounded(int64_t r, int64_t c)
      : rows(r), cols(c), value(static_cast<size_t>(r * c), 0.0), bound(static_cast<size_t>(r * c), 0.0) {}
  double& v(int64_t r, int64_t c) { return value[static_cast<size_t>(r * cols + c)]; }
  double& e(int64_t r, int64_t c) { return bound[static_cast<size_t>(r * cols + c)]; }
  double v(int64_t r, int64_t c) const { return value[static_cast<size_t>(r * cols + c)]; }
  double e(int64_t r, int64_t c) const { return bound[static_cast<size_t>(r * cols + c)]; }
};

class ShadowDrafter {
 public:
  // ctx_cap 0 = uncapped; u: the unit roundoff of the evaluation being bounded.
  ShadowDrafter(const DrafterConfig& config, const DrafterWeights& weights, int64_t ctx_cap, double unit_roundoff);

  // One sequence's propose: `ctx` [C, nT·Ht] holds positions start−C .. start−1. Returns every tap
  // of docs/spec/drafter.md §7 and "logits", with bounds, at block width `width` (already clamped).
  std::map<std::string, Bounded> propose(int seq, const Tensor& ctx, int64_t start, int anchor, int width);
  void release(int seq) { windows_.erase(seq); }

  // The bound of an evaluation including the dropped higher-order terms: each operation's Taylor
  // remainder is at most 2·rho times its first-order term while rho <= 2^-5, compounded over the
  // operations before the stage. Returns 0 when rho is larger (the derivation does not apply).
  static double remainder_factor(const Bounded& stage);

 private:
  struct CachedRow {
    int64_t position = 0;
    std::vector<Bounded> k, v;  // per layer, [1, nkv·d]; k after k_norm and RoPE
  };

  double gamma(int64_t n) const;
  Bounded linear(const Bounded& x, const Tensor& w, const Tensor& bias);
  void rms_norm(Bounded* x, int64_t col0, int64_t n, const Tensor& w);
  void norm_heads(Bounded* x, int heads, const Tensor& w);
  void rope(Bounded* x, int heads, const std::vector<int64_t>& positions);
  Bounded attention(int layer, const Bounded& q, const Bounded& k, const Bounded& v, const std::deque<CachedRow>& window);
  Bounded silu_mul(const Bounded& gate, const Bounded& up);
  Bounded add(const Bounded& a, const Bounded& b);

  DrafterConfig config_;
  const DrafterWeights& weights_;
  int64_t ctx_cap_;
  double u_;
  RopeTable rope_;
  std::map<int, std::deque<CachedRow>> windows_;
  Bounded stage(const Bounded& b) const;  // b stamped with the current rho and depth

  double worst_ = 0;          // in the current propose, cached context rows' included
  double context_worst_ = 0;  // over every context ingestion so far
  int depth_ = 0;  // bounded operations evaluated in the current propose
};

}  // namespace dflash::prop
