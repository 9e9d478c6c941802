// Paged attention (tuned d = 64/128/256, generic, simple) against a CPU loop in double: GQA, windows
// of 1 to several chunks starting mid-page, shuffled physical pages, block rows attending to each
// other, guard bands around the output; DFlash2 sliding layers (window_left = W - 1): block row i
// sees the context keys from position s + i - (W - 1) on, and the pool rows no block row sees are
// NaN, so a kernel that reads one fails (and with W in place of W - 1 must fail: the negative control).
//
// Error bound per output element (derivation): each score is a d-term fp32 dot product of bf16
// values, off by at most δs = (d + 2)·2^-23·scale·Σ|q·k|; a softmax weight's relative error is then
// at most 2·δs plus (T + 10 + 7·(C - 1))·2^-23 for the exp, the T-term sums and the fold of C
// chunks of 64 keys, plus 2^-16 for the tuned kernel's two-part p in P·V (below); the weighted mean
// of the values moves by at most that times max|v|; the final bf16 store adds u_bf16 = 2^-8 relative.
//
// The tuned kernel (tensor cores) under the same bound, with u = 2^-23 and the GEMM test's model of
// mma.sync (exact bf16 products; each addend folded into the fp32 accumulator costs at most one
// truncation, u relative to the running sum of magnitudes):
//  - score: d addends, the scale product and s - m: at most (d + 1.5)·u·scale·Σ|q·k| <= δs.
//  - P·V takes p as hi + mid (bf16 parts of the fp32 p, cuda/kernels/attention/attention_tiles.cuh): |p - hi| <= 2^-8·p
//    and |p - hi - mid| <= 2^-8·|p - hi| <= 2^-16·p, while l sums the fp32 p; so the numerator's
//    weights are off by at most 2^-16 relative against l's: at most 2^-16·max|v| on the output.
//  - a chunk's partial O: hi·V accumulates T_c <= 64 nonzero addends (T_c·u); mid·V goes to a
//    second accumulator at most 2^-8 of the first (< 0.5u), added once (0.5u): (T_c + 1)·u
//    relative to the chunk's Σp|v|. Chunk errors are relative to each chunk's own sum, so the merged
//    numerator carries at most (max_c T_c + 1)·u from them.
//  - l: per chunk a fixed tree of depth 6 (3u) over p's from expf (2u).
//  - The fold (fold_in, in chunk order, whole-window and combine alike): chunk c's l_c and O_c reach
//    the end through at most C - 1 inexact weights (the weight of a chunk holding the running
//    maximum is exp(0) = 1 exactly, as is every later weight while the maximum does not grow), each
//    2.2u (expf 2u, its argument's rounding 0.2u) and applied with a product (0.5u), and through at
//    most C - 1 adds (0.5u of the running magnitude): 3.2u·(C - 1) for the numerator and for l.
//  Total for C = 1 chunk: (T + 1 + 2) + (3 + 2) + 0.5 = (T + 8.5)·u. For C >= 2 chunks:
//  (64 + 1 + 2 + 3.2·(C - 1)) + (3 + 2 + 3.2·(C - 1)) + 0.5 = (66.1 + 6.4·C)·u, within
//  (T + 10 + 7·(C - 1))·u since T >= 64·(C - 1) + 1; with the split, + 2^-16. The CUDA-core and
//  simple kernels use the fp32 p (no split term) and stay within the rest as well.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "cuda/kernels/attention/attention.h"
#include "cuda/runtime/device_buffer.h"
#include "testing/gpu_test_util.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

struct Case {
  int head_dim, num_heads, num_kv_heads;
  std::string kernel;  // choose_attention_kernel request
  int width = 5;       // block width B
  std::vector<int32_t> window_length = {1, 64, 150};  // per sequence (the batch is their count)
  std::vector<int64_t> window_begin = {0, 37, 1000};
  int window_left = -1;  // W - 1 of a sliding layer; -1: full attention
};

// The first key (window index) block row i sees: as cuda/kernels/attention/attention.h states the rule.
int64_t first_seen(int window_left, int64_t len, int64_t i) {
  return window_left < 0 ? 0 : std::clamp<int64_t>(len - window_left + i, 0, len);
}

std::vector<uint16_t> random_bits(size_t count, uint64_t seed, float range) {
  std::vector<uint16_t> bits(count);
  for (size_t i = 0; i < count; ++i) bits[i] = float_to_bf16_bits(random_bf16(seed, 9, i, -range, range));
  return bits;
}

using gpu_test::to_device;

