// Every GEMM kernel (mma, cuBLASLt, simple, and CUTLASS for E4M3 weights) × weight format (E4M3,
// bf16) through the one dispatch the drafter calls, against a CPU loop in double at every m the
// drafter uses (1..64 block rows, and context chunk sizes), the epilogues, batch invariance bit
// for bit for every kernel but cuBLASLt (CUTLASS's reduction order is fixed too, though not the
// mma kernel's), E4M3 subnormal codes exactly, argmax ties, and
// proof that the check rejects a planted "half of each 32-wide K tile" result.
//
// Error bound per element (derivation): products of a bf16 activation and a bf16 (or E4M3) weight
// are exact in fp32 (at most 8 + 8 significant bits); a sum of K of them in any order and tree with
// at most K + 8 additions, each rounding by at most one fp32 ulp
// (2^-23 relative: the tensor cores' internal accumulation may truncate rather than round), is off
// by at most (K + 8)·2^-23·Σ|a·w|; the scale multiply and the bias add each add one more ulp of
// the magnitude. So |C - C_exact| <= (K + 10)·2^-23·(scale·Σ|a·q| + |bias|).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"
#include "cuda/runtime/device_buffer.h"
#include "cuda/drafter/device_weights.h"
#include "cuda/kernels/elementwise/elementwise.h"
#include "cuda/kernels/quant/fp8_quant.h"
#include "cuda/kernels/gemm/gemm.h"
#include "cuda/kernels/gemm/gemm_cutlass_mixed.h"
#include "testing/gpu_test_util.h"
#include "fixtures/geometries.h"
#include "fixtures/random_drafter.h"

