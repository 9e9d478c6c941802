"""A small DFlash drafter in PyTorch, written from the contract (docs/spec/drafter.md §3-4) in the
upstream module layout, for the capture tests and the bundled capture fixtures.

Called as upstream_call calls it: forward(position_ids, noise_embedding, target_hidden) -> the
final-normed block rows. The planted bugs (`bug`) are the faults the tests must see caught:
"rope-interleaved" rotates pairs (2i, 2i+1) instead of (i, i+d/2); "stale-context-row" gives the
newest context row the features of the row before it (its cache slot was not written).
"""
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_rope  # noqa: E402

BUGS = (None, "rope-interleaved", "stale-context-row")


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        # Half-precision inputs are normalized in fp32 and cast back, as Qwen3's RMSNorm does.
        compute = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
        y = x.to(compute)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_interleaved(x):  # the planted bug: pairs (2i, 2i+1)
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).reshape(x.shape)


def apply_rotary_pos_emb(q, k, cos, sin, bug=None):
    """q [1, nh, B, d] at the last B positions of cos/sin, k [1, nkv, W+B, d] at all of them."""
    rotate = rotate_interleaved if bug == "rope-interleaved" else rotate_half
    if bug == "rope-interleaved":  # the interleaved convention repeats each angle pairwise
        half = cos.shape[-1] // 2
        cos = cos[..., :half].repeat_interleave(2, dim=-1)
        sin = sin[..., :half].repeat_interleave(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    qc, qs = cos[:, :, -q.shape[2]:], sin[:, :, -q.shape[2]:]
    return q * qc + rotate(q) * qs, k * cos + rotate(k) * sin


class Attention(nn.Module):
    def __init__(self, c, bug):
        super().__init__()
        H, d, bias = c["hidden_size"], c["head_dim"], bool(c.get("attention_bias", False))
        self.nh, self.nkv, self.d, self.bug = c["num_attention_heads"], c["num_key_value_heads"], d, bug
        self.q_proj = nn.Linear(H, self.nh * d, bias=bias)
        self.k_proj = nn.Linear(H, self.nkv * d, bias=bias)
        self.v_proj = nn.Linear(H, self.nkv * d, bias=bias)
        self.o_proj = nn.Linear(self.nh * d, H, bias=bias)
        self.q_norm = RMSNorm(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(d, c["rms_norm_eps"])

    def heads(self, x, n):  # [1, L, n·d] -> [1, n, L, d]
        return x.view(1, x.shape[1], n, self.d).transpose(1, 2)

    def forward(self, x, xc, cos, sin):
        B = x.shape[1]
        q = self.q_norm(self.heads(self.q_proj(x), self.nh))
        # Context rows (no input_layernorm) then block rows, projected separately as upstream does.
        k = self.k_norm(torch.cat([self.heads(self.k_proj(xc), self.nkv), self.heads(self.k_proj(x), self.nkv)], 2))
        v = torch.cat([self.heads(self.v_proj(xc), self.nkv), self.heads(self.v_proj(x), self.nkv)], 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin, self.bug)
        groups = self.nh // self.nkv
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(2, 3)) * self.d ** -0.5  # no mask: the block sees the window and itself
        compute = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype
        probs = torch.softmax(scores, dim=-1, dtype=compute).to(q.dtype)
        out = (probs @ v).transpose(1, 2).reshape(1, B, self.nh * self.d)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, I = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, y):
        return self.down_proj(nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))


class Layer(nn.Module):
    def __init__(self, c, bug):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c, bug)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, h, xc, cos, sin):
        h = h + self.self_attn(self.input_layernorm(h), xc, cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    def __init__(self, config, bug=None):
        super().__init__()
        if bug not in BUGS:
            raise ValueError(f"unknown planted bug {bug!r}")
        c = dict(config)
        c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
        c.setdefault("num_key_value_heads", c["num_attention_heads"])
        ids = c["dflash_config"].get("target_layer_ids")
        n_target = len(ids) if ids is not None else c["num_hidden_layers"]
        H = c["hidden_size"]
        self.bug = bug
        self.fc = nn.Linear(n_target * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList(Layer(c, bug) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        self.inv_freq, self.attention_scaling = hf_rope.inv_freq_and_scaling(c, c["head_dim"])

    def forward(self, position_ids, noise_embedding, target_hidden):
        xc = self.hidden_norm(self.fc(target_hidden))
        if self.bug == "stale-context-row" and xc.shape[1] >= 2:
            xc = torch.cat([xc[:, :-1], xc[:, -2:-1]], dim=1)
        cos, sin = hf_rope.cos_sin(self.inv_freq, self.attention_scaling, position_ids, noise_embedding.dtype)
        h = noise_embedding
        for layer in self.layers:
            h = layer(h, xc, cos, sin)
        return self.norm(h)


class DFlashDrafterRopeInterleaved(DFlashDrafter):
    def __init__(self, config):
        super().__init__(config, bug="rope-interleaved")


class DFlashDrafterStaleContextRow(DFlashDrafter):
    def __init__(self, config):
        super().__init__(config, bug="stale-context-row")