void run_case(const Case& c) {
  const int batch = static_cast<int>(c.window_length.size()), width = c.width, page = 16;
  const int d = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads, group = nh / nkv;
  const int64_t kv_dim = static_cast<int64_t>(nkv) * d, q_dim = static_cast<int64_t>(nh) * d;
  const std::vector<int64_t>& window_begin = c.window_begin;
  const std::vector<int32_t>& window_length = c.window_length;
  ASSERT_EQ(window_begin.size(), window_length.size());
  const int64_t max_window = *std::max_element(window_length.begin(), window_length.end()) + 10;
  int max_pages = static_cast<int>(max_window / page + 1);
  for (int b = 0; b < batch; ++b) {  // pages a window starting mid-page spans
    const int64_t begin = window_begin[static_cast<size_t>(b)], len = window_length[static_cast<size_t>(b)];
    max_pages = std::max(max_pages, static_cast<int>((begin + len - 1) / page - begin / page + 1));
  }
  const int max_chunks = static_cast<int>((max_window + width + kAttentionChunk - 1) / kAttentionChunk);
  const int num_pages = batch * max_pages;

  // Physical pages in a shuffled order, each sequence's logical pages from window_begin / page on.
  std::vector<int32_t> order(static_cast<size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  for (int i = num_pages - 1; i > 0; --i) std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>((i * 7919 + 13) % (i + 1))]);
  std::vector<int32_t> tables(static_cast<size_t>(batch * max_pages), -1);
  std::vector<int64_t> first_page(static_cast<size_t>(batch));
  int next = 0;
  for (int b = 0; b < batch; ++b) {
    first_page[static_cast<size_t>(b)] = window_begin[static_cast<size_t>(b)] / page;
    const int64_t last = (window_begin[static_cast<size_t>(b)] + window_length[static_cast<size_t>(b)] - 1) / page;
    for (int64_t lp = first_page[static_cast<size_t>(b)]; lp <= last; ++lp) {
      tables[static_cast<size_t>(b * max_pages + (lp - first_page[static_cast<size_t>(b)]))] = order[static_cast<size_t>(next++)];
    }
  }
  const int64_t slots = static_cast<int64_t>(num_pages) * page;
  std::vector<uint16_t> k_pool = random_bits(static_cast<size_t>(slots * kv_dim), 1, 1.0f);
  std::vector<uint16_t> v_pool = random_bits(static_cast<size_t>(slots * kv_dim), 2, 1.0f);
  int poisoned = 0;  // sliding: the window's rows before row 0's left edge are NaN (no row may read them)
  for (int b = 0; b < batch; ++b) {
    const int64_t begin = window_begin[static_cast<size_t>(b)];
    for (int64_t j = 0; j < first_seen(c.window_left, window_length[static_cast<size_t>(b)], 0); ++j, ++poisoned) {
      const int64_t pos = begin + j;
      const int32_t phys = tables[static_cast<size_t>(b * max_pages + (pos / page - first_page[static_cast<size_t>(b)]))];
      const int64_t slot = static_cast<int64_t>(phys) * page + pos % page;
      std::fill_n(k_pool.begin() + slot * kv_dim, kv_dim, uint16_t{0x7fc0});
      std::fill_n(v_pool.begin() + slot * kv_dim, kv_dim, uint16_t{0x7fc0});
    }
  }
  const int64_t rows = static_cast<int64_t>(batch) * width;
  const std::vector<uint16_t> q = random_bits(static_cast<size_t>(rows * q_dim), 3, 2.0f);
  const std::vector<uint16_t> k_block = random_bits(static_cast<size_t>(rows * kv_dim), 4, 1.0f);
  const std::vector<uint16_t> v_block = random_bits(static_cast<size_t>(rows * kv_dim), 5, 1.0f);

  // The tuned kernel's split-KV form, one chunk per CTA: the whole-window form and the walking
  // split-KV kernel are compared with it bit for bit below.
  AttentionChoice choice = choose_attention_kernel(c.kernel, d);
  choice.whole_window = WholeWindow::kOff;
  choice.walk_ctas = -1;
  const int64_t ld_out = q_dim + 8;  // guard columns after every row
  const uint16_t sentinel = 0x7fc1;  // a NaN pattern nothing writes
  std::vector<uint16_t> out_init(static_cast<size_t>((rows + 1) * ld_out), sentinel);  // plus a guard row

  auto dk = to_device(k_pool), dv = to_device(v_pool), dq = to_device(q);
  auto dkb = to_device(k_block), dvb = to_device(v_block);
  auto dtables = to_device(tables);
  auto dbegin = to_device(window_begin);
  auto dlen = to_device(window_length);
  auto dfirst = to_device(first_page);
  auto dout = to_device(out_init);
  DeviceBuffer<float> partial(static_cast<size_t>(attention_partial_floats(batch, nh, width, max_chunks, d)));
  DeviceBuffer<float> max_sum(static_cast<size_t>(attention_partial_floats(batch, nh, width, max_chunks, 2)));

  AttentionArgs a;
  a.q = dq.get();
  a.k_block = dkb.get();
  a.v_block = dvb.get();
  a.k_pool = dk.get();
  a.v_pool = dv.get();
  a.block_tables = dtables.get();
  a.window_begin = dbegin.get();
  a.window_length = dlen.get();
  a.first_logical_page = dfirst.get();
  a.max_pages_per_seq = max_pages;
  a.page_size = page;
  a.window_left = c.window_left;
  a.batch = batch;
  a.block_width = width;
  a.num_heads = nh;
  a.num_kv_heads = nkv;
  a.head_dim = d;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  a.max_chunks = max_chunks;
  ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&a.sm_count, cudaDevAttrMultiProcessorCount, 0));
  a.max_block_width = width;
  a.partial_out = partial.get();
  a.partial_max_sum = max_sum.get();
  a.out = dout.get();
  a.ld_out = ld_out;
  prepare_attention_kernels();
  // Runs one kernel choice on fresh buffers: the output back to the sentinel and the partials to
  // NaN, so that no run can pass on what an earlier one left behind.
  auto run_kernel = [&](const AttentionChoice& k) {
    std::vector<uint16_t> result(out_init.size());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(dout.get(), out_init.data(), out_init.size() * 2, cudaMemcpyHostToDevice));
    EXPECT_EQ(cudaSuccess, cudaMemset(partial.get(), 0xff, partial.size() * sizeof(float)));
    EXPECT_EQ(cudaSuccess, cudaMemset(max_sum.get(), 0xff, max_sum.size() * sizeof(float)));
    launch_attention(k, a, nullptr);
    EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(result.data(), dout.get(), result.size() * 2, cudaMemcpyDeviceToHost));
    return result;
  };
  const std::vector<uint16_t> out = run_kernel(choice);
  ASSERT_FALSE(testing::Test::HasFailure());
  // The tuned kernel's forms: split-KV (the choice above), split-KV walking runs of chunks over 3
  // CTAs per kv head and sequence, and whole-window (last).
  std::vector<AttentionChoice> forms = {choice};
  if (choice.kernel == AttentionKernel::kTuned) {
    forms.push_back(choice);
    forms.back().walk_ctas = 3;
    forms.push_back(choice);
    forms.back().whole_window = WholeWindow::kOn;
  }
  if (poisoned > 0) {
    // Negative control: a window of W instead of W - 1 gives row 0 one poisoned key more.
    for (const AttentionChoice& form : forms) {
      a.window_left = c.window_left + 1;
      const std::vector<uint16_t> wide = run_kernel(form);
      a.window_left = c.window_left;
      int nan_rows = 0;
      for (int64_t row = 0; row < rows; ++row) nan_rows += std::isnan(bf16_bits_to_float(wide[static_cast<size_t>(row * ld_out)])) ? 1 : 0;
      EXPECT_GT(nan_rows, 0) << form.name() << ": a window one key wider read no poisoned row";
      std::printf("[attention] %s window W instead of W-1: %d block rows read a poisoned key\n", form.name().c_str(),
                  nan_rows);
    }
  }
  if (choice.kernel == AttentionKernel::kTuned) {
    // Runs of chunks walked by 1, 2, 3 or 16 CTAs per kv head and sequence (16: empty runs for
    // short windows) and auto, and the whole-window form (the combine's operations in the combine's
    // order, its own split of the work): every output element comes from the same operations, so
    // the same bits, guard bands included (checked before the bound).
    std::vector<AttentionChoice> same_bits = {forms.back()};
    for (int walk_ctas : {0, 1, 2, 3, 16}) {
      same_bits.push_back(choice);
      same_bits.back().walk_ctas = walk_ctas;
    }
    for (const AttentionChoice& variant : same_bits) {
      const AttentionLaunch how = attention_launch(variant, a);  // what the launch plans report
      if (variant.walk_ctas > 0) {
        EXPECT_TRUE(how.form == AttentionForm::kWalk && how.walk_ctas == variant.walk_ctas) << how.name();
      }
      if (variant.whole_window == WholeWindow::kOn) {
        EXPECT_TRUE(how.form == AttentionForm::kWholeWindow) << how.name();
      }
      const std::vector<uint16_t> variant_out = run_kernel(variant);
      size_t differing = 0, first = variant_out.size();
      for (size_t e = 0; e < variant_out.size(); ++e) {
        if (variant_out[e] != out[e]) {
          ++differing;
          first = std::min(first, e);
        }
      }
      EXPECT_EQ(differing, 0u) << variant.name() << " differs from " << choice.name() << " in " << differing << " of "
                               << variant_out.size() << " elements, first at row "
                               << (first < variant_out.size() ? static_cast<int64_t>(first) / ld_out : -1) << " column "
                               << (first < variant_out.size() ? static_cast<int64_t>(first) % ld_out : -1);
      std::printf("[attention] %s: %zu elements bit-identical to %s\n", variant.name().c_str(),
                  variant_out.size() - differing, choice.name().c_str());
    }
  }

  auto value = [](const std::vector<uint16_t>& v, int64_t i) { return static_cast<double>(bf16_bits_to_float(v[static_cast<size_t>(i)])); };
  double worst = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t len = window_length[static_cast<size_t>(b)];
    const int64_t total = len + width;
    for (int i = 0; i < width; ++i) {
      const int64_t row = static_cast<int64_t>(b) * width + i;
      for (int head = 0; head < nh; ++head) {
        const int kvh = head / group;
        std::vector<double> score(static_cast<size_t>(total));
        std::vector<int64_t> key_base(static_cast<size_t>(total));
        std::vector<const std::vector<uint16_t>*> k_src(static_cast<size_t>(total)), v_src(static_cast<size_t>(total));
        double max_score = -INFINITY, max_mag = 0;
        const int64_t first = first_seen(c.window_left, len, i);  // keys before it: weight 0
        for (int64_t j = first; j < total; ++j) {
          if (j < len) {
            const int64_t pos = window_begin[static_cast<size_t>(b)] + j;
            const int32_t phys = tables[static_cast<size_t>(b * max_pages + (pos / page - first_page[static_cast<size_t>(b)]))];
            key_base[static_cast<size_t>(j)] = (static_cast<int64_t>(phys) * page + pos % page) * kv_dim + kvh * d;
            k_src[static_cast<size_t>(j)] = &k_pool;
            v_src[static_cast<size_t>(j)] = &v_pool;
          } else {
            key_base[static_cast<size_t>(j)] = (static_cast<int64_t>(b) * width + (j - len)) * kv_dim + kvh * d;
            k_src[static_cast<size_t>(j)] = &k_block;
            v_src[static_cast<size_t>(j)] = &v_block;
          }
          double dot = 0, mag = 0;
          for (int e = 0; e < d; ++e) {
            const double p = value(q, row * q_dim + head * d + e) * value(*k_src[static_cast<size_t>(j)], key_base[static_cast<size_t>(j)] + e);
            dot += p;
            mag += std::fabs(p);
          }
          score[static_cast<size_t>(j)] = dot * a.scale;
          max_score = std::max(max_score, score[static_cast<size_t>(j)]);
          max_mag = std::max(max_mag, mag * a.scale);
        }
        double sum = 0;
        for (int64_t j = first; j < total; ++j) sum += (score[static_cast<size_t>(j)] = std::exp(score[static_cast<size_t>(j)] - max_score));
        const double delta_s = (d + 2) * 0x1p-23 * max_mag;
        for (int e = 0; e < d; ++e) {
          double o = 0, vmax = 0;
          for (int64_t j = first; j < total; ++j) {
            const double v = value(*v_src[static_cast<size_t>(j)], key_base[static_cast<size_t>(j)] + e);
            o += score[static_cast<size_t>(j)] * v;
            vmax = std::max(vmax, std::fabs(v));
          }
          o /= sum;
          const int64_t chunks = (total + kAttentionChunk - 1) / kAttentionChunk;
          const double split = choice.kernel == AttentionKernel::kTuned ? 0x1p-16 : 0.0;  // two-part p
          const double bound =
              0x1p-8 * std::fabs(o) + (2 * delta_s + (total + 10 + 7 * (chunks - 1)) * 0x1p-23 + split) * vmax;
          const double got = value(out, row * ld_out + head * d + e);
          ASSERT_FALSE(std::isnan(got)) << choice.name() << " unwritten output b" << b << " i" << i << " h" << head << " e" << e;
          worst = std::max(worst, std::fabs(got - o) / bound);
          ASSERT_LE(std::fabs(got - o), bound) << choice.name() << " d=" << d << " b" << b << " i" << i << " h" << head << " e" << e;
        }
      }
      for (int64_t g = q_dim; g < ld_out; ++g) ASSERT_EQ(out[static_cast<size_t>(row * ld_out + g)], sentinel) << "guard column written";
    }
  }
  for (int64_t g = 0; g < ld_out; ++g) ASSERT_EQ(out[static_cast<size_t>(rows * ld_out + g)], sentinel) << "guard row written";
  std::printf("[attention] %-10s d=%3d nh=%d nkv=%d window_left %d: max error/bound %.3g\n", choice.name().c_str(), d, nh,
              nkv, c.window_left, worst);
}

