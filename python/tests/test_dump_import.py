"""Engine dumps as fixtures: files written by SGLang's real dumper (sglang 0.5.14, sglang_dumper.py)
from the tiny SGLang-layout drafter (tiny_sglang_dflash.py), imported with `dflash-capture import
sglang` and replayed by this build's dflash-harness; the plain layout (`import dir`) round-tripped
from a recorded fixture; and the refusals. DFLASH_HARNESS names the dflash-harness binary."""
import contextlib
import io
import json
import os
import shutil
import sys
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import drafter_checkpoints as dc  # noqa: E402
import harness_replay  # noqa: E402
import sglang_dumper  # noqa: E402
import sglang_runs  # noqa: E402
import tiny_sglang_dflash  # noqa: E402
from dflash_capture import CaptureError  # noqa: E402
from dflash_capture.cli import main as capture_main  # noqa: E402
from dflash_capture.dims import gather_tp  # noqa: E402
from dflash_capture.safetensors_io import read_safetensors, write_safetensors  # noqa: E402

SEED = 11


def run_cli(argv):
    """(exit code, stdout, stderr) of dflash-capture."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = capture_main(argv)
    return code, out.getvalue(), err.getvalue()


def read_fixture(path):
    with open(os.path.join(path, "fixture.json")) as f:
        return json.load(f), read_safetensors(os.path.join(path, "trace.safetensors"))


class Workspace(dc.CheckpointWorkspace):
    """A temporary folder with the tiny drafter's checkpoint and target."""

    seed = SEED
    prefix = "dflash-dump-test-"

    def path(self, name):
        return os.path.join(self.dir, name)

    def import_dump(self, kind, dump, out, *extra):
        return run_cli(["import", kind, dump, "--checkpoint", self.checkpoint, "--target", self.target,
                        "--out", self.path(out), *extra])

    def imported(self, kind, dump, out, *extra):
        code, stdout, stderr = self.import_dump(kind, dump, out, *extra)
        self.assertEqual(code, 0, stderr)
        return self.path(out)

    def refused(self, kind, dump, *extra):
        code, _, stderr = self.import_dump(kind, dump, "refused", *extra)
        self.assertEqual(code, 2, stderr)
        self.assertTrue(stderr.startswith("error: "), stderr)
        return stderr


