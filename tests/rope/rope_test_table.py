#!/usr/bin/python3
"""Writes tests/rope/rope_test_table.h: RoPE inv_freq, angles and cos/sin formed as Hugging Face
transformers forms them (modeling_rope_utils `_compute_default_rope_parameters`,
`_compute_yarn_parameters`, and the rotary module's forward), for tests/rope/rope_test.cc.

Independent of the C++ code under test: numpy float32 for every tensor operation upstream does
in fp32 (+, -, *, / and clamp are correctly rounded IEEE operations in numpy as in torch), Python
floats (doubles) where upstream computes in Python, and:
  - pow: SLEEF's Sleef_powf_u10 (through ctypes), the fp32 pow torch's CPU kernels use for whole
    vectors. It is not always the nearest float; the script lists where it is not (mpmath at 200
    bits gives the nearest).
  - cos, sin: mpmath at 200 bits rounded once to the nearest float32 (what the harness uses;
    torch's SLEEF cosf/sinf are within 1 ulp of it). The script prints the smallest distance of an
    exact value to a rounding midpoint, which bounds how close a double-based rounding comes to
    going the other way.

When torch is importable, the script also runs python/tests/hf_rope.py (the capture tests' HF-style
RoPE in torch) on the same cases and reports how its inv_freq and cos/sin compare with the table.

Usage: /usr/bin/python3 tests/rope/rope_test_table.py > tests/rope/rope_test_table.h
Needs numpy, mpmath and libsleef.so.3 (Debian: python3-numpy python3-mpmath libsleef3).
"""
import ctypes
import math
import sys

import mpmath
import numpy as np

mpmath.mp.prec = 200
SLEEF = ctypes.CDLL("libsleef.so.3")
SLEEF.Sleef_powf_u10.restype = ctypes.c_float
SLEEF.Sleef_powf_u10.argtypes = [ctypes.c_float, ctypes.c_float]

F32 = np.float32
POSITIONS = [0, 1, 2, 3, 7, 100, 511, 512, 1000, 4095, 4096, 4097, 8191, 32768, 65535, 100003, 131071, 131072]

closest_midpoint = {}  # per function: smallest |exact - midpoint| in ulps, and where


def bits(x):
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def nearest_f32(exact, where):
    """The float32 nearest to the mpmath value `exact` (no double rounding through float64)."""
    guess = F32(float(exact))
    candidates = [np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf))]
    best = min(candidates, key=lambda c: abs(mpmath.mpf(float(c)) - exact))
    other = np.nextafter(best, F32(np.inf) if exact > mpmath.mpf(float(best)) else F32(-np.inf))
    ulp = abs(mpmath.mpf(float(other)) - mpmath.mpf(float(best)))
    midpoint = (mpmath.mpf(float(other)) + mpmath.mpf(float(best))) / 2
    distance = float(abs(exact - midpoint) / ulp) if ulp > 0 else math.inf
    kind = where.split()[1]
    if distance < closest_midpoint.get(kind, (math.inf, ""))[0]:
        closest_midpoint[kind] = (distance, where)
    return best


not_nearest = []  # (case, j) where SLEEF's powf is not the nearest float


def pow_f32(base, exponents, where):
    # torch.pow(python_float, fp32_tensor): the base is converted to float32 first.
    b = F32(base)
    out = []
    for j, e in enumerate(exponents):
        sleef = F32(SLEEF.Sleef_powf_u10(b, e))
        if sleef != nearest_f32(mpmath.mpf(float(b)) ** mpmath.mpf(float(e)), f"{where} pow j={j}"):
            not_nearest.append(f"{where} j={j}")
        out.append(sleef)
    return np.array(out, dtype=np.float32)


def pos_freqs(theta, dim, where):
    # base ** (torch.arange(0, dim, 2).float() / dim): exponent 2j/d as an fp32 division.
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / F32(dim)
    return pow_f32(theta, exponents, where)


def default_inv_freq(theta, dim, where):
    # 1.0 / tensor is tensor.reciprocal() * 1.0: one fp32 division.
    return F32(1.0) / pos_freqs(theta, dim, where), 1.0