TEST(AttentionGpu, TunedKernelsForEveryBuiltHeadDim) {
  DFLASH_REQUIRE_GPU();
  run_case({64, 8, 2, "tuned"});
  run_case({128, 8, 2, "tuned"});
  run_case({256, 4, 1, "tuned"});
}

TEST(AttentionGpu, TunedKernelsLargeGroupAndLongWindows) {
  DFLASH_REQUIRE_GPU();
  // nh 16, nkv 2: 8 heads per kv head; block width 16 -> 128 query rows (8 m-tiles: every warp of
  // the tuned kernel takes two). Windows of several chunks with a partial last chunk: 300 + 16 =
  // 316 keys (4 full chunks + 60), 113 + 16 = 129 (2 full chunks + 1 key), and 47 + 16 = 63 (one
  // partial chunk); windows start mid-page.
  const std::vector<int32_t> lengths = {300, 47, 113};
  const std::vector<int64_t> begins = {5, 1000, 33};
  run_case({64, 16, 2, "tuned", 16, lengths, begins});
  run_case({128, 16, 2, "tuned", 16, lengths, begins});
  run_case({256, 16, 2, "tuned", 16, lengths, begins});
  run_case({128, 16, 2, "generic", 16, lengths, begins});
  // Qwen3-8B's attention geometry: nh 32, nkv 8, d 128, block width 16, window 1024 (17 chunks, the
  // last one 16 keys), beside a 1-key window and a 500-key one.
  run_case({128, 32, 8, "tuned", 16, {1024, 1, 500}, {3, 0, 70}});
}

