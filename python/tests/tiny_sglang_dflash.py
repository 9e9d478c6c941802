"""A small DFlash drafter in SGLang's module layout and a tiny engine that runs it as SGLang's DFlash
worker does, so that SGLang's real dumper writes the files an SGLang run would.

Layout facts from sglang 0.5.14: python/sglang/srt/models/dflash.py (DFlashDraftModel: fc,
hidden_norm, layers.{l}.{input_layernorm, self_attn.{qkv_proj, q_norm, k_norm, rotary_emb, attn,
o_proj}, post_attention_layernorm, mlp.{gate_up_proj, act_fn, down_proj}}, norm; RMSNorm that adds
a residual and returns (normed, sum); linear layers returning (output, bias); a layer returning
(mlp output, residual)) and python/sglang/srt/speculative/dflash_worker_v2.py (context rows:
project_target_hidden, then kv_proj_only, apply_k_norm, apply_k_rope into the draft KV cache; the
block [anchor, mask, ...] at positions start..start+B-1 through the model; greedy draft tokens from
the lm_head over rows 1..B-1). The math is docs/spec/drafter.md's, with tiny_dflash.py's RMSNorm
and Hugging Face's RoPE (hf_rope.py), in the activations' dtype.

With tp_size > 1 (torch.distributed, gloo) each rank holds its share of the attention heads and
of the MLP's intermediate columns, o_proj and down_proj sum their partial outputs over the ranks,
and the lm_head is split over the vocabulary. The engine always dumps the draft logits and tokens
(dflash_draft_logits, dflash_draft_tokens); `explicit` adds dumper.dump calls at each stage (the
names of EXPLICIT_MAP), as an engine developer would write them, with their `dims` unless
`with_dims` is off.

Planted bugs: "rope-sign" flips the sign of the sine term; "skip-mlp-norm" has
post_attention_layernorm return the residual sum without normalizing it.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_rope  # noqa: E402
from tiny_dflash import RMSNorm, rotate_half  # noqa: E402

BUGS = (None, "rope-sign", "skip-mlp-norm")

# The dumped names of the explicit dumps, as a dump map (docs/capture.md).
EXPLICIT_MAP = {
    "format": "dflash-dump-map", "version": 1,
    "inputs": {"ctx": "ctx_rows", "ctx_positions": "ctx_positions", "block_ids": "block_ids",
               "block_positions": "block_positions", "seq_ids": "slots",
               "logits": "dflash_draft_logits", "draft_tokens": "dflash_draft_tokens"},
    "taps": {"ctx_proj": "ctx_proj", "embed": "block_embed",
             "L{l}.attn_norm": {"name": "attn_norm", "where": {"layer_id": "{l}"}},
             "L{l}.q": {"name": "q", "where": {"layer_id": "{l}"}},
             "L{l}.k": {"name": "k", "where": {"layer_id": "{l}"}},
             "L{l}.v": {"name": "v", "where": {"layer_id": "{l}"}},
             "L{l}.attn": {"name": "attn", "where": {"layer_id": "{l}"}},
             "L{l}.o_proj": {"name": "o_proj_partial", "where": {"layer_id": "{l}"}},
             "L{l}.mlp_norm": {"name": "mlp_norm", "where": {"layer_id": "{l}"}},
             "L{l}.mlp": {"name": "mlp_partial", "where": {"layer_id": "{l}"}},
             "L{l}.out": {"name": "layer_out", "where": {"layer_id": "{l}"}},
             "final_norm": "final_norm"},
}
REPLICATED = "# tp:replicated"


class Parallel:
    """The tp rank and size, and the dumps: `dump` is the dumper's dump (None: no dumps)."""

    def __init__(self, tp_rank=0, tp_size=1, dump=None, explicit=False, with_dims=True):
        self.rank, self.size, self.dump = tp_rank, tp_size, dump
        self.explicit, self.with_dims = explicit, with_dims

    def emit(self, name, value, dims, always=False, **tags):
        """An explicit dump (`always`: also when the run has no explicit dumps)."""
        if self.dump is not None and (self.explicit or always):
            self.dump(name, value, dims=dims if self.with_dims else None, **tags)

    def all_reduce(self, x):
        if self.size == 1:
            return x
        wide = x.float()  # gloo sums fp32; one rounding back, as a bf16 all-reduce of two ranks
        dist.all_reduce(wide)
        return wide.to(x.dtype)

    def all_gather_columns(self, x):
        if self.size == 1:
            return x
        parts = [torch.empty_like(x, dtype=torch.float32) for _ in range(self.size)]
        dist.all_gather(parts, x.float())
        return torch.cat(parts, dim=-1).to(x.dtype)


