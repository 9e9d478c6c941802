"""A seeded capture scenario: which sequences propose when, with which context rows, anchors and
widths. Everything comes from one torch.Generator seeded with `seed`: same options, same bytes."""
import torch

from .errors import CaptureError
from .safetensors_io import read_safetensors


def bf16_valued_normal(generator, rows, cols):
    """Target-hidden-like rows: standard normal values rounded to bf16 (exact in every dtype)."""
    return torch.randn(rows, cols, generator=generator, dtype=torch.float32).to(torch.bfloat16)


def load_hidden(path, features):
    """The [N, nT·Ht] hidden states of a safetensors file (its only tensor, or 'hidden_states')."""
    tensors = read_safetensors(path)
    if "hidden_states" in tensors:
        t = tensors["hidden_states"]
    elif len(tensors) == 1:
        t = next(iter(tensors.values()))
    else:
        raise CaptureError(f"{path}: holds {len(tensors)} tensors and none is named 'hidden_states'")
    if t.dim() != 2 or t.shape[1] != features:
        raise CaptureError(f"{path}: hidden states have shape {list(t.shape)}; expected [N, {features}] (nT·Ht)")
    return t


class ContextSource:
    """Context rows per sequence and position: from `hidden` (rows = positions 0..N-1, shared by
    every sequence) or seeded random. Random rows that fall outside the first window of a sequence
    are zeros: the drafter never attends to them, and the fixture stays small."""

    def __init__(self, generator, features, ctx_cap, hidden=None, hidden_path=None):
        self.generator, self.features, self.ctx_cap = generator, features, ctx_cap
        self.hidden, self.hidden_path = hidden, hidden_path

    def rows(self, first, last, seen_from):
        """Rows for positions first..last-1; `seen_from`: the first position a window can hold."""
        if self.hidden is not None:
            if last > self.hidden.shape[0]:
                raise CaptureError(f"{self.hidden_path}: holds {self.hidden.shape[0]} rows; the capture needs "
                                   f"positions up to {last - 1}")
            return self.hidden[first:last]
        out = torch.zeros(last - first, self.features, dtype=torch.bfloat16)
        begin = max(first, seen_from)
        if begin < last:
            out[begin - first:] = bf16_valued_normal(self.generator, last - begin, self.features)
        return out


def run_scenario(recorder, *, seed, prompt, steps, batch, positions_from, widths, hidden=None, hidden_path=None,
                 target=None):
    """Drives `recorder`: `batch` sequences, sequence i with a prompt of prompt+i rows starting at
    position positions_from, proposing together `steps` times (each accepts a random 0..B-1 drafts,
    so 1..B new context rows), then released. Widths cycle through `widths`. With `target` (a
    target_side.TokenTarget or ModuleTarget) each anchor is the target's token at its position and
    each propose carries the target's side."""
    f = recorder.facts
    if prompt < 1 or steps < 1 or batch < 1 or positions_from < 0:
        raise CaptureError("--prompt, --steps and --batch must be >= 1, --positions-from >= 0")
    generator = torch.Generator().manual_seed(seed)
    ctx_cap = recorder.head["ctx_cap"]
    source = ContextSource(generator, f.ctx_features, ctx_cap, hidden, hidden_path)
    next_pos = {}
    for step in range(steps):
        width = widths[step % len(widths)]
        B = f.clamp_width(width, recorder.gamma)
        entries = []
        for seq in range(batch):
            if seq not in next_pos:
                first, start = 0, positions_from + prompt + seq
                seen_from = start - ctx_cap
            else:
                first = next_pos[seq]
                start = first + int(torch.randint(1, B + 1, (1,), generator=generator))
                seen_from = first
            anchor = int(torch.randint(0, f.vocab_size, (1,), generator=generator))
            ctx = source.rows(first, start, seen_from)
            entry = {"seq": seq, "ctx": ctx, "start": start, "anchor": anchor, "block_width": width}
            if target is not None:
                entry["anchor"] = target.anchor(seq, start)
                entry["target"] = target.side(seq, start, B)
            entries.append(entry)
            next_pos[seq] = start
        recorder.propose(entries)
    recorder.release(list(range(batch)))
