// The CUTLASS Hopper GEMMs of E4M3 weights (gemm_cutlass_mixed.h): the mixed-input one (bf16
// activations, the E4M3 codes converted to bf16 in registers) and W8A8's (E4M3 activations too:
// an FP8 × FP8 wgmma, whose fp32 accumulators CUTLASS promotes every few k-blocks). CUTLASS passes
// the narrower operand of a mixed GEMM through registers and requires it as its operand A, so the
// product is computed transposed: D[n, m] = W[n, k]·Aᵀ with W (E4M3, K-major: row-major) as A, the
// activations (K-major: a column-major k × m matrix) as B, and D column-major with leading
// dimension ld_out, which is out[m, ld_out] row-major. The per-weight-row scale is then a per-row
// vector of D and W8A8's per-token scale a per-column one, both broadcast by the epilogue, which
// may also add a source matrix C (the residual stream, in place; mixed only). Configurations
// (compile time): with or without C, tiles of 128 weight rows × 128 or 256 activation rows × 64 k
// (128 k for E4M3 activations: one 128-byte swizzle; gemm_cutlass_tile_rows picks the rows), all
// with the cooperative warp-specialized schedule, no clusters, and the stream-K tile scheduler:
// when the output tiles alone leave SMs idle (CUTLASS's heuristic, from the tile count and k), the
// k range of some tiles is split over CTAs and reduced in a fixed (turnstile) order, so a shape
// gives the same bits run to run, but the split, and so the order, may change with m. (Persistent
// data-parallel tiles, m-invariant, were up to 2.1x slower at m = 64-128: docs/benchmarks.md.)
#include "cuda/kernels/gemm/gemm_cutlass_mixed.h"

#include <algorithm>
#include <type_traits>
#include <variant>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "core/error.h"
#include "cuda/runtime/cuda_check.h"