class FusedAddRMSNorm(RMSNorm):
    """RMSNorm(x), or with a residual: (RMSNorm(x + residual), x + residual)."""

    def __init__(self, size, eps, skip=False):
        super().__init__(size, eps)
        self.skip = skip

    def forward(self, x, residual=None):
        if residual is not None:
            x = x + residual
        y = x if self.skip else super().forward(x)
        return y if residual is None else (y, x)


class ColumnLinear(nn.Module):
    """This rank's rows of a weight; returns (x·Wᵀ, None)."""

    def __init__(self, rows, cols):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(rows, cols))

    def forward(self, x):
        return F.linear(x, self.weight), None


class RowLinear(ColumnLinear):
    """This rank's columns of a weight; the ranks' partial outputs are summed (dumped first as
    `partial_name`, a partial sum over tp)."""

    def __init__(self, rows, cols, parallel, partial_name, layer_id):
        super().__init__(rows, cols)
        self.parallel, self.partial_name, self.layer_id = parallel, partial_name, layer_id

    def forward(self, x):
        partial = F.linear(x, self.weight)
        self.parallel.emit(self.partial_name, partial, "t h[tp:partial]", layer_id=self.layer_id)
        return self.parallel.all_reduce(partial), None


class RotaryEmbedding(nn.Module):
    """(q, k) after RoPE at `positions`, both flat per token [T, n·d] (rotate-half pairs)."""

    def __init__(self, config, head_dim, bug):
        super().__init__()
        self.d, self.bug = head_dim, bug
        self.inv_freq, self.attention_scaling = hf_rope.inv_freq_and_scaling(config, head_dim)

    def forward(self, positions, q, k):
        cos, sin = hf_rope.cos_sin(self.inv_freq, self.attention_scaling, positions.view(1, -1), q.dtype)
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [T, 1, d]
        sign = -1 if self.bug == "rope-sign" else 1

        def rotate(x):
            x = x.view(x.shape[0], -1, self.d)
            return (x * cos + sign * rotate_half(x) * sin).reshape(x.shape[0], -1)
        return rotate(q), rotate(k)


class ContextAttention(nn.Module):
    """The block's queries over each sequence's cached context K/V and the block's own K/V (no
    mask): what RadixAttention computes for SGLang's DFlash drafter."""

    def __init__(self, layer_id, heads, kv_heads, head_dim):
        super().__init__()
        self.layer_id, self.nh, self.nkv, self.d = layer_id, heads, kv_heads, head_dim

    def forward(self, q, k, v, batch):
        out, B = [], batch.block
        for i, seq in enumerate(batch.seqs):
            rows = slice(i * B, (i + 1) * B)
            ck, cv = batch.cache[seq][self.layer_id]
            keys = torch.cat([ck, k[rows]]).view(-1, self.nkv, self.d).transpose(0, 1)
            values = torch.cat([cv, v[rows]]).view(-1, self.nkv, self.d).transpose(0, 1)
            groups = self.nh // self.nkv
            keys, values = keys.repeat_interleave(groups, 0), values.repeat_interleave(groups, 0)
            queries = q[rows].view(B, self.nh, self.d).transpose(0, 1)
            scores = (queries @ keys.transpose(1, 2)) * self.d ** -0.5
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            out.append((probs @ values).transpose(0, 1).reshape(B, self.nh * self.d))
        return torch.cat(out)


