#include "reference/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/rope.h"
#include "core/stages.h"
#include "reference/aligned_matrix.h"
#include "reference/attention.h"
#include "reference/candidate_selector.h"
#include "reference/grouped_conv.h"
#include "reference/head_ops.h"
#include "reference/kv_store.h"
#include "reference/ops/ops.h"
#include "reference/prepared_weights.h"
#include "reference/stage_policy.h"
#include "reference/tap_recorder.h"
#include "reference/thread_pool.h"

namespace dflash {
namespace {

template <typename T>
class Engine final : public DrafterEngine {
 public:
  Engine(const DrafterConfig& config, const DrafterWeights& weights, const StagePolicy& policy, int64_t num_slots,
         int threads)
      : config_(config),
        policy_(policy),
        pool_(threads),
        weights_(weights, policy, pool_),
        rope_(make_rope_table(config.rope, config.head_dim)),
        kv_(config.num_layers, num_slots, config.kv_dim()),
        eps_(static_cast<T>(config.rms_norm_eps)),
        geometry_{config.num_heads, config.num_kv_heads, config.head_dim} {}

  void ingest(const std::vector<SequenceStep>& steps) override { ingest_context(steps, false, nullptr); }

  KvRows read_kv(int layer, const std::vector<int64_t>& slots) const override {
    if (layer < 0 || layer >= config_.num_layers) throw bad_input("read_kv: no layer " + std::to_string(layer));
    const AlignedMatrix<T>& k_pool = kv_.k[static_cast<size_t>(layer)];
    const AlignedMatrix<T>& v_pool = kv_.v[static_cast<size_t>(layer)];
    const int64_t n = static_cast<int64_t>(slots.size()), cols = k_pool.cols();
    KvRows out{Tensor::zeros({n, cols}), Tensor::zeros({n, cols})};
    for (int64_t i = 0; i < n; ++i) {
      const int64_t slot = slots[static_cast<size_t>(i)];
      if (slot < 0 || slot >= k_pool.rows()) {
        throw bad_input("read_kv: slot " + std::to_string(slot) + " outside the pool of " +
                        std::to_string(k_pool.rows()));
      }
      for (int64_t c = 0; c < cols; ++c) {
        out.k.row(i)[c] = static_cast<float>(k_pool.row(slot)[c]);
        out.v.row(i)[c] = static_cast<float>(v_pool.row(slot)[c]);
      }
    }
    return out;
  }

  void poison(const std::vector<int64_t>& slots) override {
    const T nan = std::numeric_limits<T>::quiet_NaN();
    for (int l = 0; l < config_.num_layers; ++l) {
      for (AlignedMatrix<T>* pool : {&kv_.k[static_cast<size_t>(l)], &kv_.v[static_cast<size_t>(l)]}) {
        for (int64_t slot : slots) std::fill(pool->row(slot), pool->row(slot) + pool->cols(), nan);
      }
    }
  }

  std::string compute_type() const override { return policy_.use_double ? "double" : "float"; }
  int threads() const override { return pool_.threads(); }

  std::vector<ProposeOutput> propose(const std::vector<SequenceStep>& steps, int block_width, bool want_taps) override {
    std::vector<ProposeOutput> outputs(steps.size());
    for (size_t b = 0; b < steps.size(); ++b) {
      outputs[b].seq = steps[b].seq;
      outputs[b].block_width = block_width;
    }
    ingest_context(steps, want_taps, &outputs);
    forward_block(steps, block_width, want_taps, &outputs);
    return outputs;
  }

 private:
  // Rows [begin, end) of m: RMSNorm with `weight`, in place.
  void norm_rows(AlignedMatrix<T>* m, int64_t begin, int64_t end, const std::vector<T>& weight) {
    for (int64_t r = begin; r < end; ++r) ops::rms_norm(m->row(r), weight.data(), static_cast<size_t>(m->cols()), eps_, m->row(r));
  }

