"""Runs of the tiny SGLang-layout engine (tiny_sglang_dflash.py) with SGLang's real dumper
(sglang_dumper.py), writing the dump files an SGLang run writes: one rank with the non-intrusive
hooks on every module, or two tensor-parallel ranks (gloo) with explicit dumps."""
import contextlib
import io
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import sglang_dumper  # noqa: E402
from dflash_capture.checkpoint import load_target, read_config  # noqa: E402
from dflash_capture.drafter_config import DrafterFacts  # noqa: E402
from dflash_capture.safetensors_io import read_checkpoint_tensors  # noqa: E402
from dflash_capture.scenario import bf16_valued_normal, run_scenario  # noqa: E402
from tiny_sglang_dflash import DFlashDraftModel, Engine, Parallel  # noqa: E402

SCENARIO = dict(seed=5, prompt=12, steps=3, batch=2, positions_from=0)
# The DUMPER_FILTER of docs/capture.md: the core fields, the dflash_* dumps and the drafter's modules
# (a target's modules sit under "model.").
DRAFTER_FILTER = (r"match(r'(input_ids|positions|req_pool_indices|dflash_\w+)$|"
                  r"non_intrusive__(fc|hidden_norm|norm|layers\.\d+)\.', name)")


def _engine(dump_dir, checkpoint, target, *, bug=None, tp_rank=0, tp_size=1, explicit=False, with_dims=True,
            non_intrusive=True):
    dumper = sglang_dumper.start(dump_dir, non_intrusive_mode="all" if non_intrusive else "off",
                                 filter=DRAFTER_FILTER if non_intrusive else None)
    if tp_size > 1:
        sglang_dumper.add_tp_plugin(tp_rank, tp_size)
    config = read_config(checkpoint)
    facts = DrafterFacts(config)
    embed, lm_head = load_target(target, config)
    parallel = Parallel(tp_rank, tp_size, dumper.dump, explicit=explicit, with_dims=with_dims)
    model = DFlashDraftModel(config, parallel, bug).load(read_checkpoint_tensors(checkpoint))
    engine = Engine(model, embed, lm_head, facts, dumper)
    if non_intrusive:
        dumper.register_non_intrusive_dumper(model)
    return engine, dumper


def run(dump_dir, checkpoint, target, **options):
    """Dumps one run of the scenario into dump_dir/run; returns that folder. `options`: bug,
    tp_rank, tp_size, explicit, with_dims, non_intrusive."""
    engine, dumper = _engine(dump_dir, checkpoint, target, **options)
    with contextlib.redirect_stdout(io.StringIO()):  # the dumper logs each step()
        run_scenario(engine, widths=[engine.facts.block_size], **SCENARIO)
    dumper.reset()
    return os.path.join(dump_dir, "run")


def run_slot_reuse(dump_dir, checkpoint, target):
    """Sequences 0 and 1 propose; 0 finishes, and sequence 2 takes its slot (req_pool_indices 0)
    and proposes with 1."""
    engine, dumper = _engine(dump_dir, checkpoint, target)
    g = torch.Generator().manual_seed(7)
    F, B = engine.facts.ctx_features, engine.facts.block_size

    def entry(seq, rows, start, anchor):
        return {"seq": seq, "ctx": bf16_valued_normal(g, rows, F), "start": start, "anchor": anchor, "block_width": B}
    with contextlib.redirect_stdout(io.StringIO()):
        engine.propose([entry(0, 10, 10, 3), entry(1, 12, 12, 4)])
        engine.release([0])
        engine.propose([entry(2, 9, 9, 5), entry(1, 3, 15, 6)])
        engine.release([1, 2])
    dumper.reset()
    return os.path.join(dump_dir, "run")


def _tp_rank(rank, dump_dir, checkpoint, target, rendezvous, with_dims):
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    try:
        run(dump_dir, checkpoint, target, tp_rank=rank, tp_size=2, explicit=True, with_dims=with_dims,
            non_intrusive=False)
    finally:
        dist.destroy_process_group()


def run_tp2(dump_dir, checkpoint, target, *, with_dims=True):
    """Dumps the scenario run by two tp ranks (explicit dumps, with or without dims)."""
    os.makedirs(dump_dir, exist_ok=True)
    torch.multiprocessing.spawn(_tp_rank, args=(dump_dir, checkpoint, target, os.path.join(dump_dir, "rendezvous"),
                                                with_dims), nprocs=2, join=True)
    return os.path.join(dump_dir, "run")