class DFlashAttention(nn.Module):
    def __init__(self, c, layer_id, parallel, bug):
        super().__init__()
        H, d, tp = c["hidden_size"], c["head_dim"], parallel.size
        self.nh, self.nkv = c["num_attention_heads"] // tp, max(1, c["num_key_value_heads"] // tp)
        self.d, self.layer_id, self.parallel = d, layer_id, parallel
        self.q_size, self.kv_size = self.nh * d, self.nkv * d
        self.qkv_proj = ColumnLinear(self.q_size + 2 * self.kv_size, H)
        self.o_proj = RowLinear(H, self.q_size, parallel, "o_proj_partial", layer_id)
        self.q_norm = RMSNorm(d, c["rms_norm_eps"])
        self.k_norm = RMSNorm(d, c["rms_norm_eps"])
        self.rotary_emb = RotaryEmbedding(c, d, bug)
        self.attn = ContextAttention(layer_id, self.nh, self.nkv, d)

    def _norm(self, norm, x):
        return norm(x.view(x.shape[0], -1, self.d)).view(x.shape)

    def forward(self, positions, hidden_states, forward_batch):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary_emb(positions, self._norm(self.q_norm, q), self._norm(self.k_norm, k))
        emit, l = self.parallel.emit, self.layer_id
        emit("q", q, "t h[tp]", layer_id=l)
        emit("k", k, "t h[tp]", layer_id=l)
        emit("v", v, "t h[tp]", layer_id=l)
        attn = self.attn(q, k, v, forward_batch)
        emit("attn", attn, "t h[tp]", layer_id=l)
        out, _ = self.o_proj(attn)
        return out

    def kv_proj_only(self, hidden_states):
        kv = F.linear(hidden_states, self.qkv_proj.weight[self.q_size:])
        return kv.split([self.kv_size, self.kv_size], dim=-1)

    def apply_k_norm(self, k):
        return self._norm(self.k_norm, k)

    def apply_k_rope(self, positions, k):
        _, k = self.rotary_emb(positions, torch.zeros_like(k), k)
        return k


class SiluAndMul(nn.Module):
    def forward(self, x):
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]


class DFlashMLP(nn.Module):
    def __init__(self, c, layer_id, parallel):
        super().__init__()
        I = c["intermediate_size"] // parallel.size
        self.gate_up_proj = ColumnLinear(2 * I, c["hidden_size"])
        self.act_fn = SiluAndMul()
        self.down_proj = RowLinear(c["hidden_size"], I, parallel, "mlp_partial", layer_id)

    def forward(self, x):
        gate_up, _ = self.gate_up_proj(x)
        out, _ = self.down_proj(self.act_fn(gate_up))
        return out


class DFlashDecoderLayer(nn.Module):
    def __init__(self, c, layer_id, parallel, bug):
        super().__init__()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        self.layer_id, self.parallel = layer_id, parallel
        self.input_layernorm = FusedAddRMSNorm(H, eps)
        self.self_attn = DFlashAttention(c, layer_id, parallel, bug)
        self.post_attention_layernorm = FusedAddRMSNorm(H, eps, skip=bug == "skip-mlp-norm")
        self.mlp = DFlashMLP(c, layer_id, parallel)

    def forward(self, positions, hidden_states, forward_batch, residual):
        emit, l = self.parallel.emit, self.layer_id
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            if self.parallel.explicit:
                emit("layer_out", hidden_states + residual, "t h " + REPLICATED, layer_id=l - 1)
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        emit("attn_norm", hidden_states, "t h " + REPLICATED, layer_id=l)
        attn = self.self_attn(positions=positions, hidden_states=hidden_states, forward_batch=forward_batch)
        hidden_states, residual = self.post_attention_layernorm(attn, residual)
        emit("mlp_norm", hidden_states, "t h " + REPLICATED, layer_id=l)
        return self.mlp(hidden_states), residual