  // docs/spec/drafter.md §3 step 1 and the context half of step 3: the rows entering each window, projected,
  // normalized, and their K/V (k_norm + RoPE at their positions) written to the pools once.
  void ingest_context(const std::vector<SequenceStep>& steps, bool want_taps, std::vector<ProposeOutput>* outputs) {
    int64_t total = 0;
    std::vector<int64_t> offset(steps.size());
    for (size_t b = 0; b < steps.size(); ++b) {
      offset[b] = total;
      total += static_cast<int64_t>(steps[b].new_slots.size());
    }
    const int64_t features = config_.ctx_feature_dim();
    AlignedMatrix<T> f(total, features);
    std::vector<int64_t> positions(static_cast<size_t>(total));
    for (size_t b = 0; b < steps.size(); ++b) {
      const SequenceStep& s = steps[b];
      for (size_t i = 0; i < s.new_slots.size(); ++i) {
        const int64_t r = offset[b] + static_cast<int64_t>(i);
        const float* src = s.ctx->row(s.first_row + static_cast<int64_t>(i));
        T* dst = f.row(r);
        for (int64_t c = 0; c < features; ++c) dst[c] = static_cast<T>(src[c]);
        positions[static_cast<size_t>(r)] = s.first_position + static_cast<int64_t>(i);
      }
    }
    AlignedMatrix<T> xc(total, config_.hidden_size);
    weights_.fc.apply(f, total, &xc, pool_);
    norm_rows(&xc, 0, total, weights_.hidden_norm);
    round_stage_to_bf16(policy_, &xc, 0, total);
    if (want_taps) {
      for (size_t b = 0; b < steps.size(); ++b) {
        append_tap(&(*outputs)[b], stage_name(StageKind::kCtxProj), xc, offset[b], static_cast<int64_t>(steps[b].new_slots.size()));
      }
    }
    if (total == 0) return;

    const RopeRows<T> rope = make_rope_rows<T>(rope_, positions);
    AlignedMatrix<T> k(total, config_.kv_dim()), v(total, config_.kv_dim());
    for (int l = 0; l < config_.num_layers; ++l) {
      const PreparedLayer<T>& L = weights_.layers[static_cast<size_t>(l)];
      L.k_proj.apply(xc, total, &k, pool_);
      norm_and_rotate_heads(&k, total, config_.num_kv_heads, config_.head_dim, L.k_norm, eps_, rope, 0);
      round_stage_to_bf16(policy_, &k, 0, total, truncates(kTruncatedKvStoreSite));
      L.v_proj.apply(xc, total, &v, pool_);
      round_stage_to_bf16(policy_, &v, 0, total, truncates(kTruncatedKvStoreSite));
      AlignedMatrix<T>& k_pool = kv_.k[static_cast<size_t>(l)];
      AlignedMatrix<T>& v_pool = kv_.v[static_cast<size_t>(l)];
      for (size_t b = 0; b < steps.size(); ++b) {
        for (size_t i = 0; i < steps[b].new_slots.size(); ++i) {
          const int64_t r = offset[b] + static_cast<int64_t>(i);
          const int64_t slot = steps[b].new_slots[i];
          std::copy(k.row(r), k.row(r) + k.cols(), k_pool.row(slot));
          std::copy(v.row(r), v.row(r) + v.cols(), v_pool.row(slot));
        }
      }
    }
  }

  void tap_block(bool want_taps, std::vector<ProposeOutput>* outputs, const std::string& name, const AlignedMatrix<T>& m,
                 int64_t block_width) {
    if (!want_taps) return;
    for (size_t b = 0; b < outputs->size(); ++b) {
      append_tap(&(*outputs)[b], name, m, static_cast<int64_t>(b) * block_width, block_width);
    }
  }

