"""`dflash-capture import sglang`: the drafter forward passes of an SGLang dump as proposes.

A forward pass has a context phase (the context rows entering the drafter since the previous
pass: the `ctx` input marks its start) and a block phase (the `block_ids` input marks its start).
A block phase holding none of the map's taps, logits or draft tokens is another model's forward
(the target's) and is skipped; context rows wait for the next drafter pass. The block's rows are
the batch's sequences in order, B rows each; the context rows are the sequences' new rows in batch
order, each sequence's continuing at its next position (or starting over at 0 in a reused slot).
"""
import torch

from .dims import first_difference
from .dump_import import DumpFixture
from .dump_map import CONTEXT_INPUTS
from .errors import CaptureError
from .sglang_dump import read_dump
from .stages import CONTEXT_TAP, tap_width

_BLOCK_INPUTS = ("block_ids", "block_positions", "seq_ids", "logits", "draft_tokens")


class _Pass:
    def __init__(self, context, block):
        self.context, self.block = context, block
        self.where = f"{block[0].where} (step {block[0].step})"


def _matches(record, source):
    return all(str(record.meta.get(k)) == v for k, v in source.where.items())


def _records(records, source):
    """The records of the first of the source's names that has any."""
    for name in source.names:
        found = [r for r in records if r.name == name and _matches(r, source)]
        if found:
            return found
    return []


def passes_of(records, dump_map, num_layers):
    """The drafter forward passes among the records (sorted by step and dump order)."""
    taps = dump_map.layer_taps(num_layers)
    ctx_marks = set(dump_map.inputs["ctx"].names)
    block_marks = set(dump_map.inputs["block_ids"].names)
    context_names = {n for k in CONTEXT_INPUTS for n in dump_map.inputs[k].all_names()}
    if CONTEXT_TAP in taps:
        context_names |= set(taps[CONTEXT_TAP].all_names())
    drafter_names = {n for t, s in taps.items() if t != CONTEXT_TAP for n in s.all_names()}
    drafter_names |= {n for k in ("logits", "draft_tokens") if k in dump_map.inputs
                      for n in dump_map.inputs[k].all_names()}
    out, pending, block, phase = [], [], None, None

    def close():
        nonlocal pending
        if block and any(r.name in drafter_names for r in block):
            out.append(_Pass(pending, block))
            pending = []

    for r in records:
        if r.name in ctx_marks and phase != "context":
            close()
            block, phase = None, "context"
        elif r.name in block_marks:
            close()
            block, phase = [], "block"
        if phase == "context" and r.name in context_names:
            pending.append(r)
        elif phase == "block":
            block.append(r)
    close()
    return out


def _one_input(records, source, key):
    """A block input: its first record; later ones in the same pass must hold the same values."""
    found = _records(records, source)
    if not found:
        return None
    different = first_difference([r.value for r in found])
    if different is not None:
        raise CaptureError(f"{found[different].where}: input '{key}' differs from {found[0].where} in the same "
                           f"forward pass")
    return found[0]


def _concat(found, width, what):
    parts = []
    for r in found:
        if width is not None and r.value.numel() % width:
            raise CaptureError(f"{r.where}: {what} has shape {list(r.value.shape)}, not rows of {width}")
        parts.append(r.value.reshape(-1, width) if width is not None else r.value.reshape(-1))
    return torch.cat(parts)


class _Resolver:
    """Tensors of one pass by source: parts, sums and shapes applied; dtypes as dumped."""

    def __init__(self, p, facts):
        self.p, self.facts = p, facts
        self.dtypes = []

    def block_tap(self, tap, source, rows):
        if source.sum is not None:
            parts = [self.block_tap(tap, s, rows) for s in source.sum]
            if parts[0] is None or any(x is None for x in parts):
                return None
            return torch.stack(parts).sum(0, dtype=parts[0].dtype)
        found = _records(self.p.block, source)
        if not found:
            return None
        if len(found) > 1:
            raise CaptureError(f"{found[1].where}: '{found[1].name}' (tap {tap}) was dumped {len(found)} times in the "
                               f"forward pass of {self.p.where}")
        r = found[0]
        width = tap_width(tap, self.facts)
        value = r.value
        if source.part is not None:
            value = self._part(r, source.part, rows, tap)
        elif value.numel() != rows * width:
            raise CaptureError(f"{r.where}: '{r.name}' (tap {tap}) has shape {list(value.shape)}; the block's "
                               f"{rows} rows of {width} need {rows * width} values")
        self.dtypes.append(r.dtype)
        return value.reshape(rows, width)

    def _part(self, r, part, rows, tap):
        f = self.facts
        if r.gathered:
            raise CaptureError(f"{r.where}: '{r.name}' (tap {tap}) was gathered over tp ranks; a 'part' of a fused "
                               f"tensor is taken on one rank only (dump q, k and v apart)")
        total = r.value.numel() // rows if rows else 0
        heads = f.num_heads + 2 * f.num_kv_heads
        if rows * total != r.value.numel() or total % heads:
            raise CaptureError(f"{r.where}: '{r.name}' (tap {tap}) has shape {list(r.value.shape)}: not {rows} rows "
                               f"of [q | k | v] for {f.num_heads} + 2x{f.num_kv_heads} heads")
        unit = total // heads
        q, kv = f.num_heads * unit, f.num_kv_heads * unit
        begin = {"q": 0, "k": q, "v": q + kv}[part]
        width = q if part == "q" else kv
        return r.value.reshape(rows, total)[:, begin:begin + width]