namespace dflash {
namespace {

constexpr int64_t kMaxBlockRows = 64;

struct Problem {
  int64_t n = 0, k = 0;
  WeightFormat format = WeightFormat::kBf16;
  Tensor w;                 // [n, k] bf16 values
  std::vector<float> bias;  // empty or [n]
  QuantizedRows q;          // host quantization (E4M3)
  std::vector<double> seen; // [n, k] the weight as the GEMM multiplies it (decoded codes or bf16)
  DeviceLinear device;
};

// (Re)builds the device weight from p.w: bf16 rows padded to 64 columns, quantized on the device
// for E4M3 (with the decoded bf16 copy cuBLASLt reads), and the host quantization for the CPU loop.
void upload(Problem& p, cudaStream_t stream) {
  const int64_t n = p.n, k = p.k, k_pad = pad_k(k);
  std::vector<uint16_t> bits(static_cast<size_t>(n * k_pad), 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) bits[static_cast<size_t>(r * k_pad + c)] = float_to_bf16_bits(p.w.row(r)[c]);
  DeviceBuffer<uint16_t> staged(bits.size());
  ASSERT_EQ(cudaSuccess, cudaMemcpy(staged.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  DeviceLinear& d = p.device;
  d.format = p.format;
  d.n = n;
  d.k = k;
  d.k_pad = k_pad;
  p.seen.assign(p.w.values.begin(), p.w.values.end());
  if (p.format == WeightFormat::kE4M3) {
    p.q = quantize_rows_e4m3(p.w);
    for (size_t i = 0; i < p.seen.size(); ++i) p.seen[i] = e4m3_to_float(p.q.codes[i]);
    d.data.allocate(bits.size());
    d.scale.allocate(static_cast<size_t>(n));
    launch_quantize_rows_e4m3(stream, staged.get(), n, k_pad, d.data.get(), d.scale.get());
    d.decoded.allocate(bits.size());
    launch_decode_e4m3_to_bf16(stream, d.data.get(), n * k_pad, d.decoded.get());
  } else {
    d.data.allocate(bits.size() * 2);
    ASSERT_EQ(cudaSuccess, cudaMemcpy(d.data.get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  }
  if (!p.bias.empty()) {
    d.bias.allocate(static_cast<size_t>(n));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(d.bias.get(), p.bias.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
  }
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
}

Problem make_problem(int64_t n, int64_t k, WeightFormat format, bool with_bias, uint64_t seed, cudaStream_t stream) {
  Problem p;
  p.n = n;
  p.k = k;
  p.format = format;
  p.w = Tensor::zeros({n, k});
  const float a = static_cast<float>(std::sqrt(3.0 / static_cast<double>(k)));
  for (int64_t i = 0; i < n * k; ++i) p.w.values[static_cast<size_t>(i)] = random_bf16(seed, 1, static_cast<uint64_t>(i), -a, a);
  if (with_bias) {
    for (int64_t i = 0; i < n; ++i) p.bias.push_back(random_bf16(seed, 2, static_cast<uint64_t>(i), -0.5f, 0.5f));
  }
  upload(p, stream);
  return p;
}

// The weight as the GEMM sees it: decoded codes (E4M3) or the bf16 values, and the row scale.
double weight_at(const Problem& p, int64_t n, int64_t k) { return p.seen[static_cast<size_t>(n * p.k + k)]; }
double scale_at(const Problem& p, int64_t n) { return p.format == WeightFormat::kE4M3 ? p.q.scales[static_cast<size_t>(n)] : 1.0; }

struct Reference {
  std::vector<double> value, bound;  // [m, n]
};

// keep(k) selects the K columns summed: all of them, or a planted bug's subset.
template <typename Keep>
Reference reference(const Problem& p, const Tensor& a, int64_t m, Keep keep) {
  Reference r;
  r.value.resize(static_cast<size_t>(m * p.n));
  r.bound.resize(r.value.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t n = 0; n < p.n; ++n) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < p.k; ++k) {
        if (!keep(k)) continue;
        const double prod = static_cast<double>(a.row(i)[k]) * weight_at(p, n, k);
        sum += prod;
        mag += std::fabs(prod);
      }
      const double s = scale_at(p, n);
      const double b = p.bias.empty() ? 0.0 : p.bias[static_cast<size_t>(n)];
      r.value[static_cast<size_t>(i * p.n + n)] = s * sum + b;
      r.bound[static_cast<size_t>(i * p.n + n)] = static_cast<double>(p.k + 10) * 0x1p-23 * (s * mag + std::fabs(b));
    }
  }
  return r;
}
Reference reference(const Problem& p, const Tensor& a, int64_t m) {
  return reference(p, a, m, [](int64_t) { return true; });
}

Tensor random_activations(int64_t m, int64_t k, uint64_t seed) { return make_random_context(m, k, seed); }

using gpu_test::upload_activations;

// The kernels that serve `format` on this device: CUTLASS takes E4M3 weights only, on sm_90.
std::vector<GemmKernel> kernels_for(WeightFormat format) {
  std::vector<GemmKernel> kernels = {GemmKernel::kMma, GemmKernel::kCublasLt, GemmKernel::kSimple};
  std::string why;
  if (format == WeightFormat::kE4M3 && cutlass_mixed_supported(&why)) kernels.push_back(GemmKernel::kCutlass);
  if (format == WeightFormat::kE4M3 && !why.empty()) std::printf("[gemm] cutlass not run: %s\n", why.c_str());
  return kernels;
}

// Buffers for every epilogue at once on an m × n output (the residual starting from the first m·n
// values of residual0), the GemmEpilogue that writes them all, and their bits after a run: out,
// residual, SwiGLU, argmax values and indices, one word per element.
struct AllEpilogues {
  AllEpilogues(int64_t m, int64_t n, const std::vector<float>& residual0)
      : n(n),
        out(static_cast<size_t>(m * n)),
        residual(gpu_test::to_device(std::vector<float>(residual0.begin(), residual0.begin() + m * n))),
        values(static_cast<size_t>(m * argmax_blocks(n))),
        indices(values.size()),
        act(static_cast<size_t>(m * n / 2)) {}
  GemmEpilogue epilogue(bool with_residual = true) const {
    GemmEpilogue ep;
    ep.out = out.get();
    ep.ld_out = n;
    ep.residual = with_residual ? residual.get() : nullptr;
    ep.ld_residual = n;
    ep.swiglu_out = act.get();
    ep.ld_swiglu = n / 2;
    ep.argmax_value = values.get();
    ep.argmax_index = indices.get();
    ep.ld_argmax = argmax_blocks(n);
    return ep;
  }
  std::vector<uint32_t> bits() const {
    std::vector<uint32_t> bits;
    for (float v : gpu_test::to_host(out)) bits.push_back(gpu_test::float_bits(v));
    for (float v : gpu_test::to_host(residual)) bits.push_back(gpu_test::float_bits(v));
    for (uint16_t v : gpu_test::to_host(act)) bits.push_back(v);
    for (float v : gpu_test::to_host(values)) bits.push_back(gpu_test::float_bits(v));
    for (int32_t v : gpu_test::to_host(indices)) bits.push_back(static_cast<uint32_t>(v));
    return bits;
  }
  int64_t n;
  DeviceBuffer<float> out, residual, values;
  DeviceBuffer<int32_t> indices;
  DeviceBuffer<uint16_t> act;
};

class GemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DFLASH_REQUIRE_GPU();
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&stream_));
    ASSERT_EQ(CUBLAS_STATUS_SUCCESS, cublasLtCreate(&lt_));
    workspace_.allocate(32u << 20);
    raw_.allocate(4u << 20);
    ctx_.stream = stream_;
    ctx_.lt = lt_;
    ctx_.lt_workspace = workspace_.get();
    ctx_.lt_workspace_bytes = workspace_.bytes();
    ctx_.raw = raw_.get();
    ctx_.raw_capacity = raw_.size();
    ctx_.cutlass_workspace = workspace_.get();  // one stream: the libraries never run at once
    ctx_.cutlass_workspace_bytes = workspace_.bytes();
  }
  void TearDown() override {
    if (lt_) cublasLtDestroy(lt_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // C[m, n] fp32 through `kernel` (plain store epilogue).
  std::vector<float> run(GemmKernel kernel, const Problem& p, const DeviceBuffer<uint16_t>& a, int64_t m) {
    DeviceBuffer<float> out(static_cast<size_t>(m * p.n));
    std::vector<float> poison(out.size(), NAN);  // every element must be written
    EXPECT_EQ(cudaSuccess, cudaMemcpy(out.get(), poison.data(), out.bytes(), cudaMemcpyHostToDevice));
    GemmEpilogue ep;
    ep.out = out.get();
    ep.ld_out = p.n;
    gemm(kernel, ctx_, a.get(), pad_k(p.k), m, p.device.view(), ep);
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
    std::vector<float> host(out.size());
    EXPECT_EQ(cudaSuccess, cudaMemcpy(host.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
    return host;
  }

  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
  DeviceBuffer<float> raw_;
  GemmContext ctx_;
};

// Largest |C - ref| / bound over the first m rows (> 1 fails).
double worst_ratio(const std::vector<float>& c, const Reference& ref, int64_t m, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    const double err = std::fabs(static_cast<double>(c[static_cast<size_t>(i)]) - ref.value[static_cast<size_t>(i)]);
    if (std::isnan(c[static_cast<size_t>(i)])) return INFINITY;
    worst = std::max(worst, err / std::max(ref.bound[static_cast<size_t>(i)], 1e-30));
  }
  return worst;
}

struct Shape {
  int64_t n, k;
  bool bias;
};

TEST_F(GemmTest, EveryKernelAtEveryBlockRowCountMatchesCpuAndIsBatchInvariant) {
  const Shape shapes[] = {{200, 4096, false}, {96, 48, true}, {520, 12288, false}};
  for (const Shape& s : shapes) {
    for (WeightFormat format : {WeightFormat::kE4M3, WeightFormat::kBf16}) {
      const Problem p = make_problem(s.n, s.k, format, s.bias, 11 + s.k, stream_);
      const Tensor a = random_activations(kMaxBlockRows, s.k, 7 + s.n);
      const DeviceBuffer<uint16_t> da = upload_activations(a, pad_k(s.k));
      const Reference ref = reference(p, a, kMaxBlockRows);
      // The planted bug: each 32-wide K tile read only in its first half.
      const Reference bug = reference(p, a, kMaxBlockRows, [](int64_t k) { return k % 32 < 16; });
      for (GemmKernel kernel : kernels_for(format)) {
        const std::string what = std::string(gemm_kernel_name(kernel)) + (format == WeightFormat::kE4M3 ? " e4m3" : " bf16") +
                                 " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
        const std::vector<float> full = run(kernel, p, da, kMaxBlockRows);
        double worst = 0;
        for (int64_t m = 1; m <= kMaxBlockRows; ++m) {
          const std::vector<float> c = run(kernel, p, da, m);
          worst = std::max(worst, worst_ratio(c, ref, m, s.n));
          if (kernel != GemmKernel::kCublasLt) {
            // Our kernels: row i of an m-row product is the same bits as in the 64-row product.
            for (int64_t i = 0; i < m * s.n; ++i) {
              ASSERT_EQ(gpu_test::float_bits(c[static_cast<size_t>(i)]), gpu_test::float_bits(full[static_cast<size_t>(i)]))
                  << what << " m=" << m << " element " << i;
            }
          }
          // The check must be able to fail: the half-K-tile result is far outside the bound.
          std::vector<float> planted(bug.value.begin(), bug.value.begin() + m * s.n);
          ASSERT_GT(worst_ratio(planted, ref, m, s.n), 1.0) << what << " m=" << m;
        }
        EXPECT_LE(worst, 1.0) << what << ": error / bound";
        std::printf("[gemm] %-36s m=1..64: max error/bound %.3g\n", what.c_str(), worst);
      }
    }
  }
}

// W8A8 (gemm_w8a8): the activations quantized per token on the device, then E4M3 x E4M3 through the
// plain kernel and cuBLASLt, against the CPU in double over the host's codes (core/fp8.h, which
// fp8_quant_gpu_test.cc shows the device matches bit for bit): C = r·(s·Σ a8·w8) + b. Each product
// of two E4M3 values is exact in fp32, so the bound above holds with one more multiply:
// (K + 11)·2^-23·(r·s·Σ|a8·w8| + |b|). cuBLASLt's E4M3 tensor-core path (QGMMA) accumulates in 13
// fraction bits, truncating (e8m13: DeepSeek-V3's report §3.3.2, PyTorch's FP8 notes), and with
// FAST_ACCUM off promotes its partial sums to fp32; taking that promotion at least every 128
// products (DeepSeek-V3's interval), each product and partial sum loses under 2^-13 of the chunk's
// magnitude: its bound adds min(K, 128)·2^-13·r·s·Σ|a8·w8|. CUTLASS's FP8 GEMM (requested
// kCutlass, from 64 block rows in the drafter) promotes every 4 wgmma k-blocks of 32, every 128
// products, and scales twice in its epilogue as the epilogue kernel does: the same bound.
// Negative control: the activation scale left out (the unscaled-activation bug) is far outside
// either bound.
TEST_F(GemmTest, W8a8KernelsMatchCpuOverTheQuantizedActivations) {
  const Shape shapes[] = {{200, 4096, false}, {96, 48, true}, {520, 12288, false}};
  for (const Shape& s : shapes) {
    const Problem p = make_problem(s.n, s.k, WeightFormat::kE4M3, s.bias, 31 + s.k, stream_);
    const int64_t rows = 200, k_pad = pad_k(s.k);
    const Tensor a = random_activations(rows, s.k, 17 + s.n);
    const DeviceBuffer<uint16_t> da = upload_activations(a, k_pad);
    DeviceBuffer<uint8_t> codes(static_cast<size_t>(rows * k_pad));
    DeviceBuffer<float> row_scales(static_cast<size_t>(rows));
    launch_quantize_activations_e4m3(stream_, da.get(), k_pad, rows, s.k, k_pad, 0.0f, codes.get(), k_pad,
                                     row_scales.get(), false);
    Reference ref, unscaled, library;  // library: ref's values with the QGMMA accumulator's bound
    for (Reference* r : {&ref, &unscaled, &library}) r->value.resize(static_cast<size_t>(rows * s.n)), r->bound.resize(r->value.size());
    std::vector<uint8_t> a8(static_cast<size_t>(s.k));
    for (int64_t i = 0; i < rows; ++i) {
      const float r = activation_scale_e4m3(a.row(i), s.k);
      quantize_activation_e4m3(a.row(i), s.k, r, a8.data());
      for (int64_t n = 0; n < s.n; ++n) {
        double sum = 0, mag = 0;
        for (int64_t k = 0; k < s.k; ++k) {
          const double prod = e4m3_to_float(a8[static_cast<size_t>(k)]) * weight_at(p, n, k);
          sum += prod;
          mag += std::fabs(prod);
        }
        const double sc = scale_at(p, n), b = p.bias.empty() ? 0.0 : p.bias[static_cast<size_t>(n)];
        const size_t at = static_cast<size_t>(i * s.n + n);
        ref.value[at] = r * (sc * sum) + b;
        ref.bound[at] = static_cast<double>(s.k + 11) * 0x1p-23 * (r * sc * mag + std::fabs(b));
        library.value[at] = ref.value[at];
        library.bound[at] = ref.bound[at] + static_cast<double>(std::min<int64_t>(s.k, 128)) * 0x1p-13 * r * sc * mag;
        unscaled.value[at] = sc * sum + b;
      }
    }
    std::vector<GemmKernel> requests = {GemmKernel::kSimple, GemmKernel::kMma};
    std::string no_cutlass;
    if (cutlass_mixed_supported(&no_cutlass)) requests.push_back(GemmKernel::kCutlass);
    if (!no_cutlass.empty()) std::printf("[gemm] w8a8 cutlass not run: %s\n", no_cutlass.c_str());
    for (GemmKernel requested : requests) {
      double worst = 0;
      std::string ran;
      for (int64_t m : {1, 7, 16, 64, 65, 200}) {
        const GemmKernel kernel = w8a8_gemm_kernel(ctx_, requested, m, k_pad, p.device.view());
        if (ran.find(gemm_kernel_name(kernel)) == std::string::npos) ran += std::string(ran.empty() ? "" : "+") + gemm_kernel_name(kernel);
        DeviceBuffer<float> out(static_cast<size_t>(m * s.n));
        std::vector<float> poison(out.size(), NAN);
        ASSERT_EQ(cudaSuccess, cudaMemcpy(out.get(), poison.data(), out.bytes(), cudaMemcpyHostToDevice));
        GemmEpilogue ep;
        ep.out = out.get();
        ep.ld_out = s.n;
        gemm_w8a8(requested, ctx_, codes.get(), k_pad, m, p.device.view(), row_scales.get(), ep);
        ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
        const std::vector<float> c = gpu_test::to_host(out);
        const Reference& expected = kernel == GemmKernel::kSimple ? ref : library;
        worst = std::max(worst, worst_ratio(c, expected, m, s.n));
        ASSERT_GT(worst_ratio(std::vector<float>(unscaled.value.begin(), unscaled.value.begin() + m * s.n), expected, m, s.n), 1.0);
      }
      const std::string what = "w8a8 " + ran + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k);
      EXPECT_LE(worst, 1.0) << what << ": error / bound";
      std::printf("[gemm] %-36s m=1..200: max error/bound %.3g\n", what.c_str(), worst);
    }
  }
}

TEST_F(GemmTest, ContextChunkSizesMatchCpu) {
  // m as context ingestion uses it: chunks up to 256 rows (cuBLASLt above 64 rows by default).
  const Problem p8 = make_problem(160, 640, WeightFormat::kE4M3, true, 5, stream_);
  const Problem p16 = make_problem(160, 640, WeightFormat::kBf16, true, 6, stream_);
  for (const Problem* p : {&p8, &p16}) {
    const Tensor a = random_activations(256, p->k, 99);
    const DeviceBuffer<uint16_t> da = upload_activations(a, pad_k(p->k));
    const Reference ref = reference(*p, a, 256);
    for (GemmKernel kernel : kernels_for(p->format)) {
      for (int64_t m : {65, 100, 128, 200, 256}) {
        const std::vector<float> c = run(kernel, *p, da, m);
        EXPECT_LE(worst_ratio(c, ref, m, p->n), 1.0) << gemm_kernel_name(kernel) << " m=" << m;
      }
    }
  }
}

TEST_F(GemmTest, E4M3SubnormalCodesAreDecodedExactly) {
  // Codes 0x00-0x07 and 0x80-0x87 (zero and the subnormals ±m·2^-9) with scale 1 and A = 1: every
  // partial sum is a multiple of 2^-9 below 2^10, exact in fp32, so the result must be exact.
  const int64_t n = 16, k = 128;
  Problem p;
  p.n = n;
  p.k = k;
  p.format = WeightFormat::kE4M3;
  p.q.rows = n;
  p.q.cols = k;
  p.q.codes.resize(static_cast<size_t>(n * k));
  p.q.scales.assign(static_cast<size_t>(n), 1.0f);
  for (int64_t i = 0; i < n * k; ++i) {
    p.q.codes[static_cast<size_t>(i)] = static_cast<uint8_t>((i % 8) | ((i / 8) % 3 == 0 ? 0x80 : 0x00));
    p.seen.push_back(e4m3_to_float(p.q.codes[static_cast<size_t>(i)]));
  }
  DeviceLinear& d = p.device;
  d.format = WeightFormat::kE4M3;
  d.n = n;
  d.k = k;
  d.k_pad = k;
  d.data.allocate(p.q.codes.size());
  d.scale.allocate(static_cast<size_t>(n));
  d.decoded.allocate(p.q.codes.size());
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d.data.get(), p.q.codes.data(), p.q.codes.size(), cudaMemcpyHostToDevice));
  ASSERT_EQ(cudaSuccess, cudaMemcpy(d.scale.get(), p.q.scales.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
  launch_decode_e4m3_to_bf16(stream_, d.data.get(), n * k, d.decoded.get());
  Tensor a = Tensor::zeros({4, k});
  for (float& v : a.values) v = 1.0f;
  const DeviceBuffer<uint16_t> da = upload_activations(a, k);
  for (GemmKernel kernel : kernels_for(WeightFormat::kE4M3)) {
    const std::vector<float> c = run(kernel, p, da, 4);
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double exact = 0;
        for (int64_t kk = 0; kk < k; ++kk) exact += e4m3_to_float(p.q.codes[static_cast<size_t>(j * k + kk)]);
        ASSERT_EQ(static_cast<double>(c[static_cast<size_t>(i * n + j)]), exact) << gemm_kernel_name(kernel) << " col " << j;
      }
    }
  }
}

