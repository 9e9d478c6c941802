#include "cuda/drafter/device_weights.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <optional>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/runtime/cuda_check.h"
#include "cuda/kernels/quant/fp8_quant.h"
#include "cuda/drafter/host_parallel.h"

namespace dflash {
namespace {

// One source row of a fused weight: tensor `name`, row `row`.
struct RowSource {
  const Tensor* tensor;
  const std::string* name;
  int64_t row;
};

// bf16 bits of a weight row, padded with zeros; refuses values that are not finite bf16 values.
void convert_row(const RowSource& src, int64_t k, int64_t k_pad, uint16_t* out) {
  const float* values = src.tensor->row(src.row);
  for (int64_t c = 0; c < k; ++c) {
    const float v = values[c];
    const uint16_t bits = float_to_bf16_bits(v);
    if (!std::isfinite(v) || bf16_bits_to_float(bits) != v) {
      throw bad_input("weights: tensor '" + *src.name + "' element [" + std::to_string(src.row) + ", " +
                      std::to_string(c) + "] = " + std::to_string(v) +
                      (std::isfinite(v) ? " is not a bf16 value" : " is not finite") +
                      " (the CUDA drafter holds weights as bf16)");
    }
    out[c] = bits;
  }
  std::fill(out + k, out + k_pad, uint16_t{0});
}

std::vector<float> float_values(const Tensor& t, const std::string& name) {
  for (size_t i = 0; i < t.values.size(); ++i) {
    if (!std::isfinite(t.values[i])) {
      throw bad_input("weights: tensor '" + name + "' element " + std::to_string(i) + " is not finite");
    }
  }
  return t.values;
}

template <typename T>
DeviceBuffer<T> upload_vector(const std::vector<T>& host) {
  DeviceBuffer<T> d(host.size());
  if (!host.empty()) DFLASH_CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

DeviceBuffer<float> upload_norm(const Tensor& t, const std::string& name) { return upload_vector(float_values(t, name)); }

// An E4M3 weight whose rows hold a pre-quantized checkpoint's code · scale products (fp32 values,
// not all bf16 ones): quantized per row on the host by core/fp8.h, as the reference quantizes the
// same floats (on bf16 rows the device kernel gives the same bytes: gpu_fp8_quant_test).
DeviceLinear upload_host_quantized(const std::vector<RowSource>& rows, int64_t k, bool keep_decoded,
                                   const std::vector<float>& bias, cudaStream_t stream) {
  DeviceLinear linear;
  linear.format = WeightFormat::kE4M3;
  linear.n = static_cast<int64_t>(rows.size());
  linear.k = k;
  linear.k_pad = pad_k(k);
  const int64_t n = linear.n, k_pad = linear.k_pad;
  Tensor values = Tensor::zeros({n, k});
  for (int64_t r = 0; r < n; ++r) {
    const RowSource& src = rows[static_cast<size_t>(r)];
    const float* row = src.tensor->row(src.row);
    for (int64_t c = 0; c < k; ++c) {
      if (!std::isfinite(row[c])) {
        throw bad_input("weights: tensor '" + *src.name + "' element [" + std::to_string(src.row) + ", " +
                        std::to_string(c) + "] is not finite");
      }
    }
    std::copy_n(row, k, values.values.data() + r * k);
  }
  const QuantizedRows q = quantize_rows_e4m3(values);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k_pad), 0);  // zero codes past k
  for (int64_t r = 0; r < n; ++r) std::copy_n(q.codes.data() + r * k, k, codes.data() + r * k_pad);
  linear.data = upload_vector(codes);
  linear.scale = upload_vector(q.scales);
  if (keep_decoded) {
    linear.decoded.allocate(static_cast<size_t>(n * k_pad));
    launch_decode_e4m3_to_bf16(stream, linear.data.get(), n * k_pad, linear.decoded.get());
  }
  if (!bias.empty()) linear.bias = upload_vector(bias);
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
  return linear;
}

// Builds one (possibly fused) weight from its source rows. `stored`: some rows come from a
// pre-quantized checkpoint (E4M3 codes times scales, docs/spec/fp8-checkpoints.md).
DeviceLinear upload_linear(const std::vector<RowSource>& rows, int64_t k, WeightFormat format, bool keep_decoded,
                           const std::vector<float>& bias, cudaStream_t stream, bool stored = false) {
  if (stored && format == WeightFormat::kE4M3) return upload_host_quantized(rows, k, keep_decoded, bias, stream);
  DeviceLinear linear;
  linear.format = format;
  linear.n = static_cast<int64_t>(rows.size());
  linear.k = k;
  linear.k_pad = pad_k(k);
  const int64_t n = linear.n, k_pad = linear.k_pad;
  std::vector<uint16_t> host(static_cast<size_t>(n * k_pad));
  parallel_for(n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) convert_row(rows[static_cast<size_t>(r)], k, k_pad, host.data() + r * k_pad);
  });
  DeviceBuffer<uint16_t> bf16(host.size());
  DFLASH_CUDA_CHECK(cudaMemcpyAsync(bf16.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice, stream));
  if (format == WeightFormat::kE4M3) {
    linear.data.allocate(static_cast<size_t>(n * k_pad));
    linear.scale.allocate(static_cast<size_t>(n));
    launch_quantize_rows_e4m3(stream, bf16.get(), n, k_pad, linear.data.get(), linear.scale.get());
    if (keep_decoded) {
      linear.decoded.allocate(static_cast<size_t>(n * k_pad));
      launch_decode_e4m3_to_bf16(stream, linear.data.get(), n * k_pad, linear.decoded.get());
    }
  } else {
    linear.data.allocate(static_cast<size_t>(n * k_pad * 2));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(linear.data.get(), bf16.get(), host.size() * 2, cudaMemcpyDeviceToDevice, stream));
  }
  if (!bias.empty()) linear.bias = upload_vector(bias);
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));  // before `bf16` and `host` go away
  return linear;
}