class DFlashDraftModel(nn.Module):
    def __init__(self, config, parallel=None, bug=None):
        super().__init__()
        if bug not in BUGS:
            raise ValueError(f"unknown planted bug {bug!r}")
        c = dict(config)
        if c.get("attention_bias"):
            raise ValueError("this test drafter has no attention biases")
        self.parallel = parallel or Parallel()
        H, eps = c["hidden_size"], c["rms_norm_eps"]
        n_target = len(c["dflash_config"]["target_layer_ids"])
        self.config = c
        self.layers = nn.ModuleList(DFlashDecoderLayer(c, l, self.parallel, bug) for l in range(c["num_hidden_layers"]))
        self.norm = FusedAddRMSNorm(H, eps)
        self.fc = nn.Linear(n_target * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, eps)

    def project_target_hidden(self, target_hidden):
        out = self.hidden_norm(self.fc(target_hidden))
        self.parallel.emit("ctx_proj", out, "t h " + REPLICATED)
        return out

    def forward(self, *, input_ids, positions, forward_batch, input_embeds, seq_lens, req_pool_indices):
        # input_ids, positions, seq_lens and req_pool_indices are SGLang's ForwardBatch fields that the
        # dumper writes under these names (its core fields); here they arrive as arguments.
        hidden, residual = input_embeds, None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, forward_batch, residual)
        if self.parallel.explicit:
            self.parallel.emit("layer_out", hidden + residual, "t h " + REPLICATED, layer_id=len(self.layers) - 1)
        hidden, _ = self.norm(hidden, residual)
        self.parallel.emit("final_norm", hidden, "t h " + REPLICATED)
        return hidden

    def load(self, tensors):
        """This rank's share of an upstream-layout checkpoint (drafter_checkpoints.py names)."""
        c, r, tp = self.config, self.parallel.rank, self.parallel.size
        d, I = c["head_dim"], c["intermediate_size"] // tp

        def heads(t, n):  # this rank's rows of n heads
            return t.view(-1, d, t.shape[-1])[r * n:(r + 1) * n].reshape(-1, t.shape[-1])
        own = {"fc.weight": tensors["fc.weight"], "hidden_norm.weight": tensors["hidden_norm.weight"],
               "norm.weight": tensors["norm.weight"]}
        for l, layer in enumerate(self.layers):
            p, a = f"layers.{l}.", layer.self_attn
            own[p + "input_layernorm.weight"] = tensors[p + "input_layernorm.weight"]
            own[p + "post_attention_layernorm.weight"] = tensors[p + "post_attention_layernorm.weight"]
            own[p + "self_attn.qkv_proj.weight"] = torch.cat(
                [heads(tensors[p + "self_attn.q_proj.weight"], a.nh), heads(tensors[p + "self_attn.k_proj.weight"], a.nkv),
                 heads(tensors[p + "self_attn.v_proj.weight"], a.nkv)])
            own[p + "self_attn.o_proj.weight"] = tensors[p + "self_attn.o_proj.weight"][:, r * a.q_size:(r + 1) * a.q_size]
            own[p + "self_attn.q_norm.weight"] = tensors[p + "self_attn.q_norm.weight"]
            own[p + "self_attn.k_norm.weight"] = tensors[p + "self_attn.k_norm.weight"]
            own[p + "mlp.gate_up_proj.weight"] = torch.cat([tensors[p + "mlp.gate_proj.weight"][r * I:(r + 1) * I],
                                                            tensors[p + "mlp.up_proj.weight"][r * I:(r + 1) * I]])
            own[p + "mlp.down_proj.weight"] = tensors[p + "mlp.down_proj.weight"][:, r * I:(r + 1) * I]
        with torch.no_grad():
            for name, param in self.named_parameters():
                param.copy_(own[name])
        return self