TEST_F(GemmTest, EpiloguesResidualSwigluAndArgmax) {
  const int64_t m = 12, inter = 96, k = 256;
  for (WeightFormat format : {WeightFormat::kE4M3, WeightFormat::kBf16}) {
    // gate|up interleaved weight [2·inter, k] with bias, as the drafter lays it out.
    const Problem p = make_problem(2 * inter, k, format, true, 21, stream_);
    const Tensor a = random_activations(m, k, 3);
    const DeviceBuffer<uint16_t> da = upload_activations(a, pad_k(k));
    const Reference ref = reference(p, a, m);
    for (GemmKernel kernel : kernels_for(format)) {
      const std::string what = gemm_kernel_name(kernel);
      // residual += C
      std::vector<float> residual0(static_cast<size_t>(m * p.n));
      for (size_t i = 0; i < residual0.size(); ++i) residual0[i] = random_bf16(4, 4, i, -3.0f, 3.0f);
      DeviceBuffer<float> residual(residual0.size());
      ASSERT_EQ(cudaSuccess, cudaMemcpy(residual.get(), residual0.data(), residual.bytes(), cudaMemcpyHostToDevice));
      GemmEpilogue ep;
      ep.residual = residual.get();
      ep.ld_residual = p.n;
      gemm(kernel, ctx_, da.get(), pad_k(k), m, p.device.view(), ep);
      std::vector<float> r(residual0.size());
      ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
      ASSERT_EQ(cudaSuccess, cudaMemcpy(r.data(), residual.get(), residual.bytes(), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < r.size(); ++i) {
        const double expect = residual0[i] + ref.value[i];
        ASSERT_LE(std::fabs(r[i] - expect), ref.bound[i] + 0x1p-23 * std::fabs(expect)) << what << " residual " << i;
      }
      // SwiGLU: act[i] = bf16(silu(C[2i]) · C[2i+1]); the bound adds the bf16 rounding (u = 2^-8),
      // the fp32 silu (4 ulp) and the propagated bounds of gate (|d silu/dg| <= 1.1) and up.
      DeviceBuffer<uint16_t> act(static_cast<size_t>(m * inter));
      GemmEpilogue sw;
      sw.swiglu_out = act.get();
      sw.ld_swiglu = inter;
      gemm(kernel, ctx_, da.get(), pad_k(k), m, p.device.view(), sw);
      std::vector<uint16_t> act_bits(act.size());
      ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
      ASSERT_EQ(cudaSuccess, cudaMemcpy(act_bits.data(), act.get(), act.bytes(), cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < inter; ++j) {
          const size_t gi = static_cast<size_t>(i * p.n + 2 * j), ui = gi + 1;
          const double g = ref.value[gi], u = ref.value[ui];
          const double silu = g / (1.0 + std::exp(-g));
          const double expect = silu * u;
          const double bound = 0x1p-8 * std::fabs(expect) + 4 * 0x1p-24 * std::fabs(expect) + 1.1 * std::fabs(u) * ref.bound[gi] +
                               std::fabs(silu) * ref.bound[ui] + 1e-30;
          ASSERT_LE(std::fabs(bf16_bits_to_float(act_bits[static_cast<size_t>(i * inter + j)]) - expect), bound)
              << what << " swiglu " << i << "," << j;
        }
      }
    }
  }
}

// Where the epilogue only adds to the residual, the libraries add it themselves (CUTLASS in its
// epilogue, cuBLASLt with beta = 1): the result must be the bits of fp32(product + residual), the
// product as the same library stores it alone, as the epilogue kernel adds them. No bias (a bias
// keeps the epilogue kernel). Negative control: the residual of the next row must not match.
TEST_F(GemmTest, LibrariesAddTheResidualAsTheEpilogueKernelDoes) {
  const Shape shapes[] = {{4096, 4096, false}, {1000, 12288, false}};
  for (const Shape& s : shapes) {
    for (WeightFormat format : {WeightFormat::kE4M3, WeightFormat::kBf16}) {
      const GemmKernel kernel = format == WeightFormat::kE4M3 ? GemmKernel::kCutlass : GemmKernel::kCublasLt;
      std::string why;
      if (kernel == GemmKernel::kCutlass && !cutlass_mixed_supported(&why)) {
        std::printf("[gemm] cutlass residual add not run: %s\n", why.c_str());
        continue;
      }
      const Problem p = make_problem(s.n, s.k, format, false, 41 + s.k, stream_);
      for (int64_t m : {int64_t{64}, int64_t{200}}) {
        const std::string what = std::string(gemm_kernel_name(kernel)) + " n=" + std::to_string(s.n) +
                                 " k=" + std::to_string(s.k) + " m=" + std::to_string(m);
        const Tensor a = random_activations(m, s.k, 43 + m);
        const DeviceBuffer<uint16_t> da = upload_activations(a, pad_k(s.k));
        const std::vector<float> product = run(kernel, p, da, m);
        std::vector<float> residual0(static_cast<size_t>(m * s.n));
        for (size_t i = 0; i < residual0.size(); ++i) residual0[i] = random_bf16(44, 1, i, -3.0f, 3.0f);
        DeviceBuffer<float> residual = gpu_test::to_device(residual0);
        GemmEpilogue ep;
        ep.residual = residual.get();
        ep.ld_residual = s.n;
        gemm(kernel, ctx_, da.get(), pad_k(s.k), m, p.device.view(), ep);
        ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
        const std::vector<float> sum = gpu_test::to_host(residual);
        int64_t mismatches = 0, shifted_matches = 0;
        for (size_t i = 0; i < sum.size(); ++i) {
          const float want = product[i] + residual0[i];  // one IEEE fp32 addition
          mismatches += gpu_test::float_bits(sum[i]) != gpu_test::float_bits(want);
          if (i + static_cast<size_t>(s.n) < sum.size()) {
            const float shifted = product[i] + residual0[i + static_cast<size_t>(s.n)];
            shifted_matches += gpu_test::float_bits(sum[i]) == gpu_test::float_bits(shifted);
          }
        }
        std::printf("[gemm] %-32s residual added in the library: %lld of %zu differ; next row's residual: %lld match\n",
                    what.c_str(), static_cast<long long>(mismatches), sum.size(), static_cast<long long>(shifted_matches));
        EXPECT_EQ(mismatches, 0) << what;
        EXPECT_LT(shifted_matches, static_cast<int64_t>(sum.size()) / 2) << what << ": negative control";
      }
    }
  }
}

// The mma kernel's CTA width (32 or 64 columns at m <= 16, gemm_cols; 32 or 64 above, gemm_cols_m64)
// and its shared-memory layout change which CTA computes an element and how its operands arrive,
// never its sum: every epilogue's output must be the same bits in every combination as with 32
// columns on an unknown SM count (the shared layout, no wave split; the tests above check the
// kernel against the CPU). The shapes leave the last wide CTA partly empty; K runs from 2 k-tiles
// (6 of 8 warps idle) to 64, 45 of them uneven over the warps. At m <= 16 each width runs with the
// device's SM count (the solo layout where the grid has at most one CTA per SM), with 3 and with 7
// (n = 1000 at 64 columns: 16 CTAs, one wave of 14 and a tail of 2, which goes to a second launch
// of 32-column CTAs).
TEST_F(GemmTest, MmaCtaWidthsAndLayoutsChangeNoBit) {
  const Shape shapes[] = {{200, 4096, false}, {2500, 128, true}, {192, 256, true}, {1000, 2880, true}};
  int device_sms = 0;
  ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, 0));
  for (const Shape& s : shapes) {
    for (WeightFormat format : {WeightFormat::kE4M3, WeightFormat::kBf16}) {
      const Problem p = make_problem(s.n, s.k, format, s.bias, 41 + s.n, stream_);
      const Tensor a = random_activations(100, s.k, 43);
      const DeviceBuffer<uint16_t> da = upload_activations(a, pad_k(s.k));
      std::vector<float> residual0(static_cast<size_t>(100 * s.n));
      for (size_t i = 0; i < residual0.size(); ++i) residual0[i] = random_bf16(4, 5, i, -3.0f, 3.0f);
      for (int64_t m : {1, 5, 16, 17, 64, 100}) {
        // All four epilogues at once; returns every output's bits.
        auto outputs = [&](int columns, int sm_count, int columns_m64 = 32) {  // m > 16: 32 unless asked
          ctx_.mma_columns_m64 = columns_m64;
          ctx_.mma_columns = columns;
          ctx_.sm_count = sm_count;
          AllEpilogues outs(m, s.n, residual0);
          gemm(GemmKernel::kMma, ctx_, da.get(), pad_k(s.k), m, p.device.view(), outs.epilogue());
          EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
          return outs.bits();
        };
        const std::vector<uint32_t> narrow = outputs(32, 0);
        if (m > 16) {  // 64-row tiles: only gemm_cols_m64 shapes them (64 columns: E4M3 only, bf16 stays 32)
          if (format != WeightFormat::kE4M3) continue;
          const std::vector<uint32_t> wide = outputs(32, device_sms, 64);
          ASSERT_EQ(wide.size(), narrow.size());
          for (size_t i = 0; i < wide.size(); ++i) {
            ASSERT_EQ(wide[i], narrow[i]) << (format == WeightFormat::kE4M3 ? "e4m3" : "bf16") << " n=" << s.n
                                          << " k=" << s.k << " m=" << m << " gemm_cols_m64 64, word " << i;
          }
          continue;
        }
        for (int columns : {32, 64}) {
          for (int sms : {device_sms, 3, 7}) {
            const std::vector<uint32_t> wide = outputs(columns, sms);
            ASSERT_EQ(wide.size(), narrow.size());
            for (size_t i = 0; i < wide.size(); ++i) {
              ASSERT_EQ(wide[i], narrow[i]) << (format == WeightFormat::kE4M3 ? "e4m3" : "bf16") << " n=" << s.n
                                            << " k=" << s.k << " m=" << m << " columns " << columns << " on " << sms
                                            << " SMs, word " << i;
            }
          }
        }
      }
      ctx_.mma_columns = 0;
      ctx_.mma_columns_m64 = GemmContext{}.mma_columns_m64;
      ctx_.sm_count = 0;
    }
  }
}

