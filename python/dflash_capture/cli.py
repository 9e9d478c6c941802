"""The `dflash-capture` command: `record` a drafter into a fixture, `import` an engine's dumps as
one, `inspect` a fixture."""
import argparse
import json
import os
import sys
import time

import torch

from .checkpoint import import_class, load_drafter, load_target, read_config
from .dump_import import PRECISION_CHOICES, Drafter
from .dump_map import SGLANG_DFLASH, load_dump_map
from .errors import CaptureError
from .fixture_writer import FORMAT_NAME
from .json_file import read_json_object
from .plain_dump import import_plain
from .recorder import PRECISIONS, Recorder
from .safetensors_io import read_safetensors
from .scenario import load_hidden, run_scenario
from .sglang_import import import_sglang
from .stages import tap_order
from .target_side import ModuleTarget, TokenTarget, load_target_tokens

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _widths(text):
    try:
        widths = [int(w) for w in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--widths: expected comma-separated integers, got {text!r}") from None
    if not widths or min(widths) < 0:
        raise argparse.ArgumentTypeError(f"--widths: expected integers >= 0, got {text!r}")
    return widths


def _parser():
    p = argparse.ArgumentParser(prog="dflash-capture", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record a PyTorch drafter into a fixture (format v1; v2 with the target's "
                                      "side)")
    r.add_argument("--model-file", required=True, help="Python file defining the drafter class")
    r.add_argument("--class", dest="class_name", required=True, help="the drafter class (an nn.Module)")
    r.add_argument("--checkpoint", required=True, help="drafter checkpoint directory (Hugging Face layout)")
    r.add_argument("--target", required=True,
                   help="the target's embed_tokens/lm_head: a safetensors file or a checkpoint directory")
    r.add_argument("--out", required=True, help="fixture directory to write")
    r.add_argument("--dtype", choices=sorted(DTYPES), default="float64",
                   help="the drafter's dtype; it sets the expectation precision (default float64)")
    r.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    r.add_argument("--prompt", type=int, default=16, help="context rows of each sequence's first propose")
    r.add_argument("--steps", type=int, default=4, help="proposes per sequence")
    r.add_argument("--batch", type=int, default=1, help="sequences proposing together")
    r.add_argument("--seed", type=int, default=0, help="seed of context rows, anchors and accept counts")
    r.add_argument("--positions-from", type=int, default=0,
                   help="first prompt position: sequences start at this absolute position")
    r.add_argument("--widths", type=_widths, help="block widths, cycled (default the block size)")
    r.add_argument("--gamma", type=int, help="head gamma (default the block size)")
    r.add_argument("--ctx-cap", type=int, default=4096, help="head context window (default 4096)")
    r.add_argument("--page-size", type=int, default=16, help="head KV page size (default 16)")
    r.add_argument("--hidden", help="safetensors of real target hidden states [N, nT·Ht] (default: seeded random)")
    r.add_argument("--name", help="fixture name (default the output folder's name)")
    r.add_argument("--description", default="", help="fixture description")
    t = r.add_argument_group("the target's side (fixture format v2; docs/acceptance.md)")
    t.add_argument("--target-tokens", help="safetensors of the target's token at each position [N] (shared by every "
                                           "sequence, as --hidden): anchors and block-position tokens come from it")
    t.add_argument("--target-model-file", help="Python file defining a target module: forward(input_ids [1, N]) -> "
                                               "logits [1, N, V], run teacher-forced on its own greedy continuation")
    t.add_argument("--target-class", help="the target module's class (with --target-model-file)")
    t.add_argument("--target-checkpoint", help="the target module's checkpoint directory (Hugging Face layout)")
    t.add_argument("--target-topk", type=int, default=8, help="target logits kept per position (default 8)")
    t.add_argument("--target-prompt", type=int, default=4,
                   help="seeded random prompt tokens the target continues, per sequence (default 4)")
    imp = sub.add_parser("import", help="turn an engine's dumps of a run into a fixture (format v1)")
    kinds = imp.add_subparsers(dest="kind", required=True)
    sglang = kinds.add_parser("sglang", help="the files of SGLang's dumper (python/sglang/srt/debug_utils/dumper.py)")
    plain = kinds.add_parser("dir", help="the plain layout: manifest.json and one safetensors file per forward pass")
    for k in (sglang, plain):
        k.add_argument("dump_dir", help="the dump directory")
        k.add_argument("--checkpoint", required=True, help="the drafter checkpoint the run used (Hugging Face layout)")
        k.add_argument("--target", required=True,
                       help="the target's embed_tokens/lm_head: a safetensors file or a checkpoint directory")
        k.add_argument("--out", required=True, help="fixture directory to write")
        k.add_argument("--ctx-cap", type=int, default=4096, help="the drafter's context window (default 4096)")
        k.add_argument("--page-size", type=int, default=16, help="head KV page size (default 16)")
        k.add_argument("--precision", choices=PRECISION_CHOICES,
                       help="expectation precision (default: from the dumped dtypes)")
        k.add_argument("--name", help="fixture name (default the output folder's name)")
        k.add_argument("--description", default="", help="fixture description")
    sglang.add_argument("--tap-map", help="JSON map of dumped names to inputs and stages (default: SGLang's "
                                          "DFlash drafter, docs/capture.md)")
    i = sub.add_parser("inspect", help="print what a fixture recorded")
    i.add_argument("fixture", help="fixture directory or its fixture.json")
    return p


def _progress(total):
    started = time.monotonic()
    last = [started]

    def report(step_index):
        now = time.monotonic()
        done = step_index + 1
        if now - last[0] >= 1.0 or done == total:
            last[0] = now
            print(f"record: propose {done}/{total} ({now - started:.1f} s)", file=sys.stderr, flush=True)
    return report


def record(args):
    dtype = DTYPES[args.dtype]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise CaptureError(f"--device {args.device}: torch sees no CUDA device")
    cls = import_class(args.model_file, args.class_name)
    model, config = load_drafter(cls, args.checkpoint, dtype, torch.device(args.device))
    embed, lm_head = load_target(args.target, config)
    recorder = Recorder(model, embed, lm_head, config, gamma=args.gamma, ctx_cap=args.ctx_cap,
                        max_batch=max(args.batch, 1), kv_page_size=args.page_size, progress=_progress(args.steps))
    widths = args.widths or [recorder.facts.block_size]
    hidden = load_hidden(args.hidden, recorder.facts.ctx_features) if args.hidden else None
    target = _target(args, recorder.facts.vocab_size, dtype)
    print(f"record: seed {args.seed}, {args.dtype} on {args.device}, {args.batch} sequence(s) x {args.steps} "
          f"proposes from position {args.positions_from}", file=sys.stderr)
    run_scenario(recorder, seed=args.seed, prompt=args.prompt, steps=args.steps, batch=args.batch,
                 positions_from=args.positions_from, widths=widths, hidden=hidden,
                 hidden_path=args.hidden, target=target)
    provenance = {"seed": args.seed, "dtype": args.dtype, "device": args.device,
                  "model": f"{os.path.basename(args.model_file)}:{args.class_name}",
                  "context_rows": args.hidden or "seeded random, bf16-valued"}
    if args.target_tokens:
        provenance["target"] = {"tokens": args.target_tokens}
    elif target is not None:
        provenance["target"] = {"model": f"{os.path.basename(args.target_model_file)}:{args.target_class}",
                                "checkpoint": args.target_checkpoint, "topk": args.target_topk,
                                "prompt": args.target_prompt, "teacher_forced": "its own greedy continuation"}
    name = args.name or os.path.basename(os.path.normpath(args.out))
    for warning in recorder.save(args.out, name, args.description, provenance):
        print(f"record: warning: {warning}", file=sys.stderr)
    print(f"record: wrote {args.out} ({len(recorder.steps)} steps, expect_precision "
          f"{PRECISIONS[recorder.dtype]})")


def _target(args, vocab_size, dtype):
    """The target's side the options ask for (target_side.py), or None."""
    module = (args.target_model_file, args.target_class, args.target_checkpoint)
    if args.target_tokens and any(module):
        raise CaptureError("--target-tokens and --target-model-file are two sources of the target's side; give one")
    if args.target_tokens:
        return TokenTarget(load_target_tokens(args.target_tokens, vocab_size), args.target_tokens)
    if not any(module):
        return None
    if not all(module):
        raise CaptureError("a target module needs --target-model-file, --target-class and --target-checkpoint")
    cls = import_class(args.target_model_file, args.target_class)
    model, _ = load_drafter(cls, args.target_checkpoint, dtype, torch.device(args.device))  # any module class
    generator = torch.Generator().manual_seed(args.seed + 1)  # apart from the scenario's stream
    return ModuleTarget(model, vocab_size, generator, prompt=args.target_prompt, topk=args.target_topk)


def import_dump(args):
    for key, value in (("--ctx-cap", args.ctx_cap), ("--page-size", args.page_size)):
        if value < 1:
            raise CaptureError(f"{key} must be >= 1, got {value}")
    drafter = Drafter(args.checkpoint, args.target)
    provenance = {"producer": f"dflash_capture import {args.kind}, torch {torch.__version__}", "dump": args.dump_dir}
    precision = args.precision
    if args.kind == "sglang":
        dump_map = load_dump_map(args.tap_map) if args.tap_map else SGLANG_DFLASH
        provenance["tap_map"] = args.tap_map or "default SGLang DFlash map"
        fixture, passes = import_sglang(args.dump_dir, dump_map, drafter.facts, args.ctx_cap)
    else:
        fixture, manifest_precision = import_plain(args.dump_dir, drafter.facts, args.ctx_cap)
        precision = precision or manifest_precision
    name = args.name or os.path.basename(os.path.normpath(args.out))
    steps, precision = fixture.write(args.out, drafter, ctx_cap=args.ctx_cap, kv_page_size=args.page_size,
                                     precision=precision, name=name, description=args.description,
                                     provenance=provenance)
    taps = {t for s in steps.steps for e in s.get("propose", []) for t in e["expect"].get("taps", {})}
    missing = [t for t in tap_order(drafter.facts.num_layers) if t not in taps]
    print(f"import: wrote {args.out} ({len(steps.steps)} steps, expect_precision {precision}, {len(taps)} taps)")
    if args.kind == "sglang":
        print(f"import: {passes} drafter forward pass(es) in {args.dump_dir}", file=sys.stderr)
    if missing:
        print(f"import: note: no expectation for {', '.join(missing)}", file=sys.stderr)


def inspect(args):
    path = args.fixture
    manifest_path = os.path.join(path, "fixture.json") if os.path.isdir(path) else path
    folder = os.path.dirname(os.path.abspath(manifest_path))
    manifest = read_json_object(manifest_path)
    if manifest.get("format") != FORMAT_NAME:
        raise CaptureError(f"{manifest_path}: field 'format' is not '{FORMAT_NAME}'")
    trace_file = os.path.join(folder, manifest.get("trace", "trace.safetensors"))
    trace = read_safetensors(trace_file)
    drafter_dir = os.path.join(folder, manifest.get("drafter_dir", "drafter"))
    config = read_config(drafter_dir)
    prov = manifest.get("provenance", {})
    print(f"fixture   {manifest.get('name', '')}: {manifest.get('description', '')}")
    print(f"provenance {json.dumps(prov)}")
    print(f"head      {json.dumps(manifest.get('head', {}))}")
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "rope_theta", "rope_scaling", "attention_bias", "rms_norm_eps")
    print("drafter   " + ", ".join(f"{k}={config[k]}" for k in keys if k in config))

    def describe(name):
        if name not in trace:
            raise CaptureError(f"{trace_file}: has no tensor '{name}' (named by {manifest_path})")
        t = trace[name]
        return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"

    for i, step in enumerate(manifest.get("steps", [])):
        if "release" in step:
            print(f"step {i:3d} release {step['release']}")
            continue
        for e in step.get("propose", []):
            expect = e.get("expect", {})
            parts = [f"seq {e['seq']}", f"ctx {describe(e['ctx'])}", f"start {e['start']}", f"anchor {e['anchor']}",
                     f"width {e['block_width']}"]
            if "logits" in expect:
                parts.append(f"logits {describe(expect['logits'])}")
            if "draft_tokens" in expect:
                parts.append("drafts " + str(trace[expect["draft_tokens"]].tolist()))
            parts.append(f"{len(expect.get('taps', {}))} taps")
            if "target" in e:
                parts.append("target " + str(trace[e["target"]["tokens"]].tolist())
                             + (f", top-{describe(e['target']['topk']['values'])}" if "topk" in e["target"] else ""))
            print(f"step {i:3d} propose " + ", ".join(parts))
    print(f"trace     {len(trace)} tensors in {trace_file}")


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        {"record": record, "import": import_dump, "inspect": inspect}[args.command](args)
    except CaptureError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