namespace dflash {
namespace {

namespace fusion = cutlass::epilogue::fusion;

using Bf16 = cutlass::bfloat16_t;
using E4M3 = cutlass::float_e4m3_t;

// 128 weight rows × kTileN activation rows × kTileK k per tile.
template <int kTileN, int kTileK>
using TileShape = cute::Shape<cute::_128, cute::Int<kTileN>, cute::Int<kTileK>>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
constexpr int kAlignWeight = 16;      // elements per 16-byte TMA access: E4M3
constexpr int kAlignOut = 4;          // fp32
template <typename Activation>
constexpr int kAlignActivation = 16 / static_cast<int>(sizeof(Activation));  // 8 bf16, 16 E4M3

// D = scale[row of D] · acc in fp32, rounded to nearest: the fallbacks' epilogue multiplies alike.
template <typename Tile>
using ScaleByRow = fusion::Sm90EVT<
    fusion::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>,
    fusion::Sm90ColBroadcast<0, Tile, float, float, cute::Stride<cute::_1, cute::_0, int64_t>, kAlignOut>,
    fusion::Sm90AccFetch>;
// D = C + scale[row of D] · acc: the product rounded as above, then the source added and rounded,
// the fallbacks' residual_sum (the file is compiled without FMA contraction, so the two stay two).
template <typename Tile>
using ScaleByRowPlusSource =
    fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, float, float, cutlass::FloatRoundStyle::round_to_nearest>,
                    ScaleByRow<Tile>, fusion::Sm90SrcFetch<float>>;

// W8A8: D = token_scale[column of D] · (scale[row of D] · acc), each product rounded to nearest:
// gemm_w8a8's row_scale · (acc · scale), in that order.
template <typename Tile>
using ScaleByRowAndToken = fusion::Sm90EVT<
    fusion::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>,
    fusion::Sm90RowBroadcast<0, Tile, float, float, cute::Stride<cute::_0, cute::_1, int64_t>>, ScaleByRow<Tile>>;

// One GEMM configuration: the activations' type (bf16: mixed input; E4M3: W8A8, never with a
// source), with a source matrix C or without (ElementC void: the output is only stored), and the
// tile's activation rows.
template <typename Activation, bool kSource, int kTileN>
struct Config {
  static constexpr bool kW8A8 = std::is_same_v<Activation, E4M3>;
  static_assert(!(kW8A8 && kSource), "W8A8 adds no source in CUTLASS's epilogue");
  static constexpr bool kWithSource = kSource;
  using ActivationType = Activation;
  using Tile = TileShape<kTileN, kW8A8 ? 128 : 64>;
  using Fusion = std::conditional_t<kW8A8, ScaleByRowAndToken<Tile>,
                                    std::conditional_t<kSource, ScaleByRowPlusSource<Tile>, ScaleByRow<Tile>>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, std::conditional_t<kSource, float, void>,
      cutlass::layout::ColumnMajor, kAlignOut, float, cutlass::layout::ColumnMajor, kAlignOut,
      cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E4M3, cutlass::layout::RowMajor, kAlignWeight, Activation,
      cutlass::layout::ColumnMajor, kAlignActivation<Activation>, float, Tile, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      cutlass::gemm::StreamKScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Every argument the kernel relies on, checked on the host; the message names the field.
// token_scale: W8A8's per-row activation scales (required there, null for the mixed GEMM).
template <typename Activation>
void check_arguments(const void* a, int64_t lda, int64_t m, const DeviceMatrixView& w, float* out, int64_t ld_out,
                     const float* source, const float* token_scale) {
  constexpr bool kW8A8 = std::is_same_v<Activation, E4M3>;
  const std::string what = kW8A8 ? "cutlass w8a8 GEMM: " : "cutlass mixed GEMM: ";
  if (kW8A8 && (token_scale == nullptr || source != nullptr)) {
    throw bad_input(what + "needs the activations' row scales and adds no source");
  }
  if (!kW8A8 && token_scale != nullptr) throw bad_input(what + "takes no activation row scales");
  if (w.format != WeightFormat::kE4M3 || w.data == nullptr || w.scale == nullptr) {
    throw bad_input(what + "the weight must be E4M3 codes with per-row scales");
  }
  if (w.bias != nullptr) throw bad_input(what + "the weight has a bias; the candidate has none");
  if (a == nullptr || out == nullptr) throw bad_input(what + "null activations or output");
  if (m < 1 || m > INT32_MAX) throw bad_input(what + "m " + std::to_string(m) + " is outside [1, 2^31)");
  if (w.n < 1 || w.n % kAlignOut != 0 || w.n > INT32_MAX) {
    throw bad_input(what + "the weight's n " + std::to_string(w.n) + " is not a positive multiple of 4");
  }
  if (w.k_pad < 1 || w.k_pad % kGemmKAlign != 0 || w.k_pad > INT32_MAX) {
    throw bad_input(what + "the weight's k_pad " + std::to_string(w.k_pad) + " is not a positive multiple of 64");
  }
  if (lda < w.k_pad || lda % kAlignActivation<Activation> != 0) {
    throw bad_input(what + "lda " + std::to_string(lda) + " is below k_pad " + std::to_string(w.k_pad) +
                    " or not a multiple of " + std::to_string(kAlignActivation<Activation>));
  }
  if (ld_out < w.n || ld_out % kAlignOut != 0) {
    throw bad_input(what + "ld_out " + std::to_string(ld_out) + " is below n " + std::to_string(w.n) +
                    " or not a multiple of 4");
  }
  if (!aligned16(a) || !aligned16(w.data) || !aligned16(w.scale) || !aligned16(out) || !aligned16(source) ||
      !aligned16(token_scale)) {
    throw bad_input(what + "activations, weight, scales, output and source must be 16-byte aligned");
  }
}

// source: null (no C) or the [m, ld_out] matrix added to the product (C::kWithSource; may be out).
// token_scale: W8A8's [m] activation scales (C::kW8A8).
template <typename C>
typename C::Gemm::Arguments make_arguments(const void* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                                           float* out, int64_t ld_out, const float* source,
                                           const float* token_scale) {
  using Kernel = typename C::Kernel;
  typename Kernel::StrideA stride_w{};
  cute::get<0>(stride_w) = w.k_pad;
  typename Kernel::StrideB stride_a{};
  cute::get<0>(stride_a) = lda;
  typename Kernel::StrideD stride_out{};
  cute::get<1>(stride_out) = ld_out;
  typename C::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {static_cast<int>(w.n), static_cast<int>(m), static_cast<int>(w.k_pad), 1};
  args.mainloop.ptr_A = static_cast<const cutlass::float_e4m3_t*>(w.data);
  args.mainloop.dA = stride_w;
  args.mainloop.ptr_B = static_cast<const typename C::ActivationType*>(a);
  args.mainloop.dB = stride_a;
  // The tree's arguments: {scale broadcast, accumulator fetch, multiply}, inside {that, source, add}
  // or, W8A8, inside {token scale broadcast, that, multiply}.
  if constexpr (C::kWithSource) {
    args.epilogue.thread = {{{w.scale, 0.0f, {}}, {}, {}}, {}, {}};
    args.epilogue.ptr_C = source;
    args.epilogue.dC = stride_out;
  } else if constexpr (C::kW8A8) {
    args.epilogue.thread = {{token_scale, 0.0f, {}}, {{w.scale, 0.0f, {}}, {}, {}}, {}};
    args.epilogue.ptr_C = nullptr;
  } else {
    args.epilogue.thread = {{w.scale, 0.0f, {}}, {}, {}};
    args.epilogue.ptr_C = nullptr;
  }
  args.epilogue.ptr_D = out;
  args.epilogue.dD = stride_out;
  int device = 0;
  DFLASH_CUDA_CHECK(cudaGetDevice(&device));
  DFLASH_CUDA_CHECK(cudaDeviceGetAttribute(&args.hw_info.sm_count, cudaDevAttrMultiProcessorCount, device));
  args.hw_info.device_id = device;
  args.scheduler.decomposition_mode = cutlass::gemm::kernel::detail::DecompositionMode::Heuristic;
  args.scheduler.reduction_mode = cutlass::gemm::kernel::detail::ReductionMode::Deterministic;
  return args;
}

}  // namespace

bool cutlass_mixed_supported(std::string* why) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = "no CUDA device";
    return false;
  }
  if (major != 9 || minor != 0) {
    if (why) *why = "the CUTLASS GEMM is built for sm_90a; this device is compute capability " +
                    std::to_string(major) + "." + std::to_string(minor);
    return false;
  }
  return true;
}