// The epilogue kernel's two forms (gemm.h EpilogueKernel) on the same fp32 products: every output
// (out, residual, SwiGLU, argmax partials, all at once) must be the same bits. Three sets of
// products: NaN, ±inf and runs of equal values (argmax ties; the vector form's argmax by the total
// order); the same without NaN (its argmax by the maximum and first match); non-positive values
// with -0 before +0 and -inf (blocks whose maximum is a signed zero). The shapes leave the last 32-column block
// partly past n, pad the leading dimension, and give n % 4 != 0 (the vector form then runs the warp
// form). Without scale, bias and residual the vector form reads only the products (its acc-only
// instantiation, twice the columns per CTA): those cases span several CTAs and end in a partial one.
// Negative control: one changed product must show.
TEST_F(GemmTest, EpilogueFormsGiveTheSameBits) {
  struct Case {
    int64_t m, n, ld_raw;
    WeightFormat format;  // E4M3: a per-column scale
    bool bias, residual;
  };
  const Case cases[] = {{5, 4096, 4096, WeightFormat::kE4M3, false, true},
                        {3, 2000, 2000, WeightFormat::kE4M3, true, true},
                        {7, 1000, 1004, WeightFormat::kBf16, false, true},
                        {65, 640, 640, WeightFormat::kBf16, true, true},
                        {4, 1002, 1002, WeightFormat::kE4M3, true, true},  // n % 4 != 0: the warp form serves both
                        {3, 20000, 20004, WeightFormat::kBf16, false, false},  // acc-only
                        {9, 1000, 1000, WeightFormat::kBf16, false, false},    // acc-only, one partial CTA
                        {2, 4100, 4100, WeightFormat::kE4M3, false, false}};   // scaled, no residual
  constexpr uint64_t kSeed = 57;
  for (int products = 0; products < 3; ++products) {
    for (const Case& c : cases) {
      const std::string what = "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " ld=" + std::to_string(c.ld_raw) +
                               (c.residual ? "" : " no residual") +
                               (products == 0 ? "" : products == 1 ? " no NaN" : " signed zeros");
      std::vector<float> raw(static_cast<size_t>(c.m * c.ld_raw)), scale(static_cast<size_t>(c.n)),
          bias(static_cast<size_t>(c.n)), residual0(static_cast<size_t>(c.m * c.n));
      for (size_t i = 0; i < raw.size(); ++i) {
        const uint64_t kind = i % 97;  // specials at fixed places, a tied run in every row
        const float r = random_bf16(kSeed, 1, i, -4.0f, 4.0f);
        if (products == 2) {
          raw[i] = kind == 3 ? -0.0f : kind == 5 ? 0.0f : kind == 7 ? -INFINITY : -std::fabs(r);
        } else {
          raw[i] = kind == 3 ? (products == 0 ? NAN : 2.5f) : kind == 5 ? INFINITY : kind == 7 ? -INFINITY
                   : (i % 50) < 6 ? 2.5f : r;
        }
      }
      for (size_t i = 0; i < scale.size(); ++i) {
        scale[i] = random_bf16(kSeed, 2, i, 0.01f, 0.1f);
        bias[i] = random_bf16(kSeed, 3, i, -0.5f, 0.5f);
      }
      for (size_t i = 0; i < residual0.size(); ++i) residual0[i] = random_bf16(kSeed, 4, i, -3.0f, 3.0f);
      const DeviceBuffer<float> d_scale = gpu_test::to_device(scale), d_bias = gpu_test::to_device(bias);
      DeviceMatrixView w;
      w.format = c.format;
      w.n = c.n;
      w.scale = c.format == WeightFormat::kE4M3 ? d_scale.get() : nullptr;
      w.bias = c.bias ? d_bias.get() : nullptr;
      auto outputs = [&](EpilogueKernel kernel, const std::vector<float>& sums) {
        const DeviceBuffer<float> d_raw = gpu_test::to_device(sums);
        AllEpilogues outs(c.m, c.n, residual0);
        launch_gemm_epilogue(stream_, d_raw.get(), c.ld_raw, c.m, w, outs.epilogue(c.residual), kernel);
        EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
        return outs.bits();
      };
      auto mismatches = [](const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
        size_t count = 0;
        for (size_t i = 0; i < a.size(); ++i) count += a[i] != b[i];
        return count;
      };
      const std::vector<uint32_t> warp = outputs(EpilogueKernel::kWarp, raw);
      const std::vector<uint32_t> vector = outputs(EpilogueKernel::kVector, raw);
      ASSERT_EQ(vector.size(), warp.size());
      EXPECT_EQ(mismatches(vector, warp), 0u) << what;
      // Negative control: one finite product changed (row 1, column 11) changes an output.
      std::vector<float> planted = raw;
      const size_t at = static_cast<size_t>((c.m > 1 ? c.ld_raw : 0) + 11);
      planted[at] = planted[at] * 1.5f + 1.0f;
      EXPECT_GT(mismatches(outputs(EpilogueKernel::kVector, planted), warp), 0u) << what << ": negative control";
      std::printf("[gemm] epilogue forms %-24s %zu words equal\n", what.c_str(), warp.size());
    }
  }
}