void append_rows(std::vector<RowSource>& rows, const Tensor& t, const std::string& name) {
  for (int64_t r = 0; r < t.rows(); ++r) rows.push_back({&t, &name, r});
}

void append_bias(std::vector<float>& bias, const Tensor& t, const std::string& name) {
  const std::vector<float> v = float_values(t, name);
  bias.insert(bias.end(), v.begin(), v.end());
}

}  // namespace

DeviceMatrixView DeviceLinear::view() const {
  DeviceMatrixView v;
  v.format = format;
  v.n = n;
  v.k = k;
  v.k_pad = k_pad;
  v.data = data.get();
  v.scale = scale.size() > 0 ? scale.get() : nullptr;
  v.bias = bias.size() > 0 ? bias.get() : nullptr;
  v.decoded = decoded.size() > 0 ? decoded.get() : nullptr;
  return v;
}

int64_t DeviceLinear::storage_bytes() const {
  return static_cast<int64_t>(data.bytes() + scale.bytes() + bias.bytes());
}

DeviceDrafterWeights upload_drafter_weights(const DrafterConfig& config, const DrafterWeights& weights,
                                            WeightFormat projections, bool keep_decoded, cudaStream_t stream,
                                            bool static_activations) {
  auto scale_of = [](const std::optional<float>& s) { return s ? *s : 0.0f; };
  validate_drafter_weights(config, weights);
  DeviceDrafterWeights d;
  const std::string fc_name = "fc.weight";
  std::vector<RowSource> fc_rows;
  append_rows(fc_rows, weights.fc, fc_name);
  d.fc = upload_linear(fc_rows, config.ctx_feature_dim(), WeightFormat::kBf16, false, {}, stream);
  d.hidden_norm = upload_norm(weights.hidden_norm, "hidden_norm.weight");
  d.final_norm = upload_norm(weights.norm, "norm.weight");

  for (int l = 0; l < config.num_layers; ++l) {
    const LayerWeights& lw = weights.layers[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string qn = p + "self_attn.q_proj.weight", kn = p + "self_attn.k_proj.weight",
                      vn = p + "self_attn.v_proj.weight", on = p + "self_attn.o_proj.weight",
                      gn = p + "mlp.gate_proj.weight", un = p + "mlp.up_proj.weight", dn = p + "mlp.down_proj.weight";
    DeviceLayerWeights layer;
    std::vector<RowSource> qkv;
    append_rows(qkv, lw.q_proj, qn);
    append_rows(qkv, lw.k_proj, kn);
    append_rows(qkv, lw.v_proj, vn);
    std::vector<float> qkv_bias, o_bias;
    if (config.attention_bias) {
      append_bias(qkv_bias, lw.q_bias, p + "self_attn.q_proj.bias");
      append_bias(qkv_bias, lw.k_bias, p + "self_attn.k_proj.bias");
      append_bias(qkv_bias, lw.v_bias, p + "self_attn.v_proj.bias");
      append_bias(o_bias, lw.o_bias, p + "self_attn.o_proj.bias");
    }
    layer.qkv = upload_linear(qkv, config.hidden_size, projections, keep_decoded, qkv_bias, stream,
                              lw.q_proj_fp8 || lw.k_proj_fp8 || lw.v_proj_fp8);
    std::vector<RowSource> o;
    append_rows(o, lw.o_proj, on);
    layer.o = upload_linear(o, config.q_dim(), projections, keep_decoded, o_bias, stream, lw.o_proj_fp8.has_value());
    const int64_t inter = config.intermediate_size, kv = config.kv_dim(), q = config.q_dim();
    const bool static_mlp = static_activations && (lw.gate_input_scale || lw.up_input_scale);
    std::vector<RowSource> gate_up;
    if (static_mlp) {  // two parts: the gate rows, then the up rows
      append_rows(gate_up, lw.gate_proj, gn);
      append_rows(gate_up, lw.up_proj, un);
    } else {
      for (int64_t i = 0; i < inter; ++i) {
        gate_up.push_back({&lw.gate_proj, &gn, i});
        gate_up.push_back({&lw.up_proj, &un, i});
      }
    }
    layer.gate_up = upload_linear(gate_up, config.hidden_size, projections, keep_decoded, {}, stream,
                                  lw.gate_proj_fp8 || lw.up_proj_fp8);
    std::vector<RowSource> down;
    append_rows(down, lw.down_proj, dn);
    layer.down = upload_linear(down, config.intermediate_size, projections, keep_decoded, {}, stream,
                               lw.down_proj_fp8.has_value());
    if (static_mlp) {
      layer.gate_up.split_gate_up = true;
      layer.gate_up.activation_parts = {{0, inter, scale_of(lw.gate_input_scale)},
                                        {inter, inter, scale_of(lw.up_input_scale)}};
    }
    if (static_activations && (lw.q_input_scale || lw.k_input_scale || lw.v_input_scale)) {
      layer.qkv.activation_parts = {{0, q, scale_of(lw.q_input_scale)},
                                    {q, kv, scale_of(lw.k_input_scale)},
                                    {q + kv, kv, scale_of(lw.v_input_scale)}};
    }
    if (static_activations && lw.o_input_scale) layer.o.activation_parts = {{0, layer.o.n, *lw.o_input_scale}};
    if (static_activations && lw.down_input_scale) layer.down.activation_parts = {{0, layer.down.n, *lw.down_input_scale}};
    layer.input_norm = upload_norm(lw.input_layernorm, p + "input_layernorm.weight");
    layer.post_norm = upload_norm(lw.post_attention_layernorm, p + "post_attention_layernorm.weight");
    layer.q_norm = upload_norm(lw.q_norm, p + "self_attn.q_norm.weight");
    layer.k_norm = upload_norm(lw.k_norm, p + "self_attn.k_norm.weight");
    if (config.dflash2.enabled) {
      const std::string an = p + "attention_conv.kernel_projection.weight", mn = p + "mlp_conv.kernel_projection.weight";
      std::vector<RowSource> attn_proj, mlp_proj;
      append_rows(attn_proj, lw.attn_conv_proj, an);
      append_rows(mlp_proj, lw.mlp_conv_proj, mn);
      layer.attn_conv_proj = upload_linear(attn_proj, config.hidden_size, WeightFormat::kBf16, false, {}, stream);
      layer.mlp_conv_proj = upload_linear(mlp_proj, config.hidden_size, WeightFormat::kBf16, false, {}, stream);
      layer.attn_conv_base = upload_norm(lw.attn_conv_base, p + "attention_conv.base_kernel");
      layer.mlp_conv_base = upload_norm(lw.mlp_conv_base, p + "mlp_conv.base_kernel");
    }
    d.layers.push_back(std::move(layer));
  }

  // embed_tokens: bf16 rows, unpadded (gathered into the fp32 residual stream).
  const std::string embed_name = "embed_tokens";
  std::vector<uint16_t> embed(static_cast<size_t>(weights.embed_tokens.numel()));
  const int64_t h = config.hidden_size;
  parallel_for(weights.embed_tokens.rows(), 1024, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) convert_row({&weights.embed_tokens, &embed_name, r}, h, h, embed.data() + r * h);
  });
  d.embed = upload_vector(embed);

  if (config.dflash2.enabled) {
    const SelectorWeights& sw = weights.selector;
    const std::string hn = "candidate_selector.hidden_projection.weight", pn = "candidate_selector.predecessor_codebook",
                      sn = "candidate_selector.successor_codebook";
    std::vector<RowSource> hidden;
    append_rows(hidden, sw.hidden_projection, hn);
    d.selector.hidden_projection = upload_linear(hidden, config.hidden_size, WeightFormat::kBf16, false, {}, stream);
    const int64_t rank = config.dflash2.selector_rank;
    for (const auto& [tensor, name, out] : {std::tuple{&sw.predecessor_codebook, &pn, &d.selector.predecessor},
                                            std::tuple{&sw.successor_codebook, &sn, &d.selector.successor}}) {
      std::vector<uint16_t> bits(static_cast<size_t>(tensor->numel()));
      parallel_for(tensor->rows(), 1024, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) convert_row({tensor, name, r}, rank, rank, bits.data() + r * rank);
      });
      *out = upload_vector(bits);
    }
  }

  if (weights.nvfp4_head()) {
    d.lm_head_nvfp4 = upload_nvfp4(weights.lm_head_nvfp4);
    return d;
  }
  const std::string lm_name = "lm_head";
  std::vector<RowSource> lm;
  append_rows(lm, weights.lm_head, lm_name);
  d.lm_head = upload_linear(lm, config.hidden_size, projections, keep_decoded, {}, stream);
  if (static_activations && weights.lm_head_input_scale) {
    d.lm_head.activation_parts = {{0, d.lm_head.n, *weights.lm_head_input_scale}};
  }
  return d;
}

