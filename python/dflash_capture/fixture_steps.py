"""The steps of a fixture being written (docs/spec/fixture-format.md): proposes checked against the
format's rules, their trace tensors under the harness's names, releases, and the write. The
recorder and the dump importers both build fixtures through it."""
import torch

from .errors import CaptureError
from .fixture_writer import write_fixture
from .stages import tap_order
from .storage import exact_storage
from .target_side import check_side


def target_tensors(embed_tokens, lm_head):
    """The target.safetensors tensors, each stored exactly."""
    return {"embed_tokens.weight": exact_storage(embed_tokens, "target tensor 'embed_tokens'"),
            "lm_head.weight": exact_storage(lm_head, "target tensor 'lm_head'")}


class FixtureSteps:
    """Proposes and releases in order. `facts` is a DrafterFacts, `head` the head settings
    (gamma, ctx_cap, max_batch, kv_page_size)."""

    def __init__(self, facts, head):
        self.facts = facts
        self.head = head
        self.steps = []
        self.trace = {}
        self.sequences = {}  # seq -> {"next": next context position, "released": bool}

    @property
    def step_index(self):
        return len(self.steps)

    def next_position(self, seq):
        """The position the sequence's next context row must have (0 for a sequence not seen)."""
        state = self.sequences.get(seq)
        return 0 if state is None else state["next"]

    def active(self):
        return [seq for seq, state in self.sequences.items() if not state["released"]]

    def check_propose(self, entries):
        """Checks one batched propose before anything is computed; returns its block width (the
        one width all entries clamp to). Each entry: seq, ctx ([C, nT·Ht] new context rows), start,
        anchor, block_width."""
        f = self.facts
        step_index = self.step_index
        if not entries or len(entries) > self.head["max_batch"]:
            raise CaptureError(f"propose: {len(entries)} sequences; a propose serves 1..max_batch "
                               f"({self.head['max_batch']})")
        widths = {f.clamp_width(e["block_width"], self.head["gamma"]) for e in entries}
        if len(widths) != 1:
            raise CaptureError(f"step {step_index}: block widths clamp to {sorted(widths)}; one propose runs one width")
        seen = set()
        for e in entries:
            self._check_entry(step_index, e, seen)
        return widths.pop()

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

    def add_propose(self, entries, expectations):
        """Appends a propose checked by check_propose. expectations[i] holds entry i's expected
        "logits" [B-1, V], "draft_tokens" [B-1] and "taps" {tap: rows}; any may be absent. An entry's
        "target" (target_side.py: "tokens" [B-1], optional "topk_values" and "topk_ids" [B-1, k]) is
        its target side (fixture format v2)."""
        step_index = self.step_index
        B = self.facts.clamp_width(entries[0]["block_width"], self.head["gamma"]) if entries else 0
        step = []
        for e, expect in zip(entries, expectations):
            seq = e["seq"]
            state = self.sequences.setdefault(seq, {"next": 0, "released": False})
            state["next"] = e["start"]
            prefix = f"s{step_index}.q{seq}."
            ctx_name = prefix + "ctx"
            self.trace[ctx_name] = exact_storage(e["ctx"], f"step {step_index}, seq {seq}: context rows")
            names = {}
            if expect.get("logits") is not None:
                names["logits"] = prefix + "logits"
                self.trace[names["logits"]] = expect["logits"].detach().float().cpu().contiguous()
            if expect.get("draft_tokens") is not None:
                names["draft_tokens"] = prefix + "drafts"
                self.trace[names["draft_tokens"]] = expect["draft_tokens"].detach().to(torch.int32).cpu().contiguous()
            taps = expect.get("taps", {})
            tap_names = {}
            for tap in (t for t in tap_order(self.facts.num_layers) if t in taps):
                name = prefix + "tap." + tap
                self.trace[name] = taps[tap].detach().float().cpu().contiguous()
                tap_names[tap] = name
            names["taps"] = tap_names
            entry = {"seq": seq, "ctx": ctx_name, "start": e["start"], "anchor": e["anchor"],
                     "block_width": e["block_width"], "expect": names}
            if e.get("target") is not None:
                entry["target"] = self._add_target(e["target"], prefix, B, f"step {step_index}, seq {seq}")
            step.append(entry)
        self.steps.append({"propose": step})

    def _add_target(self, side, prefix, B, where):
        check_side(side, B, self.facts.vocab_size, where)
        names = {"tokens": prefix + "target.tokens"}
        self.trace[names["tokens"]] = side["tokens"].detach().to(torch.int32).cpu().contiguous()
        if side.get("topk_values") is not None:
            names["topk"] = {"values": prefix + "target.topk_values", "ids": prefix + "target.topk_ids"}
            self.trace[names["topk"]["values"]] = side["topk_values"].detach().float().cpu().contiguous()
            self.trace[names["topk"]["ids"]] = side["topk_ids"].detach().to(torch.int32).cpu().contiguous()
        return names

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
        self.steps.append({"release": seqs})

    def write(self, out_dir, *, name, description, provenance, config, drafter_tensors, target):
        """Writes the fixture; `target` is target_tensors(...)."""
        if not any("propose" in s for s in self.steps):
            raise CaptureError(f"{out_dir}: nothing was proposed; a fixture needs at least one propose")
        write_fixture(out_dir, name=name, description=description, provenance=provenance, config=config,
                      drafter_tensors=drafter_tensors, target_tensors=target, head=self.head,
                      steps=self.steps, trace_tensors=self.trace)
