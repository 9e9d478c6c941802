"""Writes fixture format v1, or v2 when a propose carries the target's side (docs/spec/fixture-format.md): fixture.json, drafter/config.json,
drafter/model.safetensors, target.safetensors and trace.safetensors."""
import json
import os

from .errors import CaptureError
from .safetensors_io import write_safetensors

FORMAT_NAME = "dflash-fixture"
FORMAT_VERSION = 1
TARGET_SIDE_VERSION = 2  # the version that adds the target's side


def write_fixture(out_dir, *, name, description, provenance, config, drafter_tensors, target_tensors, head,
                  steps, trace_tensors):
    """One fixture directory. `steps` are the manifest's step objects; every trace tensor they name
    is in `trace_tensors` and nothing else is (the reader refuses unnamed tensors)."""
    named = set()
    with_target = False
    for step in steps:
        for entry in step.get("propose", []):
            named.add(entry["ctx"])
            expect = entry.get("expect", {})
            named.update(v for k, v in expect.items() if k != "taps")
            named.update(expect.get("taps", {}).values())
            target = entry.get("target")
            if target is not None:
                with_target = True
                named.add(target["tokens"])
                named.update(target.get("topk", {}).values())
    if named != set(trace_tensors):
        raise CaptureError(f"{out_dir}: trace tensors and steps disagree (internal): "
                           f"{sorted(named ^ set(trace_tensors))[:5]}")
    try:
        os.makedirs(os.path.join(out_dir, "drafter"), exist_ok=True)
    except OSError as e:
        raise CaptureError(f"{out_dir}: cannot create the fixture directory ({e.strerror})") from None
    manifest = {
        "format": FORMAT_NAME,
        "version": TARGET_SIDE_VERSION if with_target else FORMAT_VERSION,
        "name": name,
        "description": description,
        "provenance": provenance,
        "drafter_dir": "drafter",
        "target": {"file": "target.safetensors", "embed_tokens": "embed_tokens.weight",
                   "lm_head": "lm_head.weight"},
        "head": head,
        "trace": "trace.safetensors",
        "steps": steps,
    }
    write_safetensors(os.path.join(out_dir, "drafter", "model.safetensors"), drafter_tensors, {"format": "pt"})
    write_safetensors(os.path.join(out_dir, "target.safetensors"), target_tensors, {"format": "pt"})
    write_safetensors(os.path.join(out_dir, "trace.safetensors"), trace_tensors, {"format": "pt"})
    _write_json(os.path.join(out_dir, "drafter", "config.json"), config)
    _write_json(os.path.join(out_dir, "fixture.json"), manifest)


def _write_json(path, value):
    partial = path + ".partial"
    with open(partial, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")
    os.replace(partial, path)