std::vector<ActivationPart> activation_parts_of_rows(const std::vector<ActivationPart>& parts, int64_t first,
                                                     int64_t count) {
  std::vector<ActivationPart> out;
  for (const ActivationPart& p : parts) {
    const int64_t begin = std::max(p.first, first), end = std::min(p.first + p.count, first + count);
    if (begin < end) out.push_back({begin - first, end - begin, p.static_scale});
  }
  return out;
}

namespace {

// Columns [begin, begin + count) of the [n, src_ld] matrix at src, of `element`-byte values, into
// a new [n, dst_ld] one, zero past count.
template <typename T>
DeviceBuffer<T> copy_columns(const T* src, int64_t n, int64_t src_ld, int64_t dst_ld, int64_t begin, int64_t count,
                             size_t element, cudaStream_t stream) {
  DeviceBuffer<T> dst(static_cast<size_t>(n * dst_ld) * element / sizeof(T));
  DFLASH_CUDA_CHECK(cudaMemsetAsync(dst.get(), 0, dst.bytes(), stream));
  DFLASH_CUDA_CHECK(cudaMemcpy2DAsync(dst.get(), static_cast<size_t>(dst_ld) * element,
                                      reinterpret_cast<const char*>(src) + static_cast<size_t>(begin) * element,
                                      static_cast<size_t>(src_ld) * element, static_cast<size_t>(count) * element,
                                      static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream));
  return dst;
}

// Columns [begin, begin + count) of every row of w, zero-padded to pad_k(count); the full rows'
// scales (a shard of a row-parallel weight keeps TP = 1's quantization); no bias (added once, after
// the reduction).
DeviceLinear column_slice(const DeviceLinear& w, int64_t begin, int64_t count, cudaStream_t stream) {
  DeviceLinear s;
  s.format = w.format;
  s.n = w.n;
  s.k = count;
  s.k_pad = pad_k(count);
  const size_t element = w.format == WeightFormat::kE4M3 ? 1 : 2;
  s.data = copy_columns(w.data.get(), w.n, w.k_pad, s.k_pad, begin, count, element, stream);
  if (w.scale.size() > 0) {
    s.scale.allocate(w.scale.size());
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(s.scale.get(), w.scale.get(), w.scale.bytes(), cudaMemcpyDeviceToDevice, stream));
  }
  if (w.decoded.size() > 0) s.decoded = copy_columns(w.decoded.get(), w.n, w.k_pad, s.k_pad, begin, count, 2, stream);
  return s;
}