size_t cutlass_mixed_workspace_bytes(int64_t m, int64_t n, int64_t k_pad) {
  DeviceMatrixView w;
  w.n = n;
  w.k_pad = k_pad;
  auto bytes = [&](auto config) {
    using C = decltype(config);
    return C::Gemm::get_workspace_size(make_arguments<C>(nullptr, k_pad, m, w, nullptr, n, nullptr, nullptr));
  };
  return std::max({bytes(Config<Bf16, false, 128>{}), bytes(Config<Bf16, true, 128>{}),
                   bytes(Config<Bf16, false, 256>{}), bytes(Config<Bf16, true, 256>{}),
                   bytes(Config<E4M3, false, 128>{}), bytes(Config<E4M3, false, 256>{})});
}

namespace {

// A prepared launch: the arguments and CUTLASS's parameters (the TMA descriptors).
template <typename C>
struct Prepared {
  using Gemm = typename C::Gemm;
  Gemm gemm;
  typename Gemm::Arguments args;
  void* workspace = nullptr;

  void prepare(const void* a, int64_t lda, int64_t m, const DeviceMatrixView& w, float* out, int64_t ld_out,
               const float* source, const float* token_scale, void* workspace_in, size_t workspace_bytes,
               cudaStream_t stream) {
    // Before the device is touched.
    check_arguments<typename C::ActivationType>(a, lda, m, w, out, ld_out, source, token_scale);
    args = make_arguments<C>(a, lda, m, w, out, ld_out, source, token_scale);
    workspace = workspace_in;
    const size_t needed = Gemm::get_workspace_size(args);
    if (needed > workspace_bytes) {
      throw bad_input(std::string(C::kW8A8 ? "cutlass w8a8" : "cutlass mixed") + " GEMM: the workspace of " +
                      std::to_string(workspace_bytes) +
                      " bytes is below the " + std::to_string(needed) + " it needs");
    }
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) {
      throw bad_input(std::string(C::kW8A8 ? "cutlass w8a8" : "cutlass mixed") + " GEMM: cannot implement m " +
                      std::to_string(m) + ", n " +
                      std::to_string(w.n) + ", k " + std::to_string(w.k_pad) + ": " + cutlassGetStatusString(status));
    }
    // On the launch's stream: stream-K clears its barrier workspace here (inside a graph capture too).
    status = gemm.initialize(args, workspace, stream);
    if (status != cutlass::Status::kSuccess) {
      throw internal_error(std::string("cutlass mixed GEMM: initialize: ") + cutlassGetStatusString(status));
    }
  }
  // clear: clear the workspace first (stream-K's barriers: a launch leaves them dirty).
  void run(cudaStream_t stream, bool clear) {
    cutlass::Status status = cutlass::Status::kSuccess;
    if (clear) status = Gemm::GemmKernel::initialize_workspace(args, workspace, stream);
    if (status == cutlass::Status::kSuccess) status = gemm.run(stream);
    if (status != cutlass::Status::kSuccess) {
      throw internal_error(std::string("cutlass mixed GEMM: run: ") + cutlassGetStatusString(status));
    }
    DFLASH_CUDA_CHECK_LAUNCH("cutlass mixed GEMM");
  }
};

