"""Recorder: drives a PyTorch DFlash drafter through proposes and releases and records what it
computed (logits, draft tokens, taps) as fixture format v1.

Each propose runs the drafter on one sequence at a time over its context window (the most recent
ctx_cap context rows, with their absolute positions) followed by the block [anchor, mask, ...], so
the module needs no cache of its own. Taps come from forward hooks (tap_map.py) and the RoPE hook
(rope_hook.py).
"""
import contextlib

import torch

from . import rope_hook
from .drafter_config import DrafterFacts
from .errors import CaptureError
from .fixture_writer import write_fixture
from .storage import exact_storage
from .tap_map import BLOCK, TapMap, detect_tap_map

PRECISIONS = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16"}


def upstream_call(model, noise_embedding, target_hidden, position_ids):
    """The upstream drafter's call: noise_embedding [1, B, H] (the block's embeddings),
    target_hidden [1, W, nT·Ht] (the window's context rows), position_ids [1, W + B] (context
    positions, then block positions); returns the final-normed hidden states [1, B, H]."""
    return model(position_ids=position_ids, noise_embedding=noise_embedding, target_hidden=target_hidden)


def _first_tensor(value, what):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    hidden = getattr(value, "last_hidden_state", None)
    if isinstance(hidden, torch.Tensor):
        return hidden
    raise CaptureError(f"{what}: expected a tensor (or a tuple starting with one), got {type(value).__name__}")


def _rows(t):
    """[rows, features] of one sequence's activation ([1, N, X], [N, X], ...)."""
    return t.detach().reshape(-1, t.shape[-1])


class _Forward:
    """What the hooks collect during one forward: per tap, the rows of every call in order."""

    def __init__(self, layer_of_attention):
        self.collected = {}
        self.layer = None
        self.layer_of_attention = layer_of_attention

    def add(self, tap, rows):
        self.collected.setdefault(tap, []).append(rows)

    def rope(self, q, k):  # called by rope_hook.rope_tap
        if self.layer is None:
            raise CaptureError("rope hook: q and k were reported outside any attention module of the tap map")
        if q is not None:
            self.add(f"L{self.layer}.q", q.detach())
        if k is not None:
            self.add(f"L{self.layer}.k", k.detach())