TEST(AttentionGpu, WholeWindowAtAServingBatch) {
  DFLASH_REQUIRE_GPU();
  // Qwen3-8B's attention geometry at 17 sequences: 136 sequence x kv head pairs, at least one CTA
  // per SM of an H200, so the whole-window form runs its P·V passes in one CTA each (fewer pairs
  // split them). Windows from 1 to 1024 keys, chunk edges on both sides (50 + 16 = 66 keys: two
  // chunks, the second of 2 keys, where the fold's share of the bound is largest), starts mid-page.
  const std::vector<int32_t> lengths = {1024, 1, 500, 47, 48, 50, 63, 64, 65, 113, 300, 1000, 2, 16, 200, 777, 128};
  std::vector<int64_t> begins;
  for (size_t i = 0; i < lengths.size(); ++i) begins.push_back(static_cast<int64_t>(37 * i % 101));
  run_case({128, 32, 8, "tuned", 16, lengths, begins});
}

TEST(AttentionGpu, GenericAndSimpleKernels) {
  DFLASH_REQUIRE_GPU();
  run_case({16, 6, 2, "auto"});   // generic, the oracle fixtures' head_dim
  run_case({12, 4, 2, "auto"});   // generic, head_dim not a multiple of 4
  run_case({128, 8, 2, "generic"});
  run_case({64, 8, 8, "simple"});
  run_case({32, 4, 1, "simple"});
}

// DFlash2 sliding, non-causal layers (docs/spec/dflash2.md §3.3) in every kernel: W 8 with B 5 and
// B 8 = W (the last block row sees no context), and W 100 over windows of 1, 64, 150 and 300 keys
// (row 0's left edge inside a chunk, rows' edges across a chunk boundary, windows shorter than W).
TEST(AttentionGpu, SlidingWindowInEveryKernel) {
  DFLASH_REQUIRE_GPU();
  for (const std::string kernel : {"tuned", "generic", "simple"}) {
    for (int d : {64, 128}) {
      run_case({d, 8, 2, kernel, 5, {1, 64, 150}, {0, 37, 1000}, 7});
      run_case({d, 8, 2, kernel, 8, {1, 64, 150}, {0, 37, 1000}, 7});
      run_case({d, 8, 2, kernel, 8, {300, 64, 150}, {5, 37, 1000}, 99});
    }
  }
  run_case({16, 6, 2, "auto", 8, {40, 58, 3}, {0, 0, 9}, 15});  // d2-tiny's head_dim and window (generic)
}

}  // namespace
}  // namespace dflash