  // docs/spec/drafter.md §3 steps 2-4 for every sequence's block rows (sequence b owns rows
  // [b·B, (b+1)·B) of every matrix here).
  void forward_block(const std::vector<SequenceStep>& steps, int block_width, bool want_taps,
                     std::vector<ProposeOutput>* outputs) {
    const int64_t B = block_width;
    const int64_t rows = static_cast<int64_t>(steps.size()) * B;
    const int64_t H = config_.hidden_size;
    const Dflash2Config& d2 = config_.dflash2;
    std::vector<int64_t> positions(static_cast<size_t>(rows));
    AlignedMatrix<T> h(rows, H);
    const T embed_scale = static_cast<T>(d2.enabled ? d2.input_embedding_scale : 1.0);
    for (size_t b = 0; b < steps.size(); ++b) {
      for (int64_t i = 0; i < B; ++i) {
        const int64_t r = static_cast<int64_t>(b) * B + i;
        const int token = i == 0 ? steps[b].anchor : config_.mask_token_id;
        const float* src = weights_.embed_tokens->row(token);
        T* dst = h.row(r);
        for (int64_t c = 0; c < H; ++c) dst[c] = static_cast<T>(src[c]) * embed_scale;
        positions[static_cast<size_t>(r)] = steps[b].start + i;
      }
    }
    tap_block(want_taps, outputs, stage_name(StageKind::kEmbed), h, B);
    const RopeRows<T> rope = make_rope_rows<T>(rope_, positions);

    AlignedMatrix<T> x(rows, H), q(rows, config_.q_dim()), k(rows, config_.kv_dim()), v(rows, config_.kv_dim());
    AlignedMatrix<T> attn(rows, config_.q_dim()), o(rows, H);
    AlignedMatrix<T> gate(rows, config_.intermediate_size), up(rows, config_.intermediate_size), mlp(rows, H);
    AlignedMatrix<T> coef(rows, d2.enabled ? config_.conv_coef_dim() : 0), conv(rows, d2.enabled ? H : 0);
    for (int l = 0; l < config_.num_layers; ++l) {
      const PreparedLayer<T>& L = weights_.layers[static_cast<size_t>(l)];
        // x = input_layernorm(h)
      x = h;
      norm_rows(&x, 0, rows, L.input_norm);
      round_stage_to_bf16(policy_, &x, 0, rows);
      tap_block(want_taps, outputs, stage_name(StageKind::kAttnNorm, l), x, B);
      if (d2.enabled) {  // x = attention_conv.prepare(x); its side-1 coefficients stay in `coef`
        conv_prepare(L.attn_conv_proj, L.attn_conv_base, &x, &coef, &conv, steps.size(), B);
        tap_block(want_taps, outputs, stage_name(StageKind::kAttnConvCoef, l), coef, B);
        tap_block(want_taps, outputs, stage_name(StageKind::kAttnConvIn, l), x, B);
      }
      // q, k, v of the block rows
      L.q_proj.apply(x, rows, &q, pool_);
      norm_and_rotate_heads(&q, rows, config_.num_heads, config_.head_dim, L.q_norm, eps_, rope, 0);
      round_stage_to_bf16(policy_, &q, 0, rows);
      tap_block(want_taps, outputs, stage_name(StageKind::kQ, l), q, B);
      L.k_proj.apply(x, rows, &k, pool_);
      norm_and_rotate_heads(&k, rows, config_.num_kv_heads, config_.head_dim, L.k_norm, eps_, rope, 0);
      round_stage_to_bf16(policy_, &k, 0, rows);
      tap_block(want_taps, outputs, stage_name(StageKind::kK, l), k, B);
      L.v_proj.apply(x, rows, &v, pool_);
      round_stage_to_bf16(policy_, &v, 0, rows);
      tap_block(want_taps, outputs, stage_name(StageKind::kV, l), v, B);
      // attention: one task per (sequence, kv head), each writing its own rows and columns
      const AlignedMatrix<T>& k_pool = kv_.k[static_cast<size_t>(l)];
      const AlignedMatrix<T>& v_pool = kv_.v[static_cast<size_t>(l)];
      const size_t kv_heads = static_cast<size_t>(config_.num_kv_heads);
      const int64_t window_left =
          d2.enabled && d2.sliding[static_cast<size_t>(l)] ? static_cast<int64_t>(d2.sliding_window) - 1 : -1;
      pool_.run(steps.size() * kv_heads, [&](size_t task) {
        const size_t b = task / kv_heads;
        const int kv_head = static_cast<int>(task % kv_heads);
        int kv_source = kv_head;
#ifdef DFLASH_FAULT_POINTS
        // The planted bug: rank r's KV heads [r·KV/N, (r+1)·KV/N) are rank r + 1's (mod N).
        if (policy_.tp_fault == TpFault::kWrongShardKvHeads) {
          kv_source = (kv_head + config_.num_kv_heads / policy_.tp_size) % config_.num_kv_heads;
        }
#endif
        attend_kv_group(geometry_, kv_head, static_cast<int64_t>(b) * B, B, q, k, v, k_pool, v_pool,
                        steps[b].window_slots, window_left, &attn, causal_block(), kv_source);
      });
      round_stage_to_bf16(policy_, &attn, 0, rows);
      tap_block(want_taps, outputs, stage_name(StageKind::kAttn, l), attn, B);
      // h = h + o_proj(attn)
      std::vector<AlignedMatrix<T>> partials;  // TP > 1 with taps: each rank's, as it enters the reduction
      const bool partial_taps = want_taps && policy_.tp_size > 1;
      L.o_proj.apply(attn, rows, &o, pool_, partial_taps ? &partials : nullptr);
      for (size_t r = 0; r < partials.size(); ++r) {
        tap_block(want_taps, outputs, stage_name(StageKind::kOProj, l, static_cast<int>(r)), partials[r], B);
      }
      tap_block(want_taps, outputs, stage_name(StageKind::kOProj, l), o, B);
      if (d2.enabled) {
        conv_finish(L.attn_conv_base, coef, &o, &conv, steps.size(), B);
        tap_block(want_taps, outputs, stage_name(StageKind::kAttnConvOut, l), o, B);
      }
      for (int64_t r = 0; r < rows; ++r) ops::add_inplace(h.row(r), o.row(r), static_cast<size_t>(H));
      // h = h + down(silu(gate(y)) * up(y)), y = post_attention_layernorm(h)
      x = h;
      norm_rows(&x, 0, rows, L.post_attention_norm);
      round_stage_to_bf16(policy_, &x, 0, rows);
      tap_block(want_taps, outputs, stage_name(StageKind::kMlpNorm, l), x, B);
      if (d2.enabled) {
        conv_prepare(L.mlp_conv_proj, L.mlp_conv_base, &x, &coef, &conv, steps.size(), B);
        tap_block(want_taps, outputs, stage_name(StageKind::kMlpConvCoef, l), coef, B);
        tap_block(want_taps, outputs, stage_name(StageKind::kMlpConvIn, l), x, B);
      }
      L.gate_proj.apply(x, rows, &gate, pool_);
      L.up_proj.apply(x, rows, &up, pool_);
      for (int64_t r = 0; r < rows; ++r) {
        ops::silu_mul(gate.row(r), up.row(r), static_cast<size_t>(config_.intermediate_size), gate.row(r));
      }
      round_stage_to_bf16(policy_, &gate, 0, rows, truncates(kTruncatedActivationSite));
      L.down_proj.apply(gate, rows, &mlp, pool_, partial_taps ? &partials : nullptr);
      for (size_t r = 0; r < partials.size(); ++r) {
        tap_block(want_taps, outputs, stage_name(StageKind::kMlp, l, static_cast<int>(r)), partials[r], B);
      }
      tap_block(want_taps, outputs, stage_name(StageKind::kMlp, l), mlp, B);
      if (d2.enabled) {
        conv_finish(L.mlp_conv_base, coef, &mlp, &conv, steps.size(), B);
        tap_block(want_taps, outputs, stage_name(StageKind::kMlpConvOut, l), mlp, B);
      }
      for (int64_t r = 0; r < rows; ++r) ops::add_inplace(h.row(r), mlp.row(r), static_cast<size_t>(H));
      tap_block(want_taps, outputs, stage_name(StageKind::kOut, l), h, B);
    }

    // hf = norm(h); logits of rows 1..B-1 of each sequence; drafts = argmax, lowest index on ties.
    norm_rows(&h, 0, rows, weights_.final_norm);
    round_stage_to_bf16(policy_, &h, 0, rows);
    tap_block(want_taps, outputs, stage_name(StageKind::kFinalNorm), h, B);
    const int64_t drafts = B - 1;
    AlignedMatrix<T> hf(static_cast<int64_t>(steps.size()) * drafts, H);
    for (size_t b = 0; b < steps.size(); ++b) {
      for (int64_t i = 0; i < drafts; ++i) {
        const T* src = h.row(static_cast<int64_t>(b) * B + 1 + i);
        std::copy(src, src + H, hf.row(static_cast<int64_t>(b) * drafts + i));
      }
    }
    const int64_t V = config_.vocab_size;
    AlignedMatrix<T> logits(hf.rows(), V);
    weights_.lm_head.apply(hf, hf.rows(), &logits, pool_);
    for (size_t b = 0; b < steps.size(); ++b) {
      ProposeOutput& out = (*outputs)[b];
      out.logits = Tensor::zeros({drafts, V});
      out.draft_tokens.resize(static_cast<size_t>(drafts));
      for (int64_t i = 0; i < drafts; ++i) {
        const T* row = logits.row(static_cast<int64_t>(b) * drafts + i);
        float* dst = out.logits.row(i);
        for (int64_t c = 0; c < V; ++c) dst[c] = static_cast<float>(row[c]);
        // On the compute type's own values: in fp64 mode two logits that round to one float stay apart.
        out.draft_tokens[static_cast<size_t>(i)] = static_cast<int32_t>(
            policy_.tp_size > 1 ? vocab_parallel_argmax(row, V) : ops::argmax(row, static_cast<size_t>(V)));
      }
      if (want_taps) out.taps.push_back(Tap{stage_name(StageKind::kLogits), out.logits});
    }
    if (d2.enabled) run_selector(steps, hf, logits, drafts, want_taps, outputs);
  }