class Recorder:
    """Records proposes of `model` into a fixture.

    model        the drafter (nn.Module); its parameters' dtype decides the expectation precision
                 (float64 -> fp64, float32 -> fp32, bfloat16 -> bf16)
    embed_tokens, lm_head   the target's [V, H] tensors
    config       the drafter's config.json as a dict (written into the fixture)
    gamma, ctx_cap, max_batch, kv_page_size   the head settings (docs/spec/fixture-format.md)
    tap_map      a TapMap; None: the built-in map of a recognized layout (else refused, listing the
                 modules seen); TapMap({}) records no taps
    call         call(model, noise_embedding, target_hidden, position_ids) -> hidden [1, B, H]
                 (default upstream_call)
    rope         "auto": patch `apply_rotary_pos_emb` where the model's module classes call it
                 (rope_hook.patch_model_rope); None: no patching (call rope_hook.rope_tap yourself); or a function that
                 returns a fresh context manager for each forward, such as
                 lambda: rope_hook.patch_rope_function(namespace, name, layout)
    """

    def __init__(self, model, embed_tokens, lm_head, config, *, gamma=None, ctx_cap=4096, max_batch=4,
                 kv_page_size=16, tap_map=None, call=upstream_call, rope="auto", producer=None, progress=None):
        self.model = model
        self.facts = DrafterFacts(config, "drafter config")
        self.config = config
        self.dtype = self._module_dtype(model)
        if self.dtype not in PRECISIONS:
            raise CaptureError(f"model dtype {self.dtype}: expectations are recorded from float64, float32 or "
                               f"bfloat16 drafters")
        f = self.facts
        self.embed_tokens = self._target_tensor(embed_tokens, "embed_tokens")
        self.lm_head = self._target_tensor(lm_head, "lm_head")
        self.gamma = f.block_size if gamma is None else gamma
        for key, value, least in (("gamma", self.gamma, 0), ("ctx_cap", ctx_cap, 1), ("max_batch", max_batch, 1),
                                  ("kv_page_size", kv_page_size, 1)):
            if not isinstance(value, int) or value < least:
                raise CaptureError(f"head setting '{key}' must be an integer >= {least}, got {value!r}")
        self.head = {"gamma": self.gamma, "ctx_cap": ctx_cap, "max_batch": max_batch, "kv_page_size": kv_page_size}
        names = [name for name, _ in model.named_modules()]
        self.tap_map = detect_tap_map(names) if tap_map is None else tap_map
        if not isinstance(self.tap_map, TapMap):
            raise CaptureError(f"tap_map must be a TapMap, got {type(self.tap_map).__name__}")
        self.taps = self.tap_map.resolve(names, f.num_layers)
        self.attention = self.tap_map.attention_modules(names, f.num_layers)
        self.call = call
        self.rope = rope
        self.producer = producer or f"dflash_capture Recorder, {type(model).__name__}, torch {torch.__version__}"
        self.progress = progress
        self.steps = []
        self.trace = {}
        self.sequences = {}  # seq -> {"next": position, "window": [W, F] rows, "released": bool}
        self.missing_rope_taps = False

    # ---- inputs ----

    @staticmethod
    def _module_dtype(model):
        dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
        if len(dtypes) != 1:
            raise CaptureError(f"model parameters must share one floating dtype, found {sorted(map(str, dtypes))}")
        return dtypes.pop()

    def _device(self):
        return next(self.model.parameters()).device

    def _target_tensor(self, t, what):
        f = self.facts
        if not isinstance(t, torch.Tensor) or list(t.shape) != [f.vocab_size, f.hidden_size]:
            shape = list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise CaptureError(f"target tensor '{what}': expected [vocab_size {f.vocab_size}, hidden_size "
                               f"{f.hidden_size}], got {shape}")
        return t.detach().to(device=self._device(), dtype=self.dtype)

    # ---- steps ----

    def release(self, seqs):
        """Frees the listed sequences (a release step)."""
        seqs = list(seqs)
        if not seqs:
            raise CaptureError("release: no sequence listed")
        for seq in seqs:
            state = self.sequences.get(seq)
            if state is None or state["released"]:
                raise CaptureError(f"release: seq {seq} is not active")
            state["released"] = True
            state["window"] = None
        self.steps.append({"release": seqs})

    def propose(self, entries):
        """One batched propose. Each entry: seq, ctx ([C, nT·Ht] new context rows), start, anchor,
        block_width. Returns the draft tokens of each entry (lists of B-1 ints)."""
        f = self.facts
        if not entries or len(entries) > self.head["max_batch"]:
            raise CaptureError(f"propose: {len(entries)} sequences; a propose serves 1..max_batch "
                               f"({self.head['max_batch']})")
        step_index = len(self.steps)
        widths = {f.clamp_width(e["block_width"], self.gamma) for e in entries}
        if len(widths) != 1:
            raise CaptureError(f"step {step_index}: block widths clamp to {sorted(widths)}; one propose runs one width")
        B = widths.pop()
        seen = set()
        for e in entries:
            self._check_entry(step_index, e, seen)
        step, drafts = [], []
        for e in entries:
            entry, tokens = self._propose_one(step_index, e, B)
            step.append(entry)
            drafts.append(tokens)
        self.steps.append({"propose": step})
        if self.progress:
            self.progress(step_index)
        return drafts

    def _check_entry(self, step_index, e, seen):
        f = self.facts
        seq = e.get("seq")
        where = f"step {step_index}, seq {seq}"
        if not isinstance(seq, int) or seq < 0:
            raise CaptureError(f"step {step_index}: seq must be an integer >= 0, got {seq!r}")
        if seq in seen:
            raise CaptureError(f"{where}: appears twice in one propose")
        seen.add(seq)
        state = self.sequences.get(seq)
        if state is not None and state["released"]:
            raise CaptureError(f"{where}: was released and is used again")
        ctx = e.get("ctx")
        if not isinstance(ctx, torch.Tensor) or ctx.dim() != 2 or ctx.shape[1] != f.ctx_features:
            shape = list(ctx.shape) if isinstance(ctx, torch.Tensor) else type(ctx).__name__
            raise CaptureError(f"{where}: ctx must be [C, {f.ctx_features}] (nT·Ht), got {shape}")
        start, anchor, width = e.get("start"), e.get("anchor"), e.get("block_width")
        for key, value in (("start", start), ("anchor", anchor), ("block_width", width)):
            if not isinstance(value, int) or value < 0:
                raise CaptureError(f"{where}: {key} must be an integer >= 0, got {value!r}")
        if anchor >= f.vocab_size:
            raise CaptureError(f"{where}: anchor {anchor} is outside [0, vocab_size {f.vocab_size})")
        nxt = 0 if state is None else state["next"]
        C = ctx.shape[0]
        if C == 0 and nxt == 0:
            raise CaptureError(f"{where}: no context rows, and the sequence has no context yet")
        if start - C != nxt:
            raise CaptureError(f"{where}: the {C} context rows cover positions {start - C}..{start - 1}, but the "
                               f"sequence's next context position is {nxt}")

    def _propose_one(self, step_index, e, B):
        f = self.facts
        seq, start, anchor = e["seq"], e["start"], e["anchor"]
        device = self._device()
        ctx = e["ctx"].detach().to(device=device, dtype=self.dtype)
        C = ctx.shape[0]
        state = self.sequences.setdefault(seq, {"next": 0, "window": ctx[:0], "released": False})
        window = torch.cat([state["window"], ctx])[-self.head["ctx_cap"]:]
        state["window"], state["next"] = window, start
        W = window.shape[0]

        tokens = torch.tensor([anchor] + [f.mask_token_id] * (B - 1), device=device)
        noise = self.embed_tokens[tokens].unsqueeze(0)
        positions = torch.arange(start - W, start + B, device=device).unsqueeze(0)
        forward = _Forward(self.attention)
        with torch.no_grad(), self._hooks(forward), self._rope_patch():
            previous = rope_hook.set_sink(forward)
            try:
                hidden = _first_tensor(self.call(self.model, noise, window.unsqueeze(0), positions), "drafter output")
            finally:
                rope_hook.set_sink(previous)
            if list(hidden.shape) != [1, B, f.hidden_size]:
                raise CaptureError(f"step {step_index}, seq {seq}: the drafter returned shape {list(hidden.shape)}; "
                                   f"expected [1, {B}, {f.hidden_size}] (final-normed block rows)")
            logits = torch.nn.functional.linear(hidden[0, 1:], self.lm_head)
        drafts = torch.argmax(logits, dim=-1)  # the first index among equal maxima (docs/spec/drafter.md §3)

        prefix = f"s{step_index}.q{seq}."
        ctx_name = prefix + "ctx"
        self.trace[ctx_name] = exact_storage(ctx, f"step {step_index}, seq {seq}: context rows")
        self.trace[prefix + "logits"] = logits.float().cpu().contiguous()
        self.trace[prefix + "drafts"] = drafts.to(torch.int32).cpu().contiguous()
        taps = {"embed": noise[0]}
        taps.update(self._taps_of(forward, B, min(C, self.head["ctx_cap"]), step_index, seq))
        tap_names = {}
        for tap in self._order(taps):
            name = prefix + "tap." + tap
            self.trace[name] = taps[tap].float().cpu().contiguous()
            tap_names[tap] = name
        entry = {"seq": seq, "ctx": ctx_name, "start": start, "anchor": anchor, "block_width": e["block_width"],
                 "expect": {"logits": prefix + "logits", "draft_tokens": prefix + "drafts", "taps": tap_names}}
        return entry, drafts.tolist()

    def _order(self, taps):
        order = ["ctx_proj", "embed"]
        for l in range(self.facts.num_layers):
            order += [f"L{l}.{s}" for s in ("attn_norm", "q", "k", "v", "attn", "o_proj", "mlp_norm", "mlp", "out")]
        order.append("final_norm")
        return [t for t in order if t in taps]

    def _taps_of(self, forward, B, new_rows, step_index, seq):
        f = self.facts
        width = {"q": f.num_heads * f.head_dim, "attn": f.num_heads * f.head_dim,
                 "k": f.num_kv_heads * f.head_dim, "v": f.num_kv_heads * f.head_dim}
        out = {}
        sources = dict(self.taps)
        if self.attention:
            for l in range(f.num_layers):
                for s in ("q", "k"):
                    sources[f"L{l}.{s}"] = None
        for tap, source in sources.items():
            parts = forward.collected.get(tap)
            what = f"step {step_index}, seq {seq}: tap '{tap}'" + (f" (module '{source.module}')" if source else "")
            if not parts:
                if source is None:
                    self.missing_rope_taps = True
                    continue
                raise CaptureError(f"{what}: the module was not called during the forward")
            rows = torch.cat(parts)
            keep = new_rows if source is not None and source.rows != BLOCK else B
            if keep == 0:
                continue
            if rows.shape[0] < keep:
                raise CaptureError(f"{what}: saw {rows.shape[0]} rows, fewer than the {keep} it needs")
            stage = tap.split(".", 1)[1] if tap.startswith("L") else tap
            cols = width.get(stage, f.hidden_size)
            if rows.shape[1] != cols:
                raise CaptureError(f"{what}: rows of {rows.shape[1]} features; the tap has {cols} "
                                   f"(docs/spec/drafter.md §7)")
            out[tap] = rows[-keep:]
        return out

    @contextlib.contextmanager
    def _hooks(self, forward):
        modules = dict(self.model.named_modules())
        handles = []
        try:
            for tap, source in self.taps.items():
                module = modules[source.module]
                if source.where == "output":
                    handles.append(module.register_forward_hook(
                        lambda m, args, out, tap=tap: forward.add(tap, _rows(_first_tensor(out, f"tap '{tap}'")))))
                else:
                    def pre(m, args, tap=tap, name=source.module):
                        if not args or not isinstance(args[0], torch.Tensor):
                            raise CaptureError(f"tap '{tap}': module '{name}' got no positional tensor input")
                        forward.add(tap, _rows(args[0]))
                    handles.append(module.register_forward_pre_hook(pre))
            for name, layer in self.attention.items():
                handles.append(modules[name].register_forward_pre_hook(
                    lambda m, args, layer=layer: setattr(forward, "layer", layer)))
                handles.append(modules[name].register_forward_hook(
                    lambda m, args, out: setattr(forward, "layer", None)))
            yield
        finally:
            for h in handles:
                h.remove()

    def _rope_patch(self):
        if self.rope is None:
            return contextlib.nullcontext()
        if self.rope == "auto":
            return rope_hook.patch_model_rope(self.model)
        if not callable(self.rope):
            raise CaptureError("rope must be 'auto', None, or a function returning a context manager")
        return self.rope()

    # ---- output ----

    def drafter_tensors(self):
        """The module's parameters by name, each stored exactly (BF16 or F32)."""
        return {name: exact_storage(p, f"drafter tensor '{name}'") for name, p in self.model.named_parameters()}

    def save(self, out_dir, name, description="", provenance=None):
        """Writes the fixture; returns the list of warnings (e.g. taps that could not be recorded)."""
        if not any("propose" in s for s in self.steps):
            raise CaptureError(f"{out_dir}: nothing was proposed; a fixture needs at least one propose")
        prov = {"producer": self.producer, "expect_precision": PRECISIONS[self.dtype]}
        prov.update(provenance or {})
        target = {"embed_tokens.weight": exact_storage(self.embed_tokens, "target tensor 'embed_tokens'"),
                  "lm_head.weight": exact_storage(self.lm_head, "target tensor 'lm_head'")}
        write_fixture(out_dir, name=name, description=description, provenance=prov, config=self.config,
                      drafter_tensors=self.drafter_tensors(), target_tensors=target, head=self.head,
                      steps=self.steps, trace_tensors=self.trace)
        warnings = []
        if self.missing_rope_taps:
            warnings.append("no RoPE hook reported q and k: the L{l}.q and L{l}.k taps are not recorded "
                            "(docs/capture.md, 'RoPE')")
        return warnings
