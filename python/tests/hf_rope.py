"""RoPE frequencies and angles formed the way Hugging Face's rotary code forms them (facts from
its `_compute_default_rope_parameters`, `_compute_yarn_parameters` and the rotary forward): inv_freq
in fp32 from an fp32 exponent, the angle position·inv_freq in fp32, cos and sin in fp32 times the
attention factor, then cast to the activations' dtype."""
import math

import torch


def rope_parameters(config):
    """(rope_type, theta, scaling dict) of a drafter config (docs/spec/drafter.md §1)."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or params
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    return rope_type, float(theta), scaling


def inv_freq_and_scaling(config, head_dim):
    """inv_freq [d/2] (fp32) and the attention scaling factor (a Python float)."""
    rope_type, base, scaling = rope_parameters(config)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    pos_freqs = base ** exponents
    if rope_type == "default":
        return 1.0 / pos_freqs, 1.0
    if rope_type != "yarn":
        raise ValueError(f"rope_type {rope_type!r} is not supported by this test drafter")
    factor = float(scaling["factor"])
    original = scaling.get("original_max_position_embeddings") or config["max_position_embeddings"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)

    def correction_dim(rotations):
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, attention


def cos_sin(inv_freq, attention, position_ids, dtype):
    """cos, sin [1, positions, d] for position_ids [1, positions]: angles and cos/sin in fp32."""
    inv = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    pos = position_ids[:, None, :].float()
    freqs = (inv @ pos).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention).to(dtype), (emb.sin() * attention).to(dtype)