  // docs/spec/tensor-parallel.md §5.2: each rank's best of its V/N tokens (lowest local index on
  // ties) with its global index r·V/N + local, merged: the greatest value, the lowest global index
  // on ties. Equal to the one-device argmax (stage_policy.h).
  int64_t vocab_parallel_argmax(const T* row, int64_t V) const {
    const int64_t n = policy_.tp_size, shard = V / n;
    int64_t best = -1;
    T best_value = T(0);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t local = static_cast<int64_t>(ops::argmax(row + r * shard, static_cast<size_t>(shard)));
      int64_t offset = r * shard;
#ifdef DFLASH_FAULT_POINTS
      if (policy_.tp_fault == TpFault::kVocabOffset && r > 0) offset = (r - 1) * shard;
#endif
      const T value = row[r * shard + local];  // each rank sends (its best value, its global index)
      const int64_t global = offset + local;
      if (best < 0 || value > best_value || (value == best_value && global < best)) best = global, best_value = value;
    }
    return best;
  }

  // docs/spec/dflash2.md §3.1: kernel_projection of x (all 2·k·ng coefficients, kept in `coef` for
  // finish), then x <- conv_0(x) per sequence block.
  void conv_prepare(const Linear<T>& projection, const std::vector<T>& base, AlignedMatrix<T>* x,
                    AlignedMatrix<T>* coef, AlignedMatrix<T>* scratch, size_t sequences, int64_t B) {
    const int64_t rows = static_cast<int64_t>(sequences) * B;
    projection.apply(*x, rows, coef, pool_);
    round_stage_to_bf16(policy_, coef, 0, rows);
    for (size_t b = 0; b < sequences; ++b)
      grouped_conv_block(conv_geometry(), 0, base, *coef, *x, static_cast<int64_t>(b) * B, B, scratch, conv_wraps());
    round_stage_to_bf16(policy_, scratch, 0, rows);
    std::swap(*x, *scratch);
  }

