"""`dflash-capture import dir`: the plain dump layout (docs/capture.md, "The plain layout"), for
engines without a dumper of their own. One safetensors file per forward pass, and a
`manifest.json`:

    {"format": "dflash-dump", "version": 1, "precision": "bf16",          (precision: optional)
     "passes": [{"file": "pass-0000.safetensors", "step": 0,
                 "sequences": [{"seq": 0, "start": 12, "anchor": 17, "block_width": 8}],
                 "tensors": [{"tensor": "ctx.0", "stage": "ctx", "seq": 0},
                             {"tensor": "q.0.0", "stage": "L0.q", "seq": 0}, ...],
                 "release": [0]}]}                                          (release: optional)

Stages: `ctx` (the sequence's new context rows [C, nT·Ht]), the taps of docs/spec/drafter.md §7
([B, width] each; ctx_proj [C, H]), `logits` [B-1, V] and `draft_tokens` [B-1].
"""
import os

import torch

from .dump_import import PRECISION_CHOICES, DumpFixture
from .errors import CaptureError
from .json_file import read_json_object
from .safetensors_io import read_safetensors
from .stages import CONTEXT_TAP, tap_order, tap_width

FORMAT_NAME = "dflash-dump"
MANIFEST = "manifest.json"


def _int(value, what, least=0):
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise CaptureError(f"{what} must be an integer >= {least}, got {value!r}")
    return value


def _list(value, what):
    if not isinstance(value, list):
        raise CaptureError(f"{what} must be a list")
    return value


def import_plain(dump_dir, facts, ctx_cap):
    """(DumpFixture, precision or None) of the plain layout in `dump_dir`."""
    path = os.path.join(dump_dir, MANIFEST)
    manifest = read_json_object(path)
    if manifest.get("format") != FORMAT_NAME:
        raise CaptureError(f"{path}: field 'format' is not '{FORMAT_NAME}'")
    if manifest.get("version") != 1:
        raise CaptureError(f"{path}: field 'version' is {manifest.get('version')!r}; this reader knows version 1")
    precision = manifest.get("precision")
    if precision is not None and precision not in PRECISION_CHOICES:
        raise CaptureError(f"{path}: field 'precision' must be one of {', '.join(PRECISION_CHOICES)}, "
                           f"got {precision!r}")
    fixture = DumpFixture(facts)
    passes = _list(manifest.get("passes"), f"{path}: field 'passes'")
    if not passes:
        raise CaptureError(f"{path}: field 'passes' is empty")
    for i, p in enumerate(passes):
        what = f"{path}: passes[{i}]"
        if not isinstance(p, dict):
            raise CaptureError(f"{what} must be an object")
        _import_pass(dump_dir, what, p, facts, ctx_cap, fixture)
    return fixture, precision