def _split_context(p, facts, seqs, keys, starts, ctx, positions):
    """Each sequence's new context rows: [(begin, end, restart)] into ctx, in batch order."""
    n = 0 if ctx is None else ctx.shape[0]
    out, offset = [], 0
    for key, start in zip(keys, starts):
        nxt = seqs.next_position(key)
        restart = nxt > 0 and offset < n and int(positions[offset]) == 0 and start != nxt
        first = 0 if restart else nxt
        need = start - first
        if need < 0:
            raise CaptureError(f"{p.where}: the block of sequence {key} starts at position {start}, before its next "
                               f"context position {first}")
        if need and ctx is None:
            raise CaptureError(f"{p.where}: no context rows were dumped before this forward pass, but sequence {key} "
                               f"needs positions {first}..{start - 1} (input 'ctx'; dump with "
                               f"DUMPER_NON_INTRUSIVE_MODE=all, docs/capture.md)")
        if offset + need > n:
            raise CaptureError(f"{p.context[0].where}: sequence {key} needs context positions {first}..{start - 1}, but "
                               f"only {n - offset} context rows are left of the {n} dumped before {p.where}")
        got = positions[offset:offset + need]
        if need and not torch.equal(got, torch.arange(first, start, dtype=got.dtype)):
            raise CaptureError(f"{p.context[0].where}: context rows {offset}..{offset + need - 1} should be sequence "
                               f"{key}'s positions {first}..{start - 1}; input 'ctx_positions' says "
                               f"{int(got[0])}..{int(got[-1])}")
        out.append((offset, offset + need, restart))
        offset += need
    if offset != n:
        raise CaptureError(f"{p.context[0].where}: {n - offset} of the {n} context rows dumped before {p.where} belong "
                           f"to no sequence of its batch")
    return out


class _Sequences:
    """Engine sequence ids (slots) -> fixture sequence ids; a slot that starts over is a new one."""

    def __init__(self):
        self.ids, self.next, self.count = {}, {}, 0

    def next_position(self, key):
        return self.next.get(key, 0)

    def begin(self, key, start, restart):
        """(fixture seq id, the id released by a restart or None)."""
        released = None
        if key not in self.ids or restart:
            released = self.ids.get(key)
            self.ids[key] = self.count
            self.count += 1
        self.next[key] = start
        return self.ids[key], released


def import_sglang(dump_dir, dump_map, facts, ctx_cap):
    """A DumpFixture of the drafter passes of the SGLang dump in `dump_dir`."""
    records = read_dump(dump_dir, dump_map.names(facts.num_layers))
    passes = passes_of(records, dump_map, facts.num_layers)
    if not passes:
        raise CaptureError(f"{dump_dir}: no drafter forward pass was found: no block input "
                           f"'{' or '.join(dump_map.inputs['block_ids'].names)}' is followed by a tap, logits or draft "
                           f"tokens of {dump_map.source}")
    fixture = DumpFixture(facts)
    seqs = _Sequences()
    taps = dump_map.layer_taps(facts.num_layers)
    for p in passes:
        _import_pass(p, dump_map, taps, facts, ctx_cap, seqs, fixture)
    return fixture, len(passes)


