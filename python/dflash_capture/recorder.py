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
from .fixture_steps import FixtureSteps, target_tensors
from .module_output import output_tensor
from .stages import tap_width
from .storage import exact_storage
from .tap_map import BLOCK, TapMap, detect_tap_map

PRECISIONS = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16"}


def upstream_call(model, noise_embedding, target_hidden, position_ids):
    """The upstream drafter's call: noise_embedding [1, B, H] (the block's embeddings),
    target_hidden [1, W, nT·Ht] (the window's context rows), position_ids [1, W + B] (context
    positions, then block positions); returns the final-normed hidden states [1, B, H]."""
    return model(position_ids=position_ids, noise_embedding=noise_embedding, target_hidden=target_hidden)


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
        self.fixture = FixtureSteps(f, self.head)
        self.windows = {}  # seq -> the [W, F] context rows in its window
        self.missing_rope_taps = False

    @property
    def steps(self):
        return self.fixture.steps

    @property
    def trace(self):
        return self.fixture.trace

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
        self.fixture.release(seqs)
        for seq in seqs:
            self.windows.pop(seq, None)

    def propose(self, entries):
        """One batched propose. Each entry: seq, ctx ([C, nT·Ht] new context rows), start, anchor,
        block_width. Returns the draft tokens of each entry (lists of B-1 ints)."""
        step_index = self.fixture.step_index
        B = self.fixture.check_propose(entries)
        used, expectations, drafts = [], [], []
        for e in entries:
            ctx, expect = self._propose_one(step_index, e, B)
            used.append(dict(e, ctx=ctx))  # the rows the module used, as the fixture stores them
            expectations.append(expect)
            drafts.append(expect["draft_tokens"].tolist())
        self.fixture.add_propose(used, expectations)
        if self.progress:
            self.progress(step_index)
        return drafts

    def _propose_one(self, step_index, e, B):
        f = self.facts
        seq, start, anchor = e["seq"], e["start"], e["anchor"]
        device = self._device()
        ctx = e["ctx"].detach().to(device=device, dtype=self.dtype)
        C = ctx.shape[0]
        window = torch.cat([self.windows.get(seq, ctx[:0]), ctx])[-self.head["ctx_cap"]:]
        self.windows[seq] = window
        W = window.shape[0]

        tokens = torch.tensor([anchor] + [f.mask_token_id] * (B - 1), device=device)
        noise = self.embed_tokens[tokens].unsqueeze(0)
        positions = torch.arange(start - W, start + B, device=device).unsqueeze(0)
        forward = _Forward(self.attention)
        with torch.no_grad(), self._hooks(forward), self._rope_patch():
            previous = rope_hook.set_sink(forward)
            try:
                hidden = output_tensor(self.call(self.model, noise, window.unsqueeze(0), positions), "drafter output",
                                       "last_hidden_state")
            finally:
                rope_hook.set_sink(previous)
            if list(hidden.shape) != [1, B, f.hidden_size]:
                raise CaptureError(f"step {step_index}, seq {seq}: the drafter returned shape {list(hidden.shape)}; "
                                   f"expected [1, {B}, {f.hidden_size}] (final-normed block rows)")
            logits = torch.nn.functional.linear(hidden[0, 1:], self.lm_head)
        drafts = torch.argmax(logits, dim=-1)  # the first index among equal maxima (docs/spec/drafter.md §3)
        taps = {"embed": noise[0]}
        taps.update(self._taps_of(forward, B, min(C, self.head["ctx_cap"]), step_index, seq))
        return ctx, {"logits": logits, "draft_tokens": drafts, "taps": taps}

    def _taps_of(self, forward, B, new_rows, step_index, seq):
        f = self.facts
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
            cols = tap_width(tap, f)
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
                        lambda m, args, out, tap=tap: forward.add(
                            tap, _rows(output_tensor(out, f"tap '{tap}'", "last_hidden_state")))))
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
        prov = {"producer": self.producer, "expect_precision": PRECISIONS[self.dtype]}
        prov.update(provenance or {})
        self.fixture.write(out_dir, name=name, description=description, provenance=prov, config=self.config,
                           drafter_tensors=self.drafter_tensors(),
                           target=target_tensors(self.embed_tokens, self.lm_head))
        warnings = []
        if self.missing_rope_taps:
            warnings.append("no RoPE hook reported q and k: the L{l}.q and L{l}.k taps are not recorded "
                            "(docs/capture.md, 'RoPE')")
        return warnings