def _import_pass(dump_dir, what, p, facts, ctx_cap, fixture):
    f = facts
    if not isinstance(p.get("file"), str):
        raise CaptureError(f"{what}: field 'file' must name the pass's safetensors file")
    file = os.path.join(dump_dir, p["file"])
    tensors = read_safetensors(file)
    step = _int(p.get("step"), f"{what}: field 'step'")
    where = f"{file} (step {step})"
    sequences = {}
    for j, s in enumerate(_list(p.get("sequences"), f"{what}: field 'sequences'")):
        sw = f"{what}: sequences[{j}]"
        if not isinstance(s, dict):
            raise CaptureError(f"{sw} must be an object")
        seq = _int(s.get("seq"), f"{sw}: field 'seq'")
        if seq in sequences:
            raise CaptureError(f"{sw}: seq {seq} appears twice in the pass")
        sequences[seq] = {"seq": seq, "start": _int(s.get("start"), f"{sw}: field 'start'"),
                          "anchor": _int(s.get("anchor"), f"{sw}: field 'anchor'"),
                          "block_width": _int(s.get("block_width"), f"{sw}: field 'block_width'", 2),
                          "expect": {"taps": {}}}
    stages = set(tap_order(f.num_layers)) | {"ctx", "logits", "draft_tokens"}
    named, seen, dtypes, ctx = set(), set(), [], {}
    for j, t in enumerate(_list(p.get("tensors"), f"{what}: field 'tensors'")):
        tw = f"{what}: tensors[{j}]"
        if not isinstance(t, dict) or not isinstance(t.get("tensor"), str) or not isinstance(t.get("stage"), str):
            raise CaptureError(f"{tw} must be an object with 'tensor', 'stage' and 'seq'")
        name, stage, seq = t["tensor"], t["stage"], t.get("seq")
        if stage not in stages:
            raise CaptureError(f"{tw}: stage '{stage}' is not ctx, logits, draft_tokens or a tap of a "
                               f"{f.num_layers}-layer drafter")
        if seq not in sequences:
            raise CaptureError(f"{tw}: seq {seq!r} is not one of the pass's sequences {sorted(sequences)}")
        if name not in tensors:
            raise CaptureError(f"{file}: has no tensor '{name}' (named by {tw})")
        if name in named:
            raise CaptureError(f"{tw}: tensor '{name}' is named twice")
        named.add(name)
        if (seq, stage) in seen:
            raise CaptureError(f"{tw}: seq {seq} has two tensors of stage '{stage}'")
        seen.add((seq, stage))
        entry, value = sequences[seq], tensors[name]
        B = entry["block_width"]
        expect = entry["expect"]
        if stage == "ctx":
            _check_shape(file, name, value, [None, f.ctx_features])
            ctx[seq] = value
            continue
        if stage == "logits":
            _check_shape(file, name, value, [B - 1, f.vocab_size])
            expect["logits"] = value
        elif stage == "draft_tokens":
            _check_shape(file, name, value, [B - 1])
            if value.is_floating_point():
                raise CaptureError(f"{file}: tensor '{name}' (draft_tokens) must hold integers, not {value.dtype}")
            expect["draft_tokens"] = value.to(torch.int64)
            continue
        else:
            rows = None if stage == CONTEXT_TAP else B
            _check_shape(file, name, value, [rows, tap_width(stage, f)])
            expect["taps"][stage] = value
        dtypes.append(value.dtype)
    unnamed = sorted(set(tensors) - named)
    if unnamed:
        raise CaptureError(f"{file}: tensor '{unnamed[0]}' is named by no entry of {what}: tensors")
    entries = []
    for seq, entry in sequences.items():
        rows = ctx.get(seq)
        entry["ctx"] = rows if rows is not None else torch.zeros(0, f.ctx_features, dtype=torch.bfloat16)
        proj = entry["expect"]["taps"].get(CONTEXT_TAP)
        if proj is not None:
            C = entry["ctx"].shape[0]
            kept = min(C, ctx_cap)
            if proj.shape[0] not in (C, kept):
                raise CaptureError(f"{file}: seq {seq}: tap {CONTEXT_TAP} has {proj.shape[0]} rows for {C} context rows")
            if kept:
                entry["expect"]["taps"][CONTEXT_TAP] = proj[-kept:]
            else:
                del entry["expect"]["taps"][CONTEXT_TAP]
        entries.append(entry)
    if not entries:
        raise CaptureError(f"{what}: field 'sequences' is empty")
    fixture.propose(where, entries, dtypes)
    if "release" in p:
        released = _list(p["release"], f"{what}: field 'release'")
        for s in released:
            _int(s, f"{what}: field 'release' entry")
        if released:
            fixture.release(where, released)


def _check_shape(file, name, value, shape):
    """`shape` with None for a free dimension."""
    if value.dim() != len(shape) or any(want is not None and got != want for got, want in zip(value.shape, shape)):
        shown = "[" + ", ".join("N" if s is None else str(s) for s in shape) + "]"
        raise CaptureError(f"{file}: tensor '{name}' has shape {list(value.shape)}; expected {shown}")