def _import_pass(p, dump_map, taps, facts, ctx_cap, seqs, fixture):
    f = facts
    inputs = {k: _one_input(p.block, dump_map.inputs[k], k) for k in _BLOCK_INPUTS if k in dump_map.inputs}
    for key in ("block_ids", "block_positions"):
        if inputs[key] is None:
            raise CaptureError(f"{p.where}: the forward pass has no input '{key}' "
                               f"({' or '.join(dump_map.inputs[key].names)})")
    ids = inputs["block_ids"].value.reshape(-1).long()
    T = ids.numel()
    block_pos = inputs["block_positions"].value.reshape(-1).long()
    if block_pos.numel() != T:
        raise CaptureError(f"{inputs['block_positions'].where}: {block_pos.numel()} block positions for {T} block ids")
    if inputs.get("seq_ids") is not None:
        keys = [int(k) for k in inputs["seq_ids"].value.reshape(-1)]
        if len(set(keys)) != len(keys):
            raise CaptureError(f"{inputs['seq_ids'].where}: a sequence id appears twice in one batch: {keys}")
    else:
        keys = list(range(T // f.block_size)) if T % f.block_size == 0 else None
    if not keys or T % len(keys):
        raise CaptureError(f"{inputs['block_ids'].where}: {T} block ids do not split into the batch's "
                           f"{len(keys) if keys else '?'} blocks")
    bs, B = len(keys), T // len(keys)
    if B < 2:
        raise CaptureError(f"{inputs['block_ids'].where}: blocks of {B} rows; a propose drafts from blocks of 2 or more")
    starts, anchors = [], []
    for i in range(bs):
        block_ids, positions = ids[i * B:(i + 1) * B], block_pos[i * B:(i + 1) * B]
        if not bool((block_ids[1:] == f.mask_token_id).all()):
            raise CaptureError(f"{inputs['block_ids'].where}: block {i} is {block_ids.tolist()}, not an anchor followed "
                               f"by mask_token_id {f.mask_token_id}")
        if not torch.equal(positions, positions[0] + torch.arange(B)):
            raise CaptureError(f"{inputs['block_positions'].where}: block {i}'s positions {positions.tolist()} are not "
                               f"consecutive")
        starts.append(int(positions[0]))
        anchors.append(int(block_ids[0]))

    ctx_found = _records(p.context, dump_map.inputs["ctx"])
    ctx = _concat(ctx_found, f.ctx_features, "input 'ctx'") if ctx_found else None
    ctx_positions = None
    if ctx is not None:
        pos_found = _records(p.context, dump_map.inputs["ctx_positions"])
        if not pos_found:
            raise CaptureError(f"{ctx_found[0].where}: the context rows before {p.where} have no positions (input "
                               f"'ctx_positions': {' or '.join(dump_map.inputs['ctx_positions'].names)})")
        ctx_positions = _concat(pos_found, None, "input 'ctx_positions'").long()
        if ctx_positions.numel() != ctx.shape[0]:
            raise CaptureError(f"{pos_found[0].where}: {ctx_positions.numel()} context positions for "
                               f"{ctx.shape[0]} context rows ({ctx_found[0].where})")
    spans = _split_context(p, f, seqs, keys, starts, ctx, ctx_positions)

    resolver = _Resolver(p, f)
    ctx_proj = None
    if CONTEXT_TAP in taps and ctx is not None:
        found = _records(p.context, taps[CONTEXT_TAP])
        if found:
            ctx_proj = _concat(found, f.hidden_size, f"tap {CONTEXT_TAP}")
            if ctx_proj.shape[0] != ctx.shape[0]:
                raise CaptureError(f"{found[0].where}: {ctx_proj.shape[0]} rows of tap {CONTEXT_TAP} for "
                                   f"{ctx.shape[0]} context rows ({ctx_found[0].where})")
            resolver.dtypes += [r.dtype for r in found]
    block_taps = {}
    for tap, source in taps.items():
        if tap != CONTEXT_TAP:
            value = resolver.block_tap(tap, source, T)
            if value is not None:
                block_taps[tap] = value
    logits = _rows_after_anchor(inputs.get("logits"), bs, B, f.vocab_size, "logits")
    drafts = _rows_after_anchor(inputs.get("draft_tokens"), bs, B, None, "draft_tokens")
    if inputs.get("logits") is not None:
        resolver.dtypes.append(inputs["logits"].dtype)

    entries = []
    for i, key in enumerate(keys):
        begin, end, restart = spans[i]
        seq, released = seqs.begin(key, starts[i], restart)
        if released is not None:
            fixture.release(p.where, [released])
        taps_i = {tap: value[i * B:(i + 1) * B] for tap, value in block_taps.items()}
        kept = min(end - begin, ctx_cap)
        if ctx_proj is not None and kept:
            taps_i[CONTEXT_TAP] = ctx_proj[end - kept:end]
        expect = {"taps": taps_i}
        if logits is not None:
            expect["logits"] = logits[i]
        if drafts is not None:
            expect["draft_tokens"] = drafts[i]
        rows = ctx[begin:end] if ctx is not None else torch.zeros(0, f.ctx_features, dtype=torch.bfloat16)
        entries.append({"seq": seq, "ctx": rows, "start": starts[i], "anchor": anchors[i], "block_width": B,
                        "expect": expect})
    fixture.propose(p.where, entries, resolver.dtypes)


def _rows_after_anchor(record, bs, B, width, key):
    """[bs, B-1, width] (or [bs, B-1]) of a per-row input dumped for rows 1..B-1 of each block (or
    for all B rows, the anchor's dropped)."""
    if record is None:
        return None
    value = record.value
    per_row = width or 1
    for rows in (B - 1, B):
        if value.numel() == bs * rows * per_row:
            shaped = value.reshape(bs, rows, per_row)[:, rows - (B - 1):]
            return shaped if width else shaped[..., 0].to(torch.int64)
    what = f"{bs} blocks of {B - 1} (or {B}) rows" + (f" of {width}" if width else "")
    raise CaptureError(f"{record.where}: input '{key}' has shape {list(value.shape)}, not {what}")