// Calls f(Config<Activation, kSource, tile_rows>{}); tile_rows must be 128 or 256.
template <typename Activation, bool kSource, typename F>
void with_tile(int tile_rows, F&& f) {
  if (tile_rows == 256) {
    f(Config<Activation, kSource, 256>{});
  } else if (tile_rows == 128) {
    f(Config<Activation, kSource, 128>{});
  } else {
    throw bad_input("cutlass GEMM: tile rows " + std::to_string(tile_rows) + " (128 or 256)");
  }
}

}  // namespace

struct CutlassMixedGemm::Impl {
  std::variant<Prepared<Config<Bf16, false, 128>>, Prepared<Config<Bf16, false, 256>>,
               Prepared<Config<E4M3, false, 128>>, Prepared<Config<E4M3, false, 256>>>
      prepared;
};

CutlassMixedGemm::CutlassMixedGemm(const uint16_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w, float* out,
                                   int64_t ld_out, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                                   int tile_rows)
    : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!cutlass_mixed_supported(&why)) throw unsupported(why);
  with_tile<Bf16, false>(tile_rows, [&](auto config) {
    impl_->prepared.emplace<Prepared<decltype(config)>>().prepare(a, lda, m, w, out, ld_out, nullptr, nullptr,
                                                                  workspace, workspace_bytes, stream);
  });
}

CutlassMixedGemm::CutlassMixedGemm(const uint8_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                                   const float* row_scale, float* out, int64_t ld_out, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream, int tile_rows)
    : impl_(std::make_unique<Impl>()) {
  std::string why;
  if (!cutlass_mixed_supported(&why)) throw unsupported(why);
  with_tile<E4M3, false>(tile_rows, [&](auto config) {
    impl_->prepared.emplace<Prepared<decltype(config)>>().prepare(a, lda, m, w, out, ld_out, nullptr, row_scale,
                                                                  workspace, workspace_bytes, stream);
  });
}

CutlassMixedGemm::~CutlassMixedGemm() = default;
CutlassMixedGemm::CutlassMixedGemm(CutlassMixedGemm&&) noexcept = default;
CutlassMixedGemm& CutlassMixedGemm::operator=(CutlassMixedGemm&&) noexcept = default;

void CutlassMixedGemm::run(cudaStream_t stream) {
  std::visit([&](auto& p) { p.run(stream, true); }, impl_->prepared);
}

void launch_gemm_cutlass_mixed(cudaStream_t stream, const uint16_t* a, int64_t lda, int64_t m,
                               const DeviceMatrixView& w, float* out, int64_t ld_out, void* workspace,
                               size_t workspace_bytes, const float* source, int tile_rows) {
  // Prepared on the stream, which clears the workspace: the launch needs no second clear.
  auto prepare_and_run = [&](auto config) {
    Prepared<decltype(config)> p;
    p.prepare(a, lda, m, w, out, ld_out, source, nullptr, workspace, workspace_bytes, stream);
    p.run(stream, false);
  };
  if (source != nullptr) {
    with_tile<Bf16, true>(tile_rows, prepare_and_run);
  } else {
    with_tile<Bf16, false>(tile_rows, prepare_and_run);
  }
}

void launch_gemm_cutlass_w8a8(cudaStream_t stream, const uint8_t* a, int64_t lda, int64_t m, const DeviceMatrixView& w,
                              const float* row_scale, float* out, int64_t ld_out, void* workspace,
                              size_t workspace_bytes, int tile_rows) {
  with_tile<E4M3, false>(tile_rows, [&](auto config) {
    Prepared<decltype(config)> p;
    p.prepare(a, lda, m, w, out, ld_out, nullptr, row_scale, workspace, workspace_bytes, stream);
    p.run(stream, false);
  });
}

}  // namespace dflash