def yarn_inv_freq(theta, dim, factor, original, beta_fast, beta_slow, truncate, where):
    attention_factor = 0.1 * math.log(factor) + 1.0  # get_mscale(factor), Python float
    pf = pos_freqs(theta, dim, where)
    extrapolation = F32(1.0) / pf
    interpolation = F32(1.0) / (F32(factor) * pf)  # factor * tensor: factor converted to fp32

    def correction_dim(rotations):  # Python floats throughout
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    # (arange(dim // 2, float32) - low) / (high - low): low converted to fp32, the difference
    # high - low formed as a Python float and then converted to fp32.
    ramp = (np.arange(dim // 2, dtype=np.float32) - F32(low)) / F32(high - low)
    ramp = np.clip(ramp, F32(0), F32(1))
    extrapolation_factor = F32(1) - ramp
    inv_freq = interpolation * (F32(1) - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq.astype(np.float32), attention_factor


def rows(inv_freq, attention_factor, where):
    """Angles, cos and sin per position as the rotary forward forms them in fp32."""
    scale = F32(attention_factor)  # cos * python_float: the factor converted to fp32
    angles, cos, sin = [], [], []
    for p in POSITIONS:
        a = F32(p) * inv_freq  # inv_freq.float() @ position_ids.float(): one product per entry
        angles.append(a)
        c = np.array([nearest_f32(mpmath.cos(mpmath.mpf(float(x))), f"{where} cos p={p} j={j}") for j, x in enumerate(a)],
                     dtype=np.float32)
        s = np.array([nearest_f32(mpmath.sin(mpmath.mpf(float(x))), f"{where} sin p={p} j={j}") for j, x in enumerate(a)],
                     dtype=np.float32)
        cos.append(c * scale)
        sin.append(s * scale)
    return angles, cos, sin, scale


CASES = [
    # name, head_dim, theta, yarn parameters (factor, original, beta_fast, beta_slow, truncate) or None
    ("default_theta1e6_d128", 128, 1e6, None),
    ("yarn_gptoss_d64", 64, 150000.0, (32.0, 4096, 32.0, 1.0, False)),
    ("yarn_gptoss_truncated_d64", 64, 150000.0, (32.0, 4096, 32.0, 1.0, True)),
]


def emit_array(name, values, per_line=8):
    out = [f"inline constexpr uint32_t {name}[] = {{"]
    flat = [bits(v) for v in np.asarray(values, dtype=np.float32).ravel()]
    for i in range(0, len(flat), per_line):
        out.append("    " + ", ".join(f"0x{b:08x}u" for b in flat[i:i + per_line]) + ",")
    out.append("};")
    return out


def torch_check(name, dim, theta, yarn, inv_freq, cos, sin):
    """Compares the table with torch running the HF formulas (python/tests/hf_rope.py), if present."""
    try:
        import os
        import torch
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "tests"))
        import hf_rope
    except ImportError:
        return
    config = {"rope_theta": theta, "max_position_embeddings": 131072}
    if yarn is not None:
        factor, original, beta_fast, beta_slow, truncate = yarn
        config["rope_scaling"] = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original,
                                  "beta_fast": beta_fast, "beta_slow": beta_slow, "truncate": truncate}
    t_inv, attention = hf_rope.inv_freq_and_scaling(config, dim)
    t_cos, t_sin = hf_rope.cos_sin(t_inv, attention, torch.tensor([POSITIONS], dtype=torch.int64), torch.float32)
    half = dim // 2

    def ulps(a, b):
        return np.abs(np.asarray(a, np.float32).view(np.int32).astype(np.int64) -
                      np.asarray(b, np.float32).view(np.int32).astype(np.int64)).ravel()

    d_inv = ulps(t_inv.numpy(), inv_freq)
    d_cos = ulps(t_cos[0, :, :half].numpy(), np.array(cos))
    d_sin = ulps(t_sin[0, :, :half].numpy(), np.array(sin))
    print(f"torch {torch.__version__} vs table, {name}: inv_freq {int((d_inv != 0).sum())} of {d_inv.size} differ; "
          f"cos {int((d_cos != 0).sum())} of {d_cos.size} differ (max {int(d_cos.max())} ulp); "
          f"sin {int((d_sin != 0).sum())} of {d_sin.size} differ (max {int(d_sin.max())} ulp)", file=sys.stderr)


def main():
    lines = [
        "// Generated by tests/rope/rope_test_table.py; do not edit. Regenerate with",
        "//   /usr/bin/python3 tests/rope/rope_test_table.py > tests/rope/rope_test_table.h",
        "// RoPE as Hugging Face transformers forms it, computed independently of core/rope.cc: numpy",
        "// float32 for the fp32 tensor operations, Python floats for the Python ones, SLEEF's powf",
        "// (torch's CPU fp32 pow), cos/sin at 200 bits (mpmath) rounded once to the nearest float32.",
        "// Values are float32 bit patterns.",
        "#pragma once",
        "#include <cstdint>",
        "",
        "namespace dflash::rope_test_table {",
        "",
        f"inline constexpr int64_t kPositions[] = {{{', '.join(str(p) for p in POSITIONS)}}};",
        f"inline constexpr int kNumPositions = {len(POSITIONS)};",
        "",
    ]
    for name, dim, theta, yarn in CASES:
        if yarn is None:
            inv_freq, attention = default_inv_freq(theta, dim, name)
        else:
            inv_freq, attention = yarn_inv_freq(theta, dim, *yarn, name)
        angles, cos, sin, scale = rows(inv_freq, attention, name)
        torch_check(name, dim, theta, yarn, inv_freq, cos, sin)
        lines.append(f"// {name}: head_dim {dim}, theta {theta:g}, " +
                     ("default RoPE" if yarn is None else
                      "YaRN factor {:g} from {}, beta_fast {:g}, beta_slow {:g}, truncate {}".format(*yarn)))
        lines.append(f"namespace {name} {{")
        lines.append(f"inline constexpr uint32_t kAttentionScaling = 0x{bits(scale):08x}u;")
        lines += emit_array("kInvFreq", inv_freq)
        lines += emit_array("kAngle", angles)
        lines += emit_array("kCos", cos)
        lines += emit_array("kSin", sin)
        lines.append(f"}}  // namespace {name}")
        lines.append("")
    lines.append("}  // namespace dflash::rope_test_table")
    print("\n".join(lines))
    print("SLEEF powf is not the nearest float at: " + (", ".join(not_nearest) or "none"), file=sys.stderr)
    for kind, (distance, where) in sorted(closest_midpoint.items()):
        print(f"closest approach of an exact {kind} to a float32 rounding midpoint: {distance:.3g} ulp ({where})",
              file=sys.stderr)


if __name__ == "__main__":
    main()