class SGLangDumps(Workspace):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.clean = sglang_runs.run(os.path.join(cls.dir, "clean"), cls.checkpoint, cls.target)
        cls.explicit_map = os.path.join(cls.dir, "explicit-map.json")
        with open(cls.explicit_map, "w") as f:
            json.dump(tiny_sglang_dflash.EXPLICIT_MAP, f)

    def without(self, name_part, copy):
        """A copy of the clean dump without the files whose name contains name_part."""
        dest = self.path(copy)
        shutil.copytree(self.clean, dest)
        removed = [f for f in os.listdir(dest) if name_part in f]
        self.assertTrue(removed)
        for f in removed:
            os.remove(os.path.join(dest, f))
        return dest

    def test_the_dumper_is_sglang_0_5_14_loaded_without_the_rest_of_sglang(self):
        self.assertEqual(sglang_dumper.installed_version(), "0.5.14")
        self.assertEqual(sglang_dumper.load().__file__, sglang_dumper.FILE)
        self.assertFalse([m for m in sys.modules if m == "sglang" or m.startswith("sglang.")])

    def test_a_clean_dump_imports_and_replays_within_the_bf16_bounds(self):
        # The run dumped through docs/capture.md's DUMPER_FILTER, which leaves out e.g. seq_lens.
        self.assertFalse([f for f in os.listdir(self.clean) if "___name=seq_lens___" in f])
        fixture = self.imported("sglang", self.clean, "clean")
        result = harness_replay.assert_passes(self, fixture, "bf16")
        manifest, trace = read_fixture(fixture)
        proposes = [s["propose"] for s in manifest["steps"] if "propose" in s]
        self.assertEqual([len(p) for p in proposes], [2, 2, 2])  # 3 passes of the 2-sequence batch
        self.assertEqual(manifest["steps"][-1], {"release": [0, 1]})
        for entries in proposes:
            for e in entries:
                self.assertEqual(len(e["expect"]["taps"]), 2 + 9 * self.config["num_hidden_layers"] + 1)
                self.assertEqual(set(e["expect"]) - {"taps"}, {"logits", "draft_tokens"})
        self.assertEqual(sorted(s["stage"] for s in result["pairs"][0]["stages"]),
                         sorted(list(proposes[0][0]["expect"]["taps"]) + ["logits"]))

    def test_a_planted_rope_sign_fails_at_L0_q(self):
        dump = sglang_runs.run(self.path("rope-sign"), self.checkpoint, self.target, bug="rope-sign")
        harness_replay.assert_rejected_at(self, self.imported("sglang", dump, "rope-sign-fixture"), "L0.q")

    def test_a_planted_skipped_norm_fails_at_L0_mlp_norm(self):
        dump = sglang_runs.run(self.path("skip-norm"), self.checkpoint, self.target, bug="skip-mlp-norm")
        harness_replay.assert_rejected_at(self, self.imported("sglang", dump, "skip-norm-fixture"), "L0.mlp_norm")

    def test_a_reused_slot_is_a_new_sequence(self):
        dump = sglang_runs.run_slot_reuse(self.path("slot-reuse"), self.checkpoint, self.target)
        fixture = self.imported("sglang", dump, "slot-reuse-fixture")
        manifest, _ = read_fixture(fixture)
        steps = [s.get("release") or [(e["seq"], e["start"]) for e in s["propose"]] for s in manifest["steps"]]
        self.assertEqual(steps, [[(0, 10), (1, 12)], [0], [(2, 9), (1, 15)], [1, 2]])
        harness_replay.assert_passes(self, fixture, "bf16")

    def test_a_dump_without_the_context_rows_is_refused_naming_the_file_and_input(self):
        stderr = self.refused("sglang", self.without("name=non_intrusive__fc.inputs.0___", "no-ctx"))
        self.assertIn("no context rows were dumped before this forward pass", stderr)
        self.assertIn("input 'ctx'", stderr)
        self.assertRegex(stderr, r"no-ctx/step=0___rank=0___dump_index=\d+___name=input_ids___")

    def test_a_dump_without_the_context_positions_is_refused_naming_the_file_and_input(self):
        stderr = self.refused("sglang", self.without("name=non_intrusive__layers.0.self_attn.rotary_emb.inputs.0___",
                                                      "no-ctx-positions"))
        self.assertIn("have no positions (input 'ctx_positions'", stderr)
        self.assertRegex(stderr, r"no-ctx-positions/step=0___rank=0___dump_index=\d+___name=non_intrusive__fc\.inputs\.0")

    def test_a_damaged_file_is_refused_by_name(self):
        dest = self.path("damaged")
        shutil.copytree(self.clean, dest)
        victim = sorted(f for f in os.listdir(dest) if "___name=non_intrusive__hidden_norm.output___" in f)[1]
        with open(os.path.join(dest, victim), "wb") as f:
            f.write(b"not a torch file")
        stderr = self.refused("sglang", dest)
        self.assertIn(f"damaged/{victim}: not a readable dumper file", stderr)

    def test_a_dump_of_another_layout_finds_no_drafter_pass(self):
        stderr = self.refused("sglang", self.clean, "--tap-map", self.explicit_map)
        self.assertIn("no drafter forward pass was found: no block input 'block_ids' is followed by a tap", stderr)
        self.assertIn("explicit-map.json", stderr)

    def test_two_tp_ranks_with_dims_are_gathered_and_pass(self):
        dump = sglang_runs.run_tp2(self.path("tp2"), self.checkpoint, self.target)
        ranks = {f.split("___rank=")[1].split("___")[0] for f in os.listdir(dump)}
        self.assertEqual(ranks, {"0", "1"})
        meta = torch.load(os.path.join(dump, sorted(f for f in os.listdir(dump) if "___name=q___" in f)[0]))["meta"]
        self.assertEqual((meta["dims"], meta["sglang_parallel_info"]), ("t h[tp]", {"tp_rank": 0, "tp_size": 2}))
        fixture = self.imported("sglang", dump, "tp2-fixture", "--tap-map", self.explicit_map)
        harness_replay.assert_passes(self, fixture, "bf16")
        # The shards, gathered in the wrong tp order, put the heads out of place: caught at L0.q.
        swapped = self.path("tp2-swapped")
        shutil.copytree(dump, swapped)
        for f in os.listdir(swapped):
            data = torch.load(os.path.join(swapped, f))
            info = data["meta"]["sglang_parallel_info"]
            info["tp_rank"] = 1 - info["tp_rank"]
            torch.save(data, os.path.join(swapped, f))
        harness_replay.assert_rejected_at(
            self, self.imported("sglang", swapped, "tp2-swapped-fixture", "--tap-map", self.explicit_map), "L0.q")

    def test_two_tp_ranks_without_dims_are_refused_by_name(self):
        dump = sglang_runs.run_tp2(self.path("tp2-no-dims"), self.checkpoint, self.target, with_dims=False)
        stderr = self.refused("sglang", dump, "--tap-map", self.explicit_map)
        self.assertIn("differs between tp ranks 0 and 1 and has no field 'dims' to gather it by", stderr)
        self.assertRegex(stderr, r"tp2-no-dims/run/step=0___rank=0___dump_index=\d+___name=\w+")

    def test_a_bad_tap_map_is_refused_naming_the_file_and_field(self):
        bad = self.path("bad-map.json")
        with open(bad, "w") as f:
            json.dump(dict(tiny_sglang_dflash.EXPLICIT_MAP, taps={"L{l}.qq": "q"}), f)
        stderr = self.refused("sglang", self.clean, "--tap-map", bad)
        self.assertIn("bad-map.json: taps: 'L{l}.qq' is not a tap", stderr)


