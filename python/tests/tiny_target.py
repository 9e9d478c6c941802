"""A tiny Qwen3-style target model in PyTorch for the capture tests of the target's side: token
embedding, layers of RMSNorm, causal GQA attention with q/k RMSNorm and rotate-half RoPE, SwiGLU
MLP, a final norm and an lm_head. forward(input_ids [1, N]) -> logits [1, N, V], as
target_side.ModuleTarget calls it. Seeded random bf16-valued weights come from `write_checkpoint`."""
import json
import os
import sys

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import hf_rope  # noqa: E402
from tiny_dflash import MLP, RMSNorm, rotate_half  # noqa: E402
from dflash_capture.safetensors_io import write_safetensors  # noqa: E402


def tiny_target_config(vocab_size=256):
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab_size,
            "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 16, "intermediate_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "max_position_embeddings": 4096, "tie_word_embeddings": False}


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, d = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.d = c["num_attention_heads"], c["num_key_value_heads"], d
        self.q_proj = nn.Linear(H, self.nh * d, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, H, bias=False)
        self.q_norm = RMSNorm(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(d, c["rms_norm_eps"])

    def forward(self, x, cos, sin):
        N = x.shape[1]
        heads = lambda t, n: t.view(1, N, n, self.d).transpose(1, 2)  # noqa: E731
        q = self.q_norm(heads(self.q_proj(x), self.nh))
        k = self.k_norm(heads(self.k_proj(x), self.nkv))
        v = heads(self.v_proj(x), self.nkv)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        groups = self.nh // self.nkv
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(2, 3)) * self.d ** -0.5
        causal = torch.ones(N, N, dtype=torch.bool, device=x.device).triu(1)
        probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(1, N, self.nh * self.d))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, h, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class TinyQwen3Target(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = dict(config)
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.inv_freq, self.attention_scaling = hf_rope.inv_freq_and_scaling(c, c["head_dim"])

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        cos, sin = hf_rope.cos_sin(self.inv_freq, self.attention_scaling, positions, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.lm_head(self.norm(h))


def write_checkpoint(directory, config, seed):
    """config.json and model.safetensors with seeded bf16-valued weights (embeddings N(0, 1),
    projections N(0, 1/fan_in), norms 1 + N(0, 0.1²))."""
    os.makedirs(directory, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in TinyQwen3Target(config).named_parameters():
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(p.shape, generator=g)
        elif name == "embed_tokens.weight":
            t = torch.randn(p.shape, generator=g)
        else:
            t = torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5
        tensors["model." + name if not name.startswith("lm_head") else name] = t.to(torch.bfloat16)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)
