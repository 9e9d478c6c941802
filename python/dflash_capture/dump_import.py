"""A fixture from the proposes read out of an engine's dumps (sglang_import.py, plain_dump.py):
the engine's tensors become the expectations, at the precision of their dtype, with the drafter
checkpoint and target the run used."""
import torch

from .checkpoint import load_target, read_config
from .drafter_config import DrafterFacts
from .errors import CaptureError
from .fixture_steps import FixtureSteps, target_tensors
from .safetensors_io import read_checkpoint_tensors
from .storage import exact_storage

PRECISION_CHOICES = ("fp64", "fp32", "bf16", "fp8")
_PRECISION_OF_DTYPE = {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16"}
_LOOSER = {"fp64": 0, "fp32": 1, "bf16": 2}


def precision_of(dtypes, where):
    """The expectation precision of tensors dumped in `dtypes`: the coarsest of them."""
    if not dtypes:
        raise CaptureError(f"{where}: no expectation was dumped")
    unknown = sorted(str(d) for d in dtypes if d not in _PRECISION_OF_DTYPE)
    if unknown:
        raise CaptureError(f"{where}: expectations dumped as {', '.join(unknown)}, which has no precision in "
                           f"docs/tolerances.md; give --precision")
    return max((_PRECISION_OF_DTYPE[d] for d in dtypes), key=_LOOSER.get)


class Drafter:
    """The drafter checkpoint and target of the dumped run, as a fixture stores them."""

    def __init__(self, checkpoint_dir, target_path):
        self.config = read_config(checkpoint_dir)
        self.facts = DrafterFacts(self.config, f"{checkpoint_dir}/config.json")
        self.tensors = {name: exact_storage(t, f"{checkpoint_dir}: tensor '{name}'")
                        for name, t in read_checkpoint_tensors(checkpoint_dir).items()}
        embed, lm_head = load_target(target_path, self.config)
        f = self.facts
        for what, t in (("embed_tokens", embed), ("lm_head", lm_head)):
            if list(t.shape) != [f.vocab_size, f.hidden_size]:
                raise CaptureError(f"{target_path}: '{what}' has shape {list(t.shape)}; the drafter config says "
                                   f"[vocab_size {f.vocab_size}, hidden_size {f.hidden_size}]")
        self.target = target_tensors(embed, lm_head)


class DumpFixture:
    """Proposes and releases in engine order. Each propose entry: seq, ctx [C, nT·Ht], start,
    anchor, block_width, expect {"logits", "draft_tokens", "taps"} (any absent); `where` names the
    dump files it came from, for errors."""

    def __init__(self, facts):
        self.facts = facts
        self.events = []
        self.dtypes = set()

    def propose(self, where, entries, dtypes):
        """`dtypes`: the dtypes the entries' expectations were dumped in."""
        self.events.append(("propose", where, entries))
        self.dtypes |= set(dtypes)

    def release(self, where, seqs):
        self.events.append(("release", where, list(seqs)))

    def write(self, out_dir, drafter, *, ctx_cap, kv_page_size, precision, name, description, provenance):
        proposes = [e for kind, _, e in self.events if kind == "propose"]
        if not proposes:
            raise CaptureError(f"{provenance.get('dump', out_dir)}: no drafter forward pass was found in the dump")
        if not any(x.get("logits") is not None or x.get("draft_tokens") is not None or x.get("taps")
                   for entries in proposes for x in (e["expect"] for e in entries)):
            raise CaptureError(f"{provenance.get('dump', out_dir)}: the dump holds no expectation (no tap, logits or "
                               f"draft tokens): a fixture of it would check nothing")
        head = {"gamma": max(e["block_width"] for entries in proposes for e in entries), "ctx_cap": ctx_cap,
                "max_batch": max(len(entries) for entries in proposes), "kv_page_size": kv_page_size}
        steps = FixtureSteps(self.facts, head)
        for kind, where, payload in self.events:
            try:
                if kind == "propose":
                    steps.check_propose(payload)
                    steps.add_propose(payload, [e["expect"] for e in payload])
                else:
                    steps.release(payload)
            except CaptureError as e:
                raise CaptureError(f"{where}: {e}") from None
        active = steps.active()
        if active:
            steps.release(active)
        prov = dict(provenance)
        prov["expect_precision"] = precision or precision_of(self.dtypes, provenance.get("dump", out_dir))
        steps.write(out_dir, name=name, description=description, provenance=prov, config=drafter.config,
                    drafter_tensors=drafter.tensors, target=drafter.target)
        return steps, prov["expect_precision"]