  // z <- conv_1(z) per sequence block, with the coefficients prepare computed from the sublayer's input.
  void conv_finish(const std::vector<T>& base, const AlignedMatrix<T>& coef, AlignedMatrix<T>* z,
                   AlignedMatrix<T>* scratch, size_t sequences, int64_t B) {
    for (size_t b = 0; b < sequences; ++b)
      grouped_conv_block(conv_geometry(), 1, base, coef, *z, static_cast<int64_t>(b) * B, B, scratch, conv_wraps());
    std::swap(*z, *scratch);
  }

  // The bf16 stores a planted RoundingFault may cut toward zero.
  enum RoundingSite { kTruncatedKvStoreSite, kTruncatedActivationSite };
#ifdef DFLASH_FAULT_POINTS
  bool conv_wraps() const { return policy_.dflash2_fault == Dflash2Fault::kConvWraps; }
  bool causal_block() const { return policy_.dflash2_fault == Dflash2Fault::kCausalBlock; }
  bool truncates(RoundingSite site) const {
    return policy_.rounding_fault == (site == kTruncatedKvStoreSite ? RoundingFault::kTruncatedKvStore
                                                                    : RoundingFault::kTruncatedActivation);
  }
#else
  static constexpr bool conv_wraps() { return false; }
  static constexpr bool causal_block() { return false; }
  static constexpr bool truncates(RoundingSite) { return false; }
#endif

