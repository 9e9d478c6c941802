"""The target's side of a capture (fixture format v2): `record --target-tokens FILE` and `record
--target-model-file` with a tiny random Qwen3-style target (tiny_target.py) built here, replayed
through dflash-harness, which measures the acceptance; bad target input is refused by name.

DFLASH_HARNESS names the dflash-harness binary (the ctest test sets it)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import drafter_checkpoints as dc  # noqa: E402
import harness_replay  # noqa: E402
import tiny_target  # noqa: E402
from dflash_capture.checkpoint import import_class, load_drafter  # noqa: E402
from dflash_capture.cli import main as capture_main  # noqa: E402
from dflash_capture.safetensors_io import read_safetensors, write_safetensors  # noqa: E402

MODEL_FILE = os.path.join(HERE, "tiny_dflash.py")
TARGET_FILE = os.path.join(HERE, "tiny_target.py")
SEED = 11


class TargetSideCapture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="dflash-capture-target-")
        cls.dir = cls.tmp.name
        cls.config = dc.tiny_config()
        cls.checkpoint = os.path.join(cls.dir, "ckpt")
        cls.target = os.path.join(cls.dir, "target.safetensors")
        dc.write_target(cls.target, dc.write_checkpoint(cls.checkpoint, cls.config, SEED))
        cls.target_checkpoint = os.path.join(cls.dir, "target-model")
        tiny_target.write_checkpoint(cls.target_checkpoint, tiny_target.tiny_target_config(), seed=3)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def record(self, out, extra, code=0):
        argv = ["record", "--model-file", MODEL_FILE, "--class", "DFlashDrafter", "--checkpoint", self.checkpoint,
                "--target", self.target, "--out", os.path.join(self.dir, out), "--prompt", "12", "--steps", "3",
                "--batch", "2", "--ctx-cap", "20", "--seed", "5", *extra]
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(capture_main(argv), code, err.getvalue())
        return os.path.join(self.dir, out), err.getvalue()

    def manifest(self, fixture):
        with open(os.path.join(fixture, "fixture.json")) as f:
            return json.load(f)

    def test_a_target_module_run_teacher_forced_gives_tokens_and_top_k(self):
        fixture, _ = self.record("module", ["--target-model-file", TARGET_FILE, "--target-class", "TinyQwen3Target",
                                            "--target-checkpoint", self.target_checkpoint, "--target-topk", "5"])
        m = self.manifest(fixture)
        self.assertEqual(m["version"], 2)
        trace = read_safetensors(os.path.join(fixture, "trace.safetensors"))
        # Recompute independently: the target module, teacher-forced on its own greedy continuation.
        cls = import_class(TARGET_FILE, "TinyQwen3Target")
        model, _ = load_drafter(cls, self.target_checkpoint, torch.float64, torch.device("cpu"))
        prompts = torch.Generator().manual_seed(5 + 1)
        sequences = {}
        for step in m["steps"]:
            for e in step.get("propose", []):
                seq, start, B = e["seq"], e["start"], len(trace[e["expect"]["draft_tokens"]]) + 1
                tokens = sequences.get(seq)
                if tokens is None:
                    tokens = torch.randint(0, 256, (4,), generator=prompts)
                with torch.no_grad():
                    while tokens.shape[0] < start + B - 1:
                        tokens = torch.cat([tokens, model(tokens.unsqueeze(0))[0, -1].argmax().reshape(1)])
                    logits = model(tokens[:start + B - 1].unsqueeze(0))[0, start:start + B - 1]
                sequences[seq] = tokens
                self.assertEqual(e["anchor"], int(tokens[start]))
                target = e["target"]
                self.assertEqual(trace[target["tokens"]].tolist(), logits.argmax(-1).tolist())
                values, ids = torch.topk(logits.float(), 5, dim=-1)
                self.assertTrue(torch.equal(trace[target["topk"]["values"]], values))
                self.assertEqual(trace[target["topk"]["ids"]].tolist(), ids.tolist())
        run, result = harness_replay.replay(fixture)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        sides = {s["name"]: s for s in result["acceptance"]["sides"]}
        self.assertEqual(sides["fixture"]["blocks"], 6)  # 3 steps x 2 sequences
        self.assertEqual(sides["fixture"]["mean_length"], sides["reference-fp64"]["mean_length"])
        self.assertIsNotNone(sides["reference-fp64"]["sampling_length"])  # top-k logits: sampling acceptance
        self.assertIn("acceptance module: fixture ", run.stdout)
        print(f"\n  module target: mean acceptance length {sides['reference-fp64']['mean_length']:.2f}, "
              f"under sampling {sides['reference-fp64']['sampling_length']:.3f}", file=sys.stderr)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(capture_main(["inspect", fixture]), 0)
        self.assertIn(", target [", out.getvalue())
        self.assertIn("top-float32[", out.getvalue())

    def test_target_tokens_from_a_file_set_the_anchors_and_the_block_tokens(self):
        tokens = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(4), dtype=torch.int64)
        path = os.path.join(self.dir, "tokens.safetensors")
        write_safetensors(path, {"target_tokens": tokens})
        fixture, _ = self.record("tokens", ["--target-tokens", path])
        m = self.manifest(fixture)
        trace = read_safetensors(os.path.join(fixture, "trace.safetensors"))
        for step in m["steps"]:
            for e in step.get("propose", []):
                B = len(trace[e["expect"]["draft_tokens"]]) + 1
                self.assertEqual(e["anchor"], int(tokens[e["start"]]))
                self.assertEqual(trace[e["target"]["tokens"]].tolist(), tokens[e["start"] + 1:e["start"] + B].tolist())
                self.assertNotIn("topk", e["target"])
        run, result = harness_replay.replay(fixture)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIsNone(result["acceptance"]["sides"][1]["sampling_length"])  # tokens only

    def test_without_a_target_the_capture_stays_version_1(self):
        fixture, _ = self.record("plain", [])
        self.assertEqual(self.manifest(fixture)["version"], 1)

    def test_bad_target_input_is_refused_by_name(self):
        short = os.path.join(self.dir, "short-tokens.safetensors")
        write_safetensors(short, {"target_tokens": torch.zeros(10, dtype=torch.int64)})
        _, err = self.record("short", ["--target-tokens", short], code=2)
        self.assertIn("short-tokens.safetensors: holds 10 target tokens; the capture needs positions up to", err)
        wide = os.path.join(self.dir, "wide-tokens.safetensors")
        write_safetensors(wide, {"target_tokens": torch.zeros(4, 8, dtype=torch.int64)})
        _, err = self.record("wide", ["--target-tokens", wide], code=2)
        self.assertIn("wide-tokens.safetensors: target tokens must be a 1-D I32 or I64 tensor", err)
        big = os.path.join(self.dir, "big-tokens.safetensors")
        write_safetensors(big, {"target_tokens": torch.full((64,), 256, dtype=torch.int64)})
        _, err = self.record("big", ["--target-tokens", big], code=2)
        self.assertIn("big-tokens.safetensors: target token 256 at position 0 is outside [0, vocab_size 256)", err)
        _, err = self.record("both", ["--target-tokens", big, "--target-model-file", TARGET_FILE], code=2)
        self.assertIn("--target-tokens and --target-model-file are two sources", err)
        _, err = self.record("half", ["--target-model-file", TARGET_FILE], code=2)
        self.assertIn("a target module needs --target-model-file, --target-class and --target-checkpoint", err)


if __name__ == "__main__":
    unittest.main()