class DimsGathering(unittest.TestCase):
    def setUp(self):
        g = torch.Generator().manual_seed(1)
        self.a, self.b = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)

    def test_a_tp_dim_is_concatenated_and_a_partial_one_summed(self):
        self.assertTrue(torch.equal(gather_tp([self.a, self.b], "t h[tp]", {"tp": 2}, "x"), torch.cat([self.a, self.b], 1)))
        self.assertTrue(torch.equal(gather_tp([self.a, self.b], "(t*b)[tp] h", {"tp": 2}, "x"),
                                    torch.cat([self.a, self.b], 0)))
        self.assertTrue(torch.equal(gather_tp([self.a, self.b], "t h[tp:partial]", {"tp": 2}, "x"), self.a + self.b))

    def test_replicated_tensors_must_agree(self):
        self.assertIs(gather_tp([self.a, self.a.clone()], "t h # tp:replicated", {"tp": 2}, "x"), self.a)
        with self.assertRaisesRegex(CaptureError, r"x: differs between tp ranks 0 and 1, but field 'dims' 't h # "
                                                  r"tp:replicated' declares it tp:replicated"):
            gather_tp([self.a, self.b], "t h # tp:replicated", {"tp": 2}, "x")

    def test_dims_that_do_not_fit_are_refused(self):
        for dims, message in (("t h d[tp]", "names 3 dimensions; the tensor of tp rank 0 has shape \\[3, 4\\]"),
                              ("t h[tp:twisted]", "modifier 'tp:twisted' is not understood"),
                              ("t[tp] h[tp]", "shards more than one dimension over tp"),
                              ("t h[cp]", "shards axis 'cp' of size 2; only 'tp' is gathered")):
            with self.assertRaisesRegex(CaptureError, message):
                gather_tp([self.a, self.b], dims, {"tp": 2, "cp": 2}, "x")