class _Batch:
    """The part of SGLang's ForwardBatch the attention reads: the sequences, the block size, and
    each sequence's draft KV cache (per layer: K and V of its context rows)."""

    def __init__(self, seqs, block, cache):
        self.seqs, self.block, self.cache = seqs, block, cache


class Engine:
    """Proposes and releases as SGLang's DFlash worker runs them (run_scenario drives it like a
    Recorder), calling the dumper's step() after each draft forward as SGLang's model runner does."""

    def __init__(self, model, embed_tokens, lm_head, facts, dumper, dtype=torch.bfloat16):
        self.model = model.to(dtype).eval()
        self.facts, self.dumper, self.dtype = facts, dumper, dtype
        self.gamma = facts.block_size
        self.head = {"ctx_cap": 1 << 20}  # SGLang's DFlash without a draft window keeps every row
        p = model.parallel
        V = facts.vocab_size // p.size
        self.embed_tokens = embed_tokens.to(dtype)
        self.lm_head = lm_head[p.rank * V:(p.rank + 1) * V].to(dtype)  # vocabulary-parallel
        self.cache, self.slots = {}, {}

    def release(self, seqs):
        for seq in seqs:
            self.cache.pop(seq)
            self.slots.pop(seq)

    def propose(self, entries):
        f, B, model = self.facts, self.facts.block_size, self.model
        emit = model.parallel.emit
        seqs = [e["seq"] for e in entries]
        with torch.no_grad():
            rows = torch.cat([e["ctx"] for e in entries]).to(self.dtype)
            if rows.shape[0]:
                positions = torch.cat([torch.arange(e["start"] - e["ctx"].shape[0], e["start"]) for e in entries])
                emit("ctx_rows", rows, "t f " + REPLICATED)
                emit("ctx_positions", positions, "t " + REPLICATED)
                ctx_hidden = model.project_target_hidden(rows)
                for l, layer in enumerate(model.layers):
                    attn = layer.self_attn
                    k, v = attn.kv_proj_only(ctx_hidden)
                    k = attn.apply_k_rope(positions, attn.apply_k_norm(k))
                    begin = 0
                    for e in entries:
                        end = begin + e["ctx"].shape[0]
                        cache = self.cache.setdefault(e["seq"], [None] * len(model.layers))
                        old = cache[l] or (k[:0], v[:0])
                        cache[l] = (torch.cat([old[0], k[begin:end]]), torch.cat([old[1], v[begin:end]]))
                        begin = end
            for seq in seqs:
                if seq not in self.slots:
                    self.slots[seq] = min(set(range(len(self.slots) + 1)) - set(self.slots.values()))
            ids = torch.tensor([t for e in entries for t in [e["anchor"]] + [f.mask_token_id] * (B - 1)])
            positions = torch.cat([e["start"] + torch.arange(B) for e in entries])
            slots = torch.tensor([self.slots[s] for s in seqs])
            embeds = self.embed_tokens[ids]
            emit("block_ids", ids, "t " + REPLICATED)
            emit("block_positions", positions, "t " + REPLICATED)
            emit("slots", slots, "b " + REPLICATED)
            emit("block_embed", embeds, "t h " + REPLICATED)
            hidden = model(input_ids=ids, positions=positions, forward_batch=_Batch(seqs, B, self.cache),
                           input_embeds=embeds, seq_lens=torch.tensor([e["start"] for e in entries]),
                           req_pool_indices=slots)
            rows = hidden.view(len(entries), B, -1)[:, 1:].reshape(-1, hidden.shape[-1])
            local = F.linear(rows, self.lm_head)
            emit("dflash_draft_logits", local, "t v[tp]", always=True)
            drafts = torch.argmax(model.parallel.all_gather_columns(local).float(), dim=-1)
            emit("dflash_draft_tokens", drafts, "t " + REPLICATED, always=True)
        self.dumper.step()
        return drafts.view(len(entries), B - 1).tolist()