// Rows [begin, begin + count) of w with their scales and biases.
DeviceLinear row_slice(const DeviceLinear& w, int64_t begin, int64_t count, cudaStream_t stream) {
  DeviceLinear s;
  s.format = w.format;
  s.n = count;
  s.k = w.k;
  s.k_pad = w.k_pad;
  auto copy = [&](auto& dst, const auto& src, int64_t per_row) {  // per_row: src's elements per weight row
    if (src.size() == 0) return;
    dst.allocate(static_cast<size_t>(count * per_row));
    DFLASH_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get() + begin * per_row, dst.bytes(), cudaMemcpyDeviceToDevice,
                                      stream));
  };
  copy(s.data, w.data, w.k_pad * (w.format == WeightFormat::kE4M3 ? 1 : 2));
  copy(s.scale, w.scale, 1);
  copy(s.bias, w.bias, 1);
  copy(s.decoded, w.decoded, w.k_pad);
  return s;
}

}  // namespace

void shard_weights(DeviceDrafterWeights& weights, const DrafterConfig& config, int tp, cudaStream_t stream) {
  const int64_t q_rank = config.q_dim() / tp, inter_rank = config.intermediate_size / tp;
  for (DeviceLayerWeights& layer : weights.layers) {
    for (int r = 0; r < tp; ++r) {
      layer.o_shards.push_back(column_slice(layer.o, r * q_rank, q_rank, stream));
      layer.down_shards.push_back(column_slice(layer.down, r * inter_rank, inter_rank, stream));
    }
  }
  if (weights.lm_head.n > 0) {
    const int64_t vocab_rank = config.vocab_size / tp;
    for (int r = 0; r < tp; ++r) weights.lm_head_shards.push_back(row_slice(weights.lm_head, r * vocab_rank, vocab_rank, stream));
  }
  DFLASH_CUDA_CHECK(cudaStreamSynchronize(stream));
}

QuantizedRows download_quantized(const DeviceLinear& linear) {
  if (linear.format != WeightFormat::kE4M3) throw internal_error("download_quantized: the weight is not E4M3");
  QuantizedRows q;
  q.rows = linear.n;
  q.cols = linear.k_pad;
  q.codes.resize(static_cast<size_t>(linear.n * linear.k_pad));
  q.scales.resize(static_cast<size_t>(linear.n));
  DFLASH_CUDA_CHECK(cudaMemcpy(q.codes.data(), linear.data.get(), q.codes.size(), cudaMemcpyDeviceToHost));
  DFLASH_CUDA_CHECK(cudaMemcpy(q.scales.data(), linear.scale.get(), q.scales.size() * 4, cudaMemcpyDeviceToHost));
  return q;
}

}  // namespace dflash
