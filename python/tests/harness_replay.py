"""Replaying a fixture with this build's dflash-harness (DFLASH_HARNESS, set by the ctest test) and
asserting its verdict from the JSON report."""
import json
import os
import subprocess
import sys


def harness():
    path = os.environ.get("DFLASH_HARNESS")
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("DFLASH_HARNESS must name the dflash-harness binary (the ctest test sets it)")
    return path


def replay(fixture):
    """(completed process, the fixture's result in the JSON report)."""
    report = fixture + ".report.json"
    run = subprocess.run([harness(), "replay", fixture, "--json", report], capture_output=True, text=True)
    with open(report) as f:
        result = json.load(f)["results"][0]
    return run, result


def assert_passes(test, fixture, precision):
    run, result = replay(fixture)
    test.assertEqual(run.returncode, 0, run.stdout + run.stderr)
    test.assertEqual(result["expect_precision"], precision)
    test.assertEqual(result["verdict"], "pass")
    pair = result["pairs"][0]
    test.assertLess(pair["worst_ratio"], 1.0)
    test.assertEqual(pair["tokens"]["mismatch"], 0)
    print(f"\n  {os.path.basename(fixture)}: worst error/bound {pair['worst_ratio']:.3f} at {pair['worst_stage']}, "
          f"tokens {pair['tokens']}", file=sys.stderr)
    return result


def assert_rejected_at(test, fixture, stage, step=0):
    run, result = replay(fixture)
    test.assertEqual(run.returncode, 1, run.stdout + run.stderr)
    first = result["first_divergence"]
    test.assertEqual((first["stage"], first["step"]), (stage, step), first["text"])
    test.assertIn(f"first divergence at {stage}", run.stdout)
    print(f"\n  {os.path.basename(fixture)}: {first['text']}", file=sys.stderr)
    return result