def write_plain_layout(fixture, out):
    """The plain layout of a fixture's proposes, as an engine would write it: one safetensors file per
    forward pass, bf16 activations, the manifest naming each tensor's stage and sequence."""
    manifest, trace = read_fixture(fixture)
    os.makedirs(out)
    passes = []
    for i, step in enumerate(manifest["steps"]):
        if "release" in step:
            passes[-1]["release"] = step["release"]
            continue
        tensors, named, sequences = {}, [], []
        for e in step["propose"]:
            seq = e["seq"]
            sequences.append({k: e[k] for k in ("seq", "start", "anchor", "block_width")})
            stages = dict(e["expect"]["taps"], logits=e["expect"]["logits"], draft_tokens=e["expect"]["draft_tokens"])
            if trace[e["ctx"]].shape[0]:
                stages["ctx"] = e["ctx"]
            for stage, name in stages.items():
                value = trace[name]
                tensors[f"{stage}.{seq}"] = value if stage in ("ctx", "draft_tokens") else value.to(torch.bfloat16)
                named.append({"tensor": f"{stage}.{seq}", "stage": stage, "seq": seq})
        file = f"pass-{len(passes):04d}.safetensors"
        write_safetensors(os.path.join(out, file), tensors)
        passes.append({"file": file, "step": i, "sequences": sequences, "tensors": named})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"format": "dflash-dump", "version": 1, "passes": passes}, f, indent=1)
    return out


class PlainLayout(Workspace):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.recorded = os.path.join(cls.dir, "recorded")
        code = capture_main(["record", "--model-file", os.path.join(HERE, "tiny_dflash.py"), "--class",
                             "DFlashDrafter", "--checkpoint", cls.checkpoint, "--target", cls.target, "--out",
                             cls.recorded, "--dtype", "bfloat16", "--prompt", "12", "--steps", "3", "--batch", "2",
                             "--ctx-cap", "20", "--seed", "5"])
        assert code == 0
        cls.plain = write_plain_layout(cls.recorded, os.path.join(cls.dir, "plain"))

    def copy_plain(self, name, edit):
        """A copy of the plain layout whose manifest `edit` changes."""
        dest = self.path(name)
        shutil.copytree(self.plain, dest)
        with open(os.path.join(dest, "manifest.json")) as f:
            manifest = json.load(f)
        edit(manifest)
        with open(os.path.join(dest, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        return dest

    def test_the_plain_layout_round_trips_to_the_same_fixture(self):
        fixture = self.imported("dir", self.plain, "round-trip", "--ctx-cap", "20")
        (original, original_trace), (imported, imported_trace) = read_fixture(self.recorded), read_fixture(fixture)
        self.assertEqual(imported["steps"], original["steps"])
        self.assertEqual(imported["head"], original["head"])
        self.assertEqual(imported["provenance"]["expect_precision"], "bf16")
        self.assertEqual(sorted(imported_trace), sorted(original_trace))
        for name, value in original_trace.items():
            self.assertEqual(imported_trace[name].dtype, value.dtype, name)
            self.assertTrue(torch.equal(imported_trace[name], value), name)
        for file in ("drafter/model.safetensors", "target.safetensors"):
            with open(os.path.join(self.recorded, file), "rb") as f, open(os.path.join(fixture, file), "rb") as g:
                self.assertEqual(f.read(), g.read(), file)
        harness_replay.assert_passes(self, fixture, "bf16")

    def test_an_unknown_stage_is_refused_naming_the_manifest_entry(self):
        def edit(m):
            m["passes"][1]["tensors"][2]["stage"] = "L9.q"
        stderr = self.refused("dir", self.copy_plain("unknown-stage", edit))
        self.assertIn("unknown-stage/manifest.json: passes[1]: tensors[2]: stage 'L9.q' is not ctx, logits, "
                      "draft_tokens or a tap of a 2-layer drafter", stderr)

    def test_a_tensor_no_entry_names_is_refused(self):
        def edit(m):
            del m["passes"][0]["tensors"][3]
        stderr = self.refused("dir", self.copy_plain("unnamed", edit))
        self.assertRegex(stderr, r"unnamed/pass-0000\.safetensors: tensor '[\w.]+' is named by no entry")

    def test_a_gap_in_the_context_is_refused_naming_the_pass(self):
        def edit(m):
            m["passes"][1]["sequences"][0]["start"] += 1
        stderr = self.refused("dir", self.copy_plain("gap", edit))
        self.assertRegex(stderr, r"gap/pass-0001\.safetensors \(step 1\): step 1, seq 0: the \d+ context rows cover "
                                 r"positions")


if __name__ == "__main__":
    unittest.main()