TEST_F(GemmTest, FusedArgmaxPicksLowestIndexOnTiesAndMatchesTheLogits) {
  const int64_t m = 15, n = 2500, k = 128;
  for (WeightFormat format : {WeightFormat::kE4M3, WeightFormat::kBf16}) {
    for (int variant = 0; variant < 3; ++variant) {
      // 0: random logits; 1: all logits equal (zero weights) -> token 0; 2: rows 1 and 1024 equal
      // and largest, everything else zero -> token 1.
      Problem p = make_problem(n, k, format, false, 31 + variant, stream_);
      Tensor a = random_activations(m, k, 8);
      if (variant > 0) {
        for (float& v : p.w.values) v = 0.0f;
        if (variant == 2) {
          for (int64_t c = 0; c < k; ++c) p.w.row(1)[c] = p.w.row(1024)[c] = 0x1p-6f;
          for (float& v : a.values) v = round_to_bf16(std::fabs(v) + 0.5f);
        }
        upload(p, stream_);
      }
      const DeviceBuffer<uint16_t> da = upload_activations(a, pad_k(k));
      for (GemmKernel kernel : kernels_for(format)) {
        DeviceBuffer<float> logits(static_cast<size_t>(m * n)), values(static_cast<size_t>(m * argmax_blocks(n)));
        DeviceBuffer<int32_t> indices(values.size()), fused(static_cast<size_t>(m)), scanned(static_cast<size_t>(m));
        GemmEpilogue ep;
        ep.out = logits.get();
        ep.ld_out = n;
        ep.argmax_value = values.get();
        ep.argmax_index = indices.get();
        ep.ld_argmax = argmax_blocks(n);
        gemm(kernel, ctx_, da.get(), pad_k(k), m, p.device.view(), ep);
        launch_argmax_reduce(values.get(), indices.get(), m, argmax_blocks(n), fused.get(), stream_);
        launch_argmax_rows(logits.get(), m, n, scanned.get(), stream_);
        ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream_));
        std::vector<float> host(logits.size());
        std::vector<int32_t> f(static_cast<size_t>(m)), s(static_cast<size_t>(m));
        ASSERT_EQ(cudaSuccess, cudaMemcpy(host.data(), logits.get(), logits.bytes(), cudaMemcpyDeviceToHost));
        ASSERT_EQ(cudaSuccess, cudaMemcpy(f.data(), fused.get(), fused.bytes(), cudaMemcpyDeviceToHost));
        ASSERT_EQ(cudaSuccess, cudaMemcpy(s.data(), scanned.get(), scanned.bytes(), cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < m; ++i) {
          int32_t best = 0;  // host argmax of the stored logits, lowest index on ties
          for (int64_t j = 1; j < n; ++j) {
            if (host[static_cast<size_t>(i * n + j)] > host[static_cast<size_t>(i * n + best)]) best = static_cast<int32_t>(j);
          }
          ASSERT_EQ(f[static_cast<size_t>(i)], best) << gemm_kernel_name(kernel) << " variant " << variant << " row " << i;
          ASSERT_EQ(s[static_cast<size_t>(i)], best) << gemm_kernel_name(kernel) << " variant " << variant << " row " << i;
          if (variant == 1) {
            ASSERT_EQ(best, 0);
          }
          if (variant == 2) {
            ASSERT_EQ(best, 1);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dflash
