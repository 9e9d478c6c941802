"""Round trips through dflash-harness: fixtures recorded from the PyTorch drafter of
tiny_dflash.py replay on the CPU reference within the bounds of their precision, planted bugs are
rejected at the stage they corrupt, and bad input is refused by name.

DFLASH_HARNESS names the dflash-harness binary (the ctest test sets it)."""
import contextlib
import io
import json
import os
import sys
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import drafter_checkpoints as dc  # noqa: E402
import harness_replay  # noqa: E402
import tiny_dflash  # noqa: E402
from dflash_capture import CaptureError, Recorder, TapMap, UPSTREAM, patch_rope_function  # noqa: E402
from dflash_capture.checkpoint import load_drafter  # noqa: E402
from dflash_capture.cli import main as capture_main  # noqa: E402
from dflash_capture.safetensors_io import read_safetensors, write_safetensors  # noqa: E402

MODEL_FILE = os.path.join(HERE, "tiny_dflash.py")
SEED = 11


class CaptureRoundTrip(dc.CheckpointWorkspace):
    seed = SEED
    prefix = "dflash-capture-test-"

    def record(self, out, cls="DFlashDrafter", dtype="float64", checkpoint=None, extra=()):
        argv = ["record", "--model-file", MODEL_FILE, "--class", cls, "--checkpoint", checkpoint or self.checkpoint,
                "--target", self.target, "--out", os.path.join(self.dir, out), "--dtype", dtype,
                "--prompt", "12", "--steps", "3", "--batch", "2", "--ctx-cap", "20", "--seed", "5", *extra]
        self.assertEqual(capture_main(argv), 0)
        return os.path.join(self.dir, out)

    def assert_passes(self, fixture, precision):
        return harness_replay.assert_passes(self, fixture, precision)

    def assert_rejected_at(self, fixture, stage):
        harness_replay.assert_rejected_at(self, fixture, stage)

    def test_fp64_capture_replays_within_the_fp64_bound(self):
        fixture = self.record("clean-fp64")
        result = self.assert_passes(fixture, "fp64")
        with open(os.path.join(fixture, "fixture.json")) as f:
            taps = json.load(f)["steps"][0]["propose"][0]["expect"]["taps"]
        # Every tap of docs/spec/drafter.md §7 but logits (recorded as the logits expectation itself).
        self.assertEqual(len(taps), 2 + 9 * self.config["num_hidden_layers"] + 1)
        self.assertEqual(sorted(s["stage"] for s in result["pairs"][0]["stages"]),
                         sorted(list(taps) + ["logits"]))

    def test_hidden_states_from_a_file_are_the_context_rows(self):
        hidden = torch.randn(40, 128, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
        path = os.path.join(self.dir, "hidden.safetensors")
        write_safetensors(path, {"hidden_states": hidden})
        fixture = self.record("from-hidden", extra=("--batch", "1", "--hidden", path))
        self.assert_passes(fixture, "fp64")
        trace = read_safetensors(os.path.join(fixture, "trace.safetensors"))
        rows = torch.cat([trace[f"s{i}.q0.ctx"] for i in range(3)])
        self.assertTrue(torch.equal(rows, hidden[:rows.shape[0]]))
        short = os.path.join(self.dir, "short.safetensors")
        write_safetensors(short, {"hidden_states": hidden[:13]})
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertNotEqual(capture_main(["record", "--model-file", MODEL_FILE, "--class", "DFlashDrafter",
                                              "--checkpoint", self.checkpoint, "--target", self.target, "--out",
                                              os.path.join(self.dir, "too-short"), "--prompt", "12",
                                              "--hidden", short]), 0)
        self.assertIn("short.safetensors: holds 13 rows", err.getvalue())

    def test_inspect_prints_the_recorded_steps_and_refuses_a_missing_fixture(self):
        fixture = self.record("inspected")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(capture_main(["inspect", fixture]), 0)
        text = out.getvalue()
        self.assertIn('"expect_precision": "fp64"', text)
        self.assertEqual(text.count(" propose seq "), 6)  # 3 steps x 2 sequences
        self.assertIn("step   3 release [0, 1]", text)
        self.assertIn("ctx bfloat16[12, 128], start 12", text)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(capture_main(["inspect", os.path.join(self.dir, "no-such")]), 2)
        self.assertIn("no-such: cannot read", err.getvalue())

    def test_planted_interleaved_rope_is_rejected_at_L0_q(self):
        self.assert_rejected_at(self.record("rope-interleaved", "DFlashDrafterRopeInterleaved"), "L0.q")

    def test_planted_stale_context_row_is_rejected_at_L0_attn(self):
        # Context rows enter through K and V of the window, which no tap shows: the first stage
        # they reach is the attention output.
        self.assert_rejected_at(self.record("stale-context-row", "DFlashDrafterStaleContextRow"), "L0.attn")

    def test_bf16_capture_passes_within_the_bf16_bounds(self):
        self.assert_passes(self.record("clean-bf16", dtype="bfloat16"), "bf16")

    def test_bf16_bounds_still_reject_a_planted_bug(self):
        self.assert_rejected_at(self.record("rope-interleaved-bf16", "DFlashDrafterRopeInterleaved", "bfloat16"),
                                "L0.q")

    def test_sharded_hugging_face_checkpoint_loads_to_the_same_bits(self):
        sharded = os.path.join(self.dir, "ckpt-sharded")
        dc.write_checkpoint(sharded, self.config, SEED, shards=3, prefix="model.")
        self.assertTrue(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")))
        a, _ = load_drafter(tiny_dflash.DFlashDrafter, self.checkpoint, torch.float64, torch.device("cpu"))
        b, _ = load_drafter(tiny_dflash.DFlashDrafter, sharded, torch.float64, torch.device("cpu"))
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            self.assertTrue(torch.equal(p, q), name)
        one = self.record("from-single", checkpoint=self.checkpoint)
        two = self.record("from-sharded", checkpoint=sharded)
        for file in ("trace.safetensors", "target.safetensors", "drafter/model.safetensors"):
            with open(os.path.join(one, file), "rb") as f, open(os.path.join(two, file), "rb") as g:
                self.assertEqual(f.read(), g.read(), file)

    def test_a_checkpoint_tensor_that_is_missing_or_unused_is_named(self):
        broken = os.path.join(self.dir, "ckpt-extra")
        dc.write_checkpoint(broken, self.config, SEED, shards=2)
        with open(os.path.join(broken, "model.safetensors.index.json")) as f:
            index = json.load(f)
        dropped = sorted(index["weight_map"])[0]
        del index["weight_map"][dropped]
        with open(os.path.join(broken, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f)
        with self.assertRaisesRegex(CaptureError, dropped.replace(".", r"\.")):
            load_drafter(tiny_dflash.DFlashDrafter, broken, torch.float64, torch.device("cpu"))


class RecorderRules(unittest.TestCase):
    def setUp(self):
        self.config = dc.tiny_config()
        params, target = dc.random_tensors(self.config, SEED)
        self.model = tiny_dflash.DFlashDrafter(self.config).double()
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(params[name].double())
        self.embed, self.lm_head = target["embed_tokens.weight"], target["lm_head.weight"]
        g = torch.Generator().manual_seed(3)
        self.ctx = torch.randn(10, 128, generator=g).to(torch.bfloat16)

    def test_an_unrecognized_layout_is_refused_listing_its_modules(self):
        wrapped = torch.nn.Sequential(self.model)
        with self.assertRaisesRegex(CaptureError, r"Modules seen: 0, 0\.fc, 0\.hidden_norm"):
            Recorder(wrapped, self.embed, self.lm_head, self.config)

    def test_a_custom_tap_map_records_the_same_taps(self):
        class Wrapper(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

        plain = Recorder(self.model, self.embed, self.lm_head, self.config)
        custom = Recorder(Wrapper(self.model), self.embed, self.lm_head, self.config,
                          tap_map=UPSTREAM.with_prefix("inner."),
                          call=lambda m, noise, ctx, pos: m.inner(position_ids=pos, noise_embedding=noise,
                                                                  target_hidden=ctx),
                          rope=lambda: patch_rope_function(tiny_dflash, "apply_rotary_pos_emb"))
        for rec in (plain, custom):
            rec.propose([{"seq": 0, "ctx": self.ctx, "start": 10, "anchor": 7, "block_width": 8}])
        self.assertEqual(sorted(plain.trace), sorted(custom.trace))
        self.assertIn("s0.q0.tap.L1.q", plain.trace)
        for name in plain.trace:
            self.assertTrue(torch.equal(plain.trace[name], custom.trace[name]), name)

    def test_without_a_rope_hook_q_and_k_are_left_out_with_a_warning(self):
        rec = Recorder(self.model, self.embed, self.lm_head, self.config, rope=None)
        rec.propose([{"seq": 0, "ctx": self.ctx, "start": 10, "anchor": 7, "block_width": 8}])
        self.assertNotIn("s0.q0.tap.L0.q", rec.trace)
        self.assertIn("s0.q0.tap.L0.v", rec.trace)
        self.assertTrue(rec.missing_rope_taps)

    def test_a_context_gap_is_refused_naming_the_sequence_and_positions(self):
        rec = Recorder(self.model, self.embed, self.lm_head, self.config)
        rec.propose([{"seq": 0, "ctx": self.ctx, "start": 10, "anchor": 7, "block_width": 8}])
        with self.assertRaisesRegex(CaptureError, r"step 1, seq 0: the 2 context rows cover positions 11\.\.12, "
                                                  r"but the sequence's next context position is 10"):
            rec.propose([{"seq": 0, "ctx": self.ctx[:2], "start": 13, "anchor": 7, "block_width": 8}])

    def test_weights_that_bf16_and_f32_cannot_hold_are_refused_by_name(self):
        with torch.no_grad():
            self.model.norm.weight[0] += 1e-12
        rec = Recorder(self.model, self.embed, self.lm_head, self.config)
        with self.assertRaisesRegex(CaptureError, r"drafter tensor 'norm\.weight'"):
            rec.drafter_tensors()


if __name__ == "__main__":
    unittest.main()