  ConvGeometry conv_geometry() const {
    return {config_.dflash2.conv_kernel_size, config_.dflash2.conv_group_size, config_.hidden_size};
  }

  // docs/spec/dflash2.md §3.4: the walk's tokens replace the per-row argmax.
  void run_selector(const std::vector<SequenceStep>& steps, const AlignedMatrix<T>& hf, const AlignedMatrix<T>& logits,
                    int64_t drafts, bool want_taps, std::vector<ProposeOutput>* outputs) {
    const Dflash2Config& d2 = config_.dflash2;
    AlignedMatrix<T> hidden_proj(hf.rows(), d2.selector_rank);
    weights_.selector.hidden_projection.apply(hf, hf.rows(), &hidden_proj, pool_);
    const int64_t K = d2.selector_top_k;
    const AlignedMatrix<T>* candidates = &logits;
#ifdef DFLASH_FAULT_POINTS
    // The planted bug: rank 0's top-K of its own V/N columns stands for the merged one (§5.3).
    AlignedMatrix<T> shard0;
    if (policy_.tp_fault == TpFault::kShardTopKUnmerged) {
      shard0 = logits;
      const int64_t V = logits.cols(), shard = V / policy_.tp_size;
      for (int64_t row = 0; row < shard0.rows(); ++row) {
        std::fill(shard0.row(row) + shard, shard0.row(row) + V, -std::numeric_limits<T>::infinity());
      }
      candidates = &shard0;
    }
#endif
    for (size_t b = 0; b < steps.size(); ++b) {
      const SelectorResult<T> s = select_candidates(d2, weights_.selector, steps[b].anchor, *candidates, hidden_proj,
                                                    static_cast<int64_t>(b) * drafts, drafts);
      ProposeOutput& out = (*outputs)[b];
      out.draft_tokens = s.draft_tokens;
      if (!want_taps) continue;
      std::vector<float> ids(s.topk_ids.begin(), s.topk_ids.end());
      out.taps.push_back(Tap{stage_name(StageKind::kSelTopkIds), Tensor({drafts, K}, std::move(ids))});
      out.taps.push_back(Tap{stage_name(StageKind::kSelTopkValues), to_tensor({drafts, K}, s.topk_values)});
      out.taps.push_back(Tap{stage_name(StageKind::kSelUnary), to_tensor({drafts, K}, s.unary)});
      out.taps.push_back(Tap{stage_name(StageKind::kSelHiddenProj), to_tensor({drafts, d2.selector_rank}, s.hidden_proj)});
      out.taps.push_back(Tap{stage_name(StageKind::kSelEdgeScores), to_tensor({drafts, K, K}, s.edge_scores)});
      out.taps.push_back(Tap{stage_name(StageKind::kSelWalkScores), to_tensor({drafts, K}, s.walk_scores)});
    }
  }

  static Tensor to_tensor(std::vector<int64_t> shape, const std::vector<T>& values) {
    return Tensor(std::move(shape), std::vector<float>(values.begin(), values.end()));
  }

  const DrafterConfig config_;
  const StagePolicy policy_;
  ThreadPool pool_;  // before weights_: their preparation runs on it
  const PreparedWeights<T> weights_;
  const RopeTable rope_;
  KvStore<T> kv_;
  const T eps_;
  const AttentionGeometry geometry_;
};

}  // namespace

std::unique_ptr<DrafterEngine> make_drafter_engine(const DrafterConfig& config, const DrafterWeights& weights,
                                                   const StagePolicy& policy, int64_t num_slots, int threads) {
  if (policy.use_double) return std::make_unique<Engine<double>>(config, weights, policy, num_slots, threads);
  return std::make_unique<Engine<float>>(config, weights, policy, num_slots, threads);
}

}  // namespace dflash
